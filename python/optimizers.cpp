// af.group and af.train's optimizers with minimize(), built as graph nodes
// (tf.train.GradientDescentOptimizer's update in the graph: var -= lr *
// grad, each update on its variable's device). Distributed training with
// aggregators and the library's optimizers (SGD, momentum, Adam, run
// where a variable lives) is actorflow-train's job (docs/training.md).
#include "python/bindings.hpp"

#include <set>

namespace af::python {

namespace {

/// The variables `loss` depends on, in creation order (TF's default var_list:
/// the trainable variables, of which those not on the loss's path would
/// make tf.gradients give None).
std::vector<output> variables_of(const py_graph& g, output loss) {
  auto closure = g.g.closure({loss.id});
  std::set<int32_t> needed;
  if (closure)
    needed.insert(closure->begin(), closure->end());
  std::vector<output> vars;
  for (auto v : g.g.variables()) {
    bool used = false; // an input of a node of the closure
    for (auto id : needed)
      for (auto in : g.g.nodes()[static_cast<size_t>(id)].inputs)
        used = used || in == v.id;
    if (used || needed.count(v.id))
      vars.push_back(v);
  }
  return vars;
}

py_group minimize_sgd(double learning_rate, const py_tensor& loss, const py::object& var_list) {
  auto& pg = *loss.owner;
  std::vector<output> vars;
  if (var_list.is_none()) {
    vars = variables_of(pg, loss.out);
  } else {
    for (auto v : var_list)
      vars.push_back(as_node(loss.owner, v));
  }
  if (vars.empty())
    raise(af_error::invalid_argument, "minimize: the loss '" + pg.g.at(loss.out).name
                                        + "' depends on no variable; nothing to train");
  auto grads = af::gradients(pg.g, loss.out, vars);
  if (!grads)
    raise(grads.error().code, grads.error().what);
  py_group train{loss.owner, {}};
  for (size_t i = 0; i < vars.size(); ++i) {
    const auto* v = pg.g.variable_node(vars[i]);
    if (v == nullptr)
      raise(af_error::invalid_argument, "minimize: '" + pg.g.at(vars[i]).name + "' is not a variable");
    // The step on the variable's device, as the update that follows it.
    pg.g.push_scope(v->requested);
    auto lr = pg.g.constant(tensor::filled(v->spec.type, {}, learning_rate), "learning_rate");
    auto step = pg.g.mul(lr, (*grads)[i]);
    pg.g.pop_scope();
    train.members.push_back(pg.g.assign_sub(vars[i], step));
  }
  return train;
}

struct sgd_optimizer {
  double learning_rate = 0.01;
};

} // namespace

void register_optimizers(py::module_& m) {
  py::class_<py_group>(m, "Operation", "Nodes run for their effect (TF's Operation): fetched, None.")
    .def_property_readonly("size", [](const py_group& g) { return g.members.size(); });
  m.def("group", [](py::args inputs) {
    py_group g{default_graph(), {}};
    for (auto in : inputs) {
      if (py::isinstance<py_group>(in)) {
        const auto& inner = in.cast<const py_group&>();
        g.owner = inner.owner;
        g.members.insert(g.members.end(), inner.members.begin(), inner.members.end());
      } else {
        const auto& t = in.cast<const py_tensor&>();
        g.owner = t.owner;
        g.members.push_back(t.out);
      }
    }
    return g;
  }, "an Operation that runs every input for its effect (tf.group)");
  auto train = py::reinterpret_borrow<py::module_>(m.attr("train"));
  py::class_<sgd_optimizer>(train, "GradientDescentOptimizer",
    "tf.train.GradientDescentOptimizer: minimize(loss) builds var -= learning_rate * grad for "
    "each variable the loss depends on (or var_list), each on its variable's device.")
    .def(py::init([](double lr) { return sgd_optimizer{lr}; }), py::arg("learning_rate"))
    .def("minimize", [](const sgd_optimizer& o, const py_tensor& loss, const py::object& var_list) {
      return minimize_sgd(o.learning_rate, loss, var_list);
    }, py::arg("loss"), py::arg("var_list") = py::none());
}

} // namespace af::python
