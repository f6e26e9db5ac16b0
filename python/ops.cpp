// Every op of the registry (kernels/op_registry.hpp) as a function of the
// module, made from the registry's table when the module loads: af.relu(x),
// af.matmul(a, b, transpose_b=True), af.reduce_sum(x, axis=1,
// keep_dims=True), ... An op added to the registry is a Python function
// with no change here; its docstring is the registry's signature and help.
// af.nn and af.math (and tf.subtract & co.) give TF 1.x's names to the
// same functions.
#include "python/bindings.hpp"

#include <algorithm>
#include <limits>
#include <string_view>
#include <utility>

#include "kernels/op_registry.hpp"

namespace af::python {

namespace {

/// The attributes `def` reads, from the call's keywords; a keyword the op
/// does not take raises TypeError naming the op's signature.
op_attrs attrs_of(const kernels::op_def& def, py::dict& kwargs) {
  op_attrs attrs;
  auto take = [&](const char* key) -> py::object {
    if (!kwargs.contains(key))
      return py::none();
    py::object v = kwargs[key];
    PyDict_DelItemString(kwargs.ptr(), key);
    return v;
  };
  if (def.attrs == kernels::op_attr_kind::transposes) {
    if (auto v = take("transpose_a"); !v.is_none())
      attrs.transpose_a = v.cast<bool>();
    if (auto v = take("transpose_b"); !v.is_none())
      attrs.transpose_b = v.cast<bool>();
  } else if (def.attrs == kernels::op_attr_kind::reduction) {
    auto axis = take("axis");
    if (axis.is_none())
      axis = take("reduction_indices"); // TF 1.x's older name
    attrs.all_axes = axis.is_none();
    std::string what = "af." + std::string(def.call_name()) + ": axis";
    // TF's axis=[1] (its MNIST tutorial's reduction_indices=[1]) was
    // pybind11's "Unable to cast Python instance"; one axis in a list is
    // that axis, several are refused by name (the kernels reduce one).
    if (py::isinstance<py::list>(axis) || py::isinstance<py::tuple>(axis)
        || py::isinstance<py::array>(axis)) {
      auto axes = py::list(axis);
      if (axes.size() != 1)
        throw py::value_error(what + " is " + py::repr(axis).cast<std::string>().substr(0, 60)
                              + "; give one axis (an int, or a list of one), or none for all "
                                "axes: the reductions take one axis at a time");
      axis = axes[0];
    }
    constexpr int64_t most = std::numeric_limits<int32_t>::max();
    attrs.axis = axis.is_none() ? 0 : static_cast<int32_t>(int_arg(axis, what, -most, most));
    auto keep = take("keep_dims");
    if (keep.is_none())
      keep = take("keepdims");
    attrs.keep_dims = !keep.is_none() && keep.cast<bool>();
  }
  return attrs;
}

/// Whether input `i` of `def` is an index or a count (its name in the
/// registry: INDICES, IDS, LABELS, NUM_SEGMENTS, PARTITIONS, ...), whose
/// Python values are integers of their own (int32, as TF makes them).
bool is_index_input(const kernels::op_def& def, size_t i, size_t count) {
  std::string_view names = def.inputs;
  // A variadic op's inputs come name by name, each `count / arity` times
  // (dynamic_stitch: N INDICES, then N DATA).
  auto each = std::max<size_t>(1, count / static_cast<size_t>(std::max(1, def.arity())));
  auto k = def.variadic ? i / each : i;
  for (size_t at = 0; k > 0 && at != std::string_view::npos; --k) {
    at = names.find(',');
    names = at == std::string_view::npos ? std::string_view{} : names.substr(at + 1);
  }
  auto name = names.substr(0, names.find(','));
  for (const char* word : {"INDICES", "IDS", "LABELS", "NUM_", "PARTITION", "SHARD_ROWS", "STRATEGY"})
    if (name.find(word) != std::string_view::npos)
      return true;
  return false;
}

/// Builds `def` on the graph of its first Tensor input (else the default
/// graph); Python values among the inputs become constants of that
/// input's dtype.
py_tensor build(const kernels::op_def& def, const py::args& args, py::dict kwargs) {
  std::string fn{def.call_name()};
  if (!def.takes(args.size()))
    throw py::type_error("af." + fn + " takes " + def.signature() + "; given "
                         + std::to_string(args.size()) + " input(s)");
  auto attrs = attrs_of(def, kwargs);
  std::string name;
  if (kwargs.contains("name")) {
    py::object n = kwargs["name"];
    if (!n.is_none())
      name = str_arg(n, "af." + fn + ": name");
    PyDict_DelItemString(kwargs.ptr(), "name");
  }
  if (!kwargs.empty())
    throw py::type_error("af." + fn + " does not take " + py::str(kwargs.attr("keys")()).cast<std::string>()
                         + "; it is " + def.signature());
  // Python values take the dtype of the op's first Tensor of data, except
  // at an index input (gather's ids, unsorted_segment_sum's ids and count):
  // af.gather(params, [0, 2]) made float32 ids, refused when it ran.
  auto index_input = [&](size_t i) { return is_index_input(def, i, args.size()); };
  graph_ptr g;
  std::optional<dtype> like;
  for (size_t i = 0; i < args.size(); ++i)
    if (py::isinstance<py_tensor>(args[i])) {
      const auto& t = args[i].cast<const py_tensor&>();
      if (!g)
        g = t.owner;
      if (!index_input(i)) {
        like = dtype_hint(*t.owner, t.out);
        break;
      }
    }
  if (!g)
    g = default_graph();
  std::vector<output> inputs;
  for (size_t i = 0; i < args.size(); ++i)
    inputs.push_back(as_node(g, args[i], index_input(i) ? std::nullopt : like));
  return py_tensor{g, checked_op(g, std::string(def.name), std::move(inputs), attrs, name)};
}

/// The Python signature of `def`'s function, as pybind11 writes one (the
/// first line of its docstring, which help() and the type stubs show):
/// inputs positional (the registry's names), attributes and name= keywords.
std::string python_signature(const kernels::op_def& def) {
  std::string out{def.call_name()};
  out += "(";
  out += def.variadic ? std::string{"*inputs"} : std::string{def.inputs} + ", /, *";
  if (def.attrs == kernels::op_attr_kind::transposes)
    out += ", transpose_a: bool = False, transpose_b: bool = False";
  else if (def.attrs == kernels::op_attr_kind::reduction)
    out += ", axis: Optional[int] = None, keep_dims: bool = False";
  return out + ", name: Optional[str] = None) -> actorflow.Tensor";
}

/// TF 1.x's names for the registry's ops: af.math (tf.math), and
/// tf.subtract, tf.multiply, tf.divide, tf.negative at the top, each the
/// registry op's own function (an op the registry lacks has no alias).
/// TF's names whose signature differs from the registry op's (tf.concat's
/// list and axis, tf.dynamic_partition's) are not aliased.
void register_aliases(py::module_& m) {
  static const std::pair<const char*, const char*> top[] = {
    {"subtract", "sub"}, {"multiply", "mul"}, {"divide", "div"}, {"negative", "neg"}};
  for (const auto& [alias, op] : top)
    if (py::hasattr(m, op))
      m.attr(alias) = m.attr(op);
  auto math = m.def_submodule("math", "tf.math's names for the registry's ops");
  static const std::pair<const char*, const char*> in_math[] = {
    {"add", "add"}, {"subtract", "sub"}, {"multiply", "mul"}, {"divide", "div"},
    {"negative", "neg"}, {"exp", "exp"}, {"log", "log"}, {"sqrt", "sqrt"},
    {"square", "square"}, {"tanh", "tanh"}, {"sigmoid", "sigmoid"}, {"softplus", "softplus"},
    {"reduce_sum", "reduce_sum"}, {"reduce_mean", "reduce_mean"}, {"reduce_max", "reduce_max"},
    {"unsorted_segment_sum", "unsorted_segment_sum"}};
  for (const auto& [alias, op] : in_math)
    if (py::hasattr(m, op))
      math.attr(alias) = m.attr(op);
  py::module_::import("sys").attr("modules")["actorflow.math"] = math;
}

} // namespace

void register_ops(py::module_& m) {
  { // our signature line instead of pybind11's "(*args, **kwargs)"
  py::options only_ours;
  only_ours.disable_function_signatures();
  for (const auto& def : kernels::op_registry()) {
    const kernels::op_def* d = &def; // the registry lives as long as the process
    std::string fn{d->call_name()};
    std::string doc = python_signature(*d) + "\n\naf." + d->signature() + ": " + std::string(d->help)
                      + "\n\nOne node of the registry's op '" + std::string(d->name)
                      + "'; inputs may be Tensors or values (made constants); name= names the node.";
    m.def(fn.c_str(), [d](py::args args, py::kwargs kwargs) {
      return build(*d, args, py::dict(kwargs));
    }, doc.c_str());
  }
  }
  // tf.nn's names for the same ops.
  auto nn = m.def_submodule("nn", "tf.nn's names for the registry's ops");
  for (const char* name : {"relu", "sigmoid", "tanh", "softmax", "log_softmax", "softplus"})
    if (py::hasattr(m, name))
      nn.attr(name) = m.attr(name);
  const kernels::op_def* gather = kernels::find_op_def("gather");
  const kernels::op_def* xent = kernels::find_op_def("softmax_xent");
  if (gather != nullptr)
    nn.def("embedding_lookup", [gather](py::handle params, py::handle ids, const py::object& name) {
      py::dict kwargs;
      kwargs["name"] = name;
      return build(*gather, py::make_tuple(params, ids), kwargs);
    }, py::arg("params"), py::arg("ids"), py::arg("name") = py::none(),
       "rows `ids` of one (unpartitioned) table: af.gather(params, ids)");
  if (xent != nullptr)
    nn.def("sparse_softmax_cross_entropy_with_logits",
           [xent](py::handle labels, py::handle logits, const py::object& name) {
      py::dict kwargs;
      kwargs["name"] = name;
      return build(*xent, py::make_tuple(logits, labels), kwargs);
    }, py::kw_only(), py::arg("labels"), py::arg("logits"), py::arg("name") = py::none(),
       "per-example loss of logits [batch, classes] and int labels [batch]: af.softmax_xent(logits, labels)");
  py::module_::import("sys").attr("modules")["actorflow.nn"] = nn;
  register_aliases(m);
}

} // namespace af::python
