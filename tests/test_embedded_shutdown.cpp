// An embedded cluster's end after clients used it: a session made in one of
// the cluster's own actor systems (embedded_cluster::session_for) on another
// thread than the cluster's, for a job's --status or --switch while the job
// trains, must not keep the cluster from shutting down (af.train.Job's
// status() and switch() did, from Python's thread). Every wait here is
// bounded: a cluster whose end hangs is a failure that says so, its thread
// left behind (a hung destructor cannot be undone), never a test that hangs.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/embedded_cluster.hpp"
#include "dist/train_client.hpp"
#include "dist/training.hpp"
#include "messages/error.hpp"

using namespace af;
using namespace std::chrono_literals;

namespace {

/// A dense job (1 ps, 2 workers) that trains until told to stop, run as
/// af.train.Job runs one: a runner thread starts the embedded cluster, a
/// thread per worker trains, and the runner ends the cluster after them.
/// The test's thread is the client. The threads share this, so that a test
/// that gives up on them leaves nothing they use behind.
struct live_job {
  train::train_config c;
  std::shared_ptr<std::atomic<bool>> stop = std::make_shared<std::atomic<bool>>(false);
  std::mutex mutex; ///< guards what follows
  std::condition_variable changed;
  embedded_cluster* cluster = nullptr; ///< while it runs
  caf::error start_error;
  uint64_t global_step = 0; ///< of the chief's last report
  bool workers_ended = false;
  bool client_done = false; ///< the test no longer uses `cluster`
  std::vector<caf::expected<train_outcome>> results;
  bool ended = false; ///< the cluster shut down (shutdown_error says how)
  caf::error shutdown_error;
};

train::train_config long_digits_job() {
  train::train_config c;
  c.mode = "sync";
  c.steps = 1000000; // stopped by the test long before
  c.log_every = 5;
  c.eval_every = 0;
  c.step_timeout_ms = 20000;
  return c;
}

/// Worker `w` of `job` on `cluster`; the chief reports its global steps.
caf::expected<train_outcome> train_worker(live_job& job, embedded_cluster& cluster, int w) {
  auto s = cluster.session_for("worker", w);
  if (!s)
    return std::move(s.error());
  train_options o;
  o.shutdown_ps = false; // the cluster stops its nodes itself
  o.print = false;
  o.stop = job.stop;
  if (w == 0)
    o.on_progress = [&job](const worker_progress& p) {
      std::lock_guard<std::mutex> guard{job.mutex};
      job.global_step = p.global_step;
      job.changed.notify_all();
    };
  return run_worker_task(*s, job.c, static_cast<uint32_t>(w), o);
}

/// The runner thread (no Catch2 assertion off the test's thread: it records).
void run_job(const std::shared_ptr<live_job>& job) {
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 2}});
  if (!cluster) {
    std::lock_guard<std::mutex> guard{job->mutex};
    job->start_error = std::move(cluster.error());
    job->ended = true;
    job->changed.notify_all();
    return;
  }
  {
    std::lock_guard<std::mutex> guard{job->mutex};
    job->cluster = cluster->get();
    job->changed.notify_all();
  }
  std::vector<caf::expected<train_outcome>> results(2, make_error(af_error::internal, "not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w)
    threads.emplace_back([&, w] { results[static_cast<size_t>(w)] = train_worker(*job, **cluster, w); });
  for (auto& t : threads)
    t.join();
  {
    std::unique_lock<std::mutex> lock{job->mutex};
    job->results = std::move(results);
    job->workers_ended = true;
    job->changed.notify_all();
    // Not under a client still using it (the test's guard says when it is done).
    job->changed.wait_for(lock, 120s, [&] { return job->client_done; });
    job->cluster = nullptr;
  }
  auto err = (*cluster)->shutdown(20s);
  cluster->reset();
  std::lock_guard<std::mutex> guard{job->mutex};
  job->shutdown_error = std::move(err);
  job->ended = true;
  job->changed.notify_all();
}

/// Waits up to `limit` for `cond` (under job.mutex).
template <class F>
bool wait_for(live_job& job, std::chrono::seconds limit, F cond) {
  std::unique_lock<std::mutex> lock{job.mutex};
  return job.changed.wait_for(lock, limit, cond);
}

/// Runs `client` on this thread with a session of /job:J/task:T made by
/// session_for while the job trains, destroys the session, stops the job,
/// and checks that the workers end and the cluster shuts down, each within
/// its bound.
void client_then_shutdown(const std::string& j, int32_t t,
                          const std::function<void(session&, const train::train_config&)>& client) {
  auto job = std::make_shared<live_job>();
  job->c = long_digits_job();
  // However this ends (a failed REQUIRE too): the job stops, the runner may end the cluster.
  struct done_guard {
    live_job& job;
    void finish() {
      job.stop->store(true);
      std::lock_guard<std::mutex> guard{job.mutex};
      job.client_done = true;
      job.changed.notify_all();
    }
    ~done_guard() { finish(); }
  } done{*job};
  std::thread{[job] { run_job(job); }}.detach();
  REQUIRE(wait_for(*job, 60s, [&] { return job->cluster != nullptr || job->ended; }));
  INFO((job->start_error ? describe(job->start_error) : std::string{"started"}));
  REQUIRE(job->cluster != nullptr);
  REQUIRE(wait_for(*job, 60s, [&] { return job->global_step >= 5 || job->workers_ended; }));
  REQUIRE_FALSE(job->workers_ended); // training, not failed
  {
    auto s = job->cluster->session_for(j, t);
    REQUIRE(s);
    client(*s, job->c);
  }
  done.finish();
  if (!wait_for(*job, 60s, [&] { return job->workers_ended; }))
    FAIL("the workers did not end within 60 s of the job's stop");
  for (auto& r : job->results) {
    INFO((r ? std::string{"trained"} : describe(r.error())));
    CHECK((r || is(r.error(), af_error::cancelled))); // stopped
  }
  if (!wait_for(*job, 60s, [&] { return job->ended; }))
    FAIL("the embedded cluster did not shut down within 60 s after a session_for(\""
         << j << "\", " << t << ") session was used on another thread while the job trained "
         << "(its destructor hangs: one of its actor systems waits for that thread)");
  INFO(describe(job->shutdown_error));
  CHECK_FALSE(job->shutdown_error); // every system ended, none left to the background
}

} // namespace

// Catches a status or switch client in one of the cluster's own actor
// systems, on a thread of its own, that leaves the cluster's end hanging.
TEST_CASE("an embedded cluster shuts down after a session_for session on another thread asked "
          "its training job for its status or switched it",
          "[embedded_cluster][train][client]") {
  auto status = [](session& s, const train::train_config&) {
    auto text = job_status_text(s, 10s);
    REQUIRE(text);
    CHECK_THAT(*text, Catch::Contains("/job:ps/task:0: mode sync"));
  };
  auto to_async = [](session& s, const train::train_config& c) {
    auto text = job_switch(s, c, "async");
    REQUIRE(text);
    CHECK_THAT(*text, Catch::StartsWith("/job:ps/task:0: now async, at global step "));
  };
  SECTION("status from ps 0") { client_then_shutdown("ps", 0, status); }
  SECTION("switch from ps 0") { client_then_shutdown("ps", 0, to_async); }
  SECTION("status from worker 1") { client_then_shutdown("worker", 1, status); }
}
