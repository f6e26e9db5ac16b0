// af.group and af.train's optimizers (GradientDescentOptimizer,
// MomentumOptimizer, AdamOptimizer) with compute_gradients,
// apply_gradients and minimize, built as graph nodes: TF 1.x's update of
// each variable on the variable's device, its slots variables beside it.
// Distributed training with aggregators and the library's optimizers run
// inside the variable actors (train/optimizer.hpp) is actorflow-train's
// job (docs/training.md; af.train.Job from Python).
#include "python/bindings.hpp"

#include <set>

namespace af::python {

namespace {

/// The variables `loss` depends on, in creation order (TF's default var_list:
/// the trainable variables, of which those not on the loss's path would
/// make tf.gradients give None).
/// With `trainable_only` false: every variable the loss depends on.
std::vector<output> variables_of(const py_graph& g, output loss, bool trainable_only = true) {
  auto closure = g.g.closure({loss.id});
  std::set<int32_t> needed;
  if (closure)
    needed.insert(closure->begin(), closure->end());
  std::vector<output> vars;
  for (auto v : g.g.variables()) {
    if (trainable_only && g.untrainable.count(v.id) > 0)
      continue; // trainable=False
    bool used = false; // an input of a node of the closure
    for (auto id : needed)
      for (auto in : g.g.nodes()[static_cast<size_t>(id)].inputs)
        used = used || in == v.id;
    if (used || needed.count(v.id))
      vars.push_back(v);
  }
  return vars;
}

/// The variables to train: `var_list`, or those `loss` depends on.
std::vector<output> train_variables(const py_tensor& loss, const py::object& var_list) {
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
  for (auto v : vars)
    if (pg.g.variable_node(v) == nullptr)
      raise(af_error::invalid_argument, "minimize: '" + pg.g.at(v).name + "' is not a variable");
  return vars;
}

/// af.train's optimizers (tf.train.Optimizer): TF 1.x's update of each
/// variable as graph nodes on the variable's device, its slots variables
/// of that device too ("<var>/Momentum", "<var>/Adam", "<var>/Adam_1", as
/// TF names them), so a ps holds its variables' slots and each update runs
/// there. Each update is a chain of data dependencies (a slot's assign
/// gives the value the variable's update reads), so one run applies every
/// step in TF's order without control edges.
struct py_optimizer {
  enum class method : uint8_t { sgd, momentum, adam };
  method kind = method::sgd;
  double learning_rate = 0.01;
  /// A scalar Tensor given as the learning rate (a placeholder fed each
  /// step, a decayed variable): read by every update instead of the number.
  std::optional<py_tensor> rate_tensor;
  double momentum = 0;
  bool nesterov = false;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  /// The slots' suffix ("<var>/<name>", Adam's second "<var>/<name>_1"), TF's `name`.
  std::string name = "GradientDescent";
};
struct py_sgd : py_optimizer {};
struct py_momentum : py_optimizer {};
struct py_adam : py_optimizer {};

/// `base`, or base_1, base_2, ... if the graph has a variable of that name
/// (two optimizers of one variable get slots of their own, as in TF).
std::string fresh_name(const graph& g, const std::string& base) {
  if (!g.find_variable(base).valid())
    return base;
  for (int i = 1;; ++i)
    if (auto n = base + "_" + std::to_string(i); !g.find_variable(n).valid())
      return n;
}

/// A slot of `v` (the variable's shape and dtype, on its device), starting at `init`.
output make_slot(graph& g, const graph_node& v, const std::string& suffix, double init) {
  auto s = g.variable(fresh_name(g, v.name + "/" + suffix), v.spec.shape,
                      initializer::constant(init), v.spec.type);
  if (!s)
    raise(s.error().code, s.error().what);
  return *s;
}

output scalar(graph& g, dtype t, double v, const char* name) {
  return g.constant(tensor::filled(t, {}, v), name);
}

/// The learning rate as a node: the Tensor given, or a constant of `t`.
output rate_node(graph& g, const py_optimizer& o, dtype t) {
  return o.rate_tensor ? o.rate_tensor->out : scalar(g, t, o.learning_rate, "learning_rate");
}

/// TF's learning_rate: a number (a Python or NumPy scalar, a 0-d array), or
/// a scalar float Tensor (a placeholder, a variable). Anything else is a
/// TypeError naming it; a Tensor that is not a scalar, a ValueError.
void set_learning_rate(py_optimizer& o, py::handle lr, const char* cls) {
  std::string where = std::string("af.train.") + cls + ": learning_rate ";
  if (py::isinstance<py_tensor>(lr)) {
    const auto& t = lr.cast<const py_tensor&>();
    const auto& info = t.owner->shapes.of(t.owner->g, t.out);
    if (info.shape && !info.shape->empty())
      throw py::value_error(where + "must be a scalar Tensor; '" + t.owner->g.at(t.out).name
                            + ":0' has shape " + static_shape_string(info.shape));
    auto type = dtype_hint(*t.owner, t.out);
    if (type != dtype::float32 && type != dtype::float64)
      throw py::type_error(where + "must be a float32 or float64 Tensor; '"
                           + t.owner->g.at(t.out).name + ":0' is " + dtype_name(type));
    o.rate_tensor = t;
    return;
  }
  auto numbers = py::module_::import("numbers");
  bool number = !py::isinstance<py::bool_>(lr) && py::isinstance(lr, numbers.attr("Real"));
  if (!number && py::isinstance<py::array>(lr)) {
    auto a = py::reinterpret_borrow<py::array>(lr);
    auto kind = a.dtype().kind();
    number = a.ndim() == 0 && (kind == 'f' || kind == 'i' || kind == 'u');
  }
  if (!number)
    throw py::type_error(where + "must be a number (a Python or NumPy scalar, a 0-d array) or a "
                         "scalar float Tensor (af.placeholder(af.float32, []), a variable); got "
                         + py::repr(lr).cast<std::string>().substr(0, 80));
  o.learning_rate = py::float_(py::reinterpret_borrow<py::object>(lr)).cast<double>();
}

/// Adam's bias-corrected rate lr * sqrt(1 - beta2^t) / (1 - beta1^t) at
/// the run's step t: the powers are variables (TF's beta1_power and
/// beta2_power, beside the first variable by name) holding beta^t after t
/// steps; each run multiplies them once and reads the products.
output adam_rate(graph& g, const py_optimizer& o, const std::vector<output>& vars) {
  const graph_node* first = nullptr;
  for (auto v : vars)
    if (first == nullptr || g.at(v).name < first->name)
      first = g.variable_node(v);
  auto t = first->spec.type; // `first` is not used once nodes are added
  g.push_scope(first->requested);
  auto power = [&](const char* name) {
    auto p = g.variable(fresh_name(g, name), {}, initializer::ones(), t);
    if (!p)
      raise(p.error().code, p.error().what);
    return *p;
  };
  auto p1 = power("beta1_power");
  auto p2 = power("beta2_power");
  auto t1 = g.assign(p1, g.mul(p1, scalar(g, t, o.beta1, "beta1")));
  auto t2 = g.assign(p2, g.mul(p2, scalar(g, t, o.beta2, "beta2")));
  auto one = scalar(g, t, 1, "one");
  auto rate = g.div(g.mul(rate_node(g, o, t), g.sqrt(g.sub(one, t2))),
                    g.sub(one, t1), "adam_learning_rate");
  g.pop_scope();
  return rate;
}

/// The update of `var` with `grad` (TF 1.x's kernels' formulas), on the
/// variable's device; `adam_lr` is adam_rate()'s node.
output update_of(graph& g, const py_optimizer& o, output var, output grad, output adam_lr) {
  const graph_node v = *g.variable_node(var); // a copy: new nodes move the graph's
  auto t = v.spec.type;
  g.push_scope(v.requested);
  auto lr = rate_node(g, o, t);
  output step;
  switch (o.kind) {
    case py_optimizer::method::sgd: // var -= lr * grad
      step = g.mul(lr, grad);
      break;
    case py_optimizer::method::momentum: { // accum = accum * momentum + grad
      auto mom = scalar(g, t, o.momentum, "momentum");
      auto accum = make_slot(g, v, o.name, 0);
      auto a = g.assign(accum, g.add(g.mul(accum, mom), grad));
      // var -= lr * accum, or with Nesterov lr * grad + lr * momentum * accum
      step = o.nesterov ? g.add(g.mul(grad, lr), g.mul(g.mul(a, mom), lr)) : g.mul(a, lr);
      break;
    }
    case py_optimizer::method::adam: { // m += (g - m) (1 - beta1); v += (g^2 - v) (1 - beta2)
      auto m = make_slot(g, v, o.name, 0);
      auto s = make_slot(g, v, o.name + "_1", 0);
      auto one = scalar(g, t, 1, "one");
      auto m1 = g.assign(m, g.add(m, g.mul(g.sub(grad, m), g.sub(one, scalar(g, t, o.beta1, "beta1")))));
      auto v1 = g.assign(s, g.add(s, g.mul(g.sub(g.square(grad), s),
                                           g.sub(one, scalar(g, t, o.beta2, "beta2")))));
      // var -= m * lr_t / (sqrt(v) + epsilon)
      step = g.div(g.mul(m1, adam_lr), g.add(g.sqrt(v1), scalar(g, t, o.epsilon, "epsilon")));
      break;
    }
  }
  g.pop_scope();
  return g.assign_sub(var, step);
}

/// tf.train.Optimizer.compute_gradients: [(gradient, variable)], the
/// gradient None for a variable of var_list the loss does not depend on
/// (as TF's; apply_gradients skips it).
py::list compute_gradients(const py_tensor& loss, const py::object& var_list) {
  auto vars = train_variables(loss, var_list);
  std::set<int32_t> on_path;
  for (auto v : variables_of(*loss.owner, loss.out, false))
    on_path.insert(v.id);
  std::vector<output> reached;
  for (auto v : vars)
    if (on_path.count(v.id) > 0)
      reached.push_back(v);
  std::vector<output> grads;
  if (!reached.empty()) {
    auto got = af::gradients(loss.owner->g, loss.out, reached);
    if (!got)
      raise(got.error().code, got.error().what);
    grads = std::move(*got);
  }
  py::list out;
  size_t k = 0;
  for (auto v : vars) {
    py::object grad = py::none();
    if (on_path.count(v.id) > 0)
      grad = py::cast(py_tensor{loss.owner, grads[k++]});
    out.append(py::make_tuple(grad, py_tensor{loss.owner, v}));
  }
  return out;
}

/// tf.train.Optimizer.apply_gradients: an Operation of every variable's
/// update (and global_step's increment).
py_group apply_gradients(const py_optimizer& o, const py::object& grads_and_vars,
                         const py::object& global_step) {
  graph_ptr owner;
  std::vector<output> grads, vars;
  for (auto item : grads_and_vars) {
    auto pair = py::reinterpret_borrow<py::sequence>(item);
    if (py::len(pair) != 2)
      throw py::value_error("apply_gradients: each entry is a (gradient, variable) pair");
    const auto& var = pair[1].cast<const py_tensor&>();
    if (owner && owner != var.owner)
      raise(af_error::invalid_argument, "apply_gradients: the variables are of different graphs");
    owner = var.owner;
    if (owner->g.variable_node(var.out) == nullptr)
      raise(af_error::invalid_argument, "apply_gradients: '" + owner->g.at(var.out).name
                                          + "' is not a variable");
    if (pair[0].is_none()) // TF's compute_gradients gives None for a variable off the loss's path
      continue;
    vars.push_back(var.out);
    grads.push_back(as_node(owner, pair[0], dtype_hint(*owner, var.out)));
  }
  if (!owner)
    raise(af_error::invalid_argument, "apply_gradients: no (gradient, variable) pairs given");
  if (o.rate_tensor && o.rate_tensor->owner != owner)
    raise(af_error::invalid_argument, "apply_gradients: the learning rate '"
                                        + o.rate_tensor->owner->g.at(o.rate_tensor->out).name
                                        + ":0' is a Tensor of another graph than the variables");
  if (vars.empty())
    throw py::value_error("apply_gradients: no gradients provided for any variable (each "
                          "gradient is None: the loss depends on none of them)");
  auto& g = owner->g;
  if (o.rate_tensor)
    for (auto v : vars)
      if (auto t = g.variable_node(v)->spec.type; t != dtype_hint(*owner, o.rate_tensor->out))
        throw py::type_error("apply_gradients: the learning rate '"
                             + g.at(o.rate_tensor->out).name + ":0' is "
                             + dtype_name(dtype_hint(*owner, o.rate_tensor->out)) + ", variable '"
                             + g.at(v).name + "' " + dtype_name(t) + "; give one of its dtype");
  output adam_lr;
  if (o.kind == py_optimizer::method::adam)
    adam_lr = adam_rate(g, o, vars);
  py_group train{owner, {}};
  for (size_t i = 0; i < vars.size(); ++i)
    train.members.push_back(update_of(g, o, vars[i], grads[i], adam_lr));
  if (!global_step.is_none()) {
    auto step = as_node(owner, global_step);
    if (g.variable_node(step) == nullptr)
      raise(af_error::invalid_argument, "apply_gradients: global_step must be a variable");
    auto where = g.variable_node(step)->requested;
    auto type = g.variable_node(step)->spec.type;
    g.push_scope(where);
    train.members.push_back(g.assign_add(step, scalar(g, type, 1, "one")));
    g.pop_scope();
  }
  return train;
}

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
        if (!py::isinstance<py_tensor>(in))
          throw py::type_error("af.group: an input is " + py::repr(in).cast<std::string>().substr(0, 80)
                               + "; give af.Tensors, Operations (af.group, minimize) or variables");
        const auto& t = in.cast<const py_tensor&>();
        g.owner = t.owner;
        g.members.push_back(t.out);
      }
    }
    return g;
  }, "an Operation that runs every input for its effect (tf.group)");
  auto train = py::reinterpret_borrow<py::module_>(m.attr("train"));
  py::class_<py_optimizer>(train, "Optimizer",
    "tf.train.Optimizer: each variable's update in the graph, on the variable's device, its "
    "slots variables there too (docs/python.md, \"Optimizers\").")
    .def("compute_gradients", [](const py_optimizer&, const py_tensor& loss, const py::object& var_list) {
      return compute_gradients(loss, var_list);
    }, py::arg("loss"), py::arg("var_list") = py::none(),
       "[(gradient, variable)] for var_list, or every variable the loss depends on")
    .def("apply_gradients", [](const py_optimizer& o, const py::object& grads_and_vars,
                               const py::object& global_step, const py::object&) {
      return apply_gradients(o, grads_and_vars, global_step);
    }, py::arg("grads_and_vars"), py::arg("global_step") = py::none(), py::arg("name") = py::none(),
       "an Operation applying each gradient to its variable (and adding 1 to global_step)")
    .def("minimize", [](const py_optimizer& o, const py_tensor& loss, const py::object& global_step,
                        const py::object& var_list, const py::object&) {
      return apply_gradients(o, compute_gradients(loss, var_list), global_step);
    }, py::arg("loss"), py::arg("global_step") = py::none(), py::arg("var_list") = py::none(),
       py::arg("name") = py::none(), "compute_gradients then apply_gradients: the training Operation");
  py::class_<py_sgd, py_optimizer>(train, "GradientDescentOptimizer",
    "tf.train.GradientDescentOptimizer: var -= learning_rate * grad.")
    .def(py::init([](py::handle lr, bool, const std::string& name) {
      py_sgd o;
      set_learning_rate(o, lr, "GradientDescentOptimizer");
      o.name = name;
      return o;
    }), py::arg("learning_rate"), py::arg("use_locking") = false,
       py::arg("name") = "GradientDescent");
  py::class_<py_momentum, py_optimizer>(train, "MomentumOptimizer",
    "tf.train.MomentumOptimizer: accum = accum * momentum + grad; var -= learning_rate * accum "
    "(Nesterov: var -= learning_rate * (grad + momentum * accum)); slot '<var>/Momentum' ('<var>/<name>').")
    // TF 1.x's argument order (use_locking third, name fourth), so that a
    // TF script's MomentumOptimizer(lr, m, True) locks (a no-op here: each
    // update runs in its variable's actor) rather than turning on Nesterov.
    .def(py::init([](py::handle lr, double momentum, bool, const std::string& name, bool nesterov) {
      py_momentum o;
      o.kind = py_optimizer::method::momentum;
      set_learning_rate(o, lr, "MomentumOptimizer");
      o.momentum = momentum;
      o.nesterov = nesterov;
      o.name = name;
      return o;
    }), py::arg("learning_rate"), py::arg("momentum"), py::arg("use_locking") = false,
       py::arg("name") = "Momentum", py::arg("use_nesterov") = false);
  py::class_<py_adam, py_optimizer>(train, "AdamOptimizer",
    "tf.train.AdamOptimizer: m += (grad - m)(1 - beta1); v += (grad^2 - v)(1 - beta2); var -= "
    "lr_t * m / (sqrt(v) + epsilon), lr_t = learning_rate * sqrt(1 - beta2^t) / (1 - beta1^t); "
    "slots '<var>/Adam' and '<var>/Adam_1' ('<var>/<name>', '<var>/<name>_1'), beta1_power and beta2_power beside the first variable.")
    .def(py::init([](py::handle lr, double beta1, double beta2, double epsilon, bool,
                     const std::string& name) {
      py_adam o;
      o.name = name;
      o.kind = py_optimizer::method::adam;
      set_learning_rate(o, lr, "AdamOptimizer");
      o.beta1 = beta1;
      o.beta2 = beta2;
      o.epsilon = epsilon;
      return o;
    }), py::arg("learning_rate") = 0.001, py::arg("beta1") = 0.9, py::arg("beta2") = 0.999,
       py::arg("epsilon") = 1e-8, py::arg("use_locking") = false, py::arg("name") = "Adam");
}

} // namespace af::python
