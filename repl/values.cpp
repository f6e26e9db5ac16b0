// Values: what an expression evaluates to, made into tensors and graph
// nodes, and printed; and the small text helpers every part of the REPL uses.

#include "repl/interpreter_state.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace af::repl {

std::string wide_text(wide_int x) {
  bool minus = x < 0;
  auto m = minus ? -static_cast<unsigned __int128>(x) : static_cast<unsigned __int128>(x);
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(m % 10)));
    m /= 10;
  } while (m != 0);
  return minus ? "-" + digits : digits;
}

const char* kind_name(value::kind k) {
  switch (k) {
    case value::kind::none: return "nothing";
    case value::kind::number: return "a number";
    case value::kind::boolean: return "true/false";
    case value::kind::text: return "text";
    case value::kind::tensor: return "a constant tensor";
    case value::kind::node: return "a graph node";
    case value::kind::list: return "a list";
    case value::kind::init: return "an initializer";
  }
  return "?";
}

std::optional<wide_int> exact_of(const value& v) {
  if (!v.exact)
    return std::nullopt;
  auto m = static_cast<wide_int>(v.magnitude);
  return v.negative ? -m : m;
}

void set_exact(value& v, wide_int x) {
  auto m = x < 0 ? -x : x;
  v.exact = m <= static_cast<wide_int>(UINT64_MAX);
  v.negative = v.exact && x < 0;
  v.magnitude = v.exact ? static_cast<uint64_t>(m) : 0;
}

std::optional<dtype> parse_dtype(const std::string& s) {
  if (s == "float32" || s == "float")
    return dtype::float32;
  if (s == "float64" || s == "double")
    return dtype::float64;
  if (s == "int32" || s == "int")
    return dtype::int32;
  if (s == "int64")
    return dtype::int64;
  return std::nullopt;
}

std::optional<ms> parse_duration(const std::string& s) {
  if (s.empty())
    return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit{end};
  if (end == s.c_str() || !(v >= 0) || v > 86400e3)
    return std::nullopt;
  double scale = 0;
  if (unit == "ms")
    scale = 1;
  else if (unit == "s")
    scale = 1000;
  else if (unit == "m" || unit == "min")
    scale = 60000;
  else
    return std::nullopt;
  if (v * scale > 86400e3) // at most a day, whatever the unit
    return std::nullopt;
  return ms{static_cast<int64_t>(v * scale)};
}

std::string escaped(const std::string& s, size_t limit, bool keep_lines) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= limit) {
      out += "... (cut)";
      break;
    }
    bool control = c < 0x20 || c == 0x7f;
    if (control && !(keep_lines && (c == '\n' || c == '\t'))) {
      char code[8];
      std::snprintf(code, sizeof code, "\\x%02x", c);
      out += code;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string printable_message(const std::string& s) {
  return escaped(s, 2000, true);
}

std::string printable(const std::string& s) {
  return escaped(s, 60, false);
}

std::string number_text(double x) {
  std::ostringstream o;
  o.precision(10);
  o << x;
  return o.str();
}

std::pair<std::string, int32_t> parse_task(const word& w, const cluster_spec& spec) {
  std::string why;
  auto d = device_name::parse(w.text, &why);
  if (!d || !d->job)
    fail(w.at, "'" + w.text + "' does not name a task: write /job:NAME/task:N"
                 + (why.empty() ? "" : " (" + why + ")"));
  int32_t task = d->task.value_or(0);
  if (auto err = spec.check_task(*d->job, task))
    fail(w.at, describe(err));
  return {*d->job, task};
}

std::string task_name(const std::string& job, int32_t task) {
  return "/job:" + job + "/task:" + std::to_string(task);
}

std::string shape_text(const shape_type& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i)
    out += (i ? ", " : "") + std::to_string(s[i]);
  if (s.size() == 1)
    out += ",";
  return out + ")";
}

std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) {
      if (width.size() <= c)
        width.push_back(0);
      width[c] = std::max(width[c], r[c].size());
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c)
      line += r[c] + (c + 1 < r.size() ? std::string(width[c] - r[c].size() + 2, ' ') : "");
    out += line + "\n";
  }
  return out;
}

tensor interpreter::state::to_tensor(const value& v, position at, dtype type) {
  if (v.what == value::kind::tensor)
    return v.t;
  if (v.what == value::kind::number || v.what == value::kind::boolean) {
    tensor t{type, {}};
    store(t, 0, v, at);
    return t;
  }
  if (v.what != value::kind::list)
    fail(at, "expected numbers or a [list] of them, got " + std::string{kind_name(v.what)});
  shape_type shape;
  std::vector<bool> rows; ///< per depth: true if it holds lists, false numbers
  std::vector<const value*> flat; // into `v`: a number keeps its exact value
  flatten(v, at, 0, shape, rows, flat);
  size_t elements = 1;
  for (auto d : shape)
    elements *= static_cast<size_t>(d);
  if (elements != flat.size())
    fail(at, "the list is ragged: its rows have different lengths");
  tensor t{type, shape};
  for (size_t i = 0; i < flat.size(); ++i)
    store(t, i, *flat[i], at);
  return t;
}

void interpreter::state::store(tensor& t, size_t i, const value& v, position at) {
  double x = v.number;
  auto whole = [&](wide_int lo, wide_int hi) -> wide_int {
    auto range = " (" + to_string(t.type()) + " holds " + wide_text(lo) + " to " + wide_text(hi) + ")";
    if (auto exact = exact_of(v)) {
      if (*exact < lo || *exact > hi)
        fail(at, "the value " + wide_text(*exact) + " does not fit " + to_string(t.type()) + range);
      return *exact;
    }
    if (x != std::floor(x) || !std::isfinite(x)) // 2.5, inf, nan
      fail(at, "the value " + number_text(x) + " does not fit " + to_string(t.type())
                 + ": an integer tensor takes whole numbers (write const(" + number_text(x)
                 + ", dtype=\"float32\") for a float)");
    // 2^63 and -2^63 are doubles: the comparison is exact.
    if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)
        || static_cast<wide_int>(x) < lo || static_cast<wide_int>(x) > hi)
      fail(at, "the value " + (v.integral && !v.source.empty() ? printable(v.source) : number_text(x))
                 + " does not fit " + to_string(t.type()) + range);
    return static_cast<wide_int>(x);
  };
  switch (t.type()) {
    case dtype::float32: t.mutable_data<float>()[i] = static_cast<float>(x); break;
    case dtype::float64: t.mutable_data<double>()[i] = x; break;
    case dtype::int32:
      t.mutable_data<int32_t>()[i] = static_cast<int32_t>(whole(INT32_MIN, INT32_MAX));
      break;
    case dtype::int64:
      t.mutable_data<int64_t>()[i] = static_cast<int64_t>(whole(INT64_MIN, INT64_MAX));
      break;
  }
}

void interpreter::state::flatten(const value& v, position at, size_t depth,
                                 shape_type& shape, std::vector<bool>& rows,
                                 std::vector<const value*>& flat) {
  bool is_list = v.what == value::kind::list;
  if (depth > 0) {
    // Every item at one depth is a list, or every one a number.
    if (rows.size() < depth)
      rows.push_back(is_list);
    else if (rows[depth - 1] != is_list)
      fail(at, "the list is ragged: it mixes numbers and lists at depth " + std::to_string(depth));
  }
  if (depth > 32)
    fail(at, "the list nests more than 32 levels (a tensor has at most 32 dimensions)");
  if (is_list) {
    if (depth == shape.size())
      shape.push_back(static_cast<int64_t>(v.items.size()));
    else if (shape[depth] != static_cast<int64_t>(v.items.size()))
      fail(at, "the list is ragged: a row at depth " + std::to_string(depth + 1) + " has "
                 + std::to_string(v.items.size()) + " items, an earlier one "
                 + std::to_string(shape[depth]));
    if (flat.size() + v.items.size() > (size_t{1} << 26))
      fail(at, "the list is too large for a literal (more than 2^26 numbers)");
    for (const auto& item : v.items)
      flatten(item, at, depth + 1, shape, rows, flat);
    return;
  }
  if (v.what != value::kind::number && v.what != value::kind::boolean)
    fail(at, "a tensor literal holds only numbers; found " + std::string{kind_name(v.what)}
               + (v.source.empty() ? "" : " (" + v.source + ")")
               + ": to combine graph values use ops (w + b), not a list");
  if (depth != shape.size())
    fail(at, "the list is ragged: a number where a row was expected");
  flat.push_back(&v);
}

bool interpreter::state::is_numeric_list(const value& v) const {
  if (v.what != value::kind::list)
    return false;
  for (const auto& i : v.items)
    if (!(i.what == value::kind::number || i.what == value::kind::boolean || is_numeric_list(i)))
      return false;
  return true;
}

dtype interpreter::state::dtype_of(const value& v) {
  if (v.what == value::kind::tensor)
    return v.t.type();
  if (v.what != value::kind::node || !sess().graph_def().contains(v.o))
    return dtype::float32;
  // An op's result has its first input's dtype (elementwise ops,
  // reductions, matmul, assigns), except the losses and softmaxes, which
  // are float: follow first inputs back to a variable or constant.
  const auto& g = sess().graph_def();
  output o = v.o;
  for (int hops = 0; hops < 1000 && g.contains(o); ++hops) {
    const auto& n = g.at(o);
    if (n.kind == node_kind::variable)
      return n.spec.type;
    if (n.kind == node_kind::constant)
      return n.value.empty() ? dtype::float32 : n.value.type();
    if (n.kind == node_kind::placeholder || n.inputs.empty()
        || n.op.find("softmax") != std::string::npos)
      return dtype::float32;
    o = output{n.inputs[0]};
  }
  return dtype::float32;
}

output interpreter::state::to_node(const value& v, position at, dtype literal_type) {
  switch (v.what) {
    case value::kind::node: {
      if (!sess().graph_def().contains(v.o))
        fail(at, "'" + v.source + "' is not a node of this session's graph");
      return v.o;
    }
    case value::kind::number:
    case value::kind::boolean:
    case value::kind::list:
      return constant_node(to_tensor(v, at, literal_type));
    case value::kind::tensor:
      return constant_node(v.t);
    default:
      fail(at, "expected a tensor or a graph node, got " + std::string{kind_name(v.what)}
                 + (v.source.empty() ? "" : " (" + v.source + ")"));
  }
}

output interpreter::state::constant_node(tensor t) {
  auto scope = sess().graph_def().current_scope().to_string();
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i)
      h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(scope.data(), scope.size());
  auto type = static_cast<uint8_t>(t.type());
  mix(&type, 1);
  for (auto d : t.shape())
    mix(&d, sizeof d);
  mix(t.bytes(), t.nbytes());
  auto range = current->constants.equal_range(h);
  for (auto it = range.first; it != range.second; ++it) {
    const auto& n = sess().graph_def().at(it->second);
    if (n.requested.to_string() == scope && n.value.type() == t.type()
        && n.value.shape() == t.shape()
        && std::memcmp(n.value.bytes(), t.bytes(), t.nbytes()) == 0)
      return it->second;
  }
  check_graph_size();
  auto o = sess().constant(std::move(t));
  current->constants.emplace(h, o);
  return o;
}

value interpreter::state::node_value(output o, const std::string& source) {
  check_graph_size();
  value v;
  v.what = value::kind::node;
  v.o = o;
  v.source = source;
  if (const auto* n = sess().graph_def().variable_node(o))
    known_variables.insert(n->spec.name);
  return v;
}

std::string interpreter::state::describe_node(output o) {
  const auto& n = sess().graph_def().at(o);
  switch (n.kind) {
    case node_kind::variable:
      return "variable " + n.spec.name + " " + shape_text(n.spec.shape) + " "
             + to_string(n.spec.type) + " on " + sess().device_of(o);
    case node_kind::constant:
      return "constant " + n.name + " " + describe_shape(n.value);
    case node_kind::placeholder:
      return "placeholder " + n.name + " (give it a value with: run ... feed NAME=[...])";
    case node_kind::update:
    case node_kind::compute: {
      std::string dev = n.requested.to_string();
      return "op " + n.name + " (" + n.op + ")"
             + (dev.empty() ? "" : " requested on " + dev);
    }
  }
  return n.name;
}

std::string interpreter::state::show(const value& v, position at) {
  switch (v.what) {
    case value::kind::none: return "(nothing)";
    case value::kind::number:
      // A whole number typed as one prints as one; the rest as NumPy
      // prints a float64 scalar (with --precision).
      if (auto exact = exact_of(v))
        return wide_text(*exact);
      if (v.integral && std::fabs(v.number) < 9e15)
        return std::to_string(static_cast<int64_t>(v.number));
      if (std::isfinite(v.number) && v.number == std::floor(v.number) && std::fabs(v.number) < 1e16)
        return format_numpy(tensor::filled(dtype::float64, {}, v.number), opts.print); // "2.0"
      {
        // NumPy's scalars ignore `precision`; an array's elements keep it.
        auto text = format_numpy(tensor::filled(dtype::float64, {1}, v.number), opts.print);
        if (text.find('e') != std::string::npos) // "[1.e-05]": the scalar's "1e-05" reads better
          return format_numpy(tensor::filled(dtype::float64, {}, v.number), opts.print);
        return text.substr(1, text.size() - 2);
      }
    case value::kind::boolean: return v.number != 0 ? "true" : "false";
    case value::kind::text: return v.text;
    case value::kind::tensor: return format_numpy(v.t, opts.print);
    case value::kind::node: return describe_node(v.o);
    case value::kind::init: return "initializer " + v.init.kind;
    case value::kind::list: {
      if (is_numeric_list(v))
        return format_numpy(to_tensor(v, at), opts.print);
      std::string out = "[";
      for (size_t i = 0; i < v.items.size(); ++i)
        out += (i ? ", " : "") + show(v.items[i], at);
      return out + "]";
    }
  }
  return "?";
}

} // namespace af::repl
