// actorflow-train through kill -9 (issue 11 §3), one process per task: a ps
// killed mid-training and restarted (the test is its supervisor), whose
// variables the chief restores from the latest checkpoint while the other ps
// keeps its state; a worker killed and restarted with --join; the chief
// killed (the job stops, every process says why, and the restarted job
// resumes); the chief killed in the middle of writing a checkpoint (the torn
// file never replaces the good one); the chief killed and restarted while
// the job runs on (it takes the job as it is), also over a checkpoint it
// cannot read, and a chief that fails on a job that was running (a second
// one started by mistake) leaves its ps alone. Every wait is bounded and waits on
// output lines, files or exits (tests/train_job.hpp).
#define CATCH_CONFIG_ENABLE_OPTIONAL_STRINGMAKER
#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "net/data_plane.hpp"
#include "messages/error.hpp"
#include "messages/error.hpp"
#include "train/checkpoint.hpp"
#include "train_job.hpp"

using namespace std::chrono_literals;

namespace af::testing {

namespace {

/// The step of the checkpoint DIR/latest names; nullopt if there is none yet.
std::optional<uint64_t> latest_step(const std::string& dir) {
  auto path = train::latest(dir);
  if (!path || path->empty())
    return std::nullopt;
  static const std::regex re{R"(ckpt-(\d+)\.afck$)"};
  std::smatch m;
  if (!std::regex_search(*path, m, re))
    return std::nullopt;
  return std::stoull(m[1].str());
}

/// The chief's "ps recovered: TASK from PATH checkpoint_step=S at
/// global_step=T lost=L" lines.
struct recovery_line {
  std::string task, from;
  uint64_t checkpoint_step = 0, step = 0, lost = 0;
};
std::vector<recovery_line> recoveries(const std::string& out) {
  static const std::regex re{
    R"(ps recovered: (\S+) from (.+) checkpoint_step=(\d+) at global_step=(\d+) lost=(\d+))"};
  std::vector<recovery_line> found;
  for (std::sregex_iterator it{out.begin(), out.end(), re}, end; it != end; ++it)
    found.push_back({(*it)[1].str(), (*it)[2].str(), std::stoull((*it)[3].str()),
                     std::stoull((*it)[4].str()), std::stoull((*it)[5].str())});
  return found;
}

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

void check_all_exit_0(train_job& job, std::chrono::milliseconds timeout) {
  auto still_running = job.wait_all_exit(timeout);
  INFO(job.describe());
  CHECK(still_running.empty());
  for (const auto& t : job.tasks()) {
    INFO(t.name());
    CHECK(t.process->exit_code() == 0);
  }
}

/// Two ps, two workers, checkpoints every K steps; ps 1 is SIGKILLed once a
/// checkpoint of step >= 5K exists and restarted once the chief has said it
/// lost it.
void ps_killed_and_restarted(const std::string& mode, bool secure = false, uint64_t K = 20,
                             uint64_t steps = 3000) {
  temp_dir dir;
  auto ckpt_dir = dir.path + "/ckpt";
  auto metrics = dir.path + "/m.csv";
  job_spec spec;
  spec.ps_tasks = 2;
  spec.secure = secure;
  spec.train_table = "checkpoint_dir = \"" + ckpt_dir + "\"\nmetrics = \"" + metrics + "\"\n";
  if (mode == "sync" && !secure) // worker 1 is stopped for a while below
    spec.train_table += "\n[node]\nconnection_timeout_ms = 120000\n";
  spec.sets = {"mode=" + mode, "optimizer=momentum", "checkpoint_steps=" + std::to_string(K),
               "steps=" + std::to_string(steps), "log_every=20", "ps_recovery_timeout_ms=30000"};
  auto job = train_job::start(dir.path, spec);
  // Past the start, when the chief is slowest against the other worker, and
  // once worker 1 pushes too: recovery covers the training loop, not a
  // worker still reading its first parameters (on a loaded machine the chief
  // alone can reach step 5K in async before worker 1 starts; docs/training.md).
  auto worker1_pushed = [&] {
    for (const auto& row : read_worker_rows(dir.path + "/m.workers.csv"))
      if (row.worker == 1 && row.pushes > 0)
        return true;
    return false;
  };
  if (!job->wait_until([&] { return latest_step(ckpt_dir) >= 5 * K && worker1_pushed(); }, 30s))
    FAIL("no checkpoint of step >= " << 5 * K << " with worker 1 pushing within 30 s:\n"
                                     << job->describe());
  auto seen = *latest_step(ckpt_dir);
  job->process("ps", 1).signal(SIGKILL);
  auto killed = clock_type::now();
  // The chief's next push finds the data connection closed: it names the ps
  // and says what it waits for.
  const std::string gone = "/job:ps/task:1 at 127.0.0.1:";
  auto noticed = job->wait_until(
    [&] {
      const auto& out = job->chief().output();
      auto at = out.find(gone);
      return at != std::string::npos && out.find("is gone", at) != std::string::npos
             && out.find("ps_recovery_timeout_ms", at) != std::string::npos;
    },
    10s);
  INFO("the chief said it lost ps 1 " << seconds_since(killed) << " s after the kill");
  if (!noticed)
    FAIL("the chief did not say within 10 s that it lost ps 1:\n" << job->describe());
  // sync, plaintext: the restored ps's values are read back and compared
  // with the checkpoint the chief names. Race-free: worker 1 is stopped
  // (SIGSTOP, its connections stay up) before ps 1 comes back, so the new
  // aggregator's first round cannot close (it waits for worker 1's part)
  // and nothing is applied on ps 1 until SIGCONT; the read is bounded below
  // step_timeout_ms, and connection_timeout_ms is raised so that the
  // heartbeat does not drop the stopped worker meanwhile. (async applies
  // the chief's own next push at once; [security] needs a TLS client.)
  const bool check_values = mode == "sync" && !secure;
  auto stopped = clock_type::now();
  if (check_values)
    job->process("worker", 1).signal(SIGSTOP);
  job->restart("ps", 1);
  if (check_values) {
    auto recovered = job->wait_until(
      [&] { return !recoveries(job->chief().output()).empty(); }, 30s);
    if (!recovered)
      FAIL("the chief did not print 'ps recovered:' within 30 s of ps 1's restart:\n"
           << job->describe());
    auto rec = recoveries(job->chief().output()).front();
    std::smatch port_match;
    const auto& ps1_out = job->process("ps", 1).output();
    static const std::regex port_re{R"(data plane port (\d+))"};
    REQUIRE(std::regex_search(ps1_out, port_match, port_re));
    auto port = static_cast<uint16_t>(std::stoul(port_match[1].str()));
    auto ckpt = train::load(rec.from);
    INFO(rec.from);
    REQUIRE(ckpt);
    auto ch = data_channel::connect("127.0.0.1", port, "ps 1's data plane", 10s);
    INFO((ch ? std::string{} : describe(ch.error())));
    REQUIRE(ch);
    size_t compared = 0;
    for (const auto& v : ckpt->variables) {
      auto got = (*ch)->call(var_op::read, v.name, nullptr, false);
      if (!got && describe(got.error()).find("no variable") != std::string::npos)
        continue; // one of ps 0's (max_partitions = 1: whole variables, i % 2)
      INFO("variable '" << v.name << "' of ps 1 against " << rec.from);
      REQUIRE(got);
      CHECK(got->first.type() == v.value.type());
      CHECK(got->first.shape() == v.value.shape());
      REQUIRE(got->first.nbytes() == v.value.nbytes());
      CHECK(std::memcmp(got->first.bytes(), v.value.bytes(), v.value.nbytes()) == 0);
      ++compared;
    }
    CHECK(compared > 0);
    // Worker 1 was still in the membership (the round could not close
    // without it) for all of the reads.
    auto waited = seconds_since(stopped);
    INFO("worker 1 was stopped for " << waited << " s");
    REQUIRE(waited < 30.0); // step_timeout_ms = 30000: no round expired yet
    CHECK(job->chief().output().find("left at global step") == std::string::npos);
    job->process("worker", 1).signal(SIGCONT);
  }
  check_all_exit_0(*job, 60s);

  const auto& out = job->chief().output();
  INFO(out);
  auto recs = recoveries(out);
  REQUIRE(recs.size() == 1);
  const auto& r = recs[0];
  CHECK(r.task == "/job:ps/task:1");
  // From the latest checkpoint: at least the one seen before the kill, of a
  // step the job had reached, and at most one interval behind it.
  CHECK(r.checkpoint_step >= seen);
  if (mode == "sync") // async saves at the aggregators' step when they answer
    CHECK(r.checkpoint_step % K == 0);
  auto name = "ckpt-" + std::to_string(r.checkpoint_step) + ".afck";
  CHECK(r.from == (fs::path{ckpt_dir} / name).string());
  CHECK(r.checkpoint_step <= r.step);
  CHECK(r.lost == r.step - r.checkpoint_step);
  // sync: the chief checkpoints at every multiple of K it reaches, so at
  // most K - 1 steps were applied after it, K when the checkpoint that fell
  // due as the ps died was skipped or the other ps closed the round the
  // chief was pushing (the restore is at its step), never both (the
  // skipped checkpoint keeps the restore at the chief's step). async: the
  // chief's view of the step moves by every worker's pushes, and the other
  // worker's pushes between two of the chief's answers count too
  // (docs/training.md), and so do those it makes while the chief writes a
  // checkpoint (two fsyncs): 48 - 115 steps at K = 20 on a loaded 2-vCPU
  // machine once a digits step took ~0.3 ms. Within 10K here; a restore
  // from an older checkpoint than the latest is caught above (seen, name).
  CHECK(r.lost <= (mode == "sync" ? K : 10 * K));
  // ps 0 was never reloaded: no restore among its events (the chief prints
  // them under its progress lines), and its per-worker counters, which a
  // restore resets, only grew.
  CHECK(out.find("restored to global step") == std::string::npos);
  auto rows = read_worker_rows(dir.path + "/m.workers.csv");
  REQUIRE(!rows.empty());
  std::map<uint32_t, uint64_t> pushes;
  for (const auto& row : rows) {
    INFO("workers.csv row of step " << row.step << ", worker " << row.worker);
    CHECK(row.pushes >= pushes[row.worker]);
    pushes[row.worker] = row.pushes;
  }
  CHECK(rows.back().step >= r.step); // rows from after the recovery are among them
  // Worker 1 waited for the chief's restore, then went on.
  CHECK(job->process("worker", 1).output().find("/job:ps/task:1 is back, restored by the chief")
        != std::string::npos);
  auto final_step = final_global_step(out);
  REQUIRE(final_step);
  CHECK(*final_step >= steps);
  CHECK(*final_step <= (mode == "sync" ? steps : async_end_bound(steps, 2)));
  // sync: both ps closed the same rounds (a worker whose parts went a round
  // apart after the restore made one ps end past the job: 3001 of 3000; the
  // chief names each ps's step when they differ).
  if (mode == "sync")
    CHECK(out.find("ended at different global steps") == std::string::npos);
  auto acc = held_out_accuracy(out);
  REQUIRE(acc);
  CHECK(*acc >= 0.9);
}

} // namespace

// Catches: a job that fails (or hangs) when a ps dies instead of waiting for
// it; a chief that reloads every ps (ps 0's counters would restart); a
// restore from something other than the latest checkpoint, or a restore
// that loses more than one checkpoint interval; (sync) a restored ps whose
// values are not the ones of the checkpoint the chief names (another
// checkpoint, another ps's rows, its initial values); a worker that does not
// find the restarted ps's new aggregator and data port.
TEST_CASE("a ps of a sync job killed with SIGKILL and restarted is restored from the latest "
          "checkpoint, losing at most one interval, while the other ps keeps its state",
          "[train][processes][recovery]") {
  ps_killed_and_restarted("sync");
}

// Catches, with a checkpoint due at every step (so the kill often lands
// while the chief collects one): a restore at the other ps's step after the
// chief's checkpoint found ps 1 dead, which lost the skipped checkpoint's
// interval and that round too (K + 1, 2 of 25 recoveries in the 10-minute
// soak); and a checkpoint whose save went to ps 1's dead node after its
// down message had come (CAF drops it unanswered: the chief waited 60 s).
// Not every run: the kill lands in the checkpoint's collection in about
// 3 of 10 runs here (the reviewer's mutant without the fix failed 2 of 10),
// and the second bug's timing (the down message before the save is sent)
// was not seen in 10 runs; the 10-minute soak is what exercises both.
TEST_CASE("a ps of a sync job that checkpoints every step, killed with SIGKILL and restarted, "
          "loses at most that one step",
          "[train][processes][recovery]") {
  ps_killed_and_restarted("sync", false, 1, 400);
}

TEST_CASE("a ps of an async job killed with SIGKILL and restarted is restored from the latest "
          "checkpoint, losing at most one interval, while the other ps keeps its state",
          "[train][processes][recovery]") {
  ps_killed_and_restarted("async");
}

// Catches, beyond the plaintext case: a worker whose CAF connection to its
// chief is closed when a ps's TLS connection dies. CAF judged each OpenSSL
// call by the thread's error queue, which the dead ps's connection had
// filled: the next healthy connection to read nothing yet was taken as
// failed, and worker 1's ping of its chief was lost with it, so worker 1
// stopped the job as if the chief were gone (every time, by hand).
TEST_CASE("a ps of a sync job with [security] killed with SIGKILL and restarted is restored "
          "while the workers' TLS connections to the chief stay up",
          "[train][processes][recovery][security]") {
  ps_killed_and_restarted("sync", true);
}

// Catches a job that waits for ever for a ps nobody restarts, or fails
// without saying which ps and what to do.
TEST_CASE("a ps killed with SIGKILL and not restarted ends the job after ps_recovery_timeout_ms, "
          "naming the ps",
          "[train][processes][recovery]") {
  temp_dir dir;
  job_spec spec;
  spec.sets = {"steps=100000000", "ps_recovery_timeout_ms=1500", "init_timeout_ms=3000"};
  auto job = train_job::start(dir.path, spec);
  REQUIRE(job->wait_until([&] { return last_progress_step(job->chief().output()).has_value(); },
                          20s));
  job->process("ps", 0).signal(SIGKILL);
  auto code = job->chief().wait_exit(20s);
  INFO(job->describe());
  REQUIRE(code);
  CHECK(*code != 0);
  const auto& out = job->chief().output();
  CHECK(out.find("/job:ps/task:0 at 127.0.0.1:") != std::string::npos);
  CHECK(out.find("did not come back within 1500 ms (ps_recovery_timeout_ms)") != std::string::npos);
  auto left = job->wait_all_exit(20s);
  CHECK(left.empty());
  CHECK(job->process("worker", 1).exit_code() != 0);
}

// Catches a dense worker that, once a ps stopped past the nodes'
// connection_timeout_ms answers again, pushes to an aggregator that took it
// as left (its CAF link broke, so the ps saw both workers go down): the
// pushes were refused ("said it was done (or left) and pushes again") and
// both workers failed, though the ps was the same process with its state
// whole. (The sparse job's case: tests/test_sparse_faults.cpp.)
TEST_CASE("a ps of a dense sync job stopped past connection_timeout_ms and continued takes its "
          "workers back, the job runs every step and every process exits 0",
          "[train][processes][recovery]") {
  temp_dir dir;
  job_spec spec;
  spec.train_table = "\n[node]\nheartbeat_ms = 200\nconnection_timeout_ms = 2000\n";
  const uint64_t steps = 3000;
  spec.sets = {"mode=sync", "steps=" + std::to_string(steps), "log_every=20",
               "ps_recovery_timeout_ms=30000"};
  // 2 ms a step: the job lasts seconds, so that the stop lands while it trains.
  spec.worker_args = {{0, {"--step-delay-ms", "2"}}, {1, {"--step-delay-ms", "2"}}};
  auto job = train_job::start(dir.path, spec);
  auto trains = [&] { return last_progress_step(job->chief().output()) >= 100u; };
  if (!job->wait_until(trains, 30s))
    FAIL("no progress line of step >= 100 within 30 s:\n" << job->describe());
  job->process("ps", 0).signal(SIGSTOP);
  // Stopped twice connection_timeout_ms, so that its links to the workers
  // break: the fault's length, not a synchronization (that they broke is
  // checked below, in the ps's own words).
  std::this_thread::sleep_for(4s);
  job->process("ps", 0).signal(SIGCONT);
  check_all_exit_0(*job, 90s);
  INFO(job->describe());
  const auto& ps = job->process("ps", 0).output();
  for (int w = 0; w < 2; ++w) {
    INFO("worker " << w);
    CHECK(std::regex_search(ps, std::regex{"worker " + std::to_string(w)
                                           + R"( \([^)]*\) left at global step \d+ \(down: )"}));
    CHECK(job->process("worker", w).output().find("/job:ps/task:0 took it as left; joined it "
                                                  "again")
          != std::string::npos);
  }
  // sync: every step is one round, none lost or taken twice.
  auto final_step = final_global_step(job->chief().output());
  REQUIRE(final_step);
  CHECK(*final_step == steps);
}

namespace {

/// Worker 1 (one the job started with) is SIGKILLed once it has pushed, and
/// restarted with --join once the chief has named it as gone.
void worker_killed_and_rejoins(const std::string& mode) {
  temp_dir dir;
  job_spec spec;
  spec.train_table = "metrics = \"" + dir.path + "/m.csv\"\n";
  spec.sets = {"mode=" + mode, "steps=4000", "log_every=50"};
  auto job = train_job::start(dir.path, spec);
  // Killed once the aggregator counts its pushes: it has joined (a worker
  // killed before it joined is not monitored, so nobody sees it leave).
  auto pushed = [&] {
    for (const auto& row : read_worker_rows(dir.path + "/m.workers.csv"))
      if (row.worker == 1 && row.pushes > 0)
        return true;
    return false;
  };
  if (!job->wait_until(pushed, 20s))
    FAIL("worker 1 pushed nothing within 20 s:\n" << job->describe());
  job->process("worker", 1).signal(SIGKILL);
  auto killed_at = *last_progress_step(job->chief().output());
  const std::regex left{
    R"(worker 1 \(/job:worker/task:1 at 127\.0\.0\.1:\d+\) left at global step)"};
  if (!job->wait_until([&] { return std::regex_search(job->chief().output(), left); }, 20s))
    FAIL("the chief did not name worker 1 as gone within 20 s:\n" << job->describe());
  // The job went on without it.
  auto moved = job->wait_until(
    [&] { return *last_progress_step(job->chief().output()) >= killed_at + 200; }, 20s);
  CHECK(moved);
  job->restart("worker", 1, {"--join"});
  check_all_exit_0(*job, 60s);
  const auto& out = job->chief().output();
  INFO(out);
  const std::regex joined{
    R"(worker 1 \(/job:worker/task:1 at 127\.0\.0\.1:\d+\) joined at global step)"};
  CHECK(std::regex_search(out, joined));
  CHECK(job->process("worker", 1).output().find("done after") != std::string::npos);
  auto final_step = final_global_step(out);
  REQUIRE(final_step);
  CHECK(*final_step >= 4000u);
  CHECK(*final_step <= (mode == "sync" ? 4000u : 4001u));
}

} // namespace

// Catches a job that stops (or a chief that does not say whom it lost) when
// an original worker dies, and a worker that cannot come back with --join
// under its own index.
TEST_CASE("a sync worker killed with SIGKILL is named by the chief, the job goes on, and the "
          "worker restarted with --join rejoins and finishes",
          "[train][processes][recovery]") {
  worker_killed_and_rejoins("sync");
}

TEST_CASE("an async worker killed with SIGKILL is named by the chief, the job goes on, and the "
          "worker restarted with --join rejoins and finishes",
          "[train][processes][recovery]") {
  worker_killed_and_rejoins("async");
}

// Catches a job that goes on (or hangs) without its chief, a worker that
// fails without saying the chief is gone and what to do, and a restart that
// does not resume from the latest checkpoint.
TEST_CASE("a chief killed with SIGKILL stops the job: the ps and the other worker exit non-zero "
          "naming the chief, and the restarted job resumes from the latest checkpoint",
          "[train][processes][recovery]") {
  temp_dir dir;
  auto ckpt_dir = dir.path + "/ckpt";
  job_spec spec;
  spec.train_table = "checkpoint_dir = \"" + ckpt_dir + "\"\n";
  spec.sets = {"checkpoint_steps=20", "steps=100000000", "init_timeout_ms=3000",
               "ps_recovery_timeout_ms=20000"};
  uint64_t g = 0;
  {
    auto job = train_job::start(dir.path, spec);
    if (!job->wait_until([&] { return latest_step(ckpt_dir) >= 40u; }, 20s))
      FAIL("no checkpoint of step >= 40 within 20 s:\n" << job->describe());
    job->chief().signal(SIGKILL);
    auto left = job->wait_all_exit(20s);
    INFO(job->describe());
    CHECK(left.empty());
    auto& ps = job->process("ps", 0);
    CHECK(ps.exit_code() != 0);
    CHECK(ps.output().find("/job:worker/task:0 has not answered") != std::string::npos);
    auto& w1 = job->process("worker", 1);
    CHECK(w1.exit_code() != 0);
    CHECK(w1.output().find("the chief /job:worker/task:0 at 127.0.0.1:") != std::string::npos);
    CHECK(w1.output().find("restart every task of the job") != std::string::npos);
    g = *latest_step(ckpt_dir);
  }
  spec.sets = {"checkpoint_steps=20", "steps=" + std::to_string(g + 20)};
  auto job = train_job::start(dir.path, spec);
  check_all_exit_0(*job, 30s);
  const auto& out = job->chief().output();
  INFO(out);
  CHECK(out.find("(global step " + std::to_string(g) + ")") != std::string::npos);
  CHECK(final_global_step(out) == g + 20);
}

// Catches a checkpoint written in place (the kill would leave a torn file
// under the name `latest` gives) or `latest` updated before the checkpoint
// is complete: the restart would refuse it, or restore garbage.
TEST_CASE("a chief killed with SIGKILL in the middle of writing a checkpoint leaves the previous "
          "one as the latest, and the job resumes from it",
          "[train][processes][recovery]") {
  temp_dir dir;
  auto ckpt_dir = dir.path + "/ckpt";
  job_spec spec;
  spec.train_table = "checkpoint_dir = \"" + ckpt_dir + "\"\n";
  spec.sets = {"optimizer=momentum", "checkpoint_steps=20", "steps=100000000",
               "init_timeout_ms=3000"};
  std::string tmp;
  {
    // Inherited by the job's processes only (unset before anything else
    // starts): actorflow-train-pausing's hook (checkpoint_pause_hook.cpp)
    // pauses the chief halfway through writing the checkpoint of step 60 (the
    // third), and it is killed there.
    ::setenv("ACTORFLOW_TEST_CHECKPOINT_PAUSE", "60", 1);
    auto paused = spec;
    paused.binary = ACTORFLOW_TRAIN_PAUSING_BINARY;
    auto job = train_job::start(dir.path, paused);
    ::unsetenv("ACTORFLOW_TEST_CHECKPOINT_PAUSE");
    const std::regex pausing{
      R"(test pause \(ACTORFLOW_TEST_CHECKPOINT_PAUSE\) halfway through writing (\S+\.tmp))"};
    if (!job->wait_until([&] { return std::regex_search(job->chief().output(), pausing); }, 30s))
      FAIL("the chief did not pause in a checkpoint write within 30 s:\n" << job->describe());
    tmp = *last_match(job->chief().output(), pausing);
    job->chief().signal(SIGKILL);
    job->wait_all_exit(20s);
  }
  INFO("torn file " << tmp);
  auto good = fs::path{ckpt_dir} / "ckpt-40.afck";
  REQUIRE(latest_step(ckpt_dir) == 40u);
  REQUIRE(fs::exists(tmp));
  CHECK(fs::file_size(tmp) < fs::file_size(good)); // torn: half of it
  CHECK(!fs::exists(fs::path{ckpt_dir} / "ckpt-60.afck"));
  auto ck = train::load(good.string());
  REQUIRE(ck);
  CHECK(ck->global_step == 40u);

  spec.sets = {"optimizer=momentum", "checkpoint_steps=20", "steps=60"};
  auto job = train_job::start(dir.path, spec);
  check_all_exit_0(*job, 30s);
  const auto& out = job->chief().output();
  INFO(out);
  CHECK(out.find("restoring " + good.string() + " (global step 40)") != std::string::npos);
  CHECK(final_global_step(out) == 60u);
  CHECK(latest_step(ckpt_dir) == 60u);
  CHECK(!fs::exists(tmp)); // the next save removed what the crash left
}

namespace {

/// The chief of a `mode` job is SIGKILLed, the ps goes on with worker 1 a
/// checkpoint interval or more past the latest checkpoint, and the chief is
/// restarted. Worker 1 is stopped (SIGSTOP: its connections stay up, and the
/// ps holds the job as it is) from then until the restarted chief says it
/// took the job, so that nothing ends the job while the chief comes back,
/// however long that takes on a loaded machine. With `damaged_latest`, the
/// latest checkpoint is cut in half before the restart: the running job does
/// not need it.
void chief_killed_and_restarted(const std::string& mode, bool damaged_latest = false) {
  temp_dir dir;
  auto ckpt_dir = dir.path + "/ckpt";
  job_spec spec;
  // connection_timeout_ms: the heartbeat does not drop worker 1 while it is
  // stopped.
  spec.train_table = "checkpoint_dir = \"" + ckpt_dir + "\"\n\n[node]\nconnection_timeout_ms = "
                     "120000\n";
  const uint64_t steps = 2000, K = 100;
  spec.sets = {"mode=" + mode, "steps=" + std::to_string(steps),
               "checkpoint_steps=" + std::to_string(K), "log_every=50"};
  // At most 200 pushes/s from worker 1 (sync: it sets the pace of the
  // rounds): once the ps is a checkpoint interval past the chief's last
  // checkpoint, worker 1 alone would take seconds to end the job, and the
  // test stops it in one --status call.
  spec.worker_args[1] = {"--step-delay-ms", "5"};
  auto job = train_job::start(dir.path, spec);
  // sync: a checkpoint of step 3K means both have pushed; async: worker 1
  // pushes from its start (it is slower than the chief, not stopped).
  if (!job->wait_until([&] { return latest_step(ckpt_dir) >= 3 * K; }, 60s))
    FAIL("no checkpoint of step >= " << 3 * K << " within 60 s:\n" << job->describe());
  job->chief().signal(SIGKILL);
  auto ps_step_without_chief = [&]() -> std::optional<uint64_t> {
    // --status goes to the ps, not to the dead chief.
    auto status = job->client({"--status"}, 10s);
    static const std::regex step_re{R"(/job:ps/task:0: mode \w+, global step (\d+))"};
    auto step = last_match(status.output, step_re);
    auto rows = parse_status(status.output);
    bool chief_left = std::any_of(rows.begin(), rows.end(), [](const status_row& r) {
      return r.worker == 0 && r.status == "left";
    });
    if (!step || !chief_left)
      return std::nullopt;
    return std::stoull(*step);
  };
  // Only the chief writes checkpoints: the latest stays where it was while
  // the ps goes on with worker 1, a checkpoint interval past it here, so that
  // a restore from it would show.
  auto checkpointed = *latest_step(ckpt_dir);
  uint64_t ps_step = 0;
  auto moved = job->wait_until(
    [&] {
      auto st = ps_step_without_chief();
      if (st)
        ps_step = *st;
      return st && *st >= checkpointed + K;
    },
    30s);
  INFO("latest checkpoint " << checkpointed << ", the ps at global step " << ps_step
                            << " without the chief");
  if (!moved)
    FAIL("the ps did not go on with worker 1 past step " << checkpointed + K
                                                         << " within 30 s, or does not say the "
                                                            "chief left:\n"
                                                         << job->describe());
  job->process("worker", 1).signal(SIGSTOP);
  // Where the ps holds the job now (a push of worker 1's in flight as it
  // stopped may still have been applied).
  auto held = ps_step_without_chief();
  if (!held)
    FAIL("no --status of the ps with worker 1 stopped:\n" << job->describe());
  ps_step = *held;
  REQUIRE(latest_step(ckpt_dir) == checkpointed);
  REQUIRE(ps_step + 4 * K < steps);
  std::string damaged;
  if (damaged_latest) {
    damaged = *train::latest(ckpt_dir);
    fs::resize_file(damaged, fs::file_size(damaged) / 2);
  }
  job->restart("worker", 0);
  static const std::regex took_re{
    R"(chief: took the running job at global_step=(\d+) data_position=\d+ checkpoint_step=(\d+|none))"};
  auto took = job->wait_until(
    [&] {
      return std::regex_search(job->chief().output(), took_re)
             || job->chief().exit_code().has_value();
    },
    60s);
  job->process("worker", 1).signal(SIGCONT);
  if (!took)
    FAIL("the restarted chief neither took the job nor exited within 60 s:\n" << job->describe());
  check_all_exit_0(*job, 90s);

  const auto& out = job->chief().output();
  INFO(out);
  std::smatch m;
  REQUIRE(std::regex_search(out, m, took_re));
  auto taken_at = std::stoull(m[1].str());
  // From the ps's step, not the checkpoint's: nothing it applied was lost.
  CHECK(m[2].str() == (damaged_latest ? std::string{"none"} : std::to_string(checkpointed)));
  if (damaged_latest) {
    CHECK(out.find("the job's latest checkpoint cannot be read") != std::string::npos);
    CHECK(out.find(damaged) != std::string::npos);
    CHECK(out.find("does not need it: taking it as it is") != std::string::npos);
  }
  CHECK(taken_at >= ps_step);
  CHECK(out.find("worker 0: restoring ") == std::string::npos);
  CHECK(out.find("restored to global step") == std::string::npos);
  auto progress = progress_steps(out);
  REQUIRE(!progress.empty());
  CHECK(progress.front() >= taken_at);
  // Worker 1 stayed in the job to its end, with the chief back in it.
  const auto& w1 = job->process("worker", 1).output();
  CHECK(w1.find("done after") != std::string::npos);
  CHECK(w1.find("whose global step is") == std::string::npos);
  CHECK(out.find("train done: mode=" + mode + " workers=2 ") != std::string::npos);
  auto final_step = final_global_step(out);
  REQUIRE(final_step);
  CHECK(*final_step >= steps);
  CHECK(*final_step <= (mode == "sync" ? steps : async_end_bound(steps, 2)));
  // The chief went on writing checkpoints: the job's last one is its end.
  CHECK(latest_step(ckpt_dir) == final_step);
  // An undisturbed run of these processes reaches 0.95 (trains_to_accuracy
  // in test_train_processes.cpp, at the default 30 epochs, about 670 steps;
  // the digits' MLP is near 0.97 from step 1000 on). Without the chief,
  // the job took worker 1's gradients only for a few hundred of the 2000
  // steps (sync: half a global batch per step): the same bound holds.
  auto acc = held_out_accuracy(out);
  REQUIRE(acc);
  CHECK(*acc >= 0.95);
}

} // namespace

// Each catches a chief that comes back to a running job and restores its
// live ps from the latest checkpoint (issue 22, 7): the job rolled back to
// the checkpoint's step, every update since was lost, and worker 1's next
// push was refused ("whose global step is ...") so that it exited 1 while
// the chief finished alone and said "train done".
TEST_CASE("a sync job's chief killed with SIGKILL and restarted takes the running job as it is, "
          "the ps keeps every update, every process exits 0, and the job reaches an undisturbed "
          "run's accuracy",
          "[train][processes][recovery]") {
  chief_killed_and_restarted("sync");
}

TEST_CASE("an async job's chief killed with SIGKILL and restarted takes the running job as it "
          "is, the ps keeps every update, every process exits 0, and the job reaches an "
          "undisturbed run's accuracy",
          "[train][processes][recovery]") {
  chief_killed_and_restarted("async");
}

// Catches a restarted chief that fails on a latest checkpoint it cannot
// read (here torn) although every ps is live and the job does not need it,
// and, as it failed, stopped the ps: the running job died with it (issue
// 22, 7).
TEST_CASE("a sync job's chief restarted over a latest checkpoint it cannot read takes the running "
          "job as it is without it, and every process exits 0",
          "[train][processes][recovery]") {
  chief_killed_and_restarted("sync", true);
}

// Catches a restarted chief that, failing because a ps lost its state and
// the checkpoint that would restore it cannot be read, stops the live ps
// too (or restores it, or gives the lost one its initial values): the live
// ps's state is the job's, for a chief started again once the checkpoint is
// fixed (issue 22, 7).
TEST_CASE("a restarted chief that finds one ps live and one without state, and a latest "
          "checkpoint it cannot read, fails naming the ps and leaves the live one as it is",
          "[train][processes][recovery]") {
  temp_dir dir;
  auto ckpt_dir = dir.path + "/ckpt";
  job_spec spec;
  spec.ps_tasks = 2;
  spec.train_table = "checkpoint_dir = \"" + ckpt_dir + "\"\n";
  spec.sets = {"checkpoint_steps=20", "steps=100000000"};
  auto job = train_job::start(dir.path, spec);
  if (!job->wait_until([&] { return latest_step(ckpt_dir) >= 40u; }, 30s))
    FAIL("no checkpoint of step >= 40 within 30 s:\n" << job->describe());
  job->chief().signal(SIGKILL);
  job->process("ps", 1).signal(SIGKILL);
  job->restart("ps", 1);
  auto damaged = *train::latest(ckpt_dir);
  fs::resize_file(damaged, fs::file_size(damaged) / 2);
  job->restart("worker", 0);
  auto code = job->chief().wait_exit(60s);
  const auto& out = job->chief().output();
  INFO(out);
  REQUIRE(code);
  CHECK(*code != 0);
  CHECK(out.find("/job:ps/task:1 lost its state and the job's latest checkpoint cannot be read")
        != std::string::npos);
  CHECK(out.find(damaged) != std::string::npos);
  CHECK(out.find("the running job (/job:ps/task:0 at global step ") != std::string::npos);
  CHECK(out.find("its ps tasks are left as they are") != std::string::npos);
  CHECK(out.find("took the running job") == std::string::npos);
  // ps 0 still holds the job: it answers --status after the chief's exit.
  auto status = job->client({"--status"}, 10s);
  INFO(status.output);
  CHECK(std::regex_search(status.output, std::regex{R"(/job:ps/task:0: mode sync, global step \d+)"}));
  CHECK(!job->process("ps", 0).exit_code());
}

// Catches a chief that stops every ps as it fails although the job was
// running before it came: here a second chief, started by mistake while the
// first still runs the job, is refused (the ps counts the first as worker
// 0), and stopped the ps of the healthy job on its way out (issue 22, 7).
TEST_CASE("a second chief started while the first still runs the job is refused and leaves the "
          "job's ps alone, the job finishes and every process of it exits 0",
          "[train][processes][recovery]") {
  temp_dir dir;
  job_spec spec;
  // The first chief is stopped (SIGSTOP) while the second one tries, so that
  // the job cannot end meanwhile (sync: no round closes without the chief);
  // connection_timeout_ms: the heartbeat does not drop it meanwhile.
  spec.train_table = "\n[node]\nconnection_timeout_ms = 120000\n";
  spec.sets = {"steps=1000", "log_every=50"};
  // At most 200 rounds/s: the job is seconds from its end when the chief
  // is stopped.
  spec.worker_args[1] = {"--step-delay-ms", "5"};
  auto job = train_job::start(dir.path, spec);
  if (!job->wait_until([&] { return last_progress_step(job->chief().output()) >= 50u; }, 30s))
    FAIL("the chief printed no progress of step >= 50 within 30 s:\n" << job->describe());
  job->chief().signal(SIGSTOP);
  // The same job's config but for worker 0's port: a second process of
  // worker 0 on this machine cannot bind the first one's.
  std::string config;
  {
    std::ifstream f{job->config()};
    std::stringstream ss;
    ss << f.rdbuf();
    config = ss.str();
  }
  auto at = config.find("worker = [\"127.0.0.1:");
  REQUIRE(at != std::string::npos);
  at += std::strlen("worker = [\"127.0.0.1:");
  auto end = config.find('"', at);
  REQUIRE(end != std::string::npos);
  config.replace(at, end - at, std::to_string(free_loopback_port()));
  auto second_config = dir.path + "/second-chief.toml";
  std::ofstream{second_config} << config;
  std::vector<std::string> argv{ACTORFLOW_TRAIN_BINARY, "--config", second_config, "--job",
                                "worker", "--task", "0"};
  for (const auto& kv : spec.sets) {
    argv.push_back("--set");
    argv.push_back(kv);
  }
  // It waits this long for the ps to see the first chief gone.
  argv.push_back("--set");
  argv.push_back("init_timeout_ms=2000");
  background_process second{argv};
  auto ended = job->wait_until(
    [&] {
      second.read_output(0ms);
      return second.exit_code().has_value();
    },
    60s);
  second.read_output(0ms);
  INFO("the second chief:\n" << second.output());
  job->chief().signal(SIGCONT);
  if (!ended) {
    second.signal(SIGKILL);
    FAIL("the second chief did not exit within 60 s:\n" << job->describe());
  }
  CHECK(*second.exit_code() != 0);
  CHECK(second.output().find("is another chief of this job running? Stop it")
        != std::string::npos);
  CHECK(second.output().find("the job was running before this chief started: its ps tasks are "
                             "left as they are")
        != std::string::npos);
  check_all_exit_0(*job, 60s);
  const auto& out = job->chief().output();
  INFO(out);
  CHECK(out.find("train done: mode=sync workers=2 ") != std::string::npos);
  CHECK(final_global_step(out) == 1000u);
}

} // namespace af::testing
