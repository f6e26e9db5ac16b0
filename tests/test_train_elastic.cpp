// Elastic and straggler-tolerant actorflow-train jobs, one process per task:
// backup workers (replicas_to_aggregate), a step deadline with min_replicas,
// ssp's staleness bound, a live mode switch, a worker that joins a running
// job and one that is killed, and --status against a live job. Stragglers
// are made with SIGSTOP/SIGCONT and --step-delay-ms; every wait is bounded
// and waits on output lines, files or exits (tests/train_job.hpp).
#define CATCH_CONFIG_ENABLE_OPTIONAL_STRINGMAKER
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "train_job.hpp"

using namespace std::chrono_literals;

namespace af::testing {

namespace {

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

/// The job's end: every process exited by itself with 0.
void check_all_exit_0(train_job& job, std::chrono::milliseconds timeout) {
  auto still_running = job.wait_all_exit(timeout);
  INFO(job.describe());
  CHECK(still_running.empty());
  for (const auto& t : job.tasks()) {
    INFO(t.name());
    CHECK(t.process->exit_code() == 0);
  }
}

/// The workers.csv row of `worker` in the last report at a step <= `step`.
std::optional<worker_row> row_at(const std::vector<worker_row>& rows, uint32_t worker,
                                 uint64_t step) {
  std::optional<worker_row> found;
  for (const auto& r : rows)
    if (r.worker == worker && r.step <= step)
      found = r;
  return found;
}

std::optional<worker_row> last_row(const std::vector<worker_row>& rows, uint32_t worker) {
  return row_at(rows, worker, UINT64_MAX);
}

/// The [train] line that sends the metrics (and so <stem>.workers.csv) into
/// `dir`. In the file, not --set: a bare word with a digit is not a string
/// there, and mkdtemp's part of the path may have some.
std::string metrics_line(const std::string& dir) {
  return "metrics = \"" + dir + "/m.csv\"\n";
}

} // namespace

// Catches a sync aggregator with backup workers that still waits for every
// member (the chief would freeze until step_timeout_ms), a ps that does not
// say which worker stopped pushing, late gradients applied to a step they
// were not computed for (or not counted, dropped or skipped), a straggler
// that is shut out for good after it comes back (its applied count would
// stay flat), and --status rows without the workers' task names. Worker 1
// is held (SIGSTOP) from the --status call until worker 2 is back, so the
// steps that show worker 2 applied again cannot all have closed before it.
TEST_CASE("sync with replicas_to_aggregate = 2 of 3 worker processes goes on while one is "
          "stopped, names it, drops (or skips) and counts its late gradients after SIGCONT and "
          "takes it back",
          "[train][processes][elastic]") {
  temp_dir dir;
  auto t0 = clock_type::now();
  job_spec spec;
  spec.workers = 3;
  // Every worker paced (10 ms a step): the job's speed is bounded on any
  // machine, so it cannot end before the checks below are made.
  spec.sets = {"steps=400", "log_every=10", "eval_every=0"};
  for (int w = 0; w < 3; ++w)
    spec.worker_args[w] = {"--step-delay-ms", "10"};
  spec.train_table = "replicas_to_aggregate = 2\n" + metrics_line(dir.path);
  auto workers_csv = dir.path + "/m.workers.csv";
  auto job = train_job::start(dir.path, spec);
  if (!job->wait_until([&] { return last_progress_step(job->chief().output()).has_value(); }, 20s))
    FAIL("no progress line from the chief within 20 s:\n" << job->describe());

  auto& straggler = job->process("worker", 2);
  straggler.signal(SIGSTOP);
  REQUIRE(!straggler.exit_code());
  auto stopped_at = *last_progress_step(job->chief().output());
  auto stopped_time = clock_type::now();
  auto ps_from = job->process("ps", 0).output().size();
  // The ps names it (task and address) once it has been quiet for a second
  // while the steps went on.
  static const std::regex named{
    R"(worker 2 \(/job:worker/task:2 at 127\.0\.0\.1:\d+\) has pushed nothing for [0-9.]+ s)"};
  bool said = job->wait_until(
    [&] {
      auto out = job->process("ps", 0).output().substr(ps_from);
      return std::regex_search(out, named)
             && *last_progress_step(job->chief().output()) >= stopped_at + 40;
    },
    15s);
  auto moved_to = *last_progress_step(job->chief().output());
  INFO("worker 2 stopped at global step " << stopped_at << "; the chief reached " << moved_to
                                          << " in " << seconds_since(stopped_time) << " s");
  if (!said)
    FAIL("no progress without worker 2, or the ps did not name it:\n" << job->describe());

  // Worker 1 stopped too: no step closes without worker 2 from here on, so
  // the job cannot run to its end while --status is slow (a loaded CI
  // machine) or before worker 2 is back and applied (the check below).
  auto& holder = job->process("worker", 1);
  holder.signal(SIGSTOP);
  REQUIRE(!holder.exit_code());

  // --status against the live job: a row per worker, with its task name.
  auto status = job->client({"--status"}, 15s);
  INFO("--status:\n" << status.output);
  CHECK(status.exit_code == 0);
  auto rows = parse_status(status.output);
  for (int w = 0; w < 3; ++w) {
    INFO("worker " << w);
    auto it = std::find_if(rows.begin(), rows.end(),
                           [&](const status_row& r) { return r.worker == static_cast<uint32_t>(w); });
    REQUIRE(it != rows.end());
    CHECK(it->task == "/job:worker/task:" + std::to_string(w));
    CHECK(it->status == "member");
  }

  // Its applied count before SIGCONT, read while no step can close (workers
  // 1 and 2 stopped). Its late and skipped counts from the last row before
  // its SIGSTOP: a skip counted at the ps after that row and before the
  // stop leaves it fresh (the parameters it then pulls are read after
  // SIGCONT), and its next push is rightly applied.
  auto cont_at = *last_progress_step(job->chief().output());
  auto held = last_row(read_worker_rows(workers_csv), 2);
  auto before = row_at(read_worker_rows(workers_csv), 2, stopped_at);
  REQUIRE(held);
  REQUIRE(before);
  straggler.signal(SIGCONT);
  // Its first step after SIGCONT is for a step long closed: dropped as late
  // (or, had it been late before the stop, skipped: it asks first); then it
  // takes part again. Both show in the chief's per-worker rows.
  bool back = job->wait_until(
    [&] {
      auto now = last_row(read_worker_rows(workers_csv), 2);
      return now && now->late + now->skipped > before->late + before->skipped
             && now->applied > held->applied;
    },
    15s);
  auto after = last_row(read_worker_rows(workers_csv), 2);
  REQUIRE(after);
  INFO("worker 2 at SIGSTOP (step " << stopped_at << "): late " << before->late << " skipped "
                                    << before->skipped << "; at SIGCONT (step " << cont_at
                                    << "): applied " << held->applied << " late " << held->late
                                    << " skipped " << held->skipped << "; later (step "
                                    << after->step << "): applied " << after->applied << " late "
                                    << after->late << " skipped " << after->skipped);
  CHECK(back);
  holder.signal(SIGCONT);
  check_all_exit_0(*job, 25s);
  const auto& out = job->chief().output();
  CHECK(std::regex_search(
    out, std::regex{R"((late \(dropped\)|skipped \(step closed\))[ 0-9:]* 2:\d+)"}));
  CHECK(final_global_step(out) == 400u);
  INFO("took " << seconds_since(t0) << " s");
  CHECK(seconds_since(t0) < 60);
}

// Catches a backup worker that still computes and sends the gradients of
// steps that closed without it (the ps receives them only to drop them as
// late: 4 MiB each in the 1 M-float bench, on a CPU the others need), one
// that pulls the parameters after every skipped step though it computes on
// none of them (4 MiB each way, too), a skipped step not counted (on the
// worker or at the ps), and a job whose straggler never finishes, or that
// learns less for it.
TEST_CASE("sync with replicas_to_aggregate = 2 of 3 worker processes: a straggler told that its "
          "step closed sends no gradient of it, counts it as skipped, and the job ends as before",
          "[train][processes][elastic]") {
  temp_dir dir;
  auto t0 = clock_type::now();
  job_spec spec;
  spec.workers = 3;
  // The fast two paced (10 ms a step): the job lasts some seconds on any
  // machine, so the straggler's 200 ms steps (its simulated slow compute,
  // the thing under test) come many times.
  spec.sets = {"log_every=50", "eval_every=0"};
  for (int w = 0; w < 2; ++w)
    spec.worker_args[w] = {"--step-delay-ms", "10"};
  spec.worker_args[2] = {"--step-delay-ms", "200"};
  spec.train_table = "replicas_to_aggregate = 2\n" + metrics_line(dir.path);
  auto job = train_job::start(dir.path, spec);
  check_all_exit_0(*job, 90s);
  const auto& out = job->chief().output();
  INFO(job->describe());
  auto total = progress_total(out);
  REQUIRE(total);
  CHECK(final_global_step(out) == *total);
  auto acc = held_out_accuracy(out);
  REQUIRE(acc);
  CHECK(*acc >= 0.95);
  // The straggler's own count: steps skipped, of its local steps.
  std::smatch m;
  static const std::regex done_line{R"(done after (\d+) local steps \((\d+) skipped: their step )"
                                    R"(closed before it sent its gradient; (\d+) computed; (\d+) )"
                                    R"(pulls of the parameters alone\))"};
  const auto straggler_out = job->process("worker", 2).output();
  REQUIRE(std::regex_search(straggler_out, m, done_line));
  auto local = std::stoull(m[1].str());
  auto skipped = std::stoull(m[2].str());
  auto computed = std::stoull(m[3].str());
  auto pulls = std::stoull(m[4].str());
  INFO("worker 2: " << local << " local steps, " << skipped << " skipped, " << computed
                    << " computed, " << pulls << " pulls");
  CHECK(skipped >= 3);
  CHECK(skipped <= local);
  // It pulled the parameters only before a step it computed after skipped
  // ones, and once the job's last round closed; not after every skipped step.
  CHECK(pulls <= computed + 1);
  // The ps's count: none of its gradients came late (every one it sent was
  // for a step still open), and as many skipped as the worker says.
  auto last = last_row(read_worker_rows(dir.path + "/m.workers.csv"), 2);
  REQUIRE(last);
  INFO("worker 2 at the ps: pushes " << last->pushes << " applied " << last->applied << " late "
                                      << last->late << " skipped " << last->skipped);
  CHECK(last->late == 0);
  CHECK(last->skipped >= 3);
  CHECK(last->skipped <= skipped);
  static const std::regex summary{R"(aggregator: \d+ refused \(non-finite\), \d+ stale gradients )"
                                  R"(dropped, (\d+) steps skipped by workers told they had closed)"};
  REQUIRE(std::regex_search(out, m, summary));
  CHECK(std::stoull(m[1].str()) == skipped);
  INFO("took " << seconds_since(t0) << " s");
}

// Catches a timed window that never starts because a backup worker slower
// than the others skips every step and so never pushes (the chief waited for
// every worker's first push: the job, its ps included, never ended), and a
// timed end that reports none of the straggler's skipped steps.
TEST_CASE("sync, a timed window, replicas_to_aggregate = 2 of 3 worker processes: a straggler "
          "that skips every step does not keep the job from ending",
          "[train][processes][elastic]") {
  temp_dir dir;
  auto t0 = clock_type::now();
  job_spec spec;
  spec.workers = 3;
  spec.sets = {"log_every=20", "eval_every=0", "steps=100000000", "warmup_secs=0.3",
               "window_secs=1"};
  // The fast two paced (10 ms a step); the straggler's 200 ms before each
  // step: every one of its steps has closed when it asks.
  for (int w = 0; w < 2; ++w)
    spec.worker_args[w] = {"--step-delay-ms", "10"};
  spec.worker_args[2] = {"--step-delay-ms", "200"};
  spec.train_table = "replicas_to_aggregate = 2\n";
  auto job = train_job::start(dir.path, spec);
  check_all_exit_0(*job, 40s);
  INFO(job->describe());
  const auto& out = job->chief().output();
  CHECK(out.find("window=measured") != std::string::npos);
  std::smatch m;
  static const std::regex done_line{R"(done after (\d+) local steps \((\d+) skipped: their step )"
                                    R"(closed before it sent its gradient; (\d+) computed; (\d+) )"
                                    R"(pulls of the parameters alone\))"};
  const auto straggler_out = job->process("worker", 2).output();
  REQUIRE(std::regex_search(straggler_out, m, done_line));
  auto local = std::stoull(m[1].str());
  auto skipped = std::stoull(m[2].str());
  INFO("worker 2: " << local << " local steps, " << skipped << " skipped");
  CHECK(skipped >= 1);
  CHECK(skipped <= local);
  INFO("took " << seconds_since(t0) << " s");
}

namespace {

/// A paced sync job of 1 ps + 2 workers with a 0.5 s warm-up and a window of
/// `window_secs`, once the chief printed a progress line matching `phase`.
std::unique_ptr<train_job> timed_job(const temp_dir& dir, const std::string& window_secs,
                                     const char* phase) {
  job_spec spec;
  spec.sets = {"log_every=10", "eval_every=0", "steps=100000000", "warmup_secs=0.5",
               "window_secs=" + window_secs};
  for (int w = 0; w < 2; ++w)
    spec.worker_args[w] = {"--step-delay-ms", "5"};
  auto job = train_job::start(dir.path, spec);
  const std::regex line{phase};
  if (!job->wait_until([&] { return std::regex_search(job->chief().output(), line); }, 30s))
    FAIL("no progress line matching '" << phase << "' within 30 s:\n" << job->describe());
  return job;
}

} // namespace

// Catches a timed window reported as measured although the mode switched
// during it (its steps/s would mix sync and async steps), and a report of
// it that does not say why. The switch comes once the chief's progress
// lines say the window runs (its warm-up has begun by then).
TEST_CASE("a timed window during which the mode switches is reported not measured, with the "
          "reason",
          "[train][processes][elastic]") {
  temp_dir dir;
  // A window long enough for --switch's client to start and land in it on
  // a loaded machine.
  auto job = timed_job(dir, "12", R"(  (warm-up|window) [0-9.]+ s left)");
  auto to_async = job->client({"--switch", "async"}, 15s);
  INFO("--switch async:\n" << to_async.output);
  REQUIRE(to_async.exit_code == 0);
  check_all_exit_0(*job, 40s);
  INFO(job->describe());
  const auto& out = job->chief().output();
  CHECK(out.find("window=measured") == std::string::npos);
  CHECK(out.find("window=not_measured") != std::string::npos);
  CHECK(std::regex_search(out, std::regex{R"(window: not measured: during the warm-up or the )"
                                          R"(window: .*mode sync -> async)"}));
}

// Catches a chief whose window's last sample of ps 0 fails (ps 0 stopped,
// its stats unanswered for 5 s) and then neither measures nor stops: the job
// ran on towards `steps` (10^8 here), its progress lines saying "window 0.0
// s left", until the test's timeout.
TEST_CASE("a timed window whose ps stops answering at its end ends the job cut short, saying so",
          "[train][processes][elastic]") {
  temp_dir dir;
  auto job = timed_job(dir, "2", R"(  window [0-9.]+ s left)");
  auto& ps = job->process("ps", 0);
  ps.signal(SIGSTOP);
  const std::string said = "asking /job:ps/task:0 for its global step";
  bool failed = job->wait_until(
    [&] { return job->chief().output().find(said) != std::string::npos; }, 30s);
  ps.signal(SIGCONT);
  INFO(job->describe());
  REQUIRE(failed);
  auto left = job->wait_all_exit(40s);
  INFO(job->describe());
  CHECK(left.empty());
  const auto& out = job->chief().output();
  CHECK(out.find("ending the job without a measured window") != std::string::npos);
  CHECK(out.find("window=measured") == std::string::npos);
}

// Catches a worker whose CAF link to the chief broke while it was stopped
// past connection_timeout_ms during a timed window, and that, woken, took
// the chief's key-value store (its old handle went with the link) for a
// chief that is gone: it exited 1, telling the user to restart every task,
// while the chief and the ps ran on (docs/training.md: such a worker joins
// the aggregator again and goes on).
TEST_CASE("a worker stopped past connection_timeout_ms during a timed window goes on after "
          "SIGCONT and every task exits 0",
          "[train][processes][elastic]") {
  temp_dir dir;
  job_spec spec;
  spec.sets = {"log_every=10", "eval_every=0", "steps=100000000", "warmup_secs=0.5",
               "window_secs=12"};
  for (int w = 0; w < 2; ++w)
    spec.worker_args[w] = {"--step-delay-ms", "5"};
  spec.train_table = "[node]\nheartbeat_ms = 200\nconnection_timeout_ms = 1500\n";
  auto job = train_job::start(dir.path, spec);
  const std::regex window{R"(  window [0-9.]+ s left)"};
  if (!job->wait_until([&] { return std::regex_search(job->chief().output(), window); }, 30s))
    FAIL("no progress line of the window within 30 s:\n" << job->describe());
  auto& w1 = job->process("worker", 1);
  w1.signal(SIGSTOP);
  const std::regex left{R"(worker 1 \(/job:worker/task:1 at [0-9.:]+\) left at global step)"};
  bool seen = job->wait_until([&] { return std::regex_search(job->chief().output(), left); }, 20s);
  w1.signal(SIGCONT);
  INFO(job->describe());
  REQUIRE(seen);
  check_all_exit_0(*job, 40s);
  CHECK(w1.output().find("joined it again") != std::string::npos);
  // Neither of the watch's ends without the window's (the chief is gone,
  // or it did not say the window ended): both say "this worker stops"; nor
  // a wait for a ps taken as gone. A store that went with the link, looked
  // up again, may be said gone.
  CHECK(w1.output().find("this worker stops") == std::string::npos);
  CHECK_FALSE(std::regex_search(w1.output(), std::regex{R"(at [0-9.:]+ is gone \()"}));
}

// Catches a deadline that does not close a step with the gradients that
// arrived (min_replicas = 1: the chief would freeze until step_timeout_ms),
// one that closes steps faster than the deadline (they would not wait for
// the straggler at all), and a closing that is not counted in --status.
TEST_CASE("sync with step_deadline_ms = 200 and min_replicas = 1 closes steps at the deadline "
          "while a worker process is stopped",
          "[train][processes][elastic]") {
  temp_dir dir;
  auto t0 = clock_type::now();
  job_spec spec;
  spec.sets = {"steps=200", "log_every=1", "eval_every=0"};
  for (int w = 0; w < 2; ++w)
    spec.worker_args[w] = {"--step-delay-ms", "10"};
  spec.train_table = "replicas_to_aggregate = 2\nstep_deadline_ms = 200\nmin_replicas = 1\n";
  auto job = train_job::start(dir.path, spec);
  if (!job->wait_until([&] { return last_progress_step(job->chief().output()).has_value(); }, 20s))
    FAIL("no progress line from the chief within 20 s:\n" << job->describe());
  job->process("worker", 1).signal(SIGSTOP);
  auto stopped_at = *last_progress_step(job->chief().output());
  auto stopped_time = clock_type::now();
  bool moved = job->wait_until(
    [&] { return *last_progress_step(job->chief().output()) >= stopped_at + 8; }, 15s);
  auto elapsed = seconds_since(stopped_time);
  auto reached = *last_progress_step(job->chief().output());
  INFO("worker 1 stopped at global step " << stopped_at << "; the chief reached " << reached
                                          << " in " << elapsed << " s");
  CHECK(moved);
  // At most one step per 200 ms deadline, and the one in flight at the stop
  // (the progress line comes after its step) and the one closing now.
  CHECK(static_cast<double>(reached - stopped_at) <= elapsed / 0.2 + 2);
  auto status = job->client({"--status"}, 15s);
  INFO("--status:\n" << status.output);
  CHECK(status.exit_code == 0);
  std::smatch m;
  static const std::regex closed{R"((\d+) step\(s\) closed at the deadline)"};
  REQUIRE(std::regex_search(status.output, m, closed));
  // Of the 8 steps after the stop's progress line, only one (worker 1's
  // push may have been in before the stop) closed without the deadline.
  CHECK(std::stoull(m[1].str()) >= 7);
  job->process("worker", 1).signal(SIGCONT);
  check_all_exit_0(*job, 25s);
  CHECK(final_global_step(job->chief().output()) == 200u);
  INFO("took " << seconds_since(t0) << " s");
}

// Catches a deadline that closes a step with fewer than min_replicas
// gradients, a ps that waits without saying for whom (or says it at every
// sweep instead of once per deadline), and a job that does not recover
// when the straggler comes back.
TEST_CASE("sync with step_deadline_ms = 200 and min_replicas = 2 waits for a stopped worker "
          "process, naming it once per deadline, and goes on after SIGCONT",
          "[train][processes][elastic]") {
  temp_dir dir;
  auto t0 = clock_type::now();
  job_spec spec;
  spec.sets = {"steps=200", "log_every=1", "eval_every=0"};
  for (int w = 0; w < 2; ++w)
    spec.worker_args[w] = {"--step-delay-ms", "10"};
  spec.train_table = "replicas_to_aggregate = 2\nstep_deadline_ms = 200\nmin_replicas = 2\n";
  auto job = train_job::start(dir.path, spec);
  if (!job->wait_until([&] { return last_progress_step(job->chief().output()).has_value(); }, 20s))
    FAIL("no progress line from the chief within 20 s:\n" << job->describe());
  auto& ps = job->process("ps", 0);
  job->process("worker", 1).signal(SIGSTOP);
  auto ps_from = ps.output().size();
  static const std::regex waited{
    R"(has waited (\d+) ms at global step (\d+) with (\d+) of the min_replicas 2 gradients; )"
    R"(waiting for worker 1 \(/job:worker/task:1 at 127\.0\.0\.1:\d+)"};
  struct wait_line {
    uint64_t ms, step, arrived;
  };
  auto lines = [&] {
    std::vector<wait_line> out;
    auto text = ps.output().substr(ps_from);
    for (std::sregex_iterator it{text.begin(), text.end(), waited}, end; it != end; ++it)
      out.push_back({std::stoull((*it)[1].str()), std::stoull((*it)[2].str()),
                     std::stoull((*it)[3].str())});
    return out;
  };
  bool named = job->wait_until([&] { return lines().size() >= 3; }, 15s);
  auto seen = lines();
  auto chief_step = last_progress_step(job->chief().output());
  job->process("worker", 1).signal(SIGCONT);
  INFO("ps output since the stop:\n" << ps.output().substr(ps_from));
  REQUIRE(named);
  // One step, waited on: the same global step in every line, the chief's
  // progress not past it, and the wait growing by deadlines.
  for (size_t i = 0; i < seen.size(); ++i) {
    INFO("line " << i);
    CHECK(seen[i].step == seen[0].step);
    CHECK(seen[i].arrived == 1);
    CHECK(seen[i].ms >= 200 * (i + 1));
    if (i > 0)
      CHECK(seen[i].ms > seen[i - 1].ms);
  }
  CHECK(chief_step <= seen[0].step);
  // Once per deadline: no more lines than deadlines passed.
  CHECK(seen.size() <= seen.back().ms / 200);
  check_all_exit_0(*job, 25s);
  CHECK(final_global_step(job->chief().output()) == 200u);
  INFO("took " << seconds_since(t0) << " s");
}

// Catches an ssp aggregator that lets a fast worker run more than staleness
// pushes ahead of the slowest (or holds it for good), clocks not kept per
// worker, and a job whose chief cannot finish while the slow worker still
// pushes.
TEST_CASE("ssp with staleness = 2 keeps the worker processes' clocks within 2 of each other "
          "while one is slowed with --step-delay-ms, and the job finishes",
          "[train][processes][elastic]") {
  temp_dir dir;
  auto t0 = clock_type::now();
  job_spec spec;
  spec.sets = {"mode=ssp", "steps=240", "log_every=4", "eval_every=0"};
  spec.worker_args[1] = {"--step-delay-ms", "25"};
  spec.train_table = "staleness = 2\n" + metrics_line(dir.path);
  auto job = train_job::start(dir.path, spec);
  check_all_exit_0(*job, 30s);
  auto rows = read_worker_rows(dir.path + "/m.workers.csv");
  auto reports = reports_of(rows);
  REQUIRE(reports.size() >= 10);
  size_t at_bound = 0, compared = 0;
  for (const auto& rep : reports) {
    // Every row of a report is one stats answer of the aggregator: the
    // clocks are of one moment. A held worker's last gradient is applied
    // and counted in its clock already; what is held is the answer (its
    // next parameters): so a held worker is at most staleness + 1 ahead,
    // one that runs at most staleness.
    std::vector<worker_row> members;
    for (const auto& r : rep)
      if (r.status == "member" || r.status == "held")
        members.push_back(r);
    if (members.size() < 2)
      continue;
    ++compared;
    auto slowest = std::min_element(members.begin(), members.end(), [](auto& a, auto& b) {
                     return a.clock < b.clock;
                   })->clock;
    for (const auto& r : members) {
      INFO("report at step " << r.step << ": worker " << r.worker << " (" << r.status
                             << ") clock " << r.clock << ", slowest " << slowest);
      CHECK(r.clock - slowest <= (r.status == "held" ? 3u : 2u));
      if (r.clock - slowest >= 2)
        ++at_bound;
    }
  }
  INFO(compared << " reports compared, " << at_bound << " at the bound");
  CHECK(compared >= 10);
  CHECK(at_bound > 0); // the slow worker did hold the chief back
  CHECK(final_global_step(job->chief().output()) >= 240u);
  INFO("took " << seconds_since(t0) << " s");
}

// Catches a switch that loses or repeats steps (the count going backwards or
// past the total), drops the gradients of the round it drains as late, or
// applies one twice (pushes != applied + late + refused), and a job that
// does not learn across the switches.
TEST_CASE("a sync job switched to async and back with actorflow-train --switch counts its steps "
          "on, loses no gradient and reaches 0.95 held-out accuracy",
          "[train][processes][elastic]") {
  temp_dir dir;
  auto t0 = clock_type::now();
  job_spec spec;
  // 40 epochs, not 30: async steps take one batch, not two, so the async
  // stretch trains on fewer examples than its steps would in sync.
  spec.sets = {"log_every=10", "eval_every=0", "epochs=40"};
  // Both paced (an unpaced chief runs the whole job in async before the
  // second switch comes: ~1000 steps/s here), worker 1 the slower: at a
  // switch, the chief's push is most likely parked in a sync round worker 1
  // has not reached, which the switch must close with what arrived (not
  // drop, not apply twice). async runs at most ~300 steps/s, sync ~100.
  spec.worker_args[0] = {"--step-delay-ms", "5"};
  spec.worker_args[1] = {"--step-delay-ms", "10"};
  spec.train_table = metrics_line(dir.path);
  auto job = train_job::start(dir.path, spec);
  if (!job->wait_until([&] { return last_progress_step(job->chief().output()).has_value(); }, 20s))
    FAIL("no progress line from the chief within 20 s:\n" << job->describe());
  auto to_async = job->client({"--switch", "async"}, 15s);
  INFO("--switch async:\n" << to_async.output);
  REQUIRE(to_async.exit_code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(to_async.output, m,
                            std::regex{R"(/job:ps/task:0: now async, at global step (\d+))"}));
  auto switched_at = std::stoull(m[1].str());
  bool async_ran = job->wait_until(
    [&] { return last_progress_step(job->chief().output()) >= switched_at + 40; }, 15s);
  REQUIRE(async_ran);
  auto to_sync = job->client({"--switch", "sync"}, 15s);
  INFO("--switch sync:\n" << to_sync.output);
  REQUIRE(to_sync.exit_code == 0);
  CHECK(to_sync.output.find("/job:ps/task:0: now sync, at global step") != std::string::npos);
  check_all_exit_0(*job, 30s);
  const auto& out = job->chief().output();
  CHECK(out.find("mode sync -> async at global step") != std::string::npos);
  CHECK(out.find("mode async -> sync at global step") != std::string::npos);
  auto steps = progress_steps(out);
  REQUIRE(!steps.empty());
  CHECK(std::is_sorted(steps.begin(), steps.end()));
  auto total = progress_total(out);
  REQUIRE(total);
  CHECK(steps.back() == *total);
  CHECK(final_global_step(out) == *total);
  // From the chief's last report (its last step, after the last round
  // closed with both workers in it: no push is parked then), each worker's
  // pushes are each applied once or counted as dropped or refused.
  auto rows = read_worker_rows(dir.path + "/m.workers.csv");
  for (uint32_t w = 0; w < 2; ++w) {
    auto r = last_row(rows, w);
    INFO("worker " << w);
    REQUIRE(r);
    INFO("pushes " << r->pushes << " applied " << r->applied << " late " << r->late
                   << " refused " << r->refused);
    CHECK(r->late == 0);
    CHECK(r->pushes == r->applied + r->late + r->refused);
    CHECK(r->pushes > 0);
  }
  for (const auto& r : rows)
    CHECK(r.late == 0);
  auto acc = held_out_accuracy(out);
  REQUIRE(acc);
  CHECK(*acc >= 0.95);
  INFO("took " << seconds_since(t0) << " s");
}

// Catches a worker that cannot join a running job (or joins without the
// others learning of it), a sync step that does not wait for the newcomer,
// a killed member that the steps wait for until step_timeout_ms, and a job
// that does not end cleanly (or learn) after a member came and went.
TEST_CASE("a worker process joins a running sync job with --join, is killed with SIGKILL, and "
          "the job goes on with two workers to 0.95 held-out accuracy",
          "[train][processes][elastic]") {
  temp_dir dir;
  auto t0 = clock_type::now();
  job_spec spec;
  spec.spare_workers = 1;
  // A step_timeout_ms far longer than the checks wait: a step that waited
  // for the killed worker until it passed would fail them.
  spec.sets = {"log_every=10", "eval_every=0", "step_timeout_ms=20000"};
  // Paced (at most ~100 steps/s, 675 steps): the job outlasts a newcomer's
  // start (a process, the data, the chief's word) on a loaded machine.
  for (int w = 0; w < 3; ++w)
    spec.worker_args[w] = {"--step-delay-ms", "10"};
  spec.train_table = metrics_line(dir.path);
  auto job = train_job::start(dir.path, spec);
  if (!job->wait_until([&] { return last_progress_step(job->chief().output()).has_value(); }, 20s))
    FAIL("no progress line from the chief within 20 s:\n" << job->describe());
  auto& joined = job->join(2);
  static const std::regex joined_line{
    R"(\n  worker 2 \(/job:worker/task:2 at 127\.0\.0\.1:\d+\) joined at global step (\d+); 3 members push)"};
  bool seen = job->wait_until(
    [&] { return std::regex_search(job->chief().output(), joined_line); }, 20s);
  if (!seen)
    FAIL("the chief did not print that worker 2 joined:\n" << job->describe());
  std::smatch m;
  std::regex_search(job->chief().output(), m, joined_line);
  auto joined_at = std::stoull(m[1].str());
  // Steps go on with three: the newcomer's gradients are applied.
  auto workers_csv = dir.path + "/m.workers.csv";
  bool three = job->wait_until(
    [&] {
      auto r = last_row(read_worker_rows(workers_csv), 2);
      return r && r->status == "member" && r->applied >= 5;
    },
    15s);
  if (!three)
    FAIL("worker 2 joined at global step " << joined_at << " but took no part:\n"
                                           << job->describe());
  // --status lists the newcomer too (the ps's config does not name it),
  // by its task name, as a member.
  auto status = job->client({"--status"}, 15s);
  INFO("--status with three workers:\n" << status.output);
  CHECK(status.exit_code == 0);
  auto rows = parse_status(status.output);
  for (uint32_t w = 0; w < 3; ++w) {
    INFO("worker " << w);
    auto it = std::find_if(rows.begin(), rows.end(), [&](const status_row& r) { return r.worker == w; });
    REQUIRE(it != rows.end());
    CHECK(it->task == "/job:worker/task:" + std::to_string(w));
    CHECK(it->status == "member");
  }
  joined.signal(SIGKILL);
  auto killed_time = clock_type::now();
  bool left = job->wait_until(
    [&] {
      return job->chief().output().find("worker 2 (/job:worker/task:2 at ") != std::string::npos
             && std::regex_search(job->chief().output(),
                                  std::regex{R"(\n  worker 2 \([^\n]*\) left at global step \d+)"});
    },
    10s);
  if (!left)
    FAIL("no 'left' event for the killed worker:\n" << job->describe());
  auto left_at = *last_progress_step(job->chief().output());
  bool on = job->wait_until(
    [&] { return *last_progress_step(job->chief().output()) >= left_at + 30; }, 10s);
  INFO("worker 2 joined at global step " << joined_at << ", killed; the job went from step "
                                         << left_at << " on by 30 in "
                                         << seconds_since(killed_time) << " s");
  CHECK(on);
  CHECK(seconds_since(killed_time) < 10);
  auto still_running = job->wait_all_exit(30s);
  INFO(job->describe());
  CHECK(still_running.empty());
  for (const auto& t : job->tasks()) {
    if (t.index == 2)
      continue; // killed
    INFO(t.name());
    CHECK(t.process->exit_code() == 0);
  }
  const auto& out = job->chief().output();
  CHECK(final_global_step(out) == progress_total(out));
  auto acc = held_out_accuracy(out);
  REQUIRE(acc);
  CHECK(*acc >= 0.95);
  INFO("took " << seconds_since(t0) << " s");
}

} // namespace af::testing
