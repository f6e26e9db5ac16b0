// Linked into actorflow-train-pausing (tests/CMakeLists.txt): actorflow-train
// itself (programs/train_main.cpp) plus this file, whose initializer installs
// a checkpoint write hook (train/checkpoint.hpp) before main runs. With
// ACTORFLOW_TEST_CHECKPOINT_PAUSE=STEP in its environment, the write of a
// checkpoint of global step >= STEP stops for a minute halfway through (the
// first half written and fsynced, a line on stderr saying so), so that a test
// (tests/test_train_faults.cpp) can kill the process in the middle of a write
// deterministically. With ACTORFLOW_TEST_SETUP_PAUSE=TASK:PATH, the first
// set-up of sparse worker TASK (dist/sparse_job.hpp's set-up hook: its tables
// initialized or waited for, no aggregator joined yet) waits until PATH exists
// (at most 60 s), a line on stderr saying so, so that a test
// (tests/test_sparse_faults.cpp) can kill a ps while that worker sets up. The
// library reads no such variable: only this program does.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <filesystem>

#include "dist/sparse_job.hpp"
#include "train/checkpoint.hpp"

namespace {

/// The STEP of ACTORFLOW_TEST_CHECKPOINT_PAUSE; none if unset or not a number.
bool pause_at(uint64_t global_step) {
  const char* v = std::getenv("ACTORFLOW_TEST_CHECKPOINT_PAUSE");
  if (!v || !*v)
    return false;
  char* end = nullptr;
  auto from = std::strtoull(v, &end, 10);
  return end && *end == 0 && global_step >= from;
}

void pause_halfway(uint64_t global_step, const std::string& tmp_path, size_t written,
                   size_t total) {
  if (!pause_at(global_step))
    return;
  std::fprintf(stderr,
               "checkpoint: test pause (ACTORFLOW_TEST_CHECKPOINT_PAUSE) halfway through "
               "writing %s (%zu of %zu bytes written); resuming in 60 s\n",
               tmp_path.c_str(), written, total);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

/// ACTORFLOW_TEST_SETUP_PAUSE's TASK:PATH: the first set-up of `task`
/// waits for PATH.
void pause_set_up(uint32_t task, uint32_t pass) {
  const char* v = std::getenv("ACTORFLOW_TEST_SETUP_PAUSE");
  if (!v || !*v || pass != 1)
    return;
  std::string spec{v};
  auto colon = spec.find(':');
  if (colon == std::string::npos || spec.substr(0, colon) != std::to_string(task))
    return;
  auto path = spec.substr(colon + 1);
  std::fprintf(stderr, "set-up: test pause (ACTORFLOW_TEST_SETUP_PAUSE) of worker %u until %s "
                       "exists\n", task, path.c_str());
  std::fflush(stderr);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

[[maybe_unused]] const bool installed = [] {
  af::train::set_checkpoint_write_hook(&pause_halfway);
  af::set_sparse_set_up_hook(&pause_set_up);
  return true;
}();

} // namespace
