// The functions expressions call: variable, const, zeros, gradients,
// assign, ... and the ops of the registry (kernels/op_registry.hpp) by name.

#include "repl/interpreter_state.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/op_registry.hpp"

namespace af::repl {

const std::vector<std::pair<std::string, std::string>>& interpreter::state::builtins() {
  static const std::vector<std::pair<std::string, std::string>> table{
    {"variable", "variable(NAME, SHAPE=[], INIT=0, dtype=\"float32\"): gets or creates the "
                 "variable NAME on the device of the enclosing `with` (tf.get_variable); "
                 "variable(NAME, 0.0) is a scalar starting at 0; INIT: a number, a [list], "
                 "zeros(), ones(), uniform(LOW, HIGH, SEED), normal(MEAN, STDDEV, SEED)"},
    {"const", "const(VALUE, dtype=\"float32\"): a constant tensor ([[1,2],[3,4]], 2.5)"},
    {"constant", "constant(VALUE, dtype=\"float32\"): the same as const"},
    {"zeros", "zeros() as an initializer; zeros(SHAPE) a tensor of zeros"},
    {"ones", "ones() as an initializer; ones(SHAPE) a tensor of ones"},
    {"fill", "fill(SHAPE, VALUE): a tensor of VALUE"},
    {"uniform", "uniform(LOW, HIGH, SEED=0): an initializer"},
    {"normal", "normal(MEAN, STDDEV, SEED=0): an initializer"},
    {"placeholder", "placeholder(NAME): a value given at run time (run y feed x=[...])"},
    {"gradients", "gradients(LOSS, [X, ...]): d LOSS / d X for each X (tf.gradients), a list; "
                  "gradients(LOSS, X): the one gradient"},
    {"assign", "assign(VAR, VALUE) or VAR.assign(VALUE): an op that sets VAR"},
    {"assign_add", "assign_add(VAR, VALUE) or VAR.assign_add(VALUE)"},
    {"assign_sub", "assign_sub(VAR, VALUE) or VAR.assign_sub(VALUE)"},
    {"device_of", "device_of(VAR): the full device a variable lives on"},
    {"partitioned_table", "partitioned_table(NAME, SHAPE, DEVICES, INIT=0, strategy=\"mod\"): "
                          "a table [rows, dim] cut into one shard variable NAME/part_i per "
                          "device of DEVICES (the ps tasks), as a list of its shards; strategy "
                          "mod (id p on shard p % n), div or contiguous (runs of ids)"},
    {"embedding_lookup", "embedding_lookup(PARAMS, IDS, strategy=): the rows IDS of a table "
                         "(a gather), or of a partitioned table (its list of shards: each shard "
                         "sends only its rows, once each)"},
    {"sparse_gradients", "sparse_gradients(LOSS, [X, ...]): the gradients, each [ids, values] "
                         "where it is sparse (a table read by a lookup: the rows touched and "
                         "their gradients, TF's IndexedSlices), else dense; "
                         "sparse_gradients(LOSS, X): the one"},
  };
  return table;
}

std::vector<std::string> interpreter::state::function_names() {
  std::vector<std::string> out;
  for (const auto& [n, h] : builtins())
    out.push_back(n);
  for (const auto& def : kernels::op_registry()) {
    out.emplace_back(def.call_name());
    if (!def.function.empty()) // sum as well as reduce_sum
      out.emplace_back(def.name);
  }
  return out;
}

std::string interpreter::state::function_example(const std::string& name) {
  for (const auto& [n, h] : builtins())
    if (n == name) // the help starts with the call: "assign(VAR, VALUE) or ..."
      return h.substr(0, h.find(')') + 1);
  if (const auto* def = kernels::find_op_def(name))
    return name + "(" + std::string{def->inputs} + ")";
  return "";
}

std::string interpreter::state::function_help(const std::string& name) {
  for (const auto& [n, h] : builtins())
    if (n == name)
      return h;
  return op_help(name);
}

value interpreter::state::call(const std::string& fn, const expr& e,
                               std::optional<value> receiver) {
  args_view a;
  a.at = e.at;
  a.fn = fn;
  if (receiver) {
    a.positional.push_back(*receiver);
    a.positional_at.push_back(e.items[0]->at);
  }
  for (const auto& arg : e.args) {
    auto v = eval(*arg.value);
    if (arg.keyword.empty()) {
      if (!a.keyword.empty())
        fail(arg.value->at, fn + ": a positional argument after a keyword one");
      a.positional.push_back(std::move(v));
      a.positional_at.push_back(arg.value->at);
    } else {
      if (a.keyword.count(arg.keyword))
        fail(arg.value->at, fn + ": " + arg.keyword + "= is given twice");
      a.keyword[arg.keyword] = {std::move(v), arg.value->at};
    }
  }
  auto r = call_builtin(fn, a);
  r.source = e.source;
  return r;
}

void interpreter::state::check_arity(const args_view& a, size_t min, size_t max,
                                     const std::vector<std::string>& keys) {
  for (const auto& [k, v] : a.keyword)
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
      std::string known;
      for (const auto& key : keys)
        known += (known.empty() ? "" : ", ") + key + "=";
      fail(v.second, a.fn + " takes no " + k + "=" + (known.empty() ? "" : " (it takes " + known + ")"));
    }
  size_t n = a.positional.size();
  if (n < min || n > max) {
    auto help = function_help(a.fn);
    fail(a.at, a.fn + " takes " + (min == max ? std::to_string(min) : std::to_string(min) + " to " + std::to_string(max))
                 + " argument(s), got " + std::to_string(n) + (help.empty() ? "" : ": " + help));
  }
}

std::string interpreter::state::text_arg(const args_view& a, size_t i, const std::string& key,
                                         const std::string& what) {
  position at = a.at;
  const auto* v = a.get(i, key, &at);
  if (v == nullptr)
    fail(a.at, a.fn + ": " + what + " is missing: " + function_help(a.fn));
  if (v->what != value::kind::text)
    fail(at, a.fn + ": " + what + " must be \"text\", got " + kind_name(v->what));
  return v->text;
}

double interpreter::state::number_arg(const args_view& a, size_t i, const std::string& key,
                                      double fallback) {
  position at = a.at;
  const auto* v = a.get(i, key, &at);
  if (v == nullptr)
    return fallback;
  if (v->what != value::kind::number && v->what != value::kind::boolean)
    fail(at, a.fn + ": " + key + " must be a number, got " + kind_name(v->what));
  return v->number;
}

bool interpreter::state::bool_arg(const args_view& a, const std::string& key) {
  position at = a.at;
  const auto* v = a.get(size_t(-1), key, &at);
  if (v == nullptr)
    return false;
  if (v->what != value::kind::boolean && v->what != value::kind::number)
    fail(at, a.fn + ": " + key + " must be true or false");
  return v->number != 0;
}

shape_type interpreter::state::shape_arg(const value& v, position at, const std::string& fn) {
  shape_type s;
  std::vector<value> dims;
  if (v.what == value::kind::number)
    dims.push_back(v); // zeros(5): a shape of one dimension
  else if (v.what == value::kind::list)
    dims = v.items;
  else if (v.what == value::kind::tensor && v.t.shape().size() == 1)
    for (size_t i = 0; i < v.t.num_elements(); ++i) {
      value d;
      d.what = value::kind::number;
      d.number = v.t.at(i);
      d.integral = d.number == std::floor(d.number);
      d.source = std::to_string(d.number);
      dims.push_back(d);
    }
  else
    fail(at, fn + ": a shape is a [list] of sizes such as [2, 2] ([] for a scalar)");
  if (dims.size() > 32)
    fail(at, fn + ": a shape has at most 32 dimensions");
  for (const auto& d : dims) {
    if (d.what != value::kind::number || !d.integral || !(d.number >= 0) || d.number > 1e9)
      fail(at, fn + ": each size of a shape is a whole number from 0 to 10^9, found '"
                 + d.source + "'");
    s.push_back(static_cast<int64_t>(d.number));
  }
  size_t elements = 1;
  for (auto d : s) {
    elements *= static_cast<size_t>(std::max<int64_t>(d, 1));
    if (elements > (size_t{1} << 32))
      fail(at, fn + ": the shape " + shape_text(s) + " has more than 2^32 elements");
  }
  return s;
}

dtype interpreter::state::dtype_arg(const args_view& a) {
  position at = a.at;
  const auto* v = a.get(size_t(-1), "dtype", &at);
  if (v == nullptr)
    return dtype::float32;
  if (v->what != value::kind::text)
    fail(at, a.fn + ": dtype is \"float32\", \"float64\", \"int32\" or \"int64\"");
  auto t = parse_dtype(v->text);
  if (!t)
    fail(at, a.fn + ": unknown dtype '" + v->text + "': use float32, float64, int32 or int64");
  return *t;
}

tensor interpreter::state::filled_exact(const tensor& one, const shape_type& shape, position at) {
  auto n = num_elements(shape);
  if (n > (int64_t{1} << 28))
    fail(at, "an integer value past 2^53 fills at most 2^28 elements here, not "
               + std::to_string(n) + "; give a smaller shape");
  tensor t{one.type(), shape};
  if (one.type() == dtype::int64)
    std::fill_n(t.mutable_data<int64_t>(), n, one.data<int64_t>()[0]);
  else if (one.type() == dtype::int32)
    std::fill_n(t.mutable_data<int32_t>(), n, one.data<int32_t>()[0]);
  else
    t = tensor::filled(one.type(), shape, one.at(0));
  return t;
}

initializer interpreter::state::init_arg(const value& v, position at, shape_type& shape,
                                         bool shape_given, dtype type) {
  switch (v.what) {
    case value::kind::number:
    case value::kind::boolean: {
      tensor check{type, {}};
      store(check, 0, v, at); // an int variable takes whole numbers in its range
      auto exact = exact_of(v);
      if (!exact || static_cast<wide_int>(v.number) == *exact
          || (type != dtype::int32 && type != dtype::int64))
        return initializer::constant(v.number);
      // An int64 past 2^53 that a double (the constant initializer's
      // value) would round: the tensor itself, of the variable's shape.
      return initializer::from_tensor(filled_exact(check, shape, at));
    }
    case value::kind::init:
      return v.init;
    case value::kind::tensor:
    case value::kind::list: {
      auto t = to_tensor(v, at, type);
      if (t.shape().empty())
        return initializer::constant(t.at(0));
      if (!shape_given)
        shape = t.shape();
      else if (t.shape() != shape)
        fail(at, "variable: the initial value's shape " + shape_text(t.shape())
                   + " is not the variable's " + shape_text(shape));
      return initializer::from_tensor(std::move(t));
    }
    default:
      fail(at, "variable: the initial value must be a number, a [list], zeros(), ones(), "
               "uniform(...) or normal(...), got " + std::string{kind_name(v.what)});
  }
}

value interpreter::state::call_builtin(const std::string& fn, const args_view& a) {
  if (fn == "variable")
    return call_variable(a);
  if (fn == "const" || fn == "constant")
    return call_const(a);
  if (fn == "zeros" || fn == "ones" || fn == "fill")
    return call_fill(fn, a);
  if (fn == "uniform" || fn == "normal")
    return call_random_init(fn, a);
  if (fn == "placeholder")
    return call_placeholder(a);
  if (fn == "gradients")
    return call_gradients(a);
  if (fn == "assign" || fn == "assign_add" || fn == "assign_sub")
    return call_assign(fn, a);
  if (fn == "device_of")
    return call_device_of(a);
  if (fn == "partitioned_table")
    return call_partitioned_table(a);
  if (fn == "embedding_lookup")
    return call_embedding_lookup(a);
  if (fn == "sparse_gradients")
    return call_sparse_gradients(a);
  if (auto v = call_op(fn, a))
    return std::move(*v);
  fail(a.at, "unknown function or op '" + printable(fn) + "'" + nearest_name(fn)
               + " (help functions lists them)");
}

value interpreter::state::call_variable(const args_view& a) {
  auto& s = sess();
  const auto& fn = a.fn;
  check_arity(a, 1, 3, {"name", "shape", "init", "dtype"});
  auto name = text_arg(a, 0, "name", "the variable's name");
  auto type = dtype_arg(a);
  shape_type shape;
  bool shape_given = false;
  position at = a.at;
  const value* second = a.get(1, "shape", &at);
  const value* init_v = nullptr;
  position init_at = a.at;
  if (second != nullptr && a.keyword.count("shape") == 0 && a.positional.size() == 2
      && second->what == value::kind::number) {
    init_v = second; // variable("var", 0.0), as tf.Variable(0.0): a scalar starting there
    init_at = at;
  } else if (second != nullptr) {
    if (second->what == value::kind::number)
      fail(at, "variable: a shape is a [list] ([5], not 5; [] for a scalar)");
    shape = shape_arg(*second, at, fn);
    shape_given = true;
  }
  if (shape.size() > 8)
    fail(at, "variable: at most 8 dimensions (the data plane carries up to 8), got "
               + std::to_string(shape.size()));
  if (init_v == nullptr)
    init_v = a.get(2, "init", &init_at);
  initializer init = initializer::zeros();
  if (init_v != nullptr)
    init = init_arg(*init_v, init_at, shape, shape_given, type);
  auto v = s.variable(name, shape, init, type);
  if (!v)
    fail(a.at, describe(v.error()));
  return node_value(*v, "");
}

value interpreter::state::call_const(const args_view& a) {
  check_arity(a, 1, 1, {"value", "dtype"});
  value v;
  v.what = value::kind::tensor;
  v.t = to_tensor(*a.get(0, "value"), a.positional_at.empty() ? a.at : a.positional_at[0],
                  dtype_arg(a));
  return v;
}

value interpreter::state::call_fill(const std::string& fn, const args_view& a) {
  bool is_fill = fn == "fill";
  check_arity(a, is_fill ? 2 : 0, is_fill ? 2 : 1, {"shape", "value", "dtype"});
  value v;
  const value* shape_v = a.get(0, "shape");
  if (shape_v == nullptr) {
    v.what = value::kind::init;
    v.init = fn == "zeros" ? initializer::zeros() : initializer::ones();
    return v;
  }
  position shape_at = a.positional_at.empty() ? a.at : a.positional_at[0];
  auto shape = shape_arg(*shape_v, shape_at, fn);
  size_t elements = 1;
  for (auto d : shape)
    elements *= static_cast<size_t>(d);
  // A constant is built here, in the REPL's memory, then sent with the
  // step: a large one belongs in a variable, which its node allocates.
  if (elements > (size_t{1} << 28))
    fail(shape_at, fn + ": a constant of " + std::to_string(elements) + " elements is more "
                       "than the REPL builds (2^28); make it a variable with an initializer "
                       "(variable(\"v\", SHAPE, " + (fn == "fill" ? "VALUE" : fn + "()")
                       + ")), which its node allocates");
  double fillv = is_fill ? number_arg(a, 1, "value", 0) : fn == "ones" ? 1 : 0;
  v.what = value::kind::tensor;
  auto type = dtype_arg(a);
  if (is_fill && (type == dtype::int32 || type == dtype::int64)) {
    // An integer fill takes the value's exact value, refused if out of range.
    position value_at = a.at;
    tensor one{type, {}};
    store(one, 0, *a.get(1, "value", &value_at), value_at);
    v.t = filled_exact(one, shape, value_at);
  } else {
    v.t = tensor::filled(type, shape, fillv);
  }
  return v;
}

value interpreter::state::call_random_init(const std::string& fn, const args_view& a) {
  check_arity(a, 2, 3, {"low", "high", "mean", "stddev", "seed"});
  value v;
  v.what = value::kind::init;
  double seed_v = number_arg(a, 2, "seed", 0);
  if (!(seed_v >= 0 && seed_v <= 9e15) || seed_v != std::floor(seed_v))
    fail(a.at, fn + ": seed is a whole number from 0 to 9e15");
  auto seed = static_cast<uint64_t>(seed_v);
  if (fn == "uniform")
    v.init = initializer::uniform(number_arg(a, 0, "low", 0), number_arg(a, 1, "high", 1), seed);
  else
    v.init = initializer::normal(number_arg(a, 0, "mean", 0), number_arg(a, 1, "stddev", 1), seed);
  return v;
}

value interpreter::state::call_placeholder(const args_view& a) {
  check_arity(a, 0, 1, {"name"});
  std::string name = a.positional.empty() && !a.keyword.count("name")
                       ? "Placeholder"
                       : text_arg(a, 0, "name", "the placeholder's name");
  return node_value(sess().placeholder(name), "");
}

value interpreter::state::call_gradients(const args_view& a) {
  check_arity(a, 2, 2, {});
  auto loss = to_node(a.positional[0], a.positional_at[0]);
  std::vector<output> xs;
  const auto& xv = a.positional[1];
  if (xv.what == value::kind::list)
    for (const auto& x : xv.items)
      xs.push_back(to_node(x, a.positional_at[1]));
  else
    xs.push_back(to_node(xv, a.positional_at[1]));
  auto g = sess().gradients(loss, xs);
  if (!g)
    fail(a.at, describe(g.error()));
  if (xv.what != value::kind::list) // gradients(loss, w): the one gradient, not a list
    return node_value(g->front(), "d(" + a.positional[0].source + ")/d(" + xv.source + ")");
  value v;
  v.what = value::kind::list;
  for (size_t i = 0; i < g->size(); ++i)
    v.items.push_back(node_value((*g)[i], "d(" + a.positional[0].source + ")/d("
                                            + (xv.what == value::kind::list ? xv.items[i].source : xv.source) + ")"));
  return v;
}

value interpreter::state::call_assign(const std::string& fn, const args_view& a) {
  auto& s = sess();
  check_arity(a, 2, 2, {});
  auto var = to_node(a.positional[0], a.positional_at[0]);
  if (s.graph_def().variable_node(var) == nullptr)
    fail(a.positional_at[0], fn + ": '" + a.positional[0].source + "' is not a variable");
  auto val = to_node(a.positional[1], a.positional_at[1], dtype_of(a.positional[0]));
  auto o = fn == "assign" ? s.assign(var, val) : fn == "assign_add" ? s.assign_add(var, val)
                                                                    : s.assign_sub(var, val);
  return node_value(o, "");
}

value interpreter::state::call_device_of(const args_view& a) {
  auto& s = sess();
  check_arity(a, 1, 1, {});
  auto var = to_node(a.positional[0], a.positional_at[0]);
  value v;
  v.what = value::kind::text;
  v.text = s.graph_def().variable_node(var) ? s.device_of(var) : "";
  if (v.text.empty())
    fail(a.positional_at[0], "device_of: '" + a.positional[0].source
                               + "' is not a variable (ops are placed when they run: see trace)");
  return v;
}

// -- ops ---------------------------------------------------------------------------
// The ops expressions call by name (add(a, b), relu(x), reduce_sum(x, axis=0),
// matmul(a, b, transpose_b=true), ...): which exist, their inputs, keywords
// and help come from the op registry alone (kernels/op_registry.hpp); help
// functions, completion and calls all read it.

std::string interpreter::state::op_help(const std::string& name) {
  const auto* def = kernels::find_op_def(name);
  if (def == nullptr)
    return "";
  return def->signature() + ": " + std::string{def->help}
         + (def->function.empty() ? "" : "; also " + std::string{def->name} + "(...)");
}

std::optional<value> interpreter::state::call_op(const std::string& fn, const args_view& a) {
  const auto* def = kernels::find_op_def(fn);
  if (def == nullptr)
    return std::nullopt;
  std::vector<std::string> keys;
  if (def->attrs == kernels::op_attr_kind::transposes)
    keys = {"transpose_a", "transpose_b"};
  else if (def->attrs == kernels::op_attr_kind::reduction)
    keys = {"axis", "keep_dims"};
  auto arity = static_cast<size_t>(def->arity());
  check_arity(a, arity, def->variadic ? size_t(-1) : arity, keys);
  if (!def->takes(a.positional.size())) // variadic: groups of `arity` (N indices, N data)
    fail(a.at, fn + " takes a multiple of " + std::to_string(arity) + " arguments, got "
                 + std::to_string(a.positional.size()) + ": " + op_help(fn));
  // Literals take the dtype of the first graph value among the inputs, and
  // labels are int32.
  dtype literal_type = dtype::float32;
  for (const auto& p : a.positional)
    if (p.what == value::kind::node) {
      literal_type = dtype_of(p);
      break;
    }
  std::vector<output> in;
  size_t i = 0;
  for (auto names = def->inputs; i < a.positional.size(); ++i) {
    auto comma = names.find(',');
    bool labels = names.substr(0, comma) == "LABELS";
    names = comma == std::string_view::npos ? std::string_view{} : names.substr(comma + 1);
    while (!names.empty() && names.front() == ' ')
      names.remove_prefix(1);
    in.push_back(to_node(a.positional[i], a.positional_at[i], labels ? dtype::int32 : literal_type));
  }
  op_attrs attrs;
  if (def->attrs == kernels::op_attr_kind::transposes) {
    attrs.transpose_a = bool_arg(a, "transpose_a");
    attrs.transpose_b = bool_arg(a, "transpose_b");
  } else if (def->attrs == kernels::op_attr_kind::reduction) {
    position at = a.at;
    if (const auto* axis = a.get(size_t(-1), "axis", &at)) {
      if (axis->what != value::kind::number || !axis->integral || std::fabs(axis->number) > 32)
        fail(at, fn + ": axis is a whole number from -32 to 32 (negative counts from the end)");
      attrs.all_axes = false;
      attrs.axis = static_cast<int32_t>(axis->number);
    }
    attrs.keep_dims = bool_arg(a, "keep_dims");
  }
  return node_value(sess().op(std::string{def->name}, in, attrs), "");
}

} // namespace af::repl
