// A ps of a between-graph sparse job (dist/sparse_job.hpp) killed with
// SIGKILL: real actorflow-train processes, one per task (tests/train_job.hpp).
#include <catch2/catch.hpp>

#include <signal.h>

#include <chrono>
#include <regex>
#include <string>

#include "train_job.hpp"

using namespace std::chrono_literals;

namespace af::testing {

namespace {

/// The [train] table of a small recommender job that checkpoints into `ck`
/// every 50 steps, running `steps` global steps.
std::string sparse_table(const std::string& ck, uint64_t steps) {
  return "model = \"recommender\"\ndata = \"synthetic\"\nmode = \"sync\"\nusers = 400\nitems = 200\ndim = 4\n"
         "synthetic_examples = 40000\nbatch_size = 64\noptimizer = \"sgd\"\n"
         "learning_rate = 0.5\nlog_every = 10\ninit_timeout_ms = 3000\n"
         "step_timeout_ms = 3000\ncheckpoint_steps = 50\ncheckpoint_dir = \""
         + ck + "\"\nsteps = " + std::to_string(steps) + "\n";
}

/// The step of the last "checkpoint: global step S" line of the chief.
std::optional<uint64_t> last_checkpoint_step(const std::string& out) {
  static const std::regex re{R"(checkpoint: global step (\d+))"};
  std::optional<uint64_t> found;
  for (std::sregex_iterator it{out.begin(), out.end(), re}, end; it != end; ++it)
    found = std::stoull((*it)[1].str());
  return found;
}

} // namespace

TEST_CASE("a ps of a sparse job killed with SIGKILL ends every task within a bounded time, "
          "naming the ps, and the job started again resumes from its checkpoint",
          "[sparse_job][processes][sparse_checkpoint]") {
  // Catches: workers (or the other ps) left waiting for ever on a dead
  // ps, an error that does not say which ps, and a job started again
  // that does not restore the last checkpoint.
  temp_dir dir;
  auto ck = dir.path + "/ck";
  job_spec spec;
  spec.ps_tasks = 2;
  spec.workers = 2;
  spec.train_table = sparse_table(ck, 100000000);
  auto job = train_job::start(dir.path, spec);
  auto saved = [&] { return last_checkpoint_step(job->chief().output()).has_value(); };
  if (!job->wait_until(saved, 60s))
    FAIL("no checkpoint within 60 s:\n" << job->describe());
  auto killed_after = *last_checkpoint_step(job->chief().output());
  job->process("ps", 1).signal(SIGKILL);
  // Every task ends by itself: the workers' next push or read fails, the
  // chief stops ps 0 (the step and init timeouts are 3 s).
  auto left = job->wait_all_exit(30s);
  INFO(job->describe());
  CHECK(left.empty());
  CHECK(job->chief().exit_code() != 0);
  CHECK(job->process("worker", 1).exit_code() != 0);
  CHECK(job->chief().output().find("/job:ps/task:1") != std::string::npos);

  // Started again, over 3 ps: it restores the latest checkpoint (at or
  // after the one seen before the kill) and runs to its end.
  job_spec again = spec;
  again.ps_tasks = 3;
  auto last = *last_checkpoint_step(job->chief().output());
  again.train_table = sparse_table(ck, last + 30);
  auto job2 = train_job::start(dir.path, again);
  auto done = job2->wait_all_exit(60s);
  INFO(job2->describe());
  CHECK(done.empty());
  CHECK(job2->chief().exit_code() == 0);
  const auto& out = job2->chief().output();
  CHECK(last >= killed_after);
  CHECK(out.find("restored the checkpoint of global step " + std::to_string(last))
        != std::string::npos);
  CHECK(last_checkpoint_step(out) == last + 30);
}

} // namespace af::testing
