// Graph building the TF 1.x way: af.Graph and the default graph,
// af.Tensor (TF's Tensor and Variable) with + - * / @ and assign_add and
// its static shape (af.TensorShape, graph/shapes.hpp: an op whose known
// shapes cannot fit is a ValueError when built), with af.device(...)
// scopes (nesting merges, each thread's own, as TF's), af.constant,
// af.placeholder, af.Variable, af.get_variable with TF's initializers,
// af.gradients, af.global_variables_initializer(). Everything here builds
// an af::graph (graph/graph.hpp) and talks to no cluster: a session
// (python/session.cpp) creates the variables when it first runs the graph.
#include "python/bindings.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <limits>

#include "core/device_name.hpp"
#include "kernels/op_registry.hpp"

namespace af::python {

namespace {

graph_ptr& process_graph() {
  static graph_ptr g = std::make_shared<py_graph>();
  return g;
}

/// `with g.as_default():` blocks, innermost last: each thread's own, as
/// TF's default graph stack is thread-local (one shared stack let a block
/// in one thread send another thread's nodes to its graph, and its exit pop
/// the other thread's graph). Holds no Python object: a thread's ends
/// without the GIL.
std::vector<graph_ptr>& graph_stack() {
  thread_local std::vector<graph_ptr> stack;
  return stack;
}

[[noreturn]] void raise(const graph_error& err) {
  python::raise(err.code, err.what);
}

py_tensor make(const graph_ptr& g, output o) {
  return py_tensor{g, o};
}

std::string name_or(const py::object& name, const char* fallback) {
  return name.is_none() ? std::string(fallback) : str_arg(name, "name");
}

const graph_node& node_of(const py_tensor& t) {
  return t.owner->g.at(t.out);
}

/// TF's shape of a placeholder (`shape=`): None is any shape; a list or
/// tuple whose entries are sizes, or None / -1 for an axis of any size; an
/// int n is (n,). Anything else (a negative size, a float, a string)
/// raises ValueError naming it.
std::optional<std::vector<int64_t>> placeholder_shape(const py::object& shape) {
  if (shape.is_none())
    return std::nullopt;
  auto bad = [&] {
    return py::value_error("placeholder shape " + py::repr(shape).cast<std::string>().substr(0, 80)
                           + " is not a shape: a list of sizes, None or -1 for an axis of any "
                             "size, or shape=None for any shape");
  };
  auto size = [&](py::handle d) -> int64_t {
    if (d.is_none())
      return -1;
    if (!PyIndex_Check(d.ptr()) || py::isinstance<py::bool_>(d))
      throw bad(); // an int, NumPy's too (not a float, not a bool)
    int64_t v = 0;
    try {
      v = py::int_(py::reinterpret_borrow<py::object>(d)).cast<int64_t>();
    } catch (py::cast_error&) {
      throw bad(); // beyond int64
    }
    if (v < -1)
      throw bad();
    return v;
  };
  if (PyIndex_Check(shape.ptr()))
    return std::vector<int64_t>{size(shape)}; // TF's shape=3: one axis of 3
  if (!py::isinstance<py::sequence>(shape) || py::isinstance<py::str>(shape)
      || py::isinstance<py::bytes>(shape))
    throw bad();
  std::vector<int64_t> dims;
  for (auto d : shape)
    dims.push_back(size(d));
  return dims;
}

/// A shape as TF 1.x prints one: "(?, 3)", "(2,)", "()".
std::string shape_text(const std::vector<int64_t>& dims) {
  std::string out = "(";
  for (size_t i = 0; i < dims.size(); ++i) {
    out += dims[i] < 0 ? std::string("?") : std::to_string(dims[i]);
    if (i + 1 < dims.size() || dims.size() == 1)
      out += i + 1 < dims.size() ? ", " : ",";
  }
  return out + ")";
}

/// A binary operator: `x op y` or, reflected, `y op x`.
py_tensor binary(const py_tensor& x, py::handle other, const char* op, bool reflected) {
  auto y = as_node(x.owner, other, dtype_hint(*x.owner, x.out));
  auto a = reflected ? y : x.out;
  auto b = reflected ? x.out : y;
  return make(x.owner, checked_op(x.owner, op, {a, b}));
}

/// assign / assign_add / assign_sub of a variable Tensor.
py_tensor update(const py_tensor& var, py::handle value, const char* kind, const py::object& name) {
  const auto* v = var.owner->g.variable_node(var.out);
  if (v == nullptr)
    python::raise(af_error::invalid_argument,
                  std::string(kind) + " needs a variable; '" + node_of(var).name
                    + "' is not one (make it with af.Variable or af.get_variable)");
  auto value_node = as_node(var.owner, value, v->spec.type);
  auto& g = var.owner->g;
  auto n = name.is_none() ? std::string{} : str_arg(name, std::string(kind) + ": name");
  std::string k = kind;
  auto o = k == "assign" ? g.assign(var.out, value_node, n)
           : k == "assign_add" ? g.assign_add(var.out, value_node, n)
                               : g.assign_sub(var.out, value_node, n);
  return make(var.owner, o);
}

/// A variable node of the default graph; raises the graph's error.
py_tensor add_variable(const std::string& name, shape_type shape, initializer init, dtype type,
                       bool trainable) {
  auto g = default_graph();
  // A new variable under af.train.replica_device_setter goes to its next ps task.
  replica_placement placed{*g, name};
  auto o = g->g.variable(name, std::move(shape), std::move(init), type);
  if (!o)
    raise(o.error());
  if (!trainable)
    g->untrainable.insert(o->id);
  return make(g, *o);
}

/// TF's initializer argument: an af initializer, a number (constant), or
/// an array-like (the value itself).
initializer to_initializer(py::handle init, const shape_type& shape, dtype type) {
  if (init.is_none())
    return initializer::zeros();
  if (py::isinstance<initializer>(init))
    return init.cast<initializer>();
  if (py::isinstance<py::float_>(init) || py::isinstance<py::int_>(init))
    return initializer::constant(init.cast<double>());
  auto value = from_python(init, type);
  if (value.shape() != shape)
    python::raise(af_error::shape_mismatch, "the initial value has shape " + shape_string(value.shape())
                                              + ", the variable " + shape_string(shape));
  return initializer::from_tensor(std::move(value));
}

/// af.Variable's name: TF uniquifies it in the graph ("Variable_1").
std::string fresh_variable_name(const graph& g, const std::string& base) {
  if (!g.find_variable(base).valid())
    return base;
  for (int i = 1;; ++i) {
    auto candidate = base + "_" + std::to_string(i);
    if (!g.find_variable(candidate).valid())
      return candidate;
  }
}

/// af.TensorShape: a static shape (TF's TensorShape): nullopt for an
/// unknown rank, -1 for a dimension of any size (None in Python).
struct py_shape {
  std::optional<shape_type> dims;
};

py::object dim_object(int64_t d) {
  return d < 0 ? py::object(py::none()) : py::object(py::int_(d));
}

py::list shape_list(const py_shape& s) {
  if (!s.dims)
    throw py::value_error("as_list() is not defined on an unknown TensorShape.");
  py::list out;
  for (auto d : *s.dims)
    out.append(dim_object(d));
  return out;
}

/// Whether `a` and `b` may be the same shape (TF's is_compatible_with).
bool compatible(const py_shape& a, const py_shape& b) {
  if (!a.dims || !b.dims)
    return true;
  if (a.dims->size() != b.dims->size())
    return false;
  for (size_t i = 0; i < a.dims->size(); ++i)
    if ((*a.dims)[i] >= 0 && (*b.dims)[i] >= 0 && (*a.dims)[i] != (*b.dims)[i])
      return false;
  return true;
}

/// A TensorShape, or a list / tuple of sizes and None, as a py_shape.
py_shape to_shape(py::handle other) {
  if (py::isinstance<py_shape>(other))
    return other.cast<py_shape>();
  if (other.is_none())
    return {};
  shape_type dims;
  for (auto d : other)
    dims.push_back(d.is_none() ? -1 : d.cast<int64_t>());
  return {dims};
}

void register_shape_class(py::module_& m) {
  py::class_<py_shape>(m, "TensorShape",
                       "A static shape (TF's TensorShape): what the graph knows of a tensor's "
                       "shape before it runs; None for a dimension of any size")
    .def(py::init([](py::handle dims) { return to_shape(dims); }), py::arg("dims"))
    .def_property_readonly("ndims", [](const py_shape& s) -> py::object {
      return s.dims ? py::object(py::int_(s.dims->size())) : py::object(py::none());
    }, "the rank, or None when not known")
    .def_property_readonly("rank", [](const py_shape& s) -> py::object {
      return s.dims ? py::object(py::int_(s.dims->size())) : py::object(py::none());
    }, "the rank, or None when not known")
    .def_property_readonly("dims", [](const py_shape& s) -> py::object {
      return s.dims ? py::object(shape_list(s)) : py::object(py::none());
    }, "the sizes (None where not known), or None when the rank is not known")
    .def("as_list", &shape_list, "the sizes, None where not known; ValueError for an unknown rank")
    .def("is_fully_defined", [](const py_shape& s) {
      return s.dims && std::none_of(s.dims->begin(), s.dims->end(), [](int64_t d) { return d < 0; });
    })
    .def("is_compatible_with", [](const py_shape& s, py::handle o) { return compatible(s, to_shape(o)); },
         py::arg("other"))
    .def("__len__", [](const py_shape& s) {
      if (!s.dims)
        throw py::value_error("Cannot take the length of Shape with unknown rank.");
      return s.dims->size();
    })
    .def("__iter__", [](const py_shape& s) { return py::iter(shape_list(s)); })
    .def("__getitem__", [](const py_shape& s, py::handle key) -> py::object {
      // As TF's: a slice is a TensorShape (x.shape[1:].as_list()), and an
      // unknown rank has unknown dimensions and slices.
      bool slice = PySlice_Check(key.ptr());
      if (!s.dims)
        return slice ? py::cast(py_shape{}) : py::object(py::none());
      py::object got = shape_list(s)[key];
      return slice ? py::cast(to_shape(got)) : got;
    })
    .def("__eq__", [](const py_shape& s, py::handle o) {
      if (!py::isinstance<py_shape>(o) && !py::isinstance<py::list>(o) && !py::isinstance<py::tuple>(o))
        return false;
      return s.dims == to_shape(o).dims;
    })
    .def("__repr__", [](const py_shape& s) {
      return s.dims ? "TensorShape(" + py::repr(shape_list(s)).cast<std::string>() + ")"
                    : std::string("TensorShape(None)");
    })
    .def("__str__", [](const py_shape& s) {
      return s.dims ? shape_text(*s.dims) : std::string("<unknown>");
    });
}

void register_tensor_class(py::module_& m) {
  py::class_<py_tensor>(m, "Tensor",
                        "A node of a graph (TF's Tensor; a variable node is also TF's Variable).")
    .def_property_readonly("name", [](const py_tensor& t) { return node_of(t).name + ":0"; })
    .def_property_readonly("op_name", [](const py_tensor& t) {
      const auto& n = node_of(t);
      return n.kind == node_kind::compute || n.kind == node_kind::update ? n.op : std::string{};
    })
    .def_property_readonly("device", [](const py_tensor& t) { return node_of(t).requested.to_string(); },
                           "the device requested for it (the merged af.device scopes)")
    .def_property_readonly("dtype", [](const py_tensor& t) { return numpy_dtype(dtype_hint(*t.owner, t.out)); })
    .def_property_readonly("graph", [](const py_tensor& t) { return t.owner; })
    .def_property_readonly("shape", [](const py_tensor& t) {
      return py_shape{t.owner->shapes.of(t.owner->g, t.out).shape};
    }, "the static shape (af.TensorShape): what the graph knows before it runs, None where not known")
    .def("get_shape", [](const py_tensor& t) {
      return py_shape{t.owner->shapes.of(t.owner->g, t.out).shape};
    }, "the static shape (Tensor.shape)")
    .def_property_readonly("is_variable", [](const py_tensor& t) {
      return t.owner->g.variable_node(t.out) != nullptr;
    })
    .def_property_readonly("initializer", [](const py_tensor& t) {
      if (t.owner->g.variable_node(t.out) == nullptr)
        throw py::attribute_error("'" + node_of(t).name + "' is not a variable: only a variable "
                                  "(af.Variable, af.get_variable) has an initializer");
      return py_variables_op{py_variables_op::kind::initialize, t.owner, {t.out}};
    }, "run it to initialize this variable alone (TF's Variable.initializer)")
    .def("assign", [](const py_tensor& t, py::handle v, const py::object& n) {
      return update(t, v, "assign", n);
    }, py::arg("value"), py::arg("name") = py::none(),
         "var = value when run (TF's Variable.assign); fetched, its value is the new one")
    .def("assign_add", [](const py_tensor& t, py::handle v, const py::object& n) {
      return update(t, v, "assign_add", n);
    }, py::arg("value"), py::arg("name") = py::none(), "var += value when run; fetched, the new value")
    .def("assign_sub", [](const py_tensor& t, py::handle v, const py::object& n) {
      return update(t, v, "assign_sub", n);
    }, py::arg("value"), py::arg("name") = py::none(), "var -= value when run; fetched, the new value")
    .def("__add__", [](const py_tensor& x, py::handle y) { return binary(x, y, "add", false); })
    .def("__radd__", [](const py_tensor& x, py::handle y) { return binary(x, y, "add", true); })
    .def("__sub__", [](const py_tensor& x, py::handle y) { return binary(x, y, "sub", false); })
    .def("__rsub__", [](const py_tensor& x, py::handle y) { return binary(x, y, "sub", true); })
    .def("__mul__", [](const py_tensor& x, py::handle y) { return binary(x, y, "mul", false); })
    .def("__rmul__", [](const py_tensor& x, py::handle y) { return binary(x, y, "mul", true); })
    .def("__truediv__", [](const py_tensor& x, py::handle y) { return binary(x, y, "div", false); })
    .def("__rtruediv__", [](const py_tensor& x, py::handle y) { return binary(x, y, "div", true); })
    .def("__matmul__", [](const py_tensor& x, py::handle y) { return binary(x, y, "matmul", false); })
    .def("__rmatmul__", [](const py_tensor& x, py::handle y) { return binary(x, y, "matmul", true); })
    .def("__neg__", [](const py_tensor& x) { return make(x.owner, checked_op(x.owner, "neg", {x.out})); })
    .def("__hash__", [](const py_tensor& t) {
      return py::hash(py::make_tuple(reinterpret_cast<uintptr_t>(t.owner.get()), t.out.id));
    })
    .def("__eq__", [](const py_tensor& a, py::handle b) {
      // Identity, as TF 1.x's Tensor.__eq__: tensors are dict keys (feed_dict).
      if (!py::isinstance<py_tensor>(b))
        return false;
      const auto& o = b.cast<const py_tensor&>();
      return a.owner == o.owner && a.out == o.out;
    })
    .def("__repr__", [](const py_tensor& t) {
      const auto& n = node_of(t);
      auto dev = n.requested.to_string();
      return "<af.Tensor '" + n.name + ":0' dtype=" + dtype_name(dtype_hint(*t.owner, t.out))
             + (dev.empty() ? "" : " device=" + dev) + ">";
    });
}

void register_graph_class(py::module_& m) {
  py::class_<py_graph, graph_ptr>(m, "Graph", "An op graph (tf.Graph): what a Session runs.")
    .def(py::init<>())
    .def("get_operations", [](const py_graph& g) { return g.g.operations(); },
         "the names of its nodes, in creation order")
    .def("get_tensor_by_name", [](const graph_ptr& g, py::handle name) {
      bool is_tensor = false;
      auto o = node_by_name(*g, str_arg(name, "get_tensor_by_name: name"), &is_tensor);
      if (!is_tensor)
        throw py::value_error("The name '" + name.cast<std::string>() + "' refers to an Operation, "
                              "not a Tensor; Tensor names are '<op_name>:0'");
      return make(g, o);
    }, py::arg("name"), "the Tensor named 'op_name:0' (TF's Graph.get_tensor_by_name)")
    .def("as_default", [](const graph_ptr& g) { return g; },
         "`with g.as_default():` makes new nodes go to this graph")
    .def("__enter__", [](const graph_ptr& g) {
      graph_stack().push_back(g);
      return g;
    })
    .def("__exit__", [](const graph_ptr&, py::args) {
      // An __exit__ with no __enter__ popped an empty vector (SIGSEGV).
      if (graph_stack().empty())
        throw py::value_error("Graph.__exit__ without its __enter__: no graph was made the "
                              "default; use `with g.as_default():`");
      graph_stack().pop_back();
    })
    .def("__str__", [](const py_graph& g) { return g.g.to_string(); });
  m.def("get_default_graph", &default_graph);
  m.def("reset_default_graph", [] { process_graph() = std::make_shared<py_graph>(); },
        "a fresh process default graph (tf.reset_default_graph)");
}

void register_initializers(py::module_& m) {
  py::class_<initializer>(m, "Initializer", "How a variable gets its first value (TF's initializers).")
    .def_readonly("kind", &initializer::kind)
    .def("__repr__", [](const initializer& i) { return "<af.Initializer " + i.kind + ">"; });
  m.def("constant_initializer", [](double v) { return initializer::constant(v); }, py::arg("value") = 0.0);
  m.def("zeros_initializer", [] { return initializer::zeros(); });
  m.def("ones_initializer", [] { return initializer::ones(); });
  m.def("random_uniform_initializer", [](double lo, double hi, uint64_t seed) {
    return initializer::uniform(lo, hi, seed);
  }, py::arg("minval") = 0.0, py::arg("maxval") = 1.0, py::arg("seed") = 0);
  m.def("random_normal_initializer", [](double mean, double stddev, uint64_t seed) {
    return initializer::normal(mean, stddev, seed);
  }, py::arg("mean") = 0.0, py::arg("stddev") = 1.0, py::arg("seed") = 0);
}

void register_builders(py::module_& m) {
  m.def("constant", [](py::handle value, const py::object& type, const py::object& name) {
    auto g = default_graph();
    std::optional<dtype> want;
    if (!type.is_none())
      want = to_dtype(type);
    return make(g, g->g.constant(from_python(value, want), name_or(name, "Const")));
  }, py::arg("value"), py::arg("dtype") = py::none(), py::arg("name") = py::none(),
        "a constant node (tf.constant); Python floats are float32, ints int32");
  m.def("placeholder", [](const py::object& type, const py::object& shape, const py::object& name) {
    auto t = type.is_none() ? dtype::float32 : to_dtype(type);
    auto dims = placeholder_shape(shape);
    auto g = default_graph();
    std::optional<shape_type> declared;
    if (dims)
      declared = shape_type(dims->begin(), dims->end());
    return make(g, g->g.placeholder(name_or(name, "Placeholder"), t, std::move(declared)));
  }, py::arg("dtype") = py::none(), py::arg("shape") = py::none(), py::arg("name") = py::none(),
        "a value given at run time in feed_dict (tf.placeholder); feeds are converted to its "
        "dtype and must fit its shape (None or -1: any size on that axis; no shape: any), which "
        "is its static shape (Tensor.shape)");
  m.def("get_variable", [](const std::string& name, const py::object& shape, const py::object& type,
                           const py::object& init, const py::object& trainable) {
    auto t = type.is_none() ? dtype::float32 : to_dtype(type);
    shape_type s;
    if (!shape.is_none()) {
      // A number or a string was pybind11's RuntimeError "Unable to cast Python instance".
      if (PyUnicode_Check(shape.ptr()) || PyBytes_Check(shape.ptr()) || !PySequence_Check(shape.ptr()))
        throw py::type_error("get_variable '" + name + "': shape is " + py::repr(shape).cast<std::string>().substr(0, 80)
                             + "; give a list of sizes, e.g. [3, 4]");
      for (auto d : shape)
        s.push_back(int_arg(d, "get_variable '" + name + "': a dimension of shape",
                            std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    }
    return add_variable(name, s, to_initializer(init, s, t), t,
                        trainable.is_none() || trainable.cast<bool>());
  }, py::arg("name"), py::arg("shape") = py::none(), py::arg("dtype") = py::none(),
        py::arg("initializer") = py::none(), py::kw_only(), py::arg("trainable") = py::none(),
        "the variable `name` (tf.get_variable): the same name is the same variable, in this graph "
        "and across the cluster; no initializer means zeros");
  // TF's order: trainable second (tf.Variable(0, trainable=False, name="global_step")); the
  // rest by keyword, so that TF's positional collections, validate_shape, ... are refused
  // rather than taken as the name.
  m.def("Variable", [](py::handle initial_value, bool trainable, const py::object& name,
                       const py::object& type) {
    std::optional<dtype> want;
    if (!type.is_none())
      want = to_dtype(type);
    auto value = from_python(initial_value, want);
    auto g = default_graph();
    auto n = fresh_variable_name(g->g, name_or(name, "Variable"));
    auto t = value.type();
    auto shape = value.shape();
    return add_variable(n, shape, initializer::from_tensor(std::move(value)), t, trainable);
  }, py::arg("initial_value"), py::arg("trainable") = true, py::kw_only(),
        py::arg("name") = py::none(), py::arg("dtype") = py::none(),
        "a variable holding `initial_value` once initialized (tf.Variable); a name this graph "
        "has already gets a suffix, as in TF; trainable=False keeps it out of "
        "trainable_variables() and of an optimizer's default var_list");
  m.def("gradients", [](const py_tensor& loss, py::handle xs) {
    bool single = py::isinstance<py_tensor>(xs);
    std::vector<output> outs;
    py::list items = single ? py::list(py::make_tuple(xs)) : py::list(py::reinterpret_borrow<py::object>(xs));
    for (auto x : items) {
      const auto& t = x.cast<const py_tensor&>();
      if (t.owner != loss.owner)
        python::raise(af_error::invalid_argument, "af.gradients: '" + node_of(t).name
                                                    + "' is of another graph than the loss");
      outs.push_back(t.out);
    }
    auto r = af::gradients(loss.owner->g, loss.out, outs);
    if (!r)
      raise(r.error());
    py::list result;
    for (auto o : *r)
      result.append(make(loss.owner, o));
    return result;
  }, py::arg("ys"), py::arg("xs"),
        "d(ys)/d(xs) for a scalar ys (tf.gradients): backward ops on the forward ops' devices");
}

void register_variable_ops(py::module_& m) {
  py::class_<py_variables_op>(m, "_VariablesOp");
  auto all = [](py_variables_op::kind k) {
    auto g = default_graph();
    return py_variables_op{k, g, g->g.variables()};
  };
  m.def("global_variables_initializer", [all] { return all(py_variables_op::kind::initialize); },
        "run it to initialize every variable the default graph has now");
  m.def("initialize_all_variables", [all] { return all(py_variables_op::kind::initialize); },
        "the old name of global_variables_initializer");
  m.def("variables_initializer", [](py::handle var_list, const py::object& name) {
    if (!name.is_none())
      str_arg(name, "variables_initializer: name"); // TF names the op; here it is no node
    if (PyUnicode_Check(var_list.ptr()) || !PySequence_Check(var_list.ptr()))
      throw py::type_error("variables_initializer: var_list is a list of variables; got "
                           + py::repr(var_list).cast<std::string>().substr(0, 80));
    py_variables_op op{py_variables_op::kind::initialize, default_graph(), {}};
    bool first = true;
    for (auto v : var_list) {
      if (!py::isinstance<py_tensor>(v)
          || v.cast<const py_tensor&>().owner->g.variable_node(v.cast<const py_tensor&>().out) == nullptr)
        throw py::type_error("variables_initializer: var_list holds variables (af.Variable, "
                             "af.get_variable); got " + py::repr(v).cast<std::string>().substr(0, 80));
      const auto& t = v.cast<const py_tensor&>();
      if (!first && t.owner != op.owner)
        throw py::value_error("variables_initializer: the variables are of two graphs; give "
                              "those of one");
      op.owner = t.owner;
      op.vars.push_back(t.out);
      first = false;
    }
    return op;
  }, py::arg("var_list"), py::arg("name") = "init",
        "run it to initialize the variables of var_list (tf.variables_initializer)");
  m.def("report_uninitialized_variables",
        [all] { return all(py_variables_op::kind::report_uninitialized); },
        "run it to get the names of the variables that have no value yet (a NumPy array)");
  m.def("global_variables", [] {
    auto g = default_graph();
    py::list out;
    for (auto v : g->g.variables())
      out.append(make(g, v));
    return out;
  });
  m.def("trainable_variables", [] {
    auto g = default_graph();
    py::list out;
    for (auto v : g->g.variables())
      if (g->untrainable.count(v.id) == 0)
        out.append(make(g, v));
    return out;
  }, "the default graph's variables made without trainable=False (tf.trainable_variables)");
}

} // namespace

graph_ptr default_graph() {
  auto& stack = graph_stack();
  return stack.empty() ? process_graph() : stack.back();
}

dtype dtype_hint(const py_graph& pg, output o) {
  const auto& g = pg.g;
  if (!g.contains(o))
    return dtype::float32;
  if (const auto& info = pg.shapes.of(g, o); info.type)
    return *info.type;
  const auto& n = g.at(o);
  if (n.kind != node_kind::compute)
    return n.kind == node_kind::update && !n.inputs.empty() ? dtype_hint(pg, output{n.inputs[0]})
                                                            : dtype::float32;
  // No static dtype (an op whose rule refused its inputs' dtypes): the
  // registry's rule on scalars, else the first input's.
  std::vector<kernels::value_info> in;
  for (auto i : n.inputs)
    in.push_back({dtype_hint(pg, output{i}), {}});
  kernels::value_info out;
  if (kernels::infer_op(n.op, n.attrs, in, out).ok())
    return out.type;
  return in.empty() ? dtype::float32 : in.front().type;
}

void check_feed_shape(const py_graph& pg, output o, const tensor& value) {
  if (!pg.g.contains(o) || pg.g.at(o).kind != node_kind::placeholder || !pg.g.at(o).feed_shape)
    return;
  const auto& want = *pg.g.at(o).feed_shape;
  const auto& got = value.shape();
  bool fits = got.size() == want.size();
  for (size_t i = 0; fits && i < want.size(); ++i)
    fits = want[i] < 0 || want[i] == got[i];
  if (!fits)
    throw py::value_error("Cannot feed value of shape " + shape_text(got) + " for Tensor '"
                          + pg.g.at(o).name + ":0', which has shape '" + shape_text(want) + "'");
}

output checked_op(const graph_ptr& g, const std::string& kind, std::vector<output> inputs,
                  const op_attrs& attrs, const std::string& name) {
  std::vector<static_info> in;
  for (auto i : inputs)
    in.push_back(g->shapes.of(g->g, i));
  auto r = infer_static(kind, attrs, in, name.empty() ? kind : name);
  if (!r)
    throw py::value_error(r.error().what);
  return g->g.op(kind, std::move(inputs), attrs, name);
}

output as_node(const graph_ptr& g, py::handle value, std::optional<dtype> like) {
  if (py::isinstance<py_tensor>(value)) {
    const auto& t = value.cast<const py_tensor&>();
    if (t.owner != g)
      python::raise(af_error::invalid_argument,
                    "'" + node_of(t).name + "' is of another graph: use tensors of one graph in one op");
    return t.out;
  }
  return g->g.constant(from_python(value, like));
}

void register_graph(py::module_& m) {
  register_shape_class(m);
  register_graph_class(m);
  register_tensor_class(m);
  register_initializers(m);
  register_builders(m);
  register_variable_ops(m);
}

output node_by_name(const py_graph& g, const std::string& name, bool* is_tensor) {
  auto colon = name.rfind(':');
  auto op = colon == std::string::npos ? name : name.substr(0, colon);
  *is_tensor = colon != std::string::npos;
  if (*is_tensor && name.substr(colon + 1) != "0")
    throw py::key_error("The name '" + name + "' refers to a Tensor which does not exist: each "
                        "node of an actorflow graph has one output, '" + op + ":0'");
  const auto& nodes = g.g.nodes();
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].name == op)
      return output{static_cast<int32_t>(i)};
  throw py::key_error("The name '" + name + "' refers to " + (*is_tensor ? "a Tensor" : "an Operation")
                      + " which does not exist: the graph has no node '" + op
                      + "' (graph.get_operations() lists its names)");
}

} // namespace af::python
