// af.Session: tf.Session(target, graph) over af::session
// (actors/session.hpp). A Python graph is built with no cluster at hand, so
// a session hands the graph's nodes to its af::session the first time a
// run needs them (the closure of its fetches, feeds and requests, as TF
// prunes a run), in creation order (variables are then created on their
// nodes, as session::variable does for the REPL and C++ programs), and
// remembers which node of its own graph each one became. The GIL is released for
// everything that waits on the cluster.
#include "python/bindings.hpp"
#include "python/interrupt.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "actors/session.hpp"
#include "messages/error.hpp"

namespace af::python {

namespace {

/// A timeout given in seconds, as the library's milliseconds: positive and
/// finite (a NaN, a negative or 1e300 became an undefined cast, and a wait
/// that gave up at once "after -9223372036854775808 ms"); at most a year.
std::chrono::milliseconds seconds_arg(const char* what, double seconds) {
  constexpr double most = 365.0 * 24 * 3600;
  if (!std::isfinite(seconds) || seconds <= 0 || seconds > most)
    throw py::value_error(std::string(what) + " is " + py::repr(py::float_(seconds)).cast<std::string>()
                          + " seconds: give a positive number of seconds, at most a year (" +
                          std::to_string(static_cast<int64_t>(most)) + ")");
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000)));
}

class py_session {
public:
  py_session(std::shared_ptr<target_entry> target, graph_ptr g, session s,
             std::shared_ptr<std::atomic<bool>> cancel)
    : target_(std::move(target)), graph_(std::move(g)), s_(std::move(s)),
      task_(s_->target()), cancel_(std::move(cancel)) {}

  ~py_session() {
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release unlocked;
      close_locked();
    } else {
      close_locked();
    }
  }

  const graph_ptr& graph() const { return graph_; }
  /// "/job:J/replica:0/task:T", the task it belongs to.
  const std::string& task() const { return task_; }

  /// Ends the session (its graphs are dropped by the executors); the
  /// cluster it ran on may stop once nothing else holds it.
  void close() {
    interruptible_wait ctrl_c; // a run of another thread may hold the session
    {
      py::gil_scoped_release unlocked;
      auto guard = ctrl_c.lock(mtx_);
      if (guard.owns_lock()) {
        s_.reset();
        target_.reset();
      }
    }
    if (ctrl_c.seen())
      raise_interrupt(caf::none);
  }

  py::object run(py::handle fetches, py::handle feed_dict, py::handle options = py::none(),
                 py::handle run_metadata = py::none());

  /// Waits until the graph's variables (or `vars`) have values, as a
  /// tutorial worker waits for its chief; the GIL is released meanwhile.
  void wait_initialized(py::handle timeout, py::handle vars);

  /// The full device `var` lives on (after the session placed it).
  std::string device_of(const py_tensor& var) {
    if (var.owner != graph_ || graph_->g.variable_node(var.out) == nullptr)
      raise(af_error::invalid_argument, "device_of: '" + var.owner->g.at(var.out).name
                                          + "' is not a variable of this session's graph");
    snapshot();
    caf::error err;
    std::string device;
    interruptible_wait ctrl_c; // placing it may make the variable on its node
    {
      py::gil_scoped_release unlocked;
      auto guard = ctrl_c.lock(mtx_);
      if (guard.owns_lock()) {
        ctrl_c.arm(*cancel_);
        err = s_ ? replay({var.out}) : make_error(af_error::invalid_argument, "this session is closed");
        if (!err)
          device = s_->device_of(mapped(var.out));
        ctrl_c.disarm();
      }
    }
    if (ctrl_c.seen())
      raise_interrupt(err);
    if (err)
      raise(err);
    return device;
  }

  /// For python/bench only (Session._bench_cpp_runs): runs `fetch` `n` times
  /// straight through the af::session, as a C++ program does, and gives
  /// each run's seconds: the baseline of the bench's Python runs, measured
  /// on the same session and cluster in the same process.
  std::vector<double> bench_cpp_runs(const py_tensor& fetch, int n) {
    std::vector<py::object> one{py::cast(fetch)};
    run(py::cast(one), py::none()); // hands what `fetch` needs over, as the first Python run does
    std::vector<double> seconds;
    caf::error err;
    {
      py::gil_scoped_release unlocked;
      std::lock_guard<std::timed_mutex> guard{mtx_};
      std::vector<output> fetches{mapped(fetch.out)};
      for (int i = 0; i < n && !err; ++i) {
        auto start = std::chrono::steady_clock::now();
        auto values = s_->run(fetches);
        seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        if (!values)
          err = std::move(values.error());
      }
    }
    if (err)
      raise(err);
    return seconds;
  }

private:
  /// One thing run() fetches: a node, or a request about variables.
  struct leaf {
    output node;                                     ///< a node of graph_
    const py_variables_op* request = nullptr;        ///< or this
    bool target = false;                             ///< run for its effect (an Operation's)
  };
  /// What a leaf gave.
  struct result {
    tensor value;
    std::vector<std::string> names;                  ///< report_uninitialized_variables
    bool is_names = false;
  };

  void close_locked() {
    std::lock_guard<std::timed_mutex> guard{mtx_};
    s_.reset();
    target_.reset();
  }

  void collect(py::handle f, std::vector<leaf>& leaves) const;
  py::object rebuild(py::handle f, std::vector<result>& results, size_t& next) const;

  /// Queues the graph's nodes that the session has not seen (GIL held: the
  /// graph only grows under the GIL).
  void snapshot() {
    const auto& nodes = graph_->g.nodes();
    std::lock_guard<std::mutex> guard{pending_mtx_};
    for (; seen_ < nodes.size(); ++seen_)
      pending_.emplace(static_cast<int32_t>(seen_), nodes[seen_]);
  }

  /// Hands the queued nodes that `needed` depends on to the session, in
  /// creation order (mtx_ held, GIL released); the others stay queued until
  /// a run needs them, as TF prunes a run to what its fetches need.
  caf::error replay(const std::vector<output>& needed);
  caf::expected<output> replay_one(const graph_node& n);
  output mapped(output o) const { return output{ids_.at(o.id)}; }

  caf::error run_locked(const std::vector<leaf>& leaves,
                        const std::vector<std::pair<output, tensor>>& feeds,
                        std::vector<result>& results, run_trace* trace);

  std::shared_ptr<target_entry> target_;
  graph_ptr graph_;
  /// One thread at a time in the session (af::session's rule); timed, so
  /// that a wait for it takes Ctrl-C (interruptible_wait::lock).
  std::timed_mutex mtx_;
  std::optional<session> s_;
  std::unordered_map<int32_t, int32_t> ids_; ///< graph_'s node id -> the session graph's (mtx_)
  size_t seen_ = 0;          ///< nodes of graph_ queued so far (GIL)
  std::mutex pending_mtx_;
  std::map<int32_t, graph_node> pending_; ///< by graph_'s node id: not handed over yet
  std::string task_;
  std::shared_ptr<std::atomic<bool>> cancel_; ///< the session's session_options::cancel
};

/// py::isinstance<T> for the classes a run checks at every fetch, with the
/// type looked up once (pybind11 looks it up by its C++ type's name each time).
template <class T>
bool is_a(py::handle h) {
  static auto* type = reinterpret_cast<PyTypeObject*>(py::type::of<T>().ptr());
  return PyObject_TypeCheck(h.ptr(), type);
}

/// Python's own bound on a recursion in C (RecursionError, as Python
/// code nesting that deep gets): a fetch of lists nested 200,000 deep
/// overflowed the C stack (SIGSEGV).
class recursion_guard {
public:
  explicit recursion_guard(const char* where) {
    if (Py_EnterRecursiveCall(where) != 0)
      throw py::error_already_set();
  }
  ~recursion_guard() { Py_LeaveRecursiveCall(); }
  recursion_guard(const recursion_guard&) = delete;
  recursion_guard& operator=(const recursion_guard&) = delete;
};

void py_session::collect(py::handle f, std::vector<leaf>& leaves) const {
  recursion_guard guard{" in the structure of Session.run's fetches"};
  if (is_a<py_tensor>(f)) {
    const auto& t = f.cast<const py_tensor&>();
    if (t.owner != graph_)
      raise(af_error::invalid_argument, "fetch '" + t.owner->g.at(t.out).name
                                          + "' is not of this session's graph; build it in the graph "
                                            "given to af.Session (the default graph when none was)");
    leaves.push_back({t.out, nullptr});
  } else if (is_a<py_group>(f)) {
    const auto& g = f.cast<const py_group&>();
    if (g.owner != graph_)
      raise(af_error::invalid_argument, "this Operation is of another graph than the session's");
    for (auto o : g.members)
      leaves.push_back({o, nullptr, true});
  } else if (is_a<py_variables_op>(f)) {
    const auto& r = f.cast<const py_variables_op&>();
    if (r.owner != graph_)
      raise(af_error::invalid_argument, "this initializer is of another graph than the session's");
    leaves.push_back({{}, &r});
  } else if (PyUnicode_Check(f.ptr())) { // TF's "loss:0", or "train" run for its effect
    bool is_tensor = false;
    auto o = node_by_name(*graph_, str_arg(f, "a fetch's name"), &is_tensor);
    leaves.push_back({o, nullptr, !is_tensor});
  } else if (py::isinstance<py::list>(f) || py::isinstance<py::tuple>(f)) {
    for (auto item : f)
      collect(item, leaves);
  } else if (py::isinstance<py::dict>(f)) {
    for (auto item : py::reinterpret_borrow<py::dict>(f))
      collect(item.second, leaves);
  } else {
    throw py::type_error("cannot fetch " + py::repr(f).cast<std::string>().substr(0, 80)
                         + ": fetch af.Tensors, initializers, or lists, tuples and dicts of them");
  }
}

namespace {

/// rebuild() walks the fetches a second time (collect() was the first): a
/// structure that changed meanwhile (a list another thread grew while the
/// run waited with the GIL released, an __iter__ of its own) must not index
/// past the run's values.
std::runtime_error fetches_changed() {
  return std::runtime_error("the fetches changed while Session.run ran (a list or dict of them "
                            "changed by another thread, or an __iter__ that yields other items "
                            "the second time); fetch a structure that stays the same, e.g. a "
                            "tuple");
}

} // namespace

py::object py_session::rebuild(py::handle f, std::vector<result>& results, size_t& next) const {
  recursion_guard guard{" in the structure of Session.run's fetches"};
  auto take = [&](size_t n) {
    if (n > results.size() - next)
      throw fetches_changed();
    next += n;
  };
  if (is_a<py_group>(f)) {
    take(f.cast<const py_group&>().members.size());
    return py::none();
  }
  if (PyUnicode_Check(f.ptr()) && f.cast<std::string>().find(':') == std::string::npos) {
    take(1); // an operation's name: run, nothing fetched (TF gives None)
    return py::none();
  }
  if (is_a<py_tensor>(f) || is_a<py_variables_op>(f) || PyUnicode_Check(f.ptr())) {
    take(1);
    auto& r = results[next - 1];
    if (r.is_names) {
      py::list names;
      for (auto& n : r.names)
        names.append(py::bytes(n)); // TF gives the names as bytes
      return py::module_::import("numpy").attr("array")(names, "object");
    }
    return to_numpy(std::move(r.value));
  }
  if (py::isinstance<py::list>(f)) {
    py::list out;
    for (auto item : f)
      out.append(rebuild(item, results, next));
    return std::move(out);
  }
  if (py::isinstance<py::tuple>(f)) {
    py::list out;
    for (auto item : f)
      out.append(rebuild(item, results, next));
    py::tuple values(out);
    if (Py_TYPE(f.ptr()) != &PyTuple_Type && py::hasattr(f, "_fields")) // a namedtuple, as TF gives it
      return py::type::of(f)(*values);
    return std::move(values);
  }
  // A dict's own type (an OrderedDict, a defaultdict with its factory), as TF's fetch mapper keeps it.
  py::object out;
  if (Py_TYPE(f.ptr()) == &PyDict_Type)
    out = py::dict();
  else if (py::hasattr(f, "default_factory"))
    out = py::type::of(f)(f.attr("default_factory"));
  else
    out = py::type::of(f)();
  for (auto item : py::reinterpret_borrow<py::dict>(f))
    out[item.first] = rebuild(item.second, results, next);
  return out;
}

caf::expected<output> py_session::replay_one(const graph_node& n) {
  auto& b = s_->builder();
  std::vector<output> in;
  for (auto i : n.inputs)
    in.push_back(mapped(output{i}));
  b.set_scopes({n.requested}); // the node's own merged scope, as it was built
  switch (n.kind) {
    case node_kind::variable:
      return s_->variable(n.spec.name, n.spec.shape, n.init, n.spec.type);
    case node_kind::constant:
      return b.constant(n.value, n.name);
    case node_kind::placeholder:
      return b.placeholder(n.name);
    case node_kind::compute:
      return b.op(n.op, in, n.attrs, n.name);
    case node_kind::update:
      if (n.op == "assign" && in.size() == 2)
        return b.assign(in[0], in[1], n.name);
      if (n.op == "assign_add" && in.size() == 2)
        return b.assign_add(in[0], in[1], n.name);
      if (n.op == "assign_sub" && in.size() == 2)
        return b.assign_sub(in[0], in[1], n.name);
      if (n.op == "scatter_add" && in.size() == 3)
        return b.scatter_add(in[0], in[1], in[2], n.name);
      if (n.op == "scatter_sub" && in.size() == 3)
        return b.scatter_sub(in[0], in[1], in[2], n.name);
      if (n.op == "scatter_update" && in.size() == 3)
        return b.scatter_update(in[0], in[1], in[2], n.name);
      break;
  }
  return make_error(af_error::internal, "node '" + n.name + "' of kind " + n.op
                                          + " cannot be handed to the session");
}

caf::error py_session::replay(const std::vector<output>& needed) {
  std::vector<std::pair<int32_t, graph_node>> todo;
  {
    std::lock_guard<std::mutex> guard{pending_mtx_};
    // Inputs are older than their node: one pass down the ids finds what
    // `needed` depends on.
    std::set<int32_t> want;
    for (auto o : needed)
      if (ids_.count(o.id) == 0)
        want.insert(o.id);
    for (auto it = pending_.rbegin(); it != pending_.rend(); ++it)
      if (want.count(it->first) > 0)
        want.insert(it->second.inputs.begin(), it->second.inputs.end());
    for (const auto& [id, n] : pending_)
      if (want.count(id) > 0)
        todo.emplace_back(id, n);
  }
  for (const auto& [id, n] : todo) {
    auto o = replay_one(n);
    s_->builder().set_scopes({});
    if (!o) // the node stays queued: the next run that needs it tries it again
      return std::move(o.error());
    ids_[id] = o->id;
    std::lock_guard<std::mutex> guard{pending_mtx_};
    pending_.erase(id);
  }
  return caf::none;
}

caf::error py_session::run_locked(const std::vector<leaf>& leaves,
                                  const std::vector<std::pair<output, tensor>>& feeds,
                                  std::vector<result>& results, run_trace* trace) {
  if (!s_)
    return make_error(af_error::invalid_argument,
                      "this session is closed; make a new af.Session to run more");
  std::vector<output> needed; // what this run reads: its fetches, requests and feeds
  for (const auto& l : leaves) {
    if (l.request == nullptr)
      needed.push_back(l.node);
    else
      needed.insert(needed.end(), l.request->vars.begin(), l.request->vars.end());
  }
  for (const auto& f : feeds)
    needed.push_back(f.first);
  if (auto err = replay(needed))
    return err;
  std::vector<output> fetches;
  std::vector<std::pair<output, tensor>> mapped_feeds;
  for (const auto& [node, value] : feeds)
    mapped_feeds.emplace_back(mapped(node), value);
  results.resize(leaves.size());
  // Requests about variables first, in their order, then one step for every node fetched.
  for (size_t i = 0; i < leaves.size(); ++i) {
    const auto* r = leaves[i].request;
    if (r == nullptr) {
      fetches.push_back(mapped(leaves[i].node));
      continue;
    }
    std::vector<output> vars;
    for (auto v : r->vars)
      vars.push_back(mapped(v));
    if (vars.empty()) {
      // The library's empty list means every variable of the session; a request made when
      // its graph had none (or variables_initializer([])) is TF's no-op.
      results[i].is_names = r->what == py_variables_op::kind::report_uninitialized;
      continue;
    }
    if (r->what == py_variables_op::kind::initialize) {
      if (auto err = s_->initialize(vars))
        return err;
    } else {
      auto names = s_->uninitialized(vars);
      if (!names)
        return std::move(names.error());
      results[i].names = std::move(*names);
      results[i].is_names = true;
    }
  }
  if (fetches.empty())
    return caf::none;
  bool only_targets = true;
  for (const auto& l : leaves)
    only_targets = only_targets && (l.request != nullptr || l.target);
  if (only_targets) // a train op, fed or not: its updates' values do not travel back
    return s_->run_targets(fetches, mapped_feeds, trace);
  auto values = s_->run(fetches, mapped_feeds, trace);
  if (!values)
    return std::move(values.error());
  size_t k = 0;
  for (size_t i = 0; i < leaves.size(); ++i)
    if (leaves[i].request == nullptr)
      results[i].value = std::move((*values)[k++]);
  return caf::none;
}

namespace {

/// The run_trace Session.run's run_metadata gets, when its options ask for
/// one (TF: run_metadata is filled only under FULL_TRACE). The run traces
/// into a run_trace of its own, handed over with the GIL once it returns:
/// written by the run without the GIL, this one raced Python's reads of it
/// and another session's traced run into the same metadata.
run_trace* trace_of(py::handle options, py::handle run_metadata) {
  if (!options.is_none() && !py::isinstance<py_run_options>(options))
    throw py::type_error("options is an af.RunOptions; got "
                         + py::repr(options).cast<std::string>().substr(0, 80));
  if (!run_metadata.is_none() && !py::isinstance<py_run_metadata>(run_metadata))
    throw py::type_error("run_metadata is an af.RunMetadata; got "
                         + py::repr(run_metadata).cast<std::string>().substr(0, 80));
  if (options.is_none() || !options.cast<const py_run_options&>().trace || run_metadata.is_none())
    return nullptr;
  return &run_metadata.cast<py_run_metadata&>().trace;
}

} // namespace

py::object py_session::run(py::handle fetches, py::handle feed_dict, py::handle options,
                           py::handle run_metadata) {
  auto* md_trace = trace_of(options, run_metadata);
  run_trace own_trace;
  auto* trace = md_trace ? &own_trace : nullptr;
  std::vector<leaf> leaves;
  collect(fetches, leaves);
  std::vector<std::pair<output, tensor>> feeds;
  if (!feed_dict.is_none() && !py::isinstance<py::dict>(feed_dict))
    throw py::type_error("feed_dict is a dict of placeholder: value; got "
                         + py::repr(feed_dict).cast<std::string>().substr(0, 80));
  if (!feed_dict.is_none())
    for (auto item : py::reinterpret_borrow<py::dict>(feed_dict)) {
      py_tensor named;
      if (PyUnicode_Check(item.first.ptr())) { // TF's feed_dict={"x:0": ...}
        bool is_tensor = false;
        auto name = str_arg(item.first, "a feed_dict key");
        named = {graph_, node_by_name(*graph_, name, &is_tensor)};
        if (!is_tensor)
          throw py::type_error("Cannot interpret feed_dict key as Tensor: the name '" + name
                               + "' refers to an Operation, not a Tensor; Tensor names are "
                                 "'<op_name>:0'");
      } else if (!py::isinstance<py_tensor>(item.first)) {
        throw py::type_error("feed_dict's keys are af.placeholder Tensors (or their names, "
                             "'x:0'); got " + py::repr(item.first).cast<std::string>().substr(0, 80));
      }
      const auto& key = PyUnicode_Check(item.first.ptr()) ? named
                                                          : item.first.cast<const py_tensor&>();
      if (key.owner != graph_)
        raise(af_error::invalid_argument, "feed '" + key.owner->g.at(key.out).name
                                            + "' is not of this session's graph");
      auto value = from_python(item.second, dtype_hint(*graph_, key.out));
      check_feed_shape(*graph_, key.out, value);
      feeds.emplace_back(key.out, std::move(value));
    }
  snapshot();
  std::vector<result> results;
  caf::error err;
  interruptible_wait ctrl_c;
  {
    py::gil_scoped_release unlocked;
    auto guard = ctrl_c.lock(mtx_);
    if (guard.owns_lock()) {
      ctrl_c.arm(*cancel_);
      err = run_locked(leaves, feeds, results, trace);
      ctrl_c.disarm();
    }
  }
  if (md_trace && !ctrl_c.seen()) // a traced run replaces what the metadata held, failed or not
    *md_trace = std::move(own_trace);
  if (ctrl_c.seen())
    raise_interrupt(err);
  if (err)
    raise(err);
  size_t next = 0;
  auto out = rebuild(fetches, results, next);
  if (next != results.size()) // it shrank: values the structure no longer has a place for
    throw fetches_changed();
  return out;
}

void py_session::wait_initialized(py::handle timeout, py::handle vars) {
  auto timeout_s = number_arg(timeout, "wait_initialized: timeout");
  std::vector<output> wanted;
  if (!vars.is_none())
    for (auto v : vars) {
      if (!py::isinstance<py_tensor>(v))
        throw py::type_error("wait_initialized: var_list holds variables (af.Variable, "
                             "af.get_variable); got " + py::repr(v).cast<std::string>().substr(0, 80));
      const auto& t = v.cast<const py_tensor&>();
      if (t.owner != graph_ || t.owner->g.variable_node(t.out) == nullptr)
        raise(af_error::invalid_argument, "wait_initialized: '" + t.owner->g.at(t.out).name
                                            + "' is not a variable of this session's graph");
      wanted.push_back(t.out);
    }
  auto wait = seconds_arg("wait_initialized: timeout", timeout_s);
  auto graph_vars = graph_->g.variables();
  snapshot();
  caf::error err;
  interruptible_wait ctrl_c;
  {
    py::gil_scoped_release unlocked;
    auto guard = ctrl_c.lock(mtx_);
    if (guard.owns_lock()) {
      ctrl_c.arm(*cancel_);
      if (!s_)
        err = make_error(af_error::invalid_argument, "this session is closed");
      else
        err = replay(wanted.empty() ? graph_vars : wanted); // none given: the graph's, as before a prune
      std::vector<output> mapped_vars;
      if (!err)
        for (auto v : wanted)
          mapped_vars.push_back(mapped(v));
      if (!err)
        err = s_->wait_initialized(wait, mapped_vars);
      ctrl_c.disarm();
    }
  }
  // Ctrl-C wins over the wait's own end, as in run() (the wait itself ends
  // on it within 20 ms, af_error::cancelled).
  if (ctrl_c.seen())
    raise_interrupt(err);
  if (err)
    raise(err);
}

std::shared_ptr<py_session> make_session(py::handle target_arg, const py::object& g,
                                         const py::object& timeout, const py::object& cluster) {
  auto target = str_arg(target_arg, "Session: target");
  if (!g.is_none() && !py::isinstance<py_graph>(g))
    throw py::type_error("Session: graph is an af.Graph (or None: the default graph); got "
                         + py::repr(g).cast<std::string>().substr(0, 80));
  auto entry = resolve_target(target, cluster);
  auto graph = g.is_none() ? default_graph() : g.cast<graph_ptr>();
  session_options opts;
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  opts.cancel = cancel;
  // A string was pybind11's RuntimeError "Unable to cast Python instance".
  if (!timeout.is_none() && !PyFloat_Check(timeout.ptr()) && !PyLong_Check(timeout.ptr())
      && !PyObject_HasAttrString(timeout.ptr(), "__float__"))
    throw py::type_error("Session: timeout is seconds (a number) or None; got "
                         + py::repr(timeout).cast<std::string>().substr(0, 80));
  if (!timeout.is_none())
    opts.timeout = seconds_arg("Session: timeout", number_arg(timeout, "Session: timeout"));
  caf::expected<session> s{caf::error{}};
  {
    py::gil_scoped_release unlocked;
    s = session::make(*entry->system, *entry->spec,
                      "/job:" + entry->job + "/task:" + std::to_string(entry->task), opts);
  }
  if (!s)
    raise(s.error());
  return std::make_shared<py_session>(std::move(entry), std::move(graph), std::move(*s),
                                      std::move(cancel));
}

} // namespace

void register_session(py::module_& m) {
  py::class_<py_session, std::shared_ptr<py_session>>(m, "Session",
    "A client of one task of a cluster (tf.Session(target, graph)): runs the graph's nodes there.")
    .def(py::init(&make_session), py::arg("target") = "", py::arg("graph") = py::none(),
         py::arg("timeout") = py::none(), py::arg("cluster") = py::none(),
         "target: a Server's .target (\"actorflow://127.0.0.1:PORT\"), or \"\" for a one-task "
         "cluster of this process; graph: the default graph when None; timeout: seconds any one "
         "request may take (10 when None); cluster: the ClusterSpec of nodes that run in other "
         "processes (actorflow-node), `target` the address of one of its tasks: the session is "
         "then a client of its own actor system")
    .def("run", &py_session::run, py::arg("fetches"), py::arg("feed_dict") = py::none(),
         py::arg("options") = py::none(), py::arg("run_metadata") = py::none(),
         "the values of `fetches` (a Tensor, an initializer, or "
         "lists, tuples and dicts of them) in the same structure, as NumPy arrays over the "
         "fetched buffers (no copy); feed_dict maps placeholders to values. With "
         "options=af.RunOptions(trace=True), run_metadata (an af.RunMetadata) gets the step's "
         "trace: where each op ran, and when. The GIL is released while it waits.")
    .def("wait_initialized", &py_session::wait_initialized, py::arg("timeout") = 30.0,
         py::arg("var_list") = py::none(),
         "waits until the graph's variables (or var_list) have values, set by any client (as "
         "a tutorial worker waits for its chief); DeadlineExceededError after `timeout` seconds "
         "names those still missing. The GIL is released while it waits.")
    .def("device_of", &py_session::device_of, py::arg("variable"),
         "the full device a variable lives on, after placement (as log_device_placement shows)")
    .def("close", &py_session::close)
    .def("_bench_cpp_runs", &py_session::bench_cpp_runs, py::arg("fetch"), py::arg("n"),
         "for python/bench: runs `fetch` n times from C++ on this session; each run's seconds")
    .def_property_readonly("graph", &py_session::graph)
    .def_property_readonly("task", &py_session::task, "the task the session belongs to")
    .def("__enter__", [](std::shared_ptr<py_session> s) { return s; })
    .def("__exit__", [](py_session& s, py::args) { s.close(); });
}

} // namespace af::python
