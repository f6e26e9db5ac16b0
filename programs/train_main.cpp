// actorflow-train: data-parallel training on an actorflow cluster
// (docs/training.md).
//
//   actorflow-train                                   # embedded: 1 ps + 2 workers, digits MLP
//   actorflow-train --config config/train.toml --job ps --task 0
//   actorflow-train --config config/train.toml --job worker --task 0   # the chief
//   actorflow-train --config config/train.toml --job worker --task 1
//   actorflow-train --set mode=async --set steps=500   # any [train] key
//   actorflow-train --logdir /tmp/tb                  # TensorBoard event files: tensorboard --logdir /tmp/tb
//   actorflow-train --config F --job worker --task 2 --join   # a worker joins a running job
//   actorflow-train --config F --switch async                # a running job changes mode
//   actorflow-train --config F --status                      # per-worker accounting of a live job
//   actorflow-train --config config/embeddings.toml          # the sparse recommender, embedded cluster
//   actorflow-train --config config/embeddings.toml --local  # ... in one process
//   actorflow-train --config config/embeddings.toml --in-graph  # ... in-graph, a replica per worker
//
// Between-graph: each process hosts its node and, for a worker, its worker
// actor; the chief initializes or restores, saves at the end and stops the ps
// tasks, so every process exits by itself. Exit codes: 0 done, 1 training
// failed, 2 bad config or arguments.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/base_sink.h>

#include "caf/all.hpp"

#include "dist/embedded_cluster.hpp"
#include "core/log.hpp"
#include "actors/node.hpp"
#include "dist/aggregator.hpp"
#include "actors/system.hpp"
#include "dist/train_client.hpp"
#include "dist/sparse_in_graph.hpp"
#include "dist/training.hpp"
#include "config/cluster_spec.hpp"
#include "messages/error.hpp"
#include "metrics/node_metrics.hpp"
#include "train/checkpoint.hpp"
#include "train/config.hpp"
#include "train/metrics.hpp"
#include "programs/last_resort.hpp"
#include "programs/teardown_deadline.hpp"
#include "programs/train_sparse.hpp"

namespace {

/// The reasons of the error lines the logger printed. A component that fails
/// (the worker actor) logs its reason and returns the same sentence; main
/// prints a failure only if no such line has said it, so each failure is
/// printed once. Attached right after af::log::init, before any other thread.
class printed_errors : public spdlog::sinks::base_sink<std::mutex> {
public:
  /// Whether an error line printed so far is part of `text`.
  bool said(const std::string& text) {
    std::lock_guard<std::mutex> guard{mutex_};
    for (const auto& line : lines_)
      if (!line.empty() && text.find(line) != std::string::npos)
        return true;
    return false;
  }

protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level >= spdlog::level::err && lines_.size() < 1000)
      lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {
    // nop
  }

private:
  std::vector<std::string> lines_;
};

std::shared_ptr<printed_errors>& errors_printed() {
  static auto instance = std::make_shared<printed_errors>();
  return instance;
}

/// af::log::init(who), remembering its error lines.
void init_log(const std::string& who) {
  af::log::init(who);
  af::log::get()->sinks().push_back(errors_printed());
}

/// Says why the program stops, unless a component's error line said it
/// already, and returns `code` (2: config or arguments, 1: training failed).
int fail(const std::string& msg, int code = 2) {
  if (!errors_printed()->said(msg)) {
    std::fprintf(stderr, "actorflow-train: %s\n", msg.c_str());
    std::fflush(stderr);
  }
  return code;
}

/// A start that failed for want of memory is a failure to run (1), like the
/// last resort's; any other is the config's (2).
int start_status(const caf::error& err) {
  return af::is(err, af::af_error::resource_exhausted) ? 1 : 2;
}

double examples_per_step(const af::train::train_config& c, uint32_t workers) {
  // async: one global step is one worker's batch; the others: every worker's.
  return static_cast<double>(c.batch_size) * (c.mode == "async" ? 1 : workers);
}

void summary(const af::train::train_config& c, uint32_t workers, const af::train_outcome& o,
             size_t test_examples) {
  const auto& r = o.result;
  uint64_t steps = r.global_step > o.start_step ? r.global_step - o.start_step : 0;
  double sps = r.seconds > 0 ? static_cast<double>(steps) / r.seconds : 0;
  // A timed run (window_secs): the figures of its window alone.
  bool timed = c.window_secs > 0;
  if (timed)
    sps = o.window_seconds > 0 ? static_cast<double>(o.window_steps) / o.window_seconds : 0;
  std::printf("train done: mode=%s workers=%u global_step=%llu seconds=%.3f steps_per_s=%.2f "
              "examples_per_s=%.1f",
              c.mode.c_str(), workers, static_cast<unsigned long long>(r.global_step),
              timed ? o.window_seconds : r.seconds, sps, sps * examples_per_step(c, workers));
  if (timed) {
    // measured; not_measured: it ran to its end, but the workers or the
    // mode changed during it; cut_short: the job ended first.
    const char* window = o.window_seconds > 0                 ? "measured"
                         : !o.window_not_measured.empty() ? "not_measured"
                                                          : "cut_short";
    std::printf(" window_steps=%llu window=%s", static_cast<unsigned long long>(o.window_steps),
                window);
    // No progress report (log_every = 0, or none before the stop): no loss to give.
    if (r.has_loss)
      std::printf(" loss=%.6g", r.loss);
    else
      std::printf(" loss=n/a");
  }
  std::printf("\n");
  if (timed && !o.window_not_measured.empty())
    std::printf("window: not measured: during the warm-up or the window: %s\n",
                o.window_not_measured.c_str());
  if (!o.stats.mode.empty() && o.stats.mode != c.mode)
    std::printf("mode: the job ended in %s after %llu live switch(es) (the config says %s)\n",
                o.stats.mode.c_str(), static_cast<unsigned long long>(o.stats.switches),
                c.mode.c_str());
  uint64_t skipped = 0; // steps workers did not send, told that they had closed
  for (const auto& w : o.stats.workers)
    skipped += w.skipped;
  if (!o.stats.mode.empty() && (o.stats.refused > 0 || o.stats.dropped_stale > 0 || skipped > 0))
    std::printf("aggregator: %llu refused (non-finite), %llu stale gradients dropped, %llu "
                "steps skipped by workers told they had closed\n",
                static_cast<unsigned long long>(o.stats.refused),
                static_cast<unsigned long long>(o.stats.dropped_stale),
                static_cast<unsigned long long>(skipped));
  if (!o.checkpoint.empty())
    std::printf("checkpoint: %s\n", o.checkpoint.c_str());
  if (!o.plot.empty())
    std::printf("%s\n", o.plot.c_str());
  if (r.accuracy >= 0)
    std::printf("held-out accuracy: %.4f (%zu examples)\n", r.accuracy, test_examples);
  else if (timed && r.test_loss < 0 && r.has_loss)
    std::printf("training loss (the last progress report's): %.6g\n", r.loss);
  else if (timed && r.test_loss < 0)
    std::printf("training loss: n/a (no progress report before the window ended: log_every = "
                "%llu)\n",
                static_cast<unsigned long long>(c.log_every));
  else
    std::printf("held-out loss: %.6f (%zu examples)\n", r.test_loss, test_examples);
  std::fflush(stdout);
}

/// The line --status and --switch print for an error of
/// dist/train_client.hpp: the sentence it carries, which names the ps;
/// when no ps holds an aggregator, the not_found as the node worded it.
std::string client_error_line(const caf::error& err) {
  const auto& ctx = err.context();
  if (err.category() == af::error_category && !af::is(err, af::af_error::not_found)
      && ctx.size() == 1 && ctx.match_element<std::string>(0))
    return ctx.get_as<std::string>(0);
  return af::describe(err);
}

/// How long a task may take to stop once its work is done (programs/teardown_deadline.hpp).
constexpr std::chrono::milliseconds teardown_limit{8000};

/// --status, or --switch `switch_to`: a session of its own on the running
/// job's cluster asks its ps tasks' aggregators (dist/train_client.hpp).
int run_client(const af::cluster_config& cluster, const af::train::train_config& c, bool status,
               const std::string& switch_to) {
  // A mode no running job can take is an argument error, said without a cluster.
  if (!status)
    if (auto err = af::check_switch_mode(switch_to, af::sparse_job(c)))
      return fail(client_error_line(err));
  auto sec = af::security_for(cluster.security, "client");
  if (!sec)
    return fail(af::describe(sec.error()));
  // Outlives the system: its stop (the session's connections, the actor
  // system's) is bounded as a task's is, so that a client whose answer is
  // printed never hangs its caller (a script, a test's wait) in teardown.
  af::teardown_deadline bound;
  auto finish = [&](int rc) {
    bound.start("actorflow-train client", rc, teardown_limit);
    return rc;
  };
  af::system_config sys_cfg{cluster.node, *sec};
  auto sys_owner = af::start_actor_system(sys_cfg);
  caf::actor_system& sys = *sys_owner;
  af::session_options so;
  so.timeout = std::chrono::milliseconds{std::min<uint32_t>(c.step_timeout_ms, 10000)};
  so.connect_timeout = so.timeout;
  // The target only sets where unplaced ops would go; this client places none.
  auto s = af::session::make(sys, cluster.cluster, "/job:ps/task:0", so);
  if (!s)
    return finish(fail(af::describe(s.error()), 1));
  // A sparse job's aggregators have names of their own (dist/sparse_job.hpp).
  size_t unanswered = 0;
  auto text = status ? af::job_status_text(*s, std::chrono::milliseconds{c.step_timeout_ms},
                                           af::sparse_job(c) ? af::sparse_aggregator_prefix
                                                             : "train/ps",
                                           &unanswered)
                     : af::job_switch(*s, c, switch_to);
  if (!text)
    // A config without a ps job is the config's fault (2); the rest, the job's.
    return finish(fail(client_error_line(text.error()),
                       af::is(text.error(), af::af_error::invalid_config) ? 2 : 1));
  std::printf("%s", text->c_str());
  std::fflush(stdout);
  return finish(unanswered > 0 ? 1 : 0); // printed what the others said; one did not answer
}

size_t test_size(const af::train::train_config& c) {
  auto d = af::train::load_data(c);
  return d ? d->test.size() : 0;
}

int run_embedded(af::train::train_config c) {
  af::teardown_deadline bound; // outlives the cluster: it bounds its end
  bool allreduce = c.mode == "allreduce";
  std::map<std::string, int> jobs{{"worker", 2}};
  if (!allreduce)
    jobs["ps"] = 1;
  auto opts = af::embedded_cluster::defaults();
  auto cluster = af::embedded_cluster::start(jobs, opts);
  if (!cluster)
    return fail(af::describe(cluster.error()), start_status(cluster.error()));
  std::printf("actorflow-train: embedded cluster (%s2 workers), mode %s, model %s, data %s\n",
              allreduce ? "" : "1 ps + ", c.mode.c_str(), c.model.c_str(), c.data.c_str());
  std::fflush(stdout);
  std::vector<caf::expected<af::train_outcome>> results(2, af::make_error(af::af_error::internal, "not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w)
    threads.emplace_back([&, w] {
      auto s = (*cluster)->session_for("worker", w);
      if (!s) {
        results[w] = std::move(s.error());
        return;
      }
      af::train_options o;
      o.shutdown_ps = false; // the embedded cluster stops its nodes itself
      results[w] = af::run_worker_task(*s, c, static_cast<uint32_t>(w), o);
      if (w == 0 && !results[w] && !allreduce) {
        // Say why now, and stop the ps: the other worker would otherwise
        // wait init_timeout_ms for a chief that is gone (a restore that does
        // not fit, a model too large to allocate) before anything is said.
        fail("worker 0: " + af::describe(results[w].error()), 1);
        if (auto err = s->shutdown("ps", 0))
          af::log::get()->warn("chief: stopping /job:ps/task:0: {}", af::describe(err));
      }
    });
  for (auto& t : threads)
    t.join();
  auto finish = [&](int rc) {
    bound.start("actorflow-train", rc, teardown_limit);
    return rc;
  };
  for (int w = 0; w < 2; ++w)
    if (!results[w])
      return finish(w == 0 && !allreduce ? 1 // said when it happened
                                         : fail("worker " + std::to_string(w) + ": "
                                                  + af::describe(results[w].error()),
                                                1));
  summary(c, 2, *results[0], test_size(c));
  if (auto why = af::job_checkpoint_problem(c, *results[0]); !why.empty())
    return finish(fail(why, 1));
  return finish(0);
}

/// The dense in-graph job's checks before any node starts: its metrics and
/// logdir, as a between-graph chief's (job_preflight); not its checkpoint
/// settings, which it does not use yet (run_in_graph warns).
std::string in_graph_preflight(af::train::train_config c) {
  c.checkpoint_dir.clear();
  c.checkpoint_key.clear();
  return af::job_preflight(c);
}

int run_in_graph_embedded(af::train::train_config c) {
  if (c.window_secs > 0) // the chief's window counts between-graph workers' pushes
    return fail("window_secs with --in-graph: a timed window measures a between-graph job's "
                "workers; drop --in-graph, or window_secs (and warmup_secs)");
  if (auto bad = af::train::check_workers(c, 2); !bad.empty()) // a replica on each of 2 workers
    return fail("training config: " + bad);
  auto cluster = af::embedded_cluster::start({{"ps", 1}, {"worker", 2}});
  if (!cluster)
    return fail(af::describe(cluster.error()), start_status(cluster.error()));
  std::printf("actorflow-train: embedded cluster (1 ps + 2 workers), in-graph: one client, a "
              "replica on each worker\n");
  std::fflush(stdout);
  auto s = (*cluster)->session_for("worker", 0);
  if (!s)
    return fail(af::describe(s.error()), 1);
  af::train_options o;
  o.shutdown_ps = false;
  auto out = af::run_in_graph(*s, c, o);
  if (!out)
    return fail("in-graph client: " + af::describe(out.error()), 1);
  summary(c, 2, *out, test_size(c));
  return 0;
}

/// The command line of actorflow-train.
struct train_args {
  std::string config_path, job;
  int task = -1;
  std::vector<std::string> sets;
  bool in_graph = false, join = false, status = false, local = false;
  std::string switch_to;
  int step_delay_ms = 0;
  std::string logdir;    ///< --logdir: as --set logdir=DIR (after the --set ones)
  int metrics_port = -1; ///< --metrics-port: overrides [node] metrics_port
};

void add_options(CLI::App& app, train_args& a) {
  app.add_option("-c,--config", a.config_path,
                 "TOML file with the cluster and a [train] table (none: an embedded cluster)");
  app.add_option("-j,--job", a.job, "this process's job: ps or worker");
  app.add_option("-t,--task", a.task, "this process's task index")->check(CLI::Range(0, 65535));
  app.add_option("--set", a.sets, "override a [train] key: --set mode=async (repeatable)");
  app.add_option("--logdir", a.logdir,
                 "write TensorBoard event files under this folder (as --set logdir=DIR): "
                 "tensorboard --logdir DIR");
  app.add_flag("--local", a.local,
               "model recommender: train in this one process (no cluster, no ps)");
  app.add_flag("--in-graph", a.in_graph,
               "in-graph replication: this one client drives a replica on every worker");
  app.add_flag("--join", a.join,
               "this worker (--job worker --task I, I a task of the config) joins a running job");
  app.add_option("--switch", a.switch_to,
                 "tell the running job of --config to go on in this mode: sync, async, ssp or average");
  app.add_flag("--status", a.status,
               "print the running job's per-worker accounting (from its ps tasks) and exit");
  app.add_option("--step-delay-ms", a.step_delay_ms,
                 "start each of this worker's steps this much later: a straggler for tests and "
                 "benches")
    ->check(CLI::Range(0, 600000));
  app.add_option("--metrics-port", a.metrics_port,
                 "with --job/--task: serve /metrics (Prometheus) and /healthz of this task's node "
                 "on this port (as [node] metrics_port; 0 = none)")
    ->check(CLI::Range(0, 65535));
}

/// The [train] config and the cluster of --config (none: embedded), with the
/// --set overrides, checked; an exit code if they are not good.
std::optional<int> load_configs(const train_args& a, af::train::train_config& c,
                                std::optional<af::cluster_config>& cluster) {
  if (!a.config_path.empty()) {
    auto tc = af::train::load_train_config(a.config_path);
    if (!tc)
      return fail(tc.error().what);
    c = std::move(*tc);
    auto cc = af::load_cluster_config(a.config_path);
    if (!cc)
      return fail(af::describe(cc.error()));
    cluster = std::move(*cc);
  }
  auto sets = a.sets;
  if (!a.logdir.empty())
    sets.push_back("logdir=" + a.logdir);
  auto with_sets = af::train::apply_overrides(c, sets);
  if (!with_sets)
    return fail(with_sets.error().what);
  c = std::move(*with_sets);
  if (auto bad = af::train::validate(c); !bad.empty())
    return fail("training config: " + bad);
  if (cluster && cluster->cluster.num_tasks("worker") > 0)
    if (auto bad = af::train::check_workers(
          c, static_cast<uint32_t>(cluster->cluster.num_tasks("worker")));
        !bad.empty())
      return fail("training config: " + bad);
  return std::nullopt;
}

/// --in-graph with --config: this process is the one client of the job.
int run_in_graph_client(const af::cluster_config& cluster, const af::train::train_config& c) {
  af::tune_malloc_for_tensors();
  auto sec = af::security_for(cluster.security, "client");
  if (!sec)
    return fail(af::describe(sec.error()));
  af::system_config sys_cfg{cluster.node, *sec};
  auto sys_owner = af::start_actor_system(sys_cfg);
  caf::actor_system& sys = *sys_owner;
  auto s = af::session::make(sys, cluster.cluster, "/job:worker/task:0");
  if (!s)
    return fail(af::describe(s.error()), 1);
  std::chrono::milliseconds wait{c.init_timeout_ms};
  for (const auto& [name, tasks] : cluster.cluster.jobs())
    for (size_t t = 0; t < tasks.size(); ++t)
      if (auto err = s->wait_for_node(name, static_cast<int32_t>(t), wait))
        return fail(af::describe(err), 1);
  af::train_options o;
  auto out = af::run_in_graph(*s, c, o);
  if (!out)
    return fail("in-graph client: " + af::describe(out.error()), 1);
  summary(c, static_cast<uint32_t>(cluster.cluster.num_tasks("worker")), *out, test_size(c));
  return 0;
}

/// A ps task: serves until the chief stops it at the end of the job. A chief
/// that dies (kill -9) cannot: the ps watches it and gives up once it has not
/// answered for init_timeout_ms, so no ps is left behind.
int serve_ps(caf::actor_system& sys, const af::node_actor& node, const af::cluster_config& cluster,
             const std::string& name, const af::train::train_config& c,
             af::teardown_deadline& bound) {
  int rc = 0;
  caf::scoped_actor self{sys, true};
  self->monitor(node);
  af::session_options so;
  so.timeout = std::chrono::milliseconds{2000};
  so.connect_timeout = std::chrono::milliseconds{2000};
  auto watch = af::session::make(sys, cluster.cluster, name, so);
  std::chrono::milliseconds patience{c.init_timeout_ms};
  auto last_seen = std::chrono::steady_clock::now();
  bool stopped = false;
  while (!stopped) {
    auto began = std::chrono::steady_clock::now();
    self->receive([&](caf::down_msg&) { stopped = true; },
                  caf::after(std::chrono::seconds(1)) >> [] {});
    if (stopped || !watch)
      break;
    auto waited = std::chrono::steady_clock::now();
    bool answered = static_cast<bool>(watch->ping("worker", 0));
    auto now = std::chrono::steady_clock::now();
    // A wait far longer than its 1 s, or a ping far longer than its own
    // bound (a connect and a request of 2 s each), is this process that did
    // not run (SIGSTOP, then SIGCONT; or starved): no silence of the chief.
    // Without this, a ps stopped past init_timeout_ms gave up on the chief
    // at its first ping after SIGCONT, which its broken CAF link fails, and
    // left the job it was taken back into. (Each part is timed alone, with
    // a margin: pings that fail at their bound never pass for a stop.)
    if (waited - began > std::chrono::seconds(3) || now - waited > std::chrono::seconds(7))
      last_seen = now;
    if (answered)
      last_seen = now;
    else if (now - last_seen > patience) {
      rc = fail(name + ": the chief /job:worker/task:0 has not answered for "
                  + std::to_string(patience.count())
                  + " ms (init_timeout_ms); it died or never started, so nobody will end this "
                    "job: stopping",
                1);
      break;
    }
  }
  // From here on, this process only stops (the watch session first).
  bound.start(name, rc, teardown_limit);
  if (stopped)
    std::printf("actorflow-train %s: the chief ended the job; exiting\n", name.c_str());
  return rc;
}

/// A worker task whose training failed: says why and, for a chief that
/// started the job, stops the ps tasks.
int worker_failed(af::session& s, const af::cluster_config& cluster, const std::string& name,
                  int task, const af::train::train_config& c, const af::train_options& topts,
                  const caf::error& error) {
  // A job this chief started cannot go on without it: stop the ps
  // tasks too, so that no process of the job is left waiting. A job
  // that ran before this chief came (it died and was restarted, or
  // this is a second chief started by mistake) goes on: its ps are
  // not this chief's to stop, nor are ps it did not get to look at.
  auto found = task == 0 && c.mode != "allreduce" ? topts.found->load()
                                                  : af::ps_found::new_job;
  std::string left;
  if (found == af::ps_found::running)
    left = fmt::format("; the job was running before this chief started: its ps tasks "
                       "are left as they are, and wait init_timeout_ms ({} ms) for a "
                       "chief: fix the above and start the chief again before then to "
                       "take the job",
                       c.init_timeout_ms);
  else if (found == af::ps_found::unknown)
    left = "; the ps tasks are left as they are (this chief failed before it saw "
           "whether they run the job; they stop once no chief has answered for "
           "init_timeout_ms)";
  int rc = fail(name + ": " + af::describe(error) + left, 1);
  if (task == 0 && found == af::ps_found::new_job)
    for (size_t k = 0; k < cluster.cluster.num_tasks("ps"); ++k)
      if (auto err = s.shutdown("ps", static_cast<int32_t>(k)))
        af::log::get()->warn("stopping /job:ps/task:{}: {}", k, af::describe(err));
  return rc;
}

/// A worker task: waits for the ps tasks (and the chief), trains, and says
/// how it ended.
int run_worker(caf::actor_system& sys, const af::cluster_config& cluster, const std::string& name,
               const train_args& a, const af::train::train_config& c,
               af::teardown_deadline& bound) {
  // Bounds what follows the decided status, this function's session first.
  auto finish = [&](int rc) {
    bound.start(name, rc, teardown_limit);
    return rc;
  };
  af::session_options opts;
  // A ps that restarts is the job's to restore (the chief's ps recovery):
  // the session's reconnect line must not ask the user to.
  if (c.ps_recovery_timeout_ms > 0)
    opts.lost_hint = "the chief restores them from the latest checkpoint (ps recovery, within "
                     "ps_recovery_timeout_ms)";
  auto s = af::session::make(sys, cluster.cluster, name, opts);
  if (!s)
    return fail(af::describe(s.error()), 1);
  caf::error err;
  std::chrono::milliseconds wait{c.init_timeout_ms};
  for (size_t k = 0; k < cluster.cluster.num_tasks("ps") && !err && c.mode != "allreduce"; ++k)
    err = s->wait_for_node("ps", static_cast<int32_t>(k), wait);
  if (!err && a.task != 0)
    err = s->wait_for_node("worker", 0, wait);
  if (err)
    return fail(af::describe(err), 1);
  if (af::sparse_job(c)) {
    af::sparse_job_options so;
    so.join = a.join;
    so.step_delay = std::chrono::milliseconds{a.step_delay_ms};
    auto out = a.in_graph ? af::run_sparse_in_graph(*s, c, so)
                          : af::run_sparse_worker_task(*s, c, static_cast<uint32_t>(a.task), so);
    if (!out) {
      int rc = fail(name + ": " + af::describe(out.error()), 1);
      // The chief's failure ends the job: the ps tasks would otherwise wait
      // init_timeout_ms for a chief that is gone, and then say so wrongly.
      if (a.task == 0)
        for (size_t k = 0; k < cluster.cluster.num_tasks("ps"); ++k)
          if (auto err = s->shutdown("ps", static_cast<int32_t>(k)))
            af::log::get()->warn("stopping /job:ps/task:{}: {}", k, af::describe(err));
      return finish(rc);
    }
    if (a.task == 0)
      af::programs::print_sparse_summary(c, out->workers, *out); // those that finished
    else
      std::printf("actorflow-train %s: done after %llu local steps\n", name.c_str(),
                  static_cast<unsigned long long>(out->local_steps));
    return finish(0);
  }
  af::train_options topts;
  topts.join = a.join;
  topts.step_delay = std::chrono::milliseconds{a.step_delay_ms};
  topts.found = std::make_shared<std::atomic<af::ps_found>>(af::ps_found::unknown);
  auto out = af::run_worker_task(*s, c, static_cast<uint32_t>(a.task), topts);
  if (!out)
    return finish(worker_failed(*s, cluster, name, a.task, c, topts, out.error()));
  if (a.task == 0) {
    summary(c, static_cast<uint32_t>(cluster.cluster.num_tasks("worker")), *out, test_size(c));
    if (auto why = af::job_checkpoint_problem(c, *out); !why.empty())
      return finish(fail(name + ": " + why, 1));
  } else {
    std::printf("actorflow-train %s: done after %llu local steps (%llu skipped: their step "
                "closed before it sent its gradient; %llu computed; %llu pulls of the parameters "
                "alone)\n",
                name.c_str(), static_cast<unsigned long long>(out->result.local_steps),
                static_cast<unsigned long long>(out->result.skipped),
                static_cast<unsigned long long>(out->result.computed),
                static_cast<unsigned long long>(out->result.pulls));
  }
  return finish(0);
}

/// --job J --task I with --config: this process's node, and its ps or worker.
int run_task_process(const train_args& a, const af::cluster_config& cluster,
                     const af::train::train_config& c) {
  const auto& job = a.job;
  auto task = a.task;
  if (job.empty() || task < 0)
    return fail("which task is this process? pass --job ps|worker --task I");
  auto addr = cluster.cluster.address(job, task);
  if (!addr)
    return fail(af::describe(addr.error()));
  if (job != "ps" && job != "worker")
    return fail("--job " + job + ": a training job has ps and worker tasks");
  if (job == "ps" && c.mode == "allreduce")
    return fail("mode allreduce uses no ps: start only the worker tasks (a ps would wait for a "
                "chief that never stops it)");

  if (job == "worker" && task == 0)
    if (auto why = af::job_preflight(c); !why.empty())
      return fail(why);

  // The logger gets its name before the actor system's threads may use it.
  auto name = "/job:" + job + "/task:" + std::to_string(task);
  init_log(name);
  af::tune_malloc_for_tensors();
  auto opts = cluster.node;
  if (a.metrics_port >= 0)
    opts.metrics_port = a.metrics_port;
  // The task's own certificate: its node and the sessions it makes use it.
  auto sec = af::security_for(cluster.security, af::security_member_name(job, task));
  if (!sec)
    return fail(af::describe(sec.error()));
  af::teardown_deadline bound; // outlives the system: it bounds its end
  af::system_config sys_cfg{opts, *sec};
  auto sys_owner = af::start_actor_system(sys_cfg);
  caf::actor_system& sys = *sys_owner;
  auto node = af::start_node(sys, job, task, opts.bind.empty() ? addr->host : opts.bind, addr->port,
                             opts, {}, af::node_aggregators());
  if (!node)
    return fail(af::describe(node.error()), start_status(node.error()));
  std::unique_ptr<af::node_metrics> metrics; // [node] metrics_port (docs/watching.md)
  if (opts.metrics_port != 0) {
    auto m = af::start_node_metrics(sys, *node, name, opts, *sec);
    if (!m) {
      node->data_plane->stop();
      caf::anon_send_exit(node->actor, caf::exit_reason::user_shutdown);
      return fail(af::describe(m.error()));
    }
    metrics = std::move(*m);
  }
  std::printf("actorflow-train %s: node up at %s (data plane port %u)\n", name.c_str(),
              addr->to_string().c_str(), static_cast<unsigned>(node->data_plane->port()));
  std::fflush(stdout);
  if (!sec->enabled())
    af::log::get()->warn("{}", af::plaintext_warning());
  int rc = job == "ps" ? serve_ps(sys, node->actor, cluster, name, c, bound)
                       : run_worker(sys, cluster, name, a, c, bound);
  bound.start(name, rc, teardown_limit);
  node->data_plane->stop();
  caf::anon_send_exit(node->actor, caf::exit_reason::user_shutdown);
  return rc;
}

} // namespace

static int main_body(int argc, char** argv) {
  CLI::App app{"actorflow-train: data-parallel training (sync, async, average, allreduce)"};
  train_args a;
  add_options(app, a);
  CLI11_PARSE(app, argc, argv);
  init_log("actorflow-train");

  af::train::train_config c;
  std::optional<af::cluster_config> cluster;
  if (auto rc = load_configs(a, c, cluster))
    return *rc;
  if (af::sparse_job(c) && a.join && a.in_graph)
    return fail("model \"" + c.model + "\": a sparse job's in-graph client takes no --join (its "
                "replicas are the config's workers)");
  if ((a.status || !a.switch_to.empty()) && !cluster)
    return fail("--status and --switch talk to a running job: pass its --config");
  if (a.status || !a.switch_to.empty()) {
    if (!a.job.empty() || a.task >= 0 || a.in_graph || a.join)
      return fail("--status and --switch are clients of the job: pass no --job, --task, "
                  "--in-graph or --join with them");
    if (a.status && !a.switch_to.empty())
      return fail("--status or --switch: one at a time");
    init_log("actorflow-train client");
    return run_client(*cluster, c, a.status, a.switch_to);
  }
  if (af::sparse_job(c)) {
    if (a.local) {
      if (!a.job.empty() || a.task >= 0)
        return fail("--local trains in this one process: no --job or --task with it (the "
                    "config's [cluster] is not used)");
      return af::programs::run_sparse_local(c, fail);
    }
    if (a.in_graph && !a.job.empty() && (a.job != "worker" || a.task != 0))
      return fail("--in-graph with --job: the client runs in the chief's process, --job worker "
                  "--task 0 (the replicas of the other workers run there too)");
    if (a.job.empty() && a.task < 0 && !a.join) { // --join alone: refused below
      // The config's cluster gives the shape (its ps and worker counts); the
      // tasks run in this process on loopback ports of their own.
      int ps = cluster ? static_cast<int>(cluster->cluster.num_tasks("ps")) : 0;
      int workers = cluster ? static_cast<int>(cluster->cluster.num_tasks("worker")) : 0;
      if (auto why = af::job_preflight(c); !why.empty())
        return fail(why);
      return a.in_graph ? af::programs::run_sparse_in_graph_embedded(
                            c, ps > 0 ? ps : 2, workers > 0 ? workers : 2, fail)
                        : af::programs::run_sparse_embedded(c, ps > 0 ? ps : 2,
                                                            workers > 0 ? workers : 2, fail);
    }
  } else if (a.local) {
    return fail("--local is for a sparse model (model = \"recommender\")");
  }
  if (a.join && (a.job != "worker" || a.task <= 0))
    return fail("--join is for a worker task other than the chief: --job worker --task I (I > 0)");
  if (!cluster) {
    if (!a.job.empty() || a.task >= 0)
      return fail("--job and --task need --config: which cluster is this task part of?");
    if (auto why = a.in_graph ? in_graph_preflight(c) : af::job_preflight(c); !why.empty())
      return fail(why);
    return a.in_graph ? run_in_graph_embedded(c) : run_embedded(c);
  }
  if (a.in_graph && !af::sparse_job(c)) { // a sparse one's client is its chief task's
    if (!a.job.empty() || a.task >= 0)
      return fail("--in-graph is the one client of the job: start the tasks with actorflow-node "
                  "(or actorflow-train --job J --task I) and pass no --job/--task here");
    if (auto why = in_graph_preflight(c); !why.empty())
      return fail(why);
    return run_in_graph_client(*cluster, c);
  }
  return run_task_process(a, *cluster, c);
}

int main(int argc, char** argv) {
  return af::last_resort("actorflow-train", [&] { return main_body(argc, argv); });
}
