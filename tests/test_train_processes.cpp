// actorflow-train as a user runs it: one process per task of a between-graph
// job (a ps and two workers; allreduce: two workers), on free loopback ports,
// killed with SIGKILL, stopped with SIGSTOP, restarted from its checkpoints.
// Every wait is bounded and waits on output lines, files or exits. The job
// harness is tests/train_job.hpp.
#define CATCH_CONFIG_ENABLE_OPTIONAL_STRINGMAKER
#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "net/data_plane.hpp"
#include "messages/error.hpp"
#include "train/checkpoint.hpp"
#include "train_job.hpp"

using namespace std::chrono_literals;

namespace af::testing {

namespace {

/// The step of the checkpoint DIR/latest names; nullopt if there is none yet.
std::optional<uint64_t> latest_checkpoint_step(const std::string& dir) {
  auto path = train::latest(dir);
  if (!path || path->empty())
    return std::nullopt;
  static const std::regex re{R"(ckpt-(\d+)\.afck$)"};
  std::smatch m;
  if (!std::regex_search(*path, m, re))
    return std::nullopt;
  return std::stoull(m[1].str());
}

std::string latest_checkpoint(const std::string& dir) {
  auto path = train::latest(dir);
  if (!path)
    FAIL("train::latest(" << dir << "): " << path.error().what);
  return *path;
}

train::checkpoint load_checkpoint(const std::string& path) {
  auto ck = train::load(path);
  if (!ck)
    FAIL("train::load(" << path << "): " << ck.error().what);
  return std::move(*ck);
}

/// Trains the digits in `mode` across processes and checks the job's end.
void trains_to_accuracy(const std::string& mode) {
  temp_dir dir;
  auto start = clock_type::now();
  auto job = train_job::start(dir.path, mode != "allreduce", {"mode=" + mode});
  auto still_running = job->wait_all_exit(25s);
  INFO(job->describe());
  INFO("took " << std::chrono::duration<double>(clock_type::now() - start).count() << " s");
  CHECK(still_running.empty());
  for (const auto& t : job->tasks()) {
    INFO(t.name());
    CHECK(t.process->exit_code() == 0);
  }
  const auto& out = job->chief().output();
  CHECK(out.find("train done: mode=" + mode + " workers=2 ") != std::string::npos);
  auto acc = held_out_accuracy(out);
  REQUIRE(acc);
  CHECK(*acc >= 0.95);
  // Without [security] every task says once that its ports are plaintext
  // (README "Security"; actorflow-train's tasks said nothing).
  for (const auto& t : job->tasks()) {
    INFO(t.name());
    CHECK(t.process->output().find("no TLS ([security] names no certificate): both ports are unauthenticated") != std::string::npos);
  }
}

} // namespace

// Each catches: a mode that does not learn across processes (gradients lost or
// applied twice on the way through the data plane), a chief that does not
// stop the ps (the ps never exits), a worker that hangs or fails at the end.
TEST_CASE("sync training of the digits across a ps and two worker processes reaches 0.95 "
          "held-out accuracy and every process exits 0",
          "[train][processes]") {
  trains_to_accuracy("sync");
}

// Catches a secured task that goes plaintext somewhere: its node published
// without TLS, an in-process session, or a worker's or the chief's own data
// channels (pushes, in-graph shards) opened without the process's context. A
// TLS peer refuses each of those, so the job would not train.
TEST_CASE("sync training across processes with [security] runs over mutual TLS and reaches "
          "0.95 held-out accuracy",
          "[train][processes][security]") {
  temp_dir dir;
  {
    // Certificates for the task names the job will have, all on 127.0.0.1.
    std::ofstream f{dir.path + "/names.toml"};
    f << "[cluster]\nps = [\"127.0.0.1:1\"]\nworker = [\"127.0.0.1:2\", \"127.0.0.1:3\"]\n";
  }
  auto made = run_command({ACTORFLOW_CERTS_BINARY, "--config", dir.path + "/names.toml"}, 60s);
  INFO(made.output);
  REQUIRE(made.exit_code == 0);
  job_spec spec;
  spec.sets = {"mode=sync"};
  spec.train_table = "\n[security]\nca = \"" + dir.path + "/certs/ca.pem\"\ncertificate = \""
                     + dir.path + "/certs/{name}.pem\"\nkey = \"" + dir.path + "/certs/{name}.key\"\n";
  auto job = train_job::start(dir.path, spec);
  auto still_running = job->wait_all_exit(40s);
  INFO(job->describe());
  CHECK(still_running.empty());
  for (const auto& t : job->tasks()) {
    INFO(t.name());
    CHECK(t.process->exit_code() == 0);
  }
  auto acc = held_out_accuracy(job->chief().output());
  REQUIRE(acc);
  CHECK(*acc >= 0.95);
  for (const auto& t : job->tasks())
    CHECK(t.process->output().find("both ports are unauthenticated") == std::string::npos);
}

// Catches: a data-plane push that claims a worker's index without the token
// that worker joined with being taken (one push 10^30 times the others'
// destroyed the model, the real worker's push of that step was refused, it
// exited 1, and the chief still printed `train done ... workers=2`).
TEST_CASE("a forged push claiming worker 1's index during a sync job is refused and logged with "
          "its peer, and the job trains to 0.95 with every process exiting 0",
          "[train][processes][members]") {
  temp_dir dir;
  job_spec spec;
  spec.sets = {"mode=sync", "log_every=10", "eval_every=0"};
  // Paced (at most ~100 steps/s): the job is still running when the forger comes.
  for (int w = 0; w < 2; ++w)
    spec.worker_args[w] = {"--step-delay-ms", "10"};
  auto job = train_job::start(dir.path, spec);
  if (!job->wait_until([&] { return last_progress_step(job->chief().output()).has_value(); }, 20s))
    FAIL("no progress line from the chief within 20 s:\n" << job->describe());
  std::smatch port_match;
  const auto ps_out = job->process("ps", 0).output();
  static const std::regex port_re{R"(data plane port (\d+))"};
  REQUIRE(std::regex_search(ps_out, port_match, port_re));
  auto port = static_cast<uint16_t>(std::stoul(port_match[1].str()));
  auto ch = data_channel::connect("127.0.0.1", port, "ps 0's data plane", 10s);
  INFO((ch ? std::string{} : describe(ch.error())));
  REQUIRE(ch);
  // A pull says the size and the step (a pull speaks for nobody), then a
  // push of that size and step as worker 1, with a token of its own.
  auto pulled = (*ch)->aggregate(wire::kind::pull, "train/ps0", 1, 0, {}, 10s);
  REQUIRE(pulled);
  auto n = static_cast<int64_t>(pulled->second.num_elements());
  for (int i = 0; i < 3; ++i) {
    auto r = (*ch)->aggregate(wire::kind::push, "train/ps0", 1, pulled->first,
                              {tensor::filled(dtype::float32, {n}, 1e30f)}, 10s,
                              std::string(16, '\x5a'), 1 + i);
    REQUIRE_FALSE(r);
    CHECK(is(r.error(), af_error::invalid_argument));
    CHECK_THAT(describe(r.error()), Catch::Contains("worker 1") && Catch::Contains("token"));
  }
  auto still_running = job->wait_all_exit(60s);
  INFO(job->describe());
  CHECK(still_running.empty());
  for (const auto& t : job->tasks()) {
    INFO(t.name());
    CHECK(t.process->exit_code() == 0);
  }
  const auto& out = job->chief().output();
  CHECK(out.find("train done: mode=sync workers=2 ") != std::string::npos);
  auto acc = held_out_accuracy(out);
  REQUIRE(acc);
  CHECK(*acc >= 0.95);
  CHECK_THAT(job->process("ps", 0).output(),
             Catch::Contains("refused a push for worker 1")
               && Catch::Contains("from data-plane peer 127.0.0.1:"));
}

TEST_CASE("async training of the digits across a ps and two worker processes reaches 0.95 "
          "held-out accuracy and every process exits 0",
          "[train][processes]") {
  trains_to_accuracy("async");
}

TEST_CASE("model averaging of the digits across a ps and two worker processes reaches 0.95 "
          "held-out accuracy and every process exits 0",
          "[train][processes]") {
  trains_to_accuracy("average");
}

TEST_CASE("allreduce training of the digits across two worker processes and no ps reaches 0.95 "
          "held-out accuracy and both exit 0",
          "[train][processes]") {
  trains_to_accuracy("allreduce");
}

// Catches an async aggregator that waits for every worker like sync does (the
// chief's step would freeze until step_timeout_ms, 30 s), a worker that fails
// after it was stopped for a while, and a progress line without staleness.
TEST_CASE("async training goes on while one worker process is stopped, and that worker "
          "finishes after SIGCONT",
          "[train][processes]") {
  temp_dir dir;
  auto job = train_job::start(dir.path, true, {"mode=async", "steps=3000", "log_every=100"});
  if (!job->wait_until([&] { return last_progress_step(job->chief().output()).has_value(); }, 20s))
    FAIL("no progress line from the chief within 20 s:\n" << job->describe());
  job->process("worker", 1).signal(SIGSTOP);
  REQUIRE(!job->process("worker", 1).exit_code()); // stopped, not dead
  auto stopped_at = *last_progress_step(job->chief().output());
  // Three more progress lines' worth of global steps, from the chief alone.
  auto moved = job->wait_until(
    [&] { return *last_progress_step(job->chief().output()) >= stopped_at + 300; }, 10s);
  auto reached = *last_progress_step(job->chief().output());
  job->process("worker", 1).signal(SIGCONT);
  INFO("worker 1 stopped at global step " << stopped_at << "; the chief reached " << reached
                                          << " while it was stopped");
  CHECK(moved);
  auto still_running = job->wait_all_exit(25s);
  INFO(job->describe());
  CHECK(still_running.empty());
  for (const auto& t : job->tasks()) {
    INFO(t.name());
    CHECK(t.process->exit_code() == 0);
  }
  // Two workers interleave: gradients computed from parameters the other
  // worker had moved on from were applied (staleness > 0) and counted.
  auto staleness = last_staleness(job->chief().output());
  REQUIRE(staleness);
  uint64_t applied = 0, stale = 0;
  for (const auto& [s, n] : staleness->histogram) {
    applied += n;
    if (s > 0)
      stale += n;
  }
  INFO("staleness median " << staleness->median << " max " << staleness->max << ", " << stale
                           << " of " << applied << " gradients stale");
  CHECK(applied >= 3000u - 100u); // the chief's last report is within log_every of the end
  CHECK(stale > 0);
  CHECK(staleness->max > 0);
  CHECK(staleness->histogram.count(staleness->max) == 1);
  CHECK(staleness->median <= staleness->max);
  // async stops within workers - 1 = 1 step of the count (docs/training.md)
  auto final_step = final_global_step(job->chief().output());
  CHECK(final_step >= 3000u);
  CHECK(final_step <= 3001u);
}

// Catches a restore that loses the optimizer's slots (momentum restarts at 0)
// or rounds values, a chief that trains past the restored step or restarts
// its count at 0, and a restore that reads something other than DIR/latest.
TEST_CASE("a job killed with SIGKILL resumes from its latest checkpoint with bit-identical "
          "values and slots, and counts on from its global step",
          "[train][processes]") {
  temp_dir dir;
  auto ckpt_dir = dir.path + "/ckpt";
  // In the file, not in --set: --set takes a bare word as a string only when
  // it has no digit, and mkdtemp's part of the path may have some.
  auto table = "checkpoint_dir = \"" + ckpt_dir + "\"\n";
  std::vector<std::string> common{"optimizer=momentum", "checkpoint_steps=20"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), common.begin(), common.end());
    return more;
  };

  // Far more steps than it can run before the kill: the kill always lands
  // mid-training, however fast this machine is.
  {
    auto job = train_job::start(dir.path, true, with({"steps=1000000"}), table);
    if (!job->wait_until([&] { return latest_checkpoint_step(ckpt_dir) >= 40u; }, 20s))
      FAIL("no checkpoint of step >= 40 named by " << ckpt_dir << "/latest within 20 s:\n"
                                                   << job->describe());
    job->kill_all();
  }
  // Read it after the kill: the chief may have written one more meanwhile.
  auto path = latest_checkpoint(ckpt_dir);
  auto before = load_checkpoint(path);
  auto g = before.global_step;
  INFO("restoring " << path << " (global step " << g << ")");
  REQUIRE(g >= 40);
  CHECK(g % 20 == 0);
  struct stat st_before {};
  REQUIRE(::stat(path.c_str(), &st_before) == 0);

  // steps = G: nothing trains after the restore, so the checkpoint written at
  // the end must be the restored state itself.
  {
    auto job = train_job::start(dir.path, true, with({"steps=" + std::to_string(g)}), table);
    auto still_running = job->wait_all_exit(25s);
    INFO(job->describe());
    CHECK(still_running.empty());
    for (const auto& t : job->tasks()) {
      INFO(t.name());
      CHECK(t.process->exit_code() == 0);
    }
    const auto& out = job->chief().output();
    CHECK(out.find("restoring " + path + " (global step " + std::to_string(g) + ")")
          != std::string::npos);
    CHECK(final_global_step(out) == g);
    CHECK(out.find("checkpoint: " + path) != std::string::npos);
  }
  auto after_path = latest_checkpoint(ckpt_dir);
  REQUIRE(after_path == path);
  // Written anew (renamed into place), not the file from before left alone.
  struct stat st_after {};
  REQUIRE(::stat(path.c_str(), &st_after) == 0);
  CHECK(st_after.st_ino != st_before.st_ino);
  auto after = load_checkpoint(path);
  CHECK(after.global_step == g);
  CHECK(after.data_position == before.data_position);
  REQUIRE(after.variables.size() == before.variables.size());
  for (size_t i = 0; i < before.variables.size(); ++i) {
    const auto& b = before.variables[i];
    const auto& a = after.variables[i];
    INFO("variable '" << b.name << "'");
    CHECK(a.name == b.name);
    CHECK(a.value == b.value);
    CHECK(!b.slots.empty()); // momentum has a slot per variable
    REQUIRE(a.slots.size() == b.slots.size());
    for (const auto& [slot, t] : b.slots) {
      INFO("slot '" << slot << "'");
      REQUIRE(a.slots.count(slot) == 1);
      CHECK(a.slots.at(slot) == t);
    }
  }

  // steps = G + 20: trains 20 more global steps, counting on from G.
  {
    auto job = train_job::start(dir.path, true, with({"steps=" + std::to_string(g + 20)}),
                                table);
    auto still_running = job->wait_all_exit(25s);
    INFO(job->describe());
    CHECK(still_running.empty());
    for (const auto& t : job->tasks()) {
      INFO(t.name());
      CHECK(t.process->exit_code() == 0);
    }
    const auto& out = job->chief().output();
    CHECK(out.find("restoring " + path + " (global step " + std::to_string(g) + ")")
          != std::string::npos);
    CHECK(final_global_step(out) == g + 20);
    CHECK(latest_checkpoint_step(ckpt_dir) == g + 20);
  }
}

// Catches a chief that starts from fresh weights over a damaged checkpoint
// (silently losing the job's progress) or fails without saying which file.
TEST_CASE("a truncated latest checkpoint is refused with its name, and the job does not start",
          "[train][processes]") {
  temp_dir dir;
  auto ckpt_dir = dir.path + "/ckpt";
  auto table = "checkpoint_dir = \"" + ckpt_dir + "\"\n";
  std::vector<std::string> sets{"checkpoint_steps=20", "steps=40",
                                // worker 1 waits this long for the chief's initialization
                                "init_timeout_ms=3000"};
  {
    auto job = train_job::start(dir.path, true, sets, table);
    auto still_running = job->wait_all_exit(25s);
    INFO(job->describe());
    REQUIRE(still_running.empty());
    REQUIRE(job->chief().exit_code() == 0);
  }
  auto path = latest_checkpoint(ckpt_dir);
  REQUIRE(!path.empty());
  fs::resize_file(path, fs::file_size(path) / 2);

  auto job = train_job::start(dir.path, true, sets, table);
  auto chief_exit = job->chief().wait_exit(20s);
  INFO(job->describe());
  REQUIRE(chief_exit);
  CHECK(*chief_exit != 0);
  CHECK(job->chief().output().find(path) != std::string::npos);
  CHECK(job->chief().output().find("train done") == std::string::npos);
  // The others end too: the ps when the failing chief tells it, worker 1
  // after init_timeout_ms (3 s) of waiting for the chief's restore.
  auto left = job->wait_all_exit(15s);
  CHECK(left.empty());
}

// Catches a typo in a config that is silently ignored (training with the
// default instead), and the wrong exit code for a bad config.
TEST_CASE("an unknown [train] key makes actorflow-train exit 2 naming the key",
          "[train][processes]") {
  temp_dir dir;
  auto config = dir.path + "/typo.toml";
  std::ofstream{config} << "[cluster]\nps = [\"127.0.0.1:1\"]\nworker = [\"127.0.0.1:2\"]\n\n"
                           "[train]\nlearning_rat = 0.05\n";
  SECTION("in the config file") {
    auto r = run_command({ACTORFLOW_TRAIN_BINARY, "--config", config, "--job", "worker", "--task",
                          "0"},
                         30s);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("learning_rat") != std::string::npos);
  }
  SECTION("in a --set override") {
    auto r = run_command({ACTORFLOW_TRAIN_BINARY, "--set", "learning_rat=0.05"}, 30s);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("learning_rat") != std::string::npos);
  }
}


// Catches a ps left serving forever after its chief was SIGKILLed (nobody
// else ever stops it): it must give up by itself, non-zero, naming the chief.
TEST_CASE("a ps whose chief is killed with SIGKILL stops by itself, naming the chief",
          "[train][processes]") {
  temp_dir dir;
  std::vector<std::string> sets{"steps=100000000", "log_every=100", "init_timeout_ms=2000",
                                "step_timeout_ms=2000"};
  auto job = train_job::start(dir.path, true, sets);
  REQUIRE(job);
  REQUIRE(job->wait_until([&] { return last_progress_step(job->chief().output()).has_value(); },
                          20s));
  job->chief().signal(SIGKILL);
  auto& ps = job->process("ps", 0);
  auto code = ps.wait_exit(20s);
  INFO(job->describe());
  REQUIRE(code);
  CHECK(*code != 0);
  CHECK(ps.output().find("/job:worker/task:0 has not answered") != std::string::npos);
}


// Catches an all-reduce ring that stays on plain TCP between worker processes
// of one host, and a [security] job whose TCP ring (shared memory off) does
// not say that its gradients go unencrypted (docs/security.md).
TEST_CASE("allreduce workers with [security] say how their ring moves: shared memory on one host, "
          "and a warning that TCP has no TLS when shared memory is off",
          "[train][processes][security]") {
  for (bool shm : {true, false}) {
    INFO((shm ? "shared memory" : "ACTORFLOW_DATA_SHM=off"));
    const char* before = std::getenv("ACTORFLOW_DATA_SHM");
    std::string was = before != nullptr ? before : "";
    if (shm)
      unsetenv("ACTORFLOW_DATA_SHM");
    else
      setenv("ACTORFLOW_DATA_SHM", "off", 1); // the tasks inherit it
    temp_dir dir;
    job_spec spec;
    spec.with_ps = false;
    spec.secure = true;
    spec.sets = {"mode=allreduce", "steps=50"};
    auto job = train_job::start(dir.path, spec);
    auto still_running = job->wait_all_exit(40s);
    if (before != nullptr)
      setenv("ACTORFLOW_DATA_SHM", was.c_str(), 1);
    else
      unsetenv("ACTORFLOW_DATA_SHM");
    INFO(job->describe());
    CHECK(still_running.empty());
    for (const auto& t : job->tasks()) {
      INFO(t.name());
      CHECK(t.process->exit_code() == 0);
      const auto& out = t.process->output();
      auto warned = out.find("[security] is set, but the all-reduce ring has no TLS")
                    != std::string::npos;
      if (shm) {
        CHECK(out.find("all-reduce ring: shared memory to and from rank") != std::string::npos);
        CHECK_FALSE(warned);
      } else {
        CHECK(warned);
        CHECK(out.find("TCP (ACTORFLOW_DATA_SHM=off here)") != std::string::npos);
      }
    }
  }
}

} // namespace af::testing
