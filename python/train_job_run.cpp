// af.train.Job's runner (python/train_job.hpp): a job's cluster in this
// process, its tasks' threads (or its one in-graph client), and the end,
// through the dist/ calls actorflow-train's embedded runs make.
#include "python/train_job.hpp"

#include <algorithm>
#include <chrono>
#include <map>

#include "messages/error.hpp"
#include "train/memory_data.hpp"

namespace af::python {

namespace {

/// The jobs started in this process, so that the interpreter's exit stops
/// and joins those Python never collected (a job in a reference cycle with
/// its callback, `callback=lambda r: job...`): a runner still training while
/// the process's static destructors ran crashed it (SIGSEGV at exit).
struct started_jobs {
  std::mutex mutex;
  std::vector<std::weak_ptr<job_run>> jobs;
};

started_jobs& started_registry() {
  static auto* jobs = new started_jobs; // never destroyed: used at exit
  return *jobs;
}

/// The chief that failed, or that the job's stop ended, stops the ps tasks:
/// a worker in a sync round with it would otherwise wait step_timeout_ms
/// for its gradient (run_embedded does so for a failed chief).
void stop_ps(session& s, const job_run& j) {
  for (int k = 0; k < j.ps; ++k)
    if (auto err = s.shutdown("ps", k))
      (void) err; // gone already: what was asked for
}

/// The chief's reports into the job's records.
void record(job_run& j, worker_progress p) {
  std::lock_guard<std::mutex> guard{j.mutex};
  j.records.push_back(std::move(p));
  j.changed.notify_all();
}

void train_worker(job_run& j, int w, caf::expected<train_outcome>& out) {
  // A worker other than the chief gives up its session's waits (a connect
  // to the ps, a ping, the chief's initialization) once the job is stopped:
  // a worker still joining when the chief stops the ps would otherwise wait
  // its whole timeout on a node that is going away. The chief's session is
  // not cancelled: it stops the ps tasks after the stop (stop_ps).
  session_options so;
  if (w != 0)
    so.cancel = j.stop;
  auto s = j.cluster->session_for("worker", w, so);
  if (!s) {
    out = std::move(s.error());
    return;
  }
  train_options o;
  o.shutdown_ps = false; // the cluster stops its nodes itself
  o.print = j.verbose;
  o.stop = j.stop;
  if (w == 0) // the chief's reports: the job's step and loss, every worker's stats
    o.on_progress = [&j](const worker_progress& p) { record(j, p); };
  out = run_worker_task(*s, j.c, static_cast<uint32_t>(w), o);
  if (w == 0 && (!out || j.stop->load()) && j.c.mode != "allreduce")
    stop_ps(*s, j);
}

/// Between-graph: a thread per worker task (run_embedded's).
void run_workers(job_run& j, std::vector<caf::expected<train_outcome>>& results) {
  results.resize(static_cast<size_t>(j.workers), make_error(af_error::internal, "not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < j.workers; ++w)
    threads.emplace_back([&j, &results, w] { train_worker(j, w, results[static_cast<size_t>(w)]); });
  for (auto& t : threads)
    t.join();
}

/// In-graph: one client on worker 0's node, a replica per worker
/// (run_in_graph_embedded's).
caf::expected<train_outcome> run_dense_in_graph(job_run& j) {
  auto s = j.cluster->session_for("worker", 0);
  if (!s)
    return std::move(s.error());
  train_options o;
  o.shutdown_ps = false; // the cluster stops its nodes itself
  o.print = j.verbose;
  o.stop = j.stop;
  o.on_progress = [&j](const worker_progress& p) { record(j, p); };
  return run_in_graph(*s, j.c, o);
}

/// A sparse job's report as a record: its step and loss (its per-worker
/// figures are the metrics CSV's and --status's).
sparse_job_options sparse_options(job_run& j) {
  sparse_job_options o;
  o.shutdown_ps = false; // the cluster stops its nodes itself
  o.print = j.verbose;
  o.stop = j.stop;
  o.on_progress = [&j](uint64_t global, uint64_t local, double seconds, double loss) {
    worker_progress p;
    p.global_step = p.step = global;
    p.local_step = local;
    p.seconds = seconds;
    p.loss = loss;
    p.examples_per_s = seconds > 0 ? static_cast<double>(local * j.c.batch_size) / seconds : 0;
    record(j, std::move(p));
  };
  return o;
}

/// A sparse job: a thread per worker (run_sparse_embedded's), or in-graph
/// one client on worker 0's node (run_sparse_in_graph_embedded's).
void run_sparse(job_run& j) {
  std::vector<caf::expected<sparse_outcome>> results;
  if (j.in_graph) {
    auto s = j.cluster->session_for("worker", 0);
    results.push_back(s ? run_sparse_in_graph(*s, j.c, sparse_options(j))
                        : caf::expected<sparse_outcome>{std::move(s.error())});
  } else {
    results.resize(static_cast<size_t>(j.workers), make_error(af_error::internal, "not run"));
    std::vector<std::thread> threads;
    for (int w = 0; w < j.workers; ++w)
      threads.emplace_back([&j, &results, w] {
        auto& out = results[static_cast<size_t>(w)];
        auto s = j.cluster->session_for("worker", w);
        if (!s) {
          out = std::move(s.error());
          return;
        }
        auto o = sparse_options(j);
        if (w != 0)
          o.on_progress = nullptr; // the chief's reports are the job's
        out = run_sparse_worker_task(*s, j.c, static_cast<uint32_t>(w), o);
        if (w == 0 && !out) // the others would wait init_timeout_ms for a chief that is gone
          stop_ps(*s, j);
      });
    for (auto& t : threads)
      t.join();
  }
  std::lock_guard<std::mutex> guard{j.mutex};
  j.sparse_results = std::move(results);
}

} // namespace

/// Stops the job and waits for its runner (the caller has released the GIL).
void stop_and_join(job_run& j) {
  j.stop->store(true);
  std::lock_guard<std::mutex> guard{j.join_mutex};
  if (j.runner.joinable())
    j.runner.join();
  // The runner has ended: a held client call goes on, finds no cluster.
  std::vector<std::pair<std::thread, std::shared_ptr<client_call>>> clients;
  {
    std::lock_guard<std::mutex> held{j.clients_mutex};
    clients.swap(j.clients);
  }
  for (auto& c : clients)
    c.first.join();
}

std::shared_ptr<client_call> start_client_call(const std::shared_ptr<job_run>& j, client_use use) {
  auto call = std::make_shared<client_call>();
  std::lock_guard<std::mutex> held{j->clients_mutex};
  // The calls that have answered: joined now (their threads are ending).
  for (auto it = j->clients.begin(); it != j->clients.end();) {
    bool done = false;
    {
      std::lock_guard<std::mutex> guard{it->second->mutex};
      done = it->second->done;
    }
    if (done) {
      it->first.join();
      it = j->clients.erase(it);
    } else {
      ++it;
    }
  }
  std::thread t([j, call, use = std::move(use)] {
    {
      std::unique_lock<std::mutex> lock{j->mutex};
      j->changed.wait(lock, [&] { return !j->hold_clients || j->finished; });
    }
    caf::expected<std::string> text{std::string{}};
    bool no_cluster = false;
    bool cancelled = false;
    {
      std::lock_guard<std::mutex> guard{call->mutex};
      cancelled = call->cancelled;
    }
    if (!cancelled) {
      std::lock_guard<std::mutex> guard{j->cluster_mutex};
      if (j->cluster) {
        // A session in ps 0's own system, ended on this thread before the
        // runner may end the cluster (it lets go of the system as it ends:
        // dist/embedded_cluster.hpp).
        session_options so;
        so.timeout = std::chrono::milliseconds{std::min<uint32_t>(j->c.step_timeout_ms, 10000)};
        so.connect_timeout = so.timeout;
        auto s = j->cluster->session_for("ps", 0, so);
        text = use(s);
      } else {
        no_cluster = true;
      }
    }
    std::lock_guard<std::mutex> guard{call->mutex};
    call->text = std::move(text);
    call->no_cluster = no_cluster;
    call->done = true;
    call->answered.notify_all();
  });
  j->clients.emplace_back(std::move(t), call);
  return call;
}

void remember_started(const std::shared_ptr<job_run>& j) {
  auto& r = started_registry();
  std::lock_guard<std::mutex> guard{r.mutex};
  r.jobs.erase(std::remove_if(r.jobs.begin(), r.jobs.end(),
                              [](const auto& w) { return w.expired(); }),
               r.jobs.end());
  r.jobs.push_back(j);
}

/// atexit's: every job still held somewhere, stopped and joined.
void stop_every_job() {
  std::vector<std::shared_ptr<job_run>> held;
  {
    auto& r = started_registry();
    std::lock_guard<std::mutex> guard{r.mutex};
    for (const auto& w : r.jobs)
      if (auto j = w.lock())
        held.push_back(std::move(j));
  }
  for (const auto& j : held)
    stop_and_join(*j);
}

void run_job(job_run& j) {
  std::map<std::string, int> jobs{{"worker", j.workers}};
  if (j.c.mode != "allreduce")
    jobs["ps"] = j.ps;
  auto ec = embedded_cluster::start(jobs);
  std::vector<caf::expected<train_outcome>> results;
  caf::error start_error;
  if (ec) {
    {
      std::lock_guard<std::mutex> guard{j.cluster_mutex};
      j.cluster = std::move(*ec);
    }
    if (j.sparse)
      run_sparse(j);
    else if (j.in_graph)
      results.push_back(run_dense_in_graph(j));
    else
      run_workers(j, results);
    std::lock_guard<std::mutex> guard{j.cluster_mutex};
    j.cluster.reset();
  } else {
    start_error = std::move(ec.error());
  }
  if (!j.memory_name.empty())
    train::drop_memory_dataset(j.memory_name); // every worker has its split
  std::lock_guard<std::mutex> guard{j.mutex};
  j.results = std::move(results);
  j.start_error = std::move(start_error);
  j.finished = true;
  j.changed.notify_all();
}


} // namespace af::python
