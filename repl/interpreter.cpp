#include "repl/interpreter.hpp"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "dist/embedded_cluster.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "dist/train_client.hpp"
#include "dist/training.hpp"
#include "kernels/kernels.hpp"
#include "messages/error.hpp"
#include "core/spelling.hpp"
#include "repl/parser.hpp"
#include "train/checkpoint.hpp"
#include "train/config.hpp"

namespace af::repl {

namespace {

using ms = std::chrono::milliseconds;

/// Wide enough for a literal's exact value (|x| < 2^64) and the sum,
/// difference or product of two of them checked for overflow.
__extension__ typedef __int128 wide_int;

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

/// An error of one statement: where it points (column 0: nowhere) and why.
struct repl_error {
  position at;
  std::string message;
  bool statement = false; ///< `at` is the failed statement's start (a cluster error)
};

[[noreturn]] void fail(position at, std::string message) {
  throw repl_error{at, std::move(message)};
}
[[noreturn]] void fail(std::string message) {
  throw repl_error{position{0, 0}, std::move(message)};
}

/// A cluster error: the library's own message, which names the node,
/// variable or device.
[[noreturn]] void fail(const caf::error& err, const std::string& doing = "") {
  fail(doing.empty() ? describe(err) : doing + ": " + describe(err));
}

/// What an expression evaluates to.
struct value {
  enum class kind { none, number, boolean, text, tensor, node, list, init };
  kind what = kind::none;
  double number = 0;
  bool integral = false;
  /// A whole number's exact value, as in expr (`number` is the nearest
  /// double): what an int32/int64 tensor takes.
  bool exact = false;
  bool negative = false;
  uint64_t magnitude = 0;
  std::string text;
  tensor t;
  output o;
  std::vector<value> items;
  initializer init;
  std::string source; ///< the expression it came from (labels of run's values)
};

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

/// A whole number's exact value, if it has one.
std::optional<wide_int> exact_of(const value& v) {
  if (!v.exact)
    return std::nullopt;
  auto m = static_cast<wide_int>(v.magnitude);
  return v.negative ? -m : m;
}

/// Makes `x` the exact value of `v` when |x| < 2^64 (else `v` has none).
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

/// "500ms", "2s", "1m" (a bare number is refused: 10 could mean either).
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

/// `s` as it may reach a terminal: control bytes (a name typed with an
/// escape sequence, echoed back by the cluster) as \xNN, at most `limit`
/// characters; `keep_lines` keeps newlines and tabs (a message of several
/// lines).
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

/// An error message: at most 2,000 characters.
std::string printable_message(const std::string& s) {
  return escaped(s, 2000, true);
}

/// A name or word quoted in a message: at most 60 characters.
std::string printable(const std::string& s) {
  return escaped(s, 60, false);
}

/// A number as a person writes it ("2.5", "3e+10").
std::string number_text(double x) {
  std::ostringstream o;
  o.precision(10);
  o << x;
  return o.str();
}


/// "/job:ps/task:0" -> (ps, 0); the message names the word and what to write.
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

/// Left-aligned columns.
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

/// A training job started by `train start`, running in the background: one
/// thread per worker task, each with a session of its own.
struct train_job {
  train::train_config cfg;
  std::string file;
  std::mutex m;
  std::condition_variable cv;
  size_t running = 0;
  std::string last_progress;
  double last_loss = -1; ///< the chief's last reported training loss
  std::vector<std::string> failures;
  std::optional<train_outcome> chief;
  std::vector<std::thread> threads;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::shared_ptr<std::atomic<bool>> stop = std::make_shared<std::atomic<bool>>(false);

  ~train_job() {
    stop->store(true); // each worker ends before its next step
    for (auto& t : threads)
      if (t.joinable())
        t.join();
  }
};

} // namespace

/// One task's client: its session, its graph's names.
struct client {
  std::string target; ///< "/job:worker/task:0"
  session s;
  std::map<std::string, value> names;
  /// Constant nodes by (scope, value) hash: `w + 1` typed again, or in a
  /// repeat, reuses its Const instead of growing the graph every time.
  std::multimap<uint64_t, output> constants;
  /// restore's (placeholder, assign) of each variable, made once.
  std::map<std::string, std::pair<output, output>> restore_ops;
};

struct interpreter::state {
  options opts;
  std::unique_ptr<embedded_cluster> embedded;
  std::unique_ptr<system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  cluster_spec spec;
  std::map<std::string, std::unique_ptr<client>> clients;
  client* current = nullptr;
  std::string first_target;
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
  std::optional<run_trace> last_trace;
  bool quit = false;
  std::unique_ptr<train_job> job;
  std::set<std::string> known_variables; ///< seen in graphs and listings (completion)
  std::ostream* out = nullptr;
  int open_scopes = 0; ///< with blocks being run
  static constexpr size_t max_graph_nodes = 200000;

  ~state() {
    job.reset(); // its threads use sessions of the cluster below
    clients.clear();
  }

  // -- sessions --------------------------------------------------------------

  session_options session_opts() const {
    session_options so;
    so.timeout = opts.timeout;
    so.connect_timeout = std::min(opts.timeout, ms{5000});
    so.cancel = cancel;
    return so;
  }

  /// `cancellable`: the REPL's own sessions are (Ctrl-C); a training job's
  /// are not (its workers are stopped through train_options::stop).
  caf::expected<session> make_session(const std::string& job, int32_t task,
                                      bool cancellable = true) {
    auto so = session_opts();
    if (!cancellable)
      so.cancel = nullptr;
    if (embedded)
      return embedded->session_for(job, task, so);
    return session::make(*sys, spec, task_name(job, task), so);
  }

  client& use(const std::string& job, int32_t task) {
    auto name = task_name(job, task);
    auto it = clients.find(name);
    if (it == clients.end()) {
      auto s = make_session(job, task);
      if (!s)
        fail(s.error(), "opening a session on " + name);
      auto c = std::make_unique<client>(client{name, std::move(*s), {}, {}, {}});
      it = clients.emplace(name, std::move(c)).first;
    }
    current = it->second.get();
    return *current;
  }

  session& sess() { return current->s; }

  std::string prompt_text() const {
    if (current->target == first_target)
      return "actorflow> ";
    return "actorflow(" + current->target + ")> ";
  }

  bool cancelled() const { return cancel->load(); }

  /// Sleeps up to `d` in slices; false if Ctrl-C came.
  bool pause(ms d) {
    auto until = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < until) {
      if (cancelled())
        return false;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        ms{20}, until - std::chrono::steady_clock::now()));
    }
    return !cancelled();
  }

  // -- values ----------------------------------------------------------------

  /// A list literal of numbers as a tensor (nested lists: rows), float32
  /// unless `type` says otherwise.
  tensor to_tensor(const value& v, position at, dtype type = dtype::float32) {
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

  /// t[i] = v, refusing what the dtype cannot hold (a cast would be
  /// undefined). An integer tensor takes a whole number's exact value, never
  /// the double nearest to it (2^53 + 1 is not a double).
  static void store(tensor& t, size_t i, const value& v, position at) {
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

  void flatten(const value& v, position at, size_t depth, shape_type& shape,
               std::vector<bool>& rows, std::vector<const value*>& flat) {
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

  bool is_numeric_list(const value& v) const {
    if (v.what != value::kind::list)
      return false;
    for (const auto& i : v.items)
      if (!(i.what == value::kind::number || i.what == value::kind::boolean || is_numeric_list(i)))
        return false;
    return true;
  }

  /// A graph node of the current session for `v`: constants become Const nodes.
  /// The dtype of a graph value when the graph knows it (variables,
  /// constants); float32 otherwise.
  dtype dtype_of(const value& v) {
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

  output to_node(const value& v, position at, dtype literal_type = dtype::float32) {
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

  /// The Const node for `t` under the current scopes, made once.
  output constant_node(tensor t) {
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

  value node_value(output o, const std::string& source) {
    check_graph_size();
    value v;
    v.what = value::kind::node;
    v.o = o;
    v.source = source;
    if (const auto* n = sess().graph_def().variable_node(o))
      known_variables.insert(n->spec.name);
    return v;
  }

  std::string describe_node(output o) {
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

  /// What `print` and an expression statement show; `at` is the
  /// expression's position, for a list literal that turns out ragged.
  std::string show(const value& v, position at) {
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

  // -- expressions -----------------------------------------------------------

  value eval(const expr& e) {
    if (cancelled())
      fail("cancelled");
    value v;
    v.source = e.source;
    switch (e.what) {
      case expr::kind::number:
        v.what = value::kind::number;
        v.number = e.number;
        v.integral = e.integral;
        v.exact = e.exact;
        v.negative = e.negative;
        v.magnitude = e.magnitude;
        return v;
      case expr::kind::boolean:
        v.what = value::kind::boolean;
        v.number = e.number;
        return v;
      case expr::kind::string:
        v.what = value::kind::text;
        v.text = e.text;
        return v;
      case expr::kind::name: {
        auto it = current->names.find(e.text);
        if (it == current->names.end())
          fail(e.at, "'" + printable(e.text) + "' is not defined in the session of " + current->target
                       + nearest_name(e.text)
                       + (clients.size() > 1 ? " (each session has its own names)" : ""));
        v = it->second;
        v.source = e.source;
        return v;
      }
      case expr::kind::list:
        v.what = value::kind::list;
        for (const auto& item : e.items)
          v.items.push_back(eval(*item));
        return v;
      case expr::kind::negate: {
        auto x = eval(*e.items[0]);
        if (x.what == value::kind::number) {
          x.number = -x.number;
          if (auto exact = exact_of(x))
            set_exact(x, -*exact);
          x.source = e.source;
          return x;
        }
        return node_value(sess().neg(to_node(x, e.items[0]->at)), e.source);
      }
      case expr::kind::binary:
        return binary(e);
      case expr::kind::call:
        return call(e.text, e, {});
      case expr::kind::method: {
        auto receiver = eval(*e.items[0]);
        return call(e.text, e, std::optional<value>{receiver});
      }
    }
    fail(e.at, "cannot evaluate this expression");
  }

  std::string nearest_name(const std::string& n) {
    std::vector<std::string> candidates; // the session's names first: they win ties
    for (const auto& [k, v] : current->names)
      candidates.push_back(k);
    for (auto& f : function_names())
      candidates.push_back(std::move(f));
    candidates.push_back("true");
    candidates.push_back("false");
    auto best = closest(n, candidates, 2);
    return best.empty() ? "" : "; did you mean '" + best + "'?";
  }

  value binary(const expr& e) {
    auto a = eval(*e.items[0]);
    auto b = eval(*e.items[1]);
    char op = e.text[0];
    if (a.what == value::kind::number && b.what == value::kind::number && op != '@') {
      value v;
      v.what = value::kind::number;
      v.source = e.source;
      switch (op) {
        case '+': v.number = a.number + b.number; break;
        case '-': v.number = a.number - b.number; break;
        case '*': v.number = a.number * b.number; break;
        case '/': v.number = a.number / b.number; break;
      }
      v.integral = a.integral && b.integral && op != '/';
      auto xa = exact_of(a), xb = exact_of(b);
      wide_int r = 0;
      // |a|, |b| < 2^64: a sum or difference fits; a product may not.
      if (xa && xb && op != '/'
          && !(op == '*' ? __builtin_mul_overflow(*xa, *xb, &r) : false)) {
        if (op == '+')
          r = *xa + *xb;
        else if (op == '-')
          r = *xa - *xb;
        set_exact(v, r);
      }
      return v;
    }
    // A literal takes the other side's dtype when it is known (TF's k / 2
    // with an int32 k): variables and constants know theirs.
    auto x = a.what == value::kind::node ? to_node(a, e.items[0]->at)
                                         : to_node(a, e.items[0]->at, dtype_of(b));
    auto y = b.what == value::kind::node ? to_node(b, e.items[1]->at)
                                         : to_node(b, e.items[1]->at, dtype_of(a));
    switch (op) {
      case '+': return node_value(sess().add(x, y), e.source);
      case '-': return node_value(sess().sub(x, y), e.source);
      case '*': return node_value(sess().mul(x, y), e.source);
      case '/': return node_value(sess().div(x, y), e.source);
      default: return node_value(sess().matmul(x, y), e.source);
    }
  }

  // -- functions -------------------------------------------------------------

  struct args_view {
    std::vector<value> positional;
    std::vector<position> positional_at;
    std::map<std::string, std::pair<value, position>> keyword;
    position at;
    std::string fn;

    const value* get(size_t index, const std::string& key, position* where = nullptr) const {
      if (auto it = keyword.find(key); it != keyword.end()) {
        if (where)
          *where = it->second.second;
        return &it->second.first;
      }
      if (index < positional.size()) {
        if (where)
          *where = positional_at[index];
        return &positional[index];
      }
      return nullptr;
    }
  };

  static const std::vector<std::pair<std::string, std::string>>& builtins() {
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
      {"matmul", "matmul(A, B, transpose_a=false, transpose_b=false); A @ B"},
      {"reduce_sum", "reduce_sum(X, axis=all, keep_dims=false)"},
      {"reduce_mean", "reduce_mean(X, axis=all, keep_dims=false)"},
      {"reduce_max", "reduce_max(X, axis=all, keep_dims=false)"},
      {"device_of", "device_of(VAR): the full device a variable lives on"},
    };
    return table;
  }

  static std::vector<std::string> function_names() {
    std::vector<std::string> out;
    for (const auto& [n, h] : builtins())
      out.push_back(n);
    for (const auto& [n, arity] : kernels::op_list())
      out.push_back(n);
    return out;
  }

  static std::string function_help(const std::string& name) {
    for (const auto& [n, h] : builtins())
      if (n == name)
        return h;
    for (const auto& [n, arity] : kernels::op_list())
      if (n == name)
        return n + "(" + (arity == 1 ? "X" : arity == 2 ? "A, B" : "A, B, C")
               + "): the kernel op " + n + (n == "sum" || n == "mean" || n == "max"
                                              ? " (axis=, keep_dims= as for reduce_sum)"
                                              : "");
    return "";
  }

  value call(const std::string& fn, const expr& e, std::optional<value> receiver) {
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

  void check_arity(const args_view& a, size_t min, size_t max, const std::vector<std::string>& keys) {
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

  std::string text_arg(const args_view& a, size_t i, const std::string& key, const std::string& what) {
    position at = a.at;
    const auto* v = a.get(i, key, &at);
    if (v == nullptr)
      fail(a.at, a.fn + ": " + what + " is missing: " + function_help(a.fn));
    if (v->what != value::kind::text)
      fail(at, a.fn + ": " + what + " must be \"text\", got " + kind_name(v->what));
    return v->text;
  }

  double number_arg(const args_view& a, size_t i, const std::string& key, double fallback) {
    position at = a.at;
    const auto* v = a.get(i, key, &at);
    if (v == nullptr)
      return fallback;
    if (v->what != value::kind::number && v->what != value::kind::boolean)
      fail(at, a.fn + ": " + key + " must be a number, got " + kind_name(v->what));
    return v->number;
  }

  bool bool_arg(const args_view& a, const std::string& key) {
    position at = a.at;
    const auto* v = a.get(size_t(-1), key, &at);
    if (v == nullptr)
      return false;
    if (v->what != value::kind::boolean && v->what != value::kind::number)
      fail(at, a.fn + ": " + key + " must be true or false");
    return v->number != 0;
  }

  shape_type shape_arg(const value& v, position at, const std::string& fn) {
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

  dtype dtype_arg(const args_view& a) {
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

  /// A tensor of `shape` holding the scalar `one`'s element (its dtype's own
  /// bits, not through a double).
  static tensor filled_exact(const tensor& one, const shape_type& shape, position at) {
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

  initializer init_arg(const value& v, position at, shape_type& shape, bool shape_given, dtype type) {
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

  value call_builtin(const std::string& fn, const args_view& a) {
    auto& s = sess();
    if (fn == "variable") {
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
    if (fn == "const" || fn == "constant") {
      check_arity(a, 1, 1, {"value", "dtype"});
      value v;
      v.what = value::kind::tensor;
      v.t = to_tensor(*a.get(0, "value"), a.positional_at.empty() ? a.at : a.positional_at[0],
                      dtype_arg(a));
      return v;
    }
    if (fn == "zeros" || fn == "ones" || fn == "fill") {
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
    if (fn == "uniform" || fn == "normal") {
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
    if (fn == "placeholder") {
      check_arity(a, 0, 1, {"name"});
      std::string name = a.positional.empty() && !a.keyword.count("name")
                           ? "Placeholder"
                           : text_arg(a, 0, "name", "the placeholder's name");
      return node_value(s.placeholder(name), "");
    }
    if (fn == "gradients") {
      check_arity(a, 2, 2, {});
      auto loss = to_node(a.positional[0], a.positional_at[0]);
      std::vector<output> xs;
      const auto& xv = a.positional[1];
      if (xv.what == value::kind::list)
        for (const auto& x : xv.items)
          xs.push_back(to_node(x, a.positional_at[1]));
      else
        xs.push_back(to_node(xv, a.positional_at[1]));
      auto g = s.gradients(loss, xs);
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
    if (fn == "assign" || fn == "assign_add" || fn == "assign_sub") {
      check_arity(a, 2, 2, {});
      auto var = to_node(a.positional[0], a.positional_at[0]);
      if (s.graph_def().variable_node(var) == nullptr)
        fail(a.positional_at[0], fn + ": '" + a.positional[0].source + "' is not a variable");
      auto val = to_node(a.positional[1], a.positional_at[1], dtype_of(a.positional[0]));
      auto o = fn == "assign" ? s.assign(var, val) : fn == "assign_add" ? s.assign_add(var, val)
                                                                        : s.assign_sub(var, val);
      return node_value(o, "");
    }
    if (fn == "matmul") {
      check_arity(a, 2, 2, {"transpose_a", "transpose_b"});
      return node_value(s.matmul(to_node(a.positional[0], a.positional_at[0]),
                                 to_node(a.positional[1], a.positional_at[1]),
                                 bool_arg(a, "transpose_a"), bool_arg(a, "transpose_b")),
                        "");
    }
    if (fn == "device_of") {
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
    std::string op = fn;
    if (fn == "reduce_sum" || fn == "reduce_mean" || fn == "reduce_max")
      op = fn.substr(7);
    for (const auto& [name, arity] : kernels::op_list()) {
      if (name != op)
        continue;
      bool reduction = op == "sum" || op == "mean" || op == "max";
      std::vector<std::string> keys;
      if (reduction)
        keys = {"axis", "keep_dims"};
      check_arity(a, static_cast<size_t>(arity), static_cast<size_t>(arity), keys);
      std::vector<output> in;
      // Literals take the dtype of the first graph value among the inputs.
      dtype literal_type = dtype::float32;
      for (const auto& p : a.positional)
        if (p.what == value::kind::node) {
          literal_type = dtype_of(p);
          break;
        }
      if (op == "softmax_xent" && a.positional.size() == 2 && a.positional[1].what != value::kind::node)
        literal_type = dtype::int32; // its labels
      for (size_t i = 0; i < a.positional.size(); ++i)
        in.push_back(to_node(a.positional[i], a.positional_at[i], literal_type));
      op_attrs attrs;
      if (reduction) {
        position at = a.at;
        if (const auto* axis = a.get(size_t(-1), "axis", &at)) {
          if (axis->what != value::kind::number || !axis->integral || std::fabs(axis->number) > 32)
            fail(at, fn + ": axis is a whole number from -32 to 32 (negative counts from the end)");
          attrs.all_axes = false;
          attrs.axis = static_cast<int32_t>(axis->number);
        }
        attrs.keep_dims = bool_arg(a, "keep_dims");
      }
      return node_value(s.op(op, in, attrs), "");
    }
    fail(a.at, "unknown function or op '" + printable(fn) + "'" + nearest_name(fn)
                 + " (help functions lists them)");
  }

  // -- statements ------------------------------------------------------------

  /// `top`: statements the user typed, not those of a block (--echo prints
  /// only those).
  void run_program(const std::vector<stmt>& program, bool top = false) {
    for (const auto& st : program) {
      if (quit)
        return;
      if (cancelled())
        fail(st.at, "cancelled");
      if (top && opts.echo)
        *out << prompt_text() << st.source << "\n" << std::flush;
      if (top && opts.on_statement)
        opts.on_statement(st.source);
      try {
        statement(st);
      } catch (repl_error& e) {
        if (e.at.column == 0) { // a cluster's error: say which statement (a script's line)
          e.at = st.at;
          e.statement = true;
        }
        throw;
      }
    }
  }

  /// Every evaluation adds ops, as in TF 1.x: a loop that builds ops each
  /// round would grow the graph (and the REPL's memory) without bound. Only
  /// what makes ops is refused at the cap: print, help, reset still work.
  void check_graph_size() {
    if (sess().graph_def().size() >= max_graph_nodes)
      fail("this session's graph has " + std::to_string(sess().graph_def().size())
           + " ops, the most the REPL builds: each evaluation adds ops, so bind an op once "
             "(inc = var.assign_add(1)) and run its name in loops; `reset` starts a fresh graph");
  }

  void statement(const stmt& st) {
    switch (st.what) {
      case stmt::kind::assign: {
        auto v = eval(*st.value);
        if (is_numeric_list(v)) { // checked once, where it was typed
          v.t = to_tensor(v, st.value->at);
          v.what = value::kind::tensor;
          v.items.clear();
        }
        if (st.targets.size() == 1) {
          current->names[st.targets[0]] = v;
          return;
        }
        if (v.what != value::kind::list || v.items.size() != st.targets.size())
          fail(st.value->at, "cannot unpack " + std::string{kind_name(v.what)}
                               + (v.what == value::kind::list ? " of " + std::to_string(v.items.size()) + " items" : "")
                               + " into " + std::to_string(st.targets.size()) + " names");
        for (size_t i = 0; i < st.targets.size(); ++i)
          current->names[st.targets[i]] = v.items[i];
        return;
      }
      case stmt::kind::expr: {
        auto v = eval(*st.value);
        *out << show(v, st.value->at) << "\n";
        return;
      }
      case stmt::kind::with: {
        auto scope = sess().device(st.device.text);
        if (!scope)
          fail(st.device.at, describe(scope.error()));
        ++open_scopes;
        try {
          run_program(st.body);
        } catch (...) {
          --open_scopes;
          throw;
        }
        --open_scopes;
        return;
      }
      case stmt::kind::repeat:
        for (int64_t i = 0; i < st.count; ++i) {
          if (cancelled())
            fail(st.at, "repeat: cancelled after " + std::to_string(i) + " of "
                          + std::to_string(st.count) + " rounds");
          run_program(st.body);
        }
        return;
      case stmt::kind::command:
        command(st);
        return;
    }
  }

  void expect_words(const stmt& st, size_t min, size_t max) {
    if (st.words.size() < min || st.words.size() > max) {
      position at = st.words.size() > max ? st.words[max].at : st.command_at;
      fail(at, st.command + ": usage: " + find_command(st.command)->usage);
    }
  }

  std::vector<output> named_variables(const stmt& st, size_t from) {
    std::vector<output> vars;
    for (size_t i = from; i < st.words.size(); ++i) {
      const auto& w = st.words[i];
      auto it = current->names.find(w.text);
      if (it != current->names.end() && it->second.what == value::kind::node
          && sess().graph_def().variable_node(it->second.o) != nullptr) {
        vars.push_back(it->second.o);
        continue;
      }
      auto o = sess().graph_def().find_variable(w.text);
      if (!o.valid())
        fail(w.at, "'" + w.text + "' is neither a name bound to a variable nor a variable of this "
                   "session's graph");
      vars.push_back(o);
    }
    return vars;
  }

  void command(const stmt& st) {
    const auto& c = st.command;
    if (c == "help")
      return help(st);
    if (c == "quit") {
      expect_words(st, 0, 0);
      quit = true;
      return;
    }
    if (c == "cluster")
      return cluster_cmd(st);
    if (c == "devices")
      return devices_cmd(st);
    if (c == "ping") {
      expect_words(st, 1, 1);
      auto [job, task] = parse_task(st.words[0], spec);
      auto info = sess().ping(job, task);
      if (!info)
        fail(info.error());
      *out << node_line(job, task, *info) << "\n";
      auto transport = sess().data_transport(job, task);
      if (!transport)
        fail(transport.error());
      *out << "  variable ops travel by: " << *transport << "\n";
      return;
    }
    if (c == "shutdown") {
      expect_words(st, 1, 1);
      auto [job, task] = parse_task(st.words[0], spec);
      if (auto err = sess().shutdown(job, task))
        fail(err);
      *out << task_name(job, task) << " is shutting down\n";
      return;
    }
    if (c == "reset") {
      // tf.reset_default_graph(): a fresh session of the same task, with no
      // graph and no names; the cluster's variables stay.
      expect_words(st, 0, 0);
      if (open_scopes > 0)
        fail(st.command_at, "reset: not inside a with block");
      auto d = device_name::parse(current->target);
      auto fresh = make_session(*d->job, *d->task);
      if (!fresh)
        fail(fresh.error(), "reset");
      auto target = current->target;
      auto& slot = clients[target];
      slot = std::make_unique<client>(client{target, std::move(*fresh), {}, {}, {}});
      current = slot.get();
      *out << "the session of " << target << " starts again: no ops, no names (the cluster's "
           << "variables are kept)\n";
      return;
    }
    if (c == "session") {
      expect_words(st, 0, 1);
      if (!st.words.empty()) {
        // A with-scope belongs to the session that opened it: switching
        // inside one would place the other session's ops under no scope.
        if (open_scopes > 0)
          fail(st.command_at, "session: cannot switch sessions inside a with block; close the "
                              "block first");
        auto [job, task] = parse_task(st.words[0], spec);
        use(job, task);
      }
      *out << "session of " << current->target << "\n";
      return;
    }
    if (c == "run")
      return run_cmd(st);
    if (c == "print") {
      for (const auto& e : st.exprs)
        *out << show(eval(*e), e->at) << "\n";
      return;
    }
    if (c == "trace")
      return trace_cmd(st);
    if (c == "vars")
      return vars_cmd(st);
    if (c == "ops") {
      expect_words(st, 0, 0);
      for (const auto& n : sess().graph_def().nodes())
        *out << n.name << "  "
             << (n.kind == node_kind::variable      ? "variable"
                 : n.kind == node_kind::constant    ? "constant"
                 : n.kind == node_kind::placeholder ? "placeholder"
                                                    : n.op)
             << "\n";
      return;
    }
    if (c == "names") {
      expect_words(st, 0, 0);
      for (const auto& [n, v] : current->names)
        *out << n << ": " << (v.what == value::kind::tensor ? "constant " + describe_shape(v.t)
                                                            : show(v, position{0, 0}))
             << "\n";
      return;
    }
    if (c == "init") {
      auto vars = named_variables(st, 0);
      if (vars.empty() && sess().graph_def().variables().empty())
        fail(st.at, "init: this session's graph has no variables (define one with variable(...))");
      if (auto err = sess().initialize(vars))
        fail(err);
      size_t n = vars.empty() ? sess().graph_def().variables().size() : vars.size();
      *out << "initialized " << n << " variable" << (n == 1 ? "" : "s") << "\n";
      return;
    }
    if (c == "uninit") {
      auto vars = named_variables(st, 0);
      auto names = sess().uninitialized(vars);
      if (!names)
        fail(names.error());
      std::string list;
      for (const auto& n : *names)
        list += (list.empty() ? "" : ", ") + n;
      *out << "uninitialized: [" << list << "]\n";
      return;
    }
    if (c == "wait")
      return wait_cmd(st);
    if (c == "sleep") {
      expect_words(st, 1, 1);
      auto d = parse_duration(st.words[0].text);
      if (!d)
        fail(st.words[0].at, "sleep: '" + printable(st.words[0].text)
                               + "' is not a duration: 500ms, 2s, 1m (at most a day)");
      if (!pause(*d))
        fail(st.at, "cancelled");
      return;
    }
    if (c == "save")
      return save_cmd(st);
    if (c == "restore")
      return restore_cmd(st);
    if (c == "train")
      return train_cmd(st);
    fail(st.command_at, "the command " + c + " is not implemented");
  }

  void help(const stmt& st) {
    expect_words(st, 0, 1);
    if (st.words.empty()) {
      std::vector<std::vector<std::string>> rows;
      for (const auto& c : commands())
        rows.push_back({c.usage});
      *out << "commands (help COMMAND says more; help functions lists what expressions can call):\n"
           << table(rows)
           << "statements: NAME = EXPR; with DEVICE { ... }; repeat N { ... }; EXPR shows what it is\n"
           << "expressions: numbers, \"text\", [lists] as tensors, + - * / @, calls, x.assign_add(1)\n";
      return;
    }
    const auto& topic = st.words[0].text;
    if (topic == "functions") {
      for (const auto& [n, h] : builtins())
        *out << h << "\n";
      std::string ops;
      for (const auto& [n, arity] : kernels::op_list())
        ops += (ops.empty() ? "" : ", ") + n;
      *out << "kernel ops (by name, with their inputs): " << ops << "\n";
      return;
    }
    if (const auto* c = find_command(topic)) {
      *out << c->usage << "\n  " << c->help << "\n";
      return;
    }
    auto h = function_help(topic);
    if (!h.empty()) {
      *out << h << "\n";
      return;
    }
    fail(st.words[0].at, "help: no command or function '" + topic + "' (help lists them)");
  }

  std::string node_line(const std::string& job, int32_t task, const node_info& info) {
    std::string devs;
    for (const auto& d : info.devices)
      devs += (devs.empty() ? "" : ", ") + d;
    std::string line = task_name(job, task) + "  pid " + std::to_string(info.pid) + "  devices "
                       + devs + "  data port " + std::to_string(info.data_port);
    for (const auto& e : info.device_errors)
      line += "\n  device not available: " + e;
    return line;
  }

  void cluster_cmd(const stmt& st) {
    expect_words(st, 0, 0);
    std::vector<std::vector<std::string>> rows;
    for (const auto& [job, tasks] : spec.jobs())
      for (size_t t = 0; t < tasks.size(); ++t) {
        auto name = task_name(job, static_cast<int32_t>(t));
        rows.push_back({name == current->target ? "*" : " ", name, tasks[t].to_string()});
      }
    *out << (embedded ? "embedded cluster (in this process)" : "cluster") << ", session of "
         << current->target << " (*):\n" << table(rows);
  }

  void devices_cmd(const stmt& st) {
    expect_words(st, 0, 0);
    bool all_up = true;
    for (const auto& [job, tasks] : spec.jobs())
      for (size_t t = 0; t < tasks.size(); ++t) {
        if (cancelled())
          fail(st.at, "cancelled");
        auto info = sess().ping(job, static_cast<int32_t>(t));
        if (info) {
          *out << node_line(job, static_cast<int32_t>(t), *info) << "\n";
        } else {
          all_up = false;
          *out << task_name(job, static_cast<int32_t>(t)) << "  down: " << describe(info.error())
               << "\n";
        }
      }
    if (!all_up)
      fail("devices: some tasks did not answer (above)");
  }

  void run_cmd(const stmt& st) {
    std::vector<output> fetches;
    std::vector<std::string> labels;
    for (const auto& e : st.exprs) {
      auto v = eval(*e);
      if (v.what == value::kind::list && !is_numeric_list(v)) {
        for (const auto& item : v.items) {
          fetches.push_back(to_node(item, e->at));
          labels.push_back(item.source);
        }
        continue;
      }
      fetches.push_back(to_node(v, e->at));
      labels.push_back(e->source);
    }
    std::vector<std::pair<output, tensor>> feeds;
    for (const auto& [w, e] : st.feeds) {
      auto it = current->names.find(w.text);
      if (it == current->names.end() || it->second.what != value::kind::node
          || sess().graph_def().at(it->second.o).kind != node_kind::placeholder)
        fail(w.at, "feed: '" + w.text + "' is not a name bound to a placeholder (x = placeholder(\"x\"))");
      feeds.emplace_back(it->second.o, to_tensor(eval(*e), e->at));
    }
    run_trace trace;
    auto values = sess().run(fetches, feeds, &trace);
    if (!values) {
      auto why = describe(values.error());
      if (why.find("run()'s feeds") != std::string::npos) // the library speaks C++
        why += " (here: run ... feed NAME=[...])";
      fail(why);
    }
    last_trace = std::move(trace);
    for (size_t i = 0; i < values->size(); ++i) {
      auto text = format_numpy((*values)[i], opts.print);
      if (values->size() > 1)
        *out << labels[i] << " =" << (text.find('\n') == std::string::npos ? " " : "\n") << text
             << "\n";
      else
        *out << text << "\n";
    }
  }

  void trace_cmd(const stmt& st) {
    expect_words(st, 0, 2);
    if (!last_trace)
      fail(st.at, "trace: nothing has run yet in this REPL (run something first)");
    if (st.words.empty()) {
      *out << last_trace->by_device();
      return;
    }
    if (st.words[0].text == "detail" && st.words.size() == 1) {
      *out << last_trace->to_string();
      return;
    }
    if (st.words[0].text != "save" || st.words.size() != 2)
      fail(st.words[0].at, "trace: usage: " + std::string{find_command("trace")->usage});
    const auto& path = st.words[1].text;
    std::ofstream f{path, std::ios::binary | std::ios::trunc};
    if (!f)
      fail(st.words[1].at, "trace save: cannot write '" + path + "' (" + std::strerror(errno)
                             + "): check the directory exists and is writable");
    f << last_trace->to_chrome_json();
    f.close();
    if (!f)
      fail(st.words[1].at, "trace save: writing '" + path + "' failed");
    *out << "wrote " << last_trace->entries.size() << " trace events to " << path
         << " (open in https://ui.perfetto.dev or chrome://tracing)\n";
  }

  void vars_cmd(const stmt& st) {
    expect_words(st, 0, 1);
    std::vector<std::pair<std::string, int32_t>> tasks;
    if (st.words.empty()) {
      for (const auto& [job, addrs] : spec.jobs())
        for (size_t t = 0; t < addrs.size(); ++t)
          tasks.emplace_back(job, static_cast<int32_t>(t));
    } else {
      tasks.push_back(parse_task(st.words[0], spec));
    }
    std::vector<std::vector<std::string>> rows{
      {"name", "shape", "dtype", "initialized", "version", "bytes", "device"}};
    for (const auto& [job, task] : tasks) {
      auto vars = sess().list_variables(job, task);
      if (!vars)
        fail(vars.error());
      auto sorted = *vars;
      std::sort(sorted.begin(), sorted.end(),
                [](const auto& x, const auto& y) { return x.spec.name < y.spec.name; });
      for (const auto& v : sorted) {
        known_variables.insert(v.spec.name);
        size_t elements = 1;
        for (auto d : v.spec.shape)
          elements *= static_cast<size_t>(d);
        rows.push_back({v.spec.name, shape_text(v.spec.shape), to_string(v.spec.type),
                        v.initialized ? "yes" : "no", std::to_string(v.version),
                        std::to_string(elements * dtype_size(v.spec.type)), v.spec.device});
      }
    }
    if (rows.size() == 1) {
      *out << "no variables on " << (st.words.empty() ? "any task" : st.words[0].text) << "\n";
      return;
    }
    *out << table(rows);
  }

  void wait_cmd(const stmt& st) {
    ms total{10000};
    size_t from = 0;
    auto numeric = [](const std::string& w) {
      size_t k = (w[0] == '-' || w[0] == '+') ? 1 : 0;
      return k < w.size() && (std::isdigit(static_cast<unsigned char>(w[k])) || w[k] == '.');
    };
    if (!st.words.empty() && numeric(st.words[0].text)) {
      auto d = parse_duration(st.words[0].text);
      if (!d)
        fail(st.words[0].at, "wait: '" + printable(st.words[0].text)
                               + "' is not a duration: write 500ms, 10s or 1m (at most a day)");
      total = *d;
      from = 1;
    }
    auto vars = named_variables(st, from);
    auto start = std::chrono::steady_clock::now();
    for (;;) {
      auto left = total - std::chrono::duration_cast<ms>(std::chrono::steady_clock::now() - start);
      auto slice = std::clamp(left, ms{1}, ms{50});
      auto err = sess().wait_initialized(slice, vars);
      if (!err) {
        *out << "initialized\n";
        return;
      }
      if (!is(err, af_error::timeout))
        fail(err);
      if (cancelled())
        fail(st.at, "wait: cancelled");
      if (std::chrono::steady_clock::now() - start >= total) {
        // The last slice's error names what it waited for; asking the
        // variables again could block on a node that does not answer.
        // ("... for initialization of 1 variable(s): u (on ...); is the chief ...")
        auto why = describe(err);
        auto names = why;
        if (auto p = why.find("variable(s): "); p != std::string::npos)
          names = why.substr(p + 13, why.find("; is the chief") - p - 13);
        fail("wait: gave up after " + std::to_string(total.count())
             + " ms; still without a value: " + names
             + " (another client's init, or `init` here, gives them one)");
      }
    }
  }

  void save_cmd(const stmt& st) {
    expect_words(st, 1, 1);
    auto vars = sess().graph_def().variables();
    if (vars.empty())
      fail(st.at, "save: this session's graph has no variables");
    auto values = sess().run(vars);
    if (!values)
      fail(values.error(), "save: reading the variables");
    train::checkpoint ck;
    for (size_t i = 0; i < vars.size(); ++i)
      ck.variables.push_back({sess().graph_def().variable_node(vars[i])->spec.name, (*values)[i], {}});
    auto path = train::save(st.words[0].text, ck, 0);
    if (!path)
      fail(st.words[0].at, path.error().what);
    *out << "saved " << vars.size() << " variable" << (vars.size() == 1 ? "" : "s") << " to "
         << *path << "\n";
  }

  void restore_cmd(const stmt& st) {
    expect_words(st, 1, 1);
    const auto& dir = st.words[0].text;
    auto path = train::latest(dir);
    if (!path)
      fail(st.words[0].at, path.error().what);
    if (path->empty())
      fail(st.words[0].at, "restore: '" + dir + "' holds no checkpoint (save DIR writes one)");
    auto ck = train::load(*path);
    if (!ck)
      fail(st.words[0].at, ck.error().what);
    std::vector<output> targets;
    std::vector<std::pair<output, tensor>> feeds;
    std::vector<std::string> missing;
    for (const auto& sv : ck->variables) {
      auto var = sess().graph_def().find_variable(sv.name);
      if (!var.valid()) {
        missing.push_back(sv.name);
        continue;
      }
      const auto& spec_here = sess().graph_def().variable_node(var)->spec;
      if (spec_here.shape != sv.value.shape() || spec_here.type != sv.value.type())
        fail(st.words[0].at, "restore: " + sv.name + " is " + shape_text(spec_here.shape) + " "
                               + to_string(spec_here.type) + " here and "
                               + shape_text(sv.value.shape()) + " " + to_string(sv.value.type())
                               + " in " + *path);
      auto& ops = current->restore_ops[sv.name];
      if (!ops.first.valid()) {
        ops.first = sess().placeholder(sv.name + "/restore_value");
        ops.second = sess().assign(var, ops.first);
      }
      targets.push_back(ops.second);
      feeds.emplace_back(ops.first, sv.value);
    }
    if (!missing.empty()) {
      std::string names;
      for (const auto& n : missing)
        names += (names.empty() ? "" : ", ") + n;
      fail(st.words[0].at, "restore: " + *path + " holds " + names
                             + ", which this session has not defined: define them with "
                               "variable(...) first (nothing was restored)");
    }
    if (auto r = sess().run(targets, feeds); !r)
      fail(r.error(), "restore");
    *out << "restored " << targets.size() << " variable" << (targets.size() == 1 ? "" : "s")
         << " from " << *path << "\n";
  }

  // -- training --------------------------------------------------------------

  void train_cmd(const stmt& st) {
    if (st.words.empty())
      fail(st.command_at, "train: usage: " + std::string{find_command("train")->usage});
    const auto& sub = st.words[0].text;
    if (sub == "start")
      return train_start(st);
    if (sub == "status") {
      expect_words(st, 1, 1);
      return train_status();
    }
    if (sub == "mode") {
      expect_words(st, 2, 2);
      if (!job)
        fail(st.words[0].at, "train mode: no job was started here (train start FILE)");
      // Right after `train start` the aggregators may not exist yet: while
      // the job runs, look again until they do (bounded by the timeout).
      auto until = std::chrono::steady_clock::now() + opts.timeout;
      auto text = job_switch(sess(), job->cfg, st.words[1].text);
      while (!text && is(text.error(), af_error::not_found) && train_running()
             && std::chrono::steady_clock::now() < until && pause(ms{50}))
        text = job_switch(sess(), job->cfg, st.words[1].text);
      if (!text)
        fail(st.words[1].at, describe(text.error()));
      *out << *text;
      return;
    }
    if (sub == "stop") {
      expect_words(st, 1, 1);
      if (!job)
        fail(st.words[0].at, "train stop: no job was started here (train start FILE)");
      job->stop->store(true);
      return train_wait(st, opts.timeout);
    }
    if (sub == "wait") {
      expect_words(st, 1, 2);
      ms total{3600000};
      if (st.words.size() == 2) {
        auto d = parse_duration(st.words[1].text);
        if (!d)
          fail(st.words[1].at, "train wait: '" + st.words[1].text + "' is not a duration (30s, 5m)");
        total = *d;
      }
      return train_wait(st, total);
    }
    fail(st.words[0].at, "train: unknown subcommand '" + sub + "': start, status, mode, wait or stop");
  }

  bool train_running() {
    std::lock_guard<std::mutex> g{job->m};
    return job->running > 0;
  }

  void train_start(const stmt& st) {
    if (st.words.size() < 2)
      fail(st.words[0].at, "train start: usage: train start FILE [KEY=VALUE...]");
    if (job) {
      std::lock_guard<std::mutex> g{job->m};
      if (job->running > 0)
        fail(st.words[0].at, "train start: a job is running (train status; train wait)");
    }
    job.reset();
    auto c = train::load_train_config(st.words[1].text);
    if (!c)
      fail(st.words[1].at, c.error().what);
    std::vector<std::string> sets;
    ms step_delay{0};
    for (size_t i = 2; i < st.words.size(); ++i) {
      // step_delay_ms=N: every worker sleeps N ms per step (a slow job to
      // watch and switch; actorflow-train's --step-delay-ms).
      const auto& w = st.words[i];
      if (w.text.rfind("step_delay_ms=", 0) == 0) {
        auto d = parse_duration(w.text.substr(14) + "ms");
        if (!d || *d > ms{1000})
          fail(w.at, "train start: step_delay_ms takes milliseconds from 0 to 1000");
        step_delay = *d;
        continue;
      }
      sets.push_back(w.text);
    }
    auto cfg = train::apply_overrides(*c, sets);
    if (!cfg)
      fail(st.words.size() > 2 ? st.words[2].at : st.words[1].at, cfg.error().what);
    if (auto why = train::validate(*cfg); !why.empty())
      fail(st.words[1].at, why);
    auto workers = spec.num_tasks("worker");
    if (workers == 0)
      fail(st.words[0].at, "train start: the cluster has no worker job to train on");
    if (cfg->mode != "allreduce" && spec.num_tasks("ps") == 0)
      fail(st.words[0].at, "train start: mode " + cfg->mode + " needs a ps job, and this cluster has none");
    // Each worker task trains through a session of its own (not the REPL's).
    std::vector<session> sessions;
    if (auto why = job_preflight(*cfg); !why.empty())
      fail(st.words[1].at, "train start: " + why);
    for (size_t w = 0; w < workers; ++w) {
      auto s = make_session("worker", static_cast<int32_t>(w), false);
      if (!s)
        fail(s.error(), "train start");
      sessions.push_back(std::move(*s));
    }
    job = std::make_unique<train_job>();
    job->cfg = *cfg;
    job->file = st.words[1].text;
    job->running = workers;
    auto* j = job.get();
    for (size_t w = 0; w < workers; ++w)
      j->threads.emplace_back([j, w, step_delay,
                               s = std::make_shared<session>(std::move(sessions[w]))]() mutable {
        train_options o;
        o.print = false;
        o.step_delay = step_delay;
        o.stop = j->stop;
        o.shutdown_ps = false; // the REPL's cluster outlives the job
        if (w == 0)
          o.on_progress = [j](const worker_progress& p) {
            std::lock_guard<std::mutex> g{j->m};
            j->last_loss = p.loss;
            j->last_progress = "step " + std::to_string(p.step) + ", loss "
                               + std::to_string(p.loss)
                               + (p.accuracy >= 0 ? ", held-out accuracy " + std::to_string(p.accuracy) : "")
                               + ", " + std::to_string(static_cast<int64_t>(p.examples_per_s))
                               + " examples/s";
          };
        auto r = run_worker_task(*s, j->cfg, static_cast<uint32_t>(w), o);
        std::lock_guard<std::mutex> g{j->m};
        if (!r)
          j->failures.push_back("worker " + std::to_string(w) + ": " + describe(r.error()));
        else if (w == 0)
          j->chief = std::move(*r);
        s.reset();
        j->running -= 1;
        j->cv.notify_all();
      });
    *out << "training started in the background: mode " << cfg->mode << ", model " << cfg->model
         << ", data " << cfg->data << ", " << workers << " worker" << (workers == 1 ? "" : "s")
         << " (train status; train mode MODE; train wait)\n";
  }

  std::string train_result_text() {
    std::string text;
    if (job->chief) {
      const auto& r = job->chief->result;
      if (job->chief->start_step > 0)
        text = "train: resumed from the checkpoint at global step "
               + std::to_string(job->chief->start_step) + " in " + job->cfg.checkpoint_dir + "\n";
      text += "train done: global step " + std::to_string(r.global_step) + " in "
             + std::to_string(static_cast<int64_t>(r.seconds * 1000)) + " ms";
      if (job->last_loss >= 0)
        text += ", training loss " + std::to_string(job->last_loss);
      if (r.accuracy >= 0)
        text += ", held-out accuracy " + std::to_string(r.accuracy);
      else if (r.test_loss >= 0)
        text += ", held-out loss " + std::to_string(r.test_loss);
      const auto& stats = job->chief->stats;
      if (stats.switches > 0)
        text += ", mode " + stats.mode + " (after " + std::to_string(stats.switches)
                + " live switch" + (stats.switches == 1 ? "" : "es") + " from " + job->cfg.mode + ")";
      else
        text += ", mode " + job->cfg.mode;
      if (!job->chief->checkpoint.empty())
        text += ", checkpoint " + job->chief->checkpoint;
      text += "\n";
      if (auto why = job_checkpoint_problem(job->cfg, *job->chief); !why.empty())
        text += "train failed: " + why + "\n";
    }
    // A worker that `train stop` ended says so; any other failure is one.
    bool stopped = false;
    for (const auto& f : job->failures) {
      if (job->stop->load() && f.find("its client stopped the job") != std::string::npos) {
        stopped = true;
        continue;
      }
      text += "train failed: " + f + "\n";
    }
    if (stopped)
      text = "train stopped (train stop)"
             + (job->last_progress.empty() ? std::string{} : "; last: " + job->last_progress) + "\n"
             + text;
    return text;
  }

  void train_status() {
    if (!job)
      fail("train status: no job was started here (train start FILE)");
    std::unique_lock<std::mutex> g{job->m};
    auto secs = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now()
                                                                 - job->started).count();
    if (job->running > 0) {
      *out << "training (" << job->file << ", started as " << job->cfg.mode << ") running for " << secs
           << " s, " << job->running << " worker(s) still training"
           << (job->last_progress.empty() ? "" : "; last: " + job->last_progress) << "\n";
      g.unlock();
      if (job->cfg.mode != "allreduce") {
        auto text = job_status_text(sess(), opts.timeout);
        if (!text && is(text.error(), af_error::not_found) && train_running())
          *out << "(the job is starting: its ps aggregators are not up yet)\n";
        else if (!text)
          fail(text.error(), "train status");
        else
          *out << *text;
      }
      return;
    }
    *out << train_result_text();
  }

  void train_wait(const stmt& st, ms total) {
    if (!job)
      fail(st.words[0].at, "train wait: no job was started here (train start FILE)");
    auto until = std::chrono::steady_clock::now() + total;
    std::unique_lock<std::mutex> g{job->m};
    while (job->running > 0) {
      if (cancelled())
        fail(st.at, "train wait: cancelled (the job goes on: train status)");
      if (std::chrono::steady_clock::now() >= until)
        fail(st.at, "train wait: the job is still running after " + std::to_string(total.count())
                      + " ms (" + std::to_string(job->running) + " worker(s) training)");
      job->cv.wait_for(g, ms{20});
    }
    g.unlock();
    for (auto& t : job->threads)
      if (t.joinable())
        t.join();
    auto text = train_result_text();
    *out << text;
    if (text.find("train failed: ") != std::string::npos)
      fail("train: the job failed (above)");
  }
};

// -- interpreter ---------------------------------------------------------------

interpreter::interpreter(std::unique_ptr<state> st) : st_(std::move(st)) {}

interpreter::~interpreter() = default;

namespace {

std::string default_target(const cluster_spec& spec, const std::string& target) {
  if (!target.empty())
    return target;
  if (spec.has_job("worker"))
    return "/job:worker/task:0";
  return "/job:" + spec.jobs().begin()->first + "/task:0";
}

caf::error open_first(interpreter::state& st, const std::string& target) {
  try {
    word w{default_target(st.spec, target), {}};
    auto [job, task] = parse_task(w, st.spec);
    st.use(job, task);
    st.first_target = st.current->target;
  } catch (repl_error& e) {
    return make_error(af_error::invalid_argument, e.message);
  }
  return caf::none;
}

} // namespace

caf::expected<std::unique_ptr<interpreter>>
interpreter::embedded(const std::map<std::string, int>& jobs, const std::string& target,
                      options opts) {
  auto st = std::make_unique<state>();
  st->opts = opts;
  auto node = embedded_cluster::defaults();
  node.cpu_devices = 2; // cpu:0 and cpu:1, for the towers example
  auto ec = embedded_cluster::start(jobs, node);
  if (!ec)
    return std::move(ec.error());
  st->embedded = std::move(*ec);
  st->spec = st->embedded->spec();
  if (auto err = open_first(*st, target))
    return err;
  return std::unique_ptr<interpreter>{new interpreter(std::move(st))};
}

caf::expected<std::unique_ptr<interpreter>>
interpreter::connect(const cluster_config& config, const std::string& target, options opts) {
  auto st = std::make_unique<state>();
  st->opts = opts;
  // The config's heartbeat, so that the nodes do not take an idle REPL for
  // a dead client (and it does not reconnect after every pause).
  node_options client = config.node;
  // A secured cluster's clients show the "client" certificate (actorflow-certs).
  auto sec = security_for(config.security, "client");
  if (!sec)
    return std::move(sec.error());
  st->cfg = std::make_unique<system_config>(client, *sec);
  st->sys = std::make_unique<caf::actor_system>(*st->cfg);
  st->spec = config.cluster;
  if (auto err = open_first(*st, target))
    return err;
  return std::unique_ptr<interpreter>{new interpreter(std::move(st))};
}

bool interpreter::execute(const std::string& text, std::ostream& out, std::ostream& err,
                          size_t first_line) {
  auto& st = *st_;
  st.open_scopes = 0;
  st.out = &out;
  auto parsed = parse(text, first_line);
  if (parsed.error) {
    err << explain(*parsed.error, text) << "\n";
    return false;
  }
  client* before = st.current;
  try {
    st.run_program(parsed.program, true);
    out << std::flush;
    return true;
  } catch (repl_error& e) {
    out << std::flush;
    bool multiline = text.find('\n') != std::string::npos || first_line > 1;
    std::string where;
    if (e.statement && multiline)
      where = " at line " + std::to_string(e.at.line);
    else if (e.at.column > 0 && !e.statement)
      where = multiline ? " at line " + std::to_string(e.at.line) + ", column "
                            + std::to_string(e.at.column)
                        : " at column " + std::to_string(e.at.column);
    err << "error" << where << ": " << printable_message(e.message) << "\n";
  } catch (std::bad_alloc&) {
    out << std::flush;
    err << "error: out of memory in this process while running the statement (a tensor too "
           "large for the REPL: make it a variable, which its node allocates)\n";
  } catch (std::exception& e) {
    out << std::flush;
    err << "error: " << printable_message(e.what()) << "\n";
  }
  if (st.current == nullptr)
    st.current = before;
  return false;
}

bool interpreter::quit_requested() const {
  return st_->quit;
}

void interpreter::interrupt() noexcept {
  st_->cancel->store(true);
}

void interpreter::clear_interrupt() noexcept {
  st_->cancel->store(false);
}

std::string interpreter::prompt() const {
  return st_->prompt_text();
}

std::vector<std::string> interpreter::complete(const std::string& line, const std::string& word) {
  auto& st = *st_;
  std::set<std::string> cands;
  auto first = line.find_first_not_of(" \t");
  bool at_start = first == std::string::npos || line.substr(first) == word;
  if (at_start) {
    for (const auto& c : commands())
      cands.insert(c.name);
    cands.insert("with");
    cands.insert("repeat");
  }
  if (!word.empty() && word[0] == '/') {
    for (const auto& [job, tasks] : st.spec.jobs())
      for (size_t t = 0; t < tasks.size(); ++t) {
        auto n = task_name(job, static_cast<int32_t>(t));
        cands.insert(n);
        cands.insert(n + "/cpu:0");
        cands.insert(n + "/gpu:0");
      }
    cands.insert("/cpu:0");
    cands.insert("/cpu:1");
    cands.insert("/gpu:0");
  } else {
    for (const auto& f : state::function_names())
      cands.insert(f);
    for (const auto& [n, v] : st.current->names)
      cands.insert(n);
    for (const auto& v : st.current->s.graph_def().variables())
      st.known_variables.insert(st.current->s.graph_def().variable_node(v)->spec.name);
    for (const auto& v : st.known_variables)
      cands.insert(v);
    cands.insert("true");
    cands.insert("false");
    // Words that only follow a command.
    std::string head = first == std::string::npos ? "" : line.substr(first, line.find_first_of(" \t", first) - first);
    if (head == "run")
      cands.insert("feed");
    if (head == "train")
      for (const char* kw : {"start", "status", "mode", "wait", "stop", "sync", "async", "ssp", "average"})
        cands.insert(kw);
    if (head == "trace") {
      cands.insert("save");
      cands.insert("detail");
    }
    if (head == "help") {
      cands.insert("functions");
      for (const auto& c : commands())
        cands.insert(c.name);
    }
  }
  std::vector<std::string> out;
  for (const auto& c : cands)
    if (c.compare(0, word.size(), word) == 0)
      out.push_back(c);
  return out;
}

caf::expected<std::map<std::string, int>> parse_jobs(const std::string& text) {
  std::map<std::string, int> jobs;
  std::stringstream in{text};
  std::string part;
  while (std::getline(in, part, ',')) {
    auto eq = part.find('=');
    std::string job = part.substr(0, eq);
    if (eq == std::string::npos || job.empty())
      return make_error(af_error::invalid_config,
                        "--embedded: '" + part + "' is not JOB=COUNT (e.g. ps=1,worker=2)");
    char* end = nullptr;
    long n = std::strtol(part.c_str() + eq + 1, &end, 10);
    if (*end != '\0' || n < 1 || n > 64 || end == part.c_str() + eq + 1)
      return make_error(af_error::invalid_config,
                        "--embedded: the count of '" + job + "' must be from 1 to 64, found '"
                          + part.substr(eq + 1) + "'");
    if (jobs.count(job))
      return make_error(af_error::invalid_config, "--embedded: job '" + job + "' is given twice");
    jobs[job] = static_cast<int>(n);
  }
  if (jobs.empty())
    return make_error(af_error::invalid_config,
                      "--embedded: name at least one job, e.g. ps=1,worker=2");
  return jobs;
}

} // namespace af::repl
