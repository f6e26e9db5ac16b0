// af.train.Job: a training job with actorflow-train's options (a dict, or a
// TOML path with its [train] table), run from Python on a cluster of this
// process, as `actorflow-train` with no --config cluster runs one
// (programs/train_main.cpp's run_embedded; dense or sparse, between-graph
// or in-graph: python/train_job_run.cpp runs it through the same dist/
// calls). Python
// watches it (progress records, a callback), switches its mode
// (dist/train_client.hpp's job_switch, as --switch), stops it, and takes
// its final metrics. A job may be fed from NumPy arrays: they become a data
// set of the process (train/memory_data.hpp), data = "memory:NAME".
#include "python/bindings.hpp"
#include "python/train_job.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>

#include "caf/all.hpp"

#include "dist/embedded_cluster.hpp"
#include "dist/sparse_job.hpp"
#include "dist/train_client.hpp"
#include "dist/training.hpp"
#include "messages/error.hpp"
#include "train/config.hpp"
#include "train/memory_data.hpp"

namespace af::python {

namespace {

using namespace std::chrono_literals;

/// A path (or a string that may become one: metrics, checkpoint_dir) with a
/// NUL byte names another file to the system than to Python: the config
/// 'a.toml\0x' read a.toml. Refused as open() refuses it.
void no_nul(const std::string& what, const py::str& text) {
  if (str_arg(text, "af.train.Job: " + what).find('\0') != std::string::npos)
    throw py::value_error("af.train.Job: " + what + ": embedded null byte");
}

/// A TOML value of a config dict's entry; a type TOML cannot take raises
/// TypeError naming the key.
std::string toml_value(const std::string& key, py::handle v) {
  if (py::isinstance<py::bool_>(v))
    return v.cast<bool>() ? "true" : "false";
  // By value, not by the object's repr: NumPy's scalars (np.int64,
  // np.float32) and int subclasses (IntEnum) are numbers whose repr is no
  // TOML ("<E.B: 2>"). builtins' int() and float() give the exact types
  // (py::int_ keeps a subclass).
  auto numbers = py::module_::import("numbers");
  auto builtins = py::module_::import("builtins");
  if (py::isinstance(v, numbers.attr("Integral"))) {
    auto n = builtins.attr("int")(v);
    // TOML's integers are 64-bit; toml11 reads a longer one as the
    // largest (steps = 10**30 ran as 2**63 - 1), so it stops here.
    if (n < py::int_(std::numeric_limits<int64_t>::min())
        || n > py::int_(std::numeric_limits<int64_t>::max()))
      raise(af_error::invalid_config, "af.train.Job config: " + key + " = "
                                        + py::str(n).cast<std::string>()
                                        + " is out of a 64-bit integer's range");
    return py::repr(n).cast<std::string>();
  }
  if (py::isinstance(v, numbers.attr("Real"))) // inf and nan as TOML writes them
    return py::repr(builtins.attr("float")(v)).cast<std::string>();
  if (py::isinstance<py::str>(v) || py::isinstance(v, py::module_::import("os").attr("PathLike"))) {
    auto text = py::str(v);
    no_nul(key, text);
    // JSON's string escapes are TOML's basic string's.
    return py::module_::import("json").attr("dumps")(text).cast<std::string>();
  }
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::string out = "[";
    for (auto item : v)
      out += (out.size() > 1 ? ", " : "") + toml_value(key, item);
    return out + "]";
  }
  throw py::type_error("af.train.Job config: key '" + key + "' has a value of type "
                       + py::type::handle_of(v).attr("__name__").cast<std::string>()
                       + ", which a training config cannot take: give a number, a string or a "
                         "list of numbers");
}

/// The [train] options of `config`: a dict of actorflow-train's keys, a
/// TOML file's path (its [train] table), or None (the defaults), then
/// `overrides` as --set applies them; checked as actorflow-train checks
/// them. Errors name the key (InvalidArgumentError).
train::train_config config_of(py::handle config, py::handle overrides) {
  train::train_config c;
  if (py::isinstance<py::dict>(config)) {
    std::string text;
    for (auto item : py::reinterpret_borrow<py::dict>(config)) {
      auto key = str_arg(py::str(item.first), "af.train.Job: a config key");
      text += py::module_::import("json").attr("dumps")(key).cast<std::string>() + " = "
              + toml_value(key, item.second) + "\n";
    }
    auto parsed = train::parse_train_config(text, "af.train.Job config");
    if (!parsed)
      raise(parsed.error().code, parsed.error().what);
    c = std::move(*parsed);
  } else if (py::isinstance<py::str>(config)
             || py::isinstance(config, py::module_::import("os").attr("PathLike"))) {
    auto text = py::str(py::module_::import("os").attr("fspath")(config));
    no_nul("config path", text);
    auto path = str_arg(text, "af.train.Job: config path");
    auto loaded = train::load_train_config(path);
    if (!loaded)
      raise(loaded.error().code, loaded.error().what);
    c = std::move(*loaded);
  } else if (!config.is_none()) {
    throw py::type_error("af.train.Job: config is a dict of actorflow-train's [train] keys or "
                         "a TOML file's path, not "
                         + py::type::handle_of(config).attr("__name__").cast<std::string>());
  }
  if (!overrides.is_none() && !py::isinstance<py::dict>(overrides))
    // A list or a string would iterate as an empty dict: ignored in silence.
    throw py::type_error("af.train.Job: overrides is a dict of key: value (as --set KEY=VALUE), "
                         "not " + py::type::handle_of(overrides).attr("__name__").cast<std::string>());
  if (!overrides.is_none()) {
    std::vector<std::string> sets;
    for (auto item : py::reinterpret_borrow<py::dict>(overrides)) {
      auto key = str_arg(py::str(item.first), "af.train.Job: a config key");
      // --set takes a string as written, and lists as 64,64.
      if (py::isinstance<py::str>(item.second))
        no_nul(key, py::reinterpret_borrow<py::str>(item.second));
      auto value = py::isinstance<py::str>(item.second) ? item.second.cast<std::string>()
                                                        : toml_value(key, item.second);
      sets.push_back(key + "=" + value);
    }
    auto with = train::apply_overrides(c, sets);
    if (!with)
      raise(with.error().code, with.error().what);
    c = std::move(*with);
  }
  return c;
}

/// NumPy arrays as a data set of the process: x [examples, features]
/// (converted to float32 if it is not), y [examples]: integer class labels
/// (classification) or floats (regression targets). One copy each, into
/// the set; load_data takes it from there (train/memory_data.hpp).
std::shared_ptr<train::dataset> dataset_of(py::handle data) {
  if (!py::isinstance<py::tuple>(data) || py::len(data) != 2)
    throw py::type_error("af.train.Job: data is a tuple (x, y) of NumPy arrays: x [examples, "
                         "features], y [examples] (integer labels, or float targets)");
  auto pair = py::reinterpret_borrow<py::tuple>(data);
  auto x = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(pair[0]);
  auto y = py::array::ensure(pair[1]);
  if (!x || x.ndim() != 2 || x.shape(0) == 0 || x.shape(1) == 0)
    raise(af_error::invalid_argument, "af.train.Job data: x must be a non-empty 2-D float array "
                                      "[examples, features]");
  auto n = static_cast<size_t>(x.shape(0));
  if (!y || y.ndim() != 1 || static_cast<size_t>(y.shape(0)) != n)
    raise(af_error::invalid_argument, "af.train.Job data: y must be 1-D with one entry per row of "
                                      "x (" + std::to_string(n) + ")");
  auto set = std::make_shared<train::dataset>();
  set->name = "NumPy arrays";
  set->features = static_cast<size_t>(x.shape(1));
  set->x.assign(x.data(), x.data() + x.size());
  auto kind = y.dtype().kind();
  if (kind == 'i' || kind == 'u') {
    auto labels = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(y);
    set->y.resize(n);
    int64_t top = -1;
    for (size_t i = 0; i < n; ++i) {
      auto l = labels.data()[i];
      if (l < 0 || l >= train::default_max_classes)
        raise(af_error::invalid_argument, "af.train.Job data: y[" + std::to_string(i) + "] = "
                                            + std::to_string(l) + " is no class label (0 to "
                                            + std::to_string(train::default_max_classes - 1) + ")");
      set->y[i] = static_cast<int32_t>(l);
      top = std::max(top, l);
    }
    set->classes = static_cast<uint32_t>(top + 1);
  } else if (kind == 'f') {
    auto targets = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(y);
    set->targets.assign(targets.data(), targets.data() + n);
  } else {
    throw py::type_error("af.train.Job data: y has dtype " + py::str(y.dtype()).cast<std::string>()
                         + ": give integer class labels or float regression targets");
  }
  return set;
}

py::object maybe(double v) {
  return v < 0 ? py::none() : py::object(py::float_(v));
}

py::list worker_rows(const aggregator_stats& st) {
  py::list rows;
  for (const auto& w : st.workers) {
    py::dict d;
    d["worker"] = w.worker;
    d["task"] = w.task;
    d["status"] = w.status;
    d["pushes"] = w.pushes;
    d["applied"] = w.applied;
    d["late"] = w.late;
    d["refused"] = w.refused;
    d["stale"] = w.stale;
    d["max_staleness"] = w.max_staleness;
    d["skipped"] = w.skipped;
    d["waited_ms"] = w.waited_ms;
    d["examples_per_s"] = w.examples_per_s;
    d["idle_s"] = maybe(w.idle_s);
    d["error"] = w.error;
    rows.append(d);
  }
  return rows;
}

/// af.train.Progress: one of the chief's reports (every log_every steps,
/// and a final one), as the progress line and the metrics CSV give it.
struct py_progress {
  worker_progress p;
  uint32_t workers = 0;
};

/// af.train.Job's Python side.
struct py_job {
  std::shared_ptr<job_run> run;
  py::object callback;
  std::optional<worker_progress> last; ///< the last record taken
  bool began = false;                  ///< start() was called

  ~py_job() {
    if (run && !began && !run->memory_name.empty())
      train::drop_memory_dataset(run->memory_name); // the runner drops it otherwise
    if (run && began) {
      py::gil_scoped_release unlocked;
      stop_and_join(*run);
    }
  }

  bool started() const { return began; }

  bool run_finished() {
    std::lock_guard<std::mutex> guard{run->mutex};
    return run->finished;
  }

  void start() {
    if (started())
      raise(af_error::already_exists, "this af.train.Job was started already; make a new one "
                                      "to train again");
    began = true;
    auto j = run;
    j->runner = std::thread([j] { run_job(*j); });
    remember_started(j);
  }

  /// Waits (the GIL released, in slices of 50 ms so that Ctrl-C is seen)
  /// until `ready()` (under the job's mutex) or `timeout` seconds (< 0 or
  /// inf: no bound). Ctrl-C stops the job and raises KeyboardInterrupt.
  template <class Ready>
  bool wait(Ready ready, double timeout) {
    // Over a year (inf, 1e300) is no bound: converted to the clock's
    // integer ticks it overflowed, and the wait ended at once.
    bool bounded = timeout >= 0 && timeout < 365 * 86400.0;
    auto deadline = std::chrono::steady_clock::now()
                    + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(bounded ? timeout : 0));
    for (;;) {
      // First: a job whose records keep coming never waits here.
      if (PyErr_CheckSignals() != 0) {
        run->stop->store(true); // the job ends; the exception goes up
        throw py::error_already_set();
      }
      {
        py::gil_scoped_release unlocked;
        std::unique_lock<std::mutex> lock{run->mutex};
        if (run->changed.wait_for(lock, 50ms, ready))
          return true;
      }
      if (bounded && std::chrono::steady_clock::now() >= deadline)
        return false;
    }
  }

  /// `timeout` as given to next() and result(): NaN bounds nothing.
  static void check_timeout(const char* what, double timeout) {
    if (std::isnan(timeout))
      throw py::value_error(std::string{"af.train.Job."} + what + ": timeout is NaN: give "
                            "seconds, or a negative number (or inf) for no bound");
  }

  void require_started(const char* what) {
    if (!started())
      raise(af_error::uninitialized,
            std::string{"af.train.Job."} + what + ": the job was not started: call start()");
  }

  /// The next record (None once the job has ended and every record was
  /// taken), handed to the callback first.
  py::object next_record(double timeout) {
    require_started("next");
    check_timeout("next", timeout);
    if (!wait([this] { return !run->records.empty() || run->finished; }, timeout))
      raise(af_error::timeout, "af.train.Job: no progress report within " + std::to_string(timeout)
                                 + " s");
    worker_progress p;
    {
      std::lock_guard<std::mutex> guard{run->mutex};
      if (run->records.empty())
        return py::none();
      p = std::move(run->records.front());
      run->records.pop_front();
    }
    last = p;
    auto record = py::cast(py_progress{p, static_cast<uint32_t>(run->workers)});
    if (!callback.is_none()) {
      try {
        callback(record);
      } catch (py::error_already_set&) {
        // As Ctrl-C does: the exception ends the wait that called it, and
        // the job, which would otherwise train on unwatched in its threads.
        run->stop->store(true);
        throw;
      }
    }
    return record;
  }

  py::object iter_next() {
    auto r = next_record(-1);
    if (r.is_none())
      throw py::stop_iteration();
    return r;
  }

  py::dict result(double timeout);
  py::dict stopped_result();
  py::dict sparse_result();

  /// A client of the running job's cluster (switch, status): `use` gets a
  /// session of its own on it, in a thread of its own; this thread waits
  /// in slices of 50 ms, the GIL released, so that Ctrl-C raises
  /// KeyboardInterrupt at once and the job runs on, usable.
  std::string with_client(const char* what, client_use use) {
    require_started(what);
    auto call = start_client_call(run, std::move(use));
    for (;;) {
      if (PyErr_CheckSignals() != 0) { // the call ends on its own; its answer is dropped
        std::lock_guard<std::mutex> guard{call->mutex};
        call->cancelled = true;
        throw py::error_already_set();
      }
      py::gil_scoped_release unlocked;
      std::unique_lock<std::mutex> lock{call->mutex};
      if (call->answered.wait_for(lock, 50ms, [&] { return call->done; }))
        break;
    }
    std::lock_guard<std::mutex> guard{call->mutex}; // done: no one writes it any more
    if (call->no_cluster)
      raise(af_error::uninitialized, std::string{"af.train.Job."} + what
                                       + ": the job is not running (it has not begun yet, "
                                         "or it ended)");
    if (!call->text)
      raise(call->text.error());
    return *call->text;
  }

  /// The test hook of job_run::hold_clients.
  void hold_clients(bool hold) {
    std::lock_guard<std::mutex> guard{run->mutex};
    run->hold_clients = hold;
    run->changed.notify_all();
  }

  std::string switch_mode(const std::string& mode) {
    if (run->in_graph)
      raise(af_error::unsupported, "af.train.Job.switch: an in-graph job's one client averages "
                                   "its replicas in the graph and pushes in sync rounds; it "
                                   "cannot switch modes");
    if (run->c.mode == "allreduce")
      raise(af_error::unsupported, "af.train.Job.switch: an allreduce job has no ps, so no "
                                   "aggregators to switch; run sync, async, ssp or average to "
                                   "switch live");
    if (auto err = check_switch_mode(mode, sparse_job(run->c))) // a sparse job: not average
      raise(err);
    auto c = run->c; // copies: an interrupted call outlives this frame
    return with_client("switch", [c, mode](caf::expected<session>& s) {
      return s ? job_switch(*s, c, mode) : caf::expected<std::string>{s.error()};
    });
  }

  std::string status() {
    if (run->c.mode == "allreduce")
      raise(af_error::unsupported, "af.train.Job.status: an allreduce job has no ps aggregators "
                                   "to report");
    // The aggregators' names: dist/sparse_job.hpp's, dist/in_graph.cpp's, the worker's.
    std::string prefix = run->sparse ? sparse_aggregator_prefix
                                     : run->in_graph ? "train/in-graph/ps" : "train/ps";
    return with_client("status", [prefix](caf::expected<session>& s) {
      return s ? job_status_text(*s, 10s, prefix) : caf::expected<std::string>{s.error()};
    });
  }
};

py::dict py_job::stopped_result() {
  py::dict d;
  d["stopped"] = true;
  d["mode"] = last && !last->stats.mode.empty() ? last->stats.mode : run->c.mode;
  d["global_step"] = last ? last->global_step : 0;
  d["step"] = last ? last->step : 0;
  d["loss"] = last ? py::object(py::float_(last->loss)) : py::none();
  d["accuracy"] = last ? maybe(last->accuracy) : py::none();
  d["workers"] = last ? worker_rows(last->stats) : py::list();
  return d;
}

/// A sparse job's final metrics: what actorflow-train's closing lines say
/// (programs/train_sparse.cpp's print_sparse_summary), as numbers.
py::dict py_job::sparse_result() {
  const auto& chief = run->sparse_results.front();
  if (!chief) {
    const auto& err = chief.error();
    std::string who = run->in_graph ? "the in-graph client: " : "worker 0 (the chief): ";
    if (err.category() == error_category)
      raise(static_cast<af_error>(err.code()), who + describe(err));
    raise(err);
  }
  for (size_t w = 1; w < run->sparse_results.size(); ++w)
    if (!run->sparse_results[w])
      raise(run->sparse_results[w].error());
  const auto& o = *chief;
  py::dict d;
  d["stopped"] = run->stop->load(); // it ended well, short of its steps
  d["in_graph"] = run->in_graph;
  d["sparse"] = true;
  d["mode"] = run->c.mode;
  d["workers_count"] = static_cast<uint32_t>(run->workers);
  d["global_step"] = o.global_step;
  d["local_steps"] = o.local_steps;
  d["seconds"] = o.seconds;
  d["steps_per_s"] = o.seconds > 0 ? static_cast<double>(o.local_steps) / o.seconds : 0.0;
  d["loss"] = o.last_loss;
  d["auc"] = o.auc;
  d["log_loss"] = o.log_loss;
  d["truth_auc"] = o.has_truth ? py::object(py::float_(o.truth_auc)) : py::none();
  d["truth_log_loss"] = o.has_truth ? py::object(py::float_(o.truth_log_loss)) : py::none();
  d["bytes_per_step"] = o.bytes_per_step;
  d["touched_bytes_per_step"] = o.touched_bytes_per_step;
  d["train_examples"] = o.train_examples;
  d["test_examples"] = o.test_examples;
  d["late"] = o.late;
  return d;
}

/// The final metrics: what actorflow-train's summary line says, as numbers.
py::dict py_job::result(double timeout) {
  require_started("result");
  check_timeout("result", timeout);
  // One bound for the whole wait: records that keep coming do not extend it.
  auto since = std::chrono::steady_clock::now();
  for (;;) { // every record to the callback, then the end
    double left = timeout;
    if (timeout >= 0)
      left = std::max(0.0, timeout - std::chrono::duration<double>(
                                       std::chrono::steady_clock::now() - since).count());
    if (!wait([this] { return !run->records.empty() || run->finished; }, left)
        || (timeout >= 0 && left <= 0 && !run_finished()))
      raise(af_error::timeout, "af.train.Job.result: the job did not end within "
                                 + std::to_string(timeout) + " s");
    if (next_record(0).is_none())
      break;
  }
  if (run->start_error)
    raise(run->start_error);
  if (run->sparse)
    return sparse_result();
  const auto& chief = run->results.front();
  if (!chief) {
    if (run->stop->load())
      return stopped_result();
    const auto& err = chief.error();
    if (err.category() == error_category)
      raise(static_cast<af_error>(err.code()), "worker 0 (the chief): " + describe(err));
    raise(err);
  }
  const auto& o = *chief;
  const auto& r = o.result;
  auto workers = static_cast<uint32_t>(run->workers);
  uint64_t steps = r.global_step > o.start_step ? r.global_step - o.start_step : 0;
  double sps = r.seconds > 0 ? static_cast<double>(steps) / r.seconds : 0;
  double per_step = static_cast<double>(run->c.batch_size) * (run->c.mode == "async" ? 1 : workers);
  py::dict d;
  // An in-graph client stopped ends well, short of its steps.
  d["stopped"] = run->in_graph && run->stop->load();
  d["in_graph"] = run->in_graph;
  d["mode"] = o.stats.mode.empty() ? run->c.mode : o.stats.mode;
  d["switches"] = o.stats.switches;
  d["workers_count"] = workers;
  d["global_step"] = r.global_step;
  d["start_step"] = o.start_step;
  d["local_steps"] = r.local_steps;
  d["seconds"] = r.seconds;
  d["steps_per_s"] = sps;
  d["examples_per_s"] = sps * per_step;
  d["loss"] = r.has_loss ? py::object(py::float_(r.loss)) : py::none();
  d["accuracy"] = maybe(r.accuracy);
  d["test_loss"] = maybe(r.test_loss);
  d["checkpoint"] = o.checkpoint;
  d["workers"] = worker_rows(o.stats);
  return d;
}

std::shared_ptr<py_job> make_job(py::handle config, py::handle workers_arg, py::handle ps_arg,
                                 py::handle data, py::object callback, bool verbose,
                                 py::handle overrides, bool in_graph) {
  // 2.5 or "2" was pybind11's "incompatible constructor arguments".
  constexpr int64_t int32_most = std::numeric_limits<int32_t>::max();
  auto workers = static_cast<int>(int_arg(workers_arg, "af.train.Job: workers", -int32_most, int32_most));
  auto ps = static_cast<int>(int_arg(ps_arg, "af.train.Job: ps", -int32_most, int32_most));
  // Else the job ran until its first record, then stopped with
  // "'int' object is not callable".
  if (!callback.is_none() && !PyCallable_Check(callback.ptr()))
    throw py::type_error("af.train.Job: callback is a function of one af.train.Progress (or "
                         "None); got " + py::repr(callback).cast<std::string>().substr(0, 80));
  auto j = std::make_shared<job_run>();
  j->c = config_of(config, overrides);
  // Every task is a node of this process (its own actor system and
  // threads): workers=10**6 would try to start a million of them.
  constexpr int most_tasks = 64;
  if (workers < 1 || ps < 1 || workers > most_tasks || ps > most_tasks)
    raise(af_error::invalid_argument,
          "af.train.Job: workers and ps must be from 1 to " + std::to_string(most_tasks)
            + " (workers=" + std::to_string(workers) + ", ps=" + std::to_string(ps)
            + "): each task is a node in this process; for more, run actorflow-train "
              "--config F --job J --task T per task");
  j->workers = workers;
  j->ps = ps;
  j->verbose = verbose;
  j->in_graph = in_graph;
  j->sparse = sparse_job(j->c);
  if (in_graph && !j->sparse && j->c.window_secs > 0) // as actorflow-train --in-graph says
    raise(af_error::invalid_config, "af.train.Job: window_secs with in_graph: a timed window "
                                    "measures a between-graph job's workers; drop in_graph, or "
                                    "window_secs (and warmup_secs)");
  if (in_graph && !j->sparse && j->c.mode != "sync")
    raise(af_error::invalid_config, "af.train.Job: in_graph averages the replicas in the graph: "
                                    "mode must be sync, not '" + j->c.mode + "'");
  if (!data.is_none()) {
    static std::atomic<uint64_t> next{0};
    j->memory_name = "python-" + std::to_string(++next);
    train::put_memory_dataset(j->memory_name, dataset_of(data));
    j->c.data = train::memory_data_prefix + j->memory_name;
  }
  auto bad = train::validate(j->c);
  if (bad.empty())
    bad = train::check_workers(j->c, static_cast<uint32_t>(workers));
  if (bad.empty())
    bad = job_preflight(j->c);
  if (!bad.empty()) {
    if (!j->memory_name.empty())
      train::drop_memory_dataset(j->memory_name);
    raise(af_error::invalid_config, "af.train.Job: training config: " + bad);
  }
  auto job = std::make_shared<py_job>();
  job->run = std::move(j);
  job->callback = std::move(callback);
  return job;
}

void register_progress(py::module_& train) {
  py::class_<py_progress>(train, "Progress",
    "One of the chief's progress reports (the progress line's and metrics CSV's figures).")
    .def_property_readonly("step", [](const py_progress& r) { return r.p.step; },
                           "what counts toward the job's steps (the global step; average, "
                           "allreduce: every replica's local steps)")
    .def_property_readonly("global_step", [](const py_progress& r) { return r.p.global_step; })
    .def_property_readonly("local_step", [](const py_progress& r) { return r.p.local_step; })
    .def_property_readonly("loss", [](const py_progress& r) { return r.p.loss; },
                           "mean training loss since the last report")
    .def_property_readonly("accuracy", [](const py_progress& r) { return maybe(r.p.accuracy); },
                           "held-out accuracy when evaluated at this report, else None")
    .def_property_readonly("test_loss", [](const py_progress& r) { return maybe(r.p.test_loss); })
    .def_property_readonly("examples_per_s", [](const py_progress& r) {
      return r.p.examples_per_s * r.workers; }, "the job's, as the metrics CSV's column")
    .def_property_readonly("seconds", [](const py_progress& r) { return r.p.seconds; })
    .def_property_readonly("final", [](const py_progress& r) { return r.p.final; })
    .def_property_readonly("mode", [](const py_progress& r) { return r.p.stats.mode; })
    .def_property_readonly("workers", [](const py_progress& r) { return worker_rows(r.p.stats); },
                           "per-worker rows of ps 0's aggregator: pushes, applied, late, refused, "
                           "stale, examples_per_s, ... (as --status)")
    .def("__repr__", [](const py_progress& r) {
      return "<af.train.Progress step=" + std::to_string(r.p.step) + " loss="
             + std::to_string(r.p.loss) + ">";
    });
}

} // namespace

void register_train_job(py::module_& m) {
  auto train = m.attr("train").cast<py::module_>();
  register_progress(train);
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    py::gil_scoped_release unlocked;
    stop_every_job();
  }));
  py::class_<py_job, std::shared_ptr<py_job>>(train, "Job",
    "A training job with actorflow-train's options, its tasks in this process (docs/python.md, "
    "\"Training from Python\").")
    .def(py::init(&make_job), py::arg("config") = py::none(), py::kw_only(),
         py::arg("workers") = 2, py::arg("ps") = 1, py::arg("data") = py::none(),
         py::arg("callback") = py::none(), py::arg("verbose") = false,
         py::arg("overrides") = py::none(), py::arg("in_graph") = false,
         "config: a dict of actorflow-train's [train] keys, or a TOML file's path; overrides: "
         "a dict applied after it as --set; data: (x, y) NumPy arrays to train on; callback: "
         "called with every Progress, in the thread that waits (result(), iteration); "
         "verbose: the chief's progress lines on stdout; in_graph: one client drives a replica per "
         "worker (actorflow-train --in-graph). A sparse model (model = \"recommender\") runs "
         "as actorflow-train runs it")
    .def("start", [](py_job& j) -> py_job& { j.start(); return j; },
         py::return_value_policy::reference_internal, "starts the job in the background")
    .def("__iter__", [](py_job& j) -> py_job& { return j; }, py::return_value_policy::reference_internal)
    .def("__next__", &py_job::iter_next)
    .def("next", [](py_job& j, py::handle timeout) {
      return j.next_record(number_arg(timeout, "af.train.Job.next: timeout"));
    }, py::arg("timeout") = -1.0,
         "the next Progress, or None once the job ended and every record was taken")
    .def("switch", &py_job::switch_mode, py::arg("mode"),
         "switches the running job to sync, async, ssp or average (actorflow-train --switch)")
    .def("status", &py_job::status, "what actorflow-train --status prints, of the running job")
    .def("_hold_clients", &py_job::hold_clients, py::arg("hold"),
         "test hook: switch and status calls wait before asking the cluster while held")
    .def("stop", [](py_job& j) { j.run->stop->store(true); },
         "asks the workers to stop before their next step; result() then says stopped")
    .def("result", [](py_job& j, py::handle timeout) {
      return j.result(number_arg(timeout, "af.train.Job.result: timeout"));
    }, py::arg("timeout") = -1.0,
         "waits for the end (the GIL released; Ctrl-C stops the job) and gives the final metrics")
    .def_property_readonly("config", [](const py_job& j) { return train::to_toml(j.run->c); },
                           "the job's [train] config as TOML")
    .def_property_readonly("running", [](py_job& j) {
      std::lock_guard<std::mutex> guard{j.run->mutex};
      return j.started() && !j.run->finished;
    })
    .def("__enter__", [](py_job& j) -> py_job& {
      if (!j.started())
        j.start();
      return j;
    }, py::return_value_policy::reference_internal)
    .def("__exit__", [](py_job& j, py::args) {
      if (!j.started())
        return;
      py::gil_scoped_release unlocked;
      stop_and_join(*j.run);
    });
  train.def("run", [](py::handle config, py::handle workers, py::handle ps, py::handle data,
                      py::object callback, bool verbose, py::handle overrides, bool in_graph) {
    auto job = make_job(config, workers, ps, data, std::move(callback), verbose, overrides, in_graph);
    job->start();
    return job->result(-1);
  }, py::arg("config") = py::none(), py::kw_only(), py::arg("workers") = 2, py::arg("ps") = 1,
     py::arg("data") = py::none(), py::arg("callback") = py::none(), py::arg("verbose") = false,
     py::arg("overrides") = py::none(), py::arg("in_graph") = false,
     "Job(...).start().result(): trains and gives the final metrics");
  train.def("load_digits", [] {
    auto d = train::load_digits();
    if (!d)
      raise(d.error().code, d.error().what);
    auto set = std::make_shared<train::dataset>(std::move(*d));
    auto n = static_cast<py::ssize_t>(set->size());
    auto f = static_cast<py::ssize_t>(set->features);
    auto owner = py::capsule(new std::shared_ptr<train::dataset>(set), [](void* p) {
      delete static_cast<std::shared_ptr<train::dataset>*>(p);
    });
    py::array_t<float> x({n, f}, set->x.data(), owner);
    py::array_t<int32_t> y({n}, set->y.data(), owner);
    return py::make_tuple(x, y);
  }, "the bundled UCI digits (data/digits.csv.gz): x [1797, 64] float32 in [0, 1], y [1797] int32");
}

} // namespace af::python
