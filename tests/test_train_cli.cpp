// actorflow-train as a user runs it: what it refuses before it trains, how
// often it says why it stops, and its exit status. Each case names the bug it
// is there to catch.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "train/checkpoint.hpp"

#include "program_run.hpp"

namespace fs = std::filesystem;

namespace {

using af::test::run_result;
using af::test::slurp;

/// af::test::scratch_dir named after this file.
struct scratch_dir : af::test::scratch_dir {
  scratch_dir() : af::test::scratch_dir("train-cli") {}
};

/// Runs actorflow-train with `args` and waits for it to exit; `prefix`:
/// shell text before it ("ulimit -v N; ", "timeout 30 ").
run_result train(const scratch_dir& dir, const std::vector<std::string>& args,
                 const std::string& prefix = "") {
  return af::test::run_program(dir, ACTORFLOW_TRAIN_BINARY, args, prefix);
}

size_t occurrences(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
    ++n;
  return n;
}

} // namespace

TEST_CASE("actorflow-train refuses a checkpoint_dir it cannot write before it trains, once",
          "[train][cli]") {
  // Catches: an unwritable checkpoint_dir found only at the first checkpoint
  // (after the cluster started and trained), and the reason printed twice.
  scratch_dir dir;
  std::ofstream{dir / "file"} << "x";
  auto ckpt = dir / "file/ckpt";
  auto r = train(dir, {"--set", "checkpoint_dir=" + ckpt, "--set", "steps=5"});
  CAPTURE(r.out, r.err);
  CHECK(r.status == 2);
  CHECK(occurrences(r.err, "checkpoint_dir '" + ckpt + "'") == 1);
  CHECK(r.out.find("embedded cluster") == std::string::npos); // nothing was started
}

TEST_CASE("actorflow-train refuses a metrics file it cannot open before it trains",
          "[train][cli]") {
  // Catches: the metrics path found bad only after the job started.
  scratch_dir dir;
  std::ofstream{dir / "file"} << "x";
  auto metrics = dir / "file/m.csv";
  auto r = train(dir, {"--set", "metrics=" + metrics, "--set", "steps=5"});
  CAPTURE(r.out, r.err);
  CHECK(r.status == 2);
  CHECK(occurrences(r.err, "metrics file '" + metrics + "'") == 1);
  CHECK(r.out.find("embedded cluster") == std::string::npos);
}

TEST_CASE("a worker's failure is printed once, with its reason, and the exit status is 1",
          "[train][cli]") {
  // Catches: main logging the failure and printing it again, two lines with
  // the same reason.
  scratch_dir dir;
  auto missing = dir / "missing.csv";
  auto r = train(dir, {"--set", "data=csv:" + missing, "--set", "steps=5"});
  CAPTURE(r.out, r.err);
  CHECK(r.status == 1);
  CHECK(occurrences(r.err, missing) == 1);
}

TEST_CASE("a bad --set value is printed once, naming the key, the value and the type",
          "[train][cli]") {
  // Catches: a TOML parser's message for hidden=64,x, printed twice.
  scratch_dir dir;
  auto r = train(dir, {"--set", "hidden=64,x"});
  CAPTURE(r.err);
  CHECK(r.status == 2);
  CHECK(occurrences(r.err, "--set hidden=64,x") == 1);
  CHECK(occurrences(r.err, "hidden=[64,64]") == 1);
}

TEST_CASE("a final checkpoint that fails makes actorflow-train exit 1", "[train][cli]") {
  // Catches: the worker logging a failed checkpoint and the job still ending
  // with status 0, its state unsaved. The checkpoint file's name is taken by a
  // non-empty directory, so the rename that publishes it fails (as root too).
  // sync: the chief's last save; average: the worker actor's, which logs a
  // failure and trains on.
  for (std::string mode : {"sync", "average"}) {
    CAPTURE(mode);
    scratch_dir dir;
    auto ckpt = dir / "ckpt";
    fs::create_directories(ckpt + "/ckpt-20.afck/in-the-way");
    auto r = train(dir, {"--set", "mode=" + mode, "--set", "checkpoint_dir=" + ckpt, "--set",
                         "steps=20", "--set", "eval_every=0", "--set", "log_every=0"});
    CAPTURE(r.out, r.err);
    CHECK(r.status == 1);
    CHECK(occurrences(r.err, "ckpt-20.afck") == 1); // the reason, once
  }
}

namespace {

/// The names in `dir` and what 'latest' says: what a refused run must leave as it was.
std::string listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names)
    out += n + "\n";
  return out + "latest: " + slurp(dir + "/latest");
}

/// The latest checkpoint of `dir`, loaded (with `key`).
af::train::checkpoint latest_of(const std::string& dir, const std::string& key = {}) {
  auto path = af::train::latest(dir);
  REQUIRE(path);
  REQUIRE(!path->empty());
  auto ck = af::train::load(*path, key);
  REQUIRE(ck);
  return std::move(*ck);
}

/// The arguments of an embedded job of `steps` steps that checkpoints into
/// `ckpt`, with `more` --set overrides. init_timeout_ms = 10 s: the other
/// workers hear at once that the chief could not restore; if that broke, a
/// run would still end within 10 s, not the default minute.
std::vector<std::string> job(const std::string& ckpt, uint64_t steps,
                             std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"--set", "checkpoint_dir=" + ckpt, "--set",
                                   "steps=" + std::to_string(steps), "--set", "eval_every=0",
                                   "--set", "log_every=0", "--set", "init_timeout_ms=10000"};
  for (auto& m : more) {
    args.push_back("--set");
    args.push_back(std::move(m));
  }
  return args;
}

} // namespace

TEST_CASE("a checkpoint of NaN weights or of global step 2^64 - 1 is not restored, exit 1, the "
          "file and the field named, nothing trained or written",
          "[train][cli]") {
  // Catches what a forger who recomputes the checksum did: NaN weights
  // restored (every step refused, then "train done", exit 0, and a new
  // checkpoint of NaN), and global_step = data_position = 2^64 - 1 accepted
  // (the job ended at once and wrote ckpt-18446744073709551615.afck).
  struct bad_case {
    std::string what;
    std::function<void(af::train::checkpoint&)> change;
    std::vector<std::string> said;
  };
  std::vector<bad_case> cases = {
    {"NaN weights",
     [](af::train::checkpoint& ck) {
       ck.variables[0].value.mutable_data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
     },
     {"element 7 is nan", "not finite"}},
    {"global step 2^64 - 1",
     [](af::train::checkpoint& ck) {
       ck.global_step = std::numeric_limits<uint64_t>::max();
       ck.data_position = std::numeric_limits<uint64_t>::max();
     },
     {"global_step = 18446744073709551615"}},
  };
  for (const auto& bc : cases) {
    CAPTURE(bc.what);
    scratch_dir dir;
    auto ckpt = dir / "ckpt";
    auto first = train(dir, job(ckpt, 5));
    CAPTURE(first.out, first.err);
    REQUIRE(first.status == 0);
    auto ck = latest_of(ckpt);
    REQUIRE(ck.global_step == 5);
    bc.change(ck);
    auto forged = af::train::save(ckpt, ck); // a checksum anyone can compute
    REQUIRE(forged);
    auto before = listing(ckpt);
    auto r = train(dir, job(ckpt, 20));
    CAPTURE(r.out, r.err);
    CHECK(r.status == 1);
    // Refused as it is restored (not only when the chief would save it again).
    CHECK(r.err.find("checkpoint '" + *forged + "' ") != std::string::npos);
    if (bc.what == "NaN weights")
      CHECK(r.err.find("checkpoint '" + *forged + "' holds variable '" + ck.variables[0].name
                       + "'")
            != std::string::npos);
    for (const auto& part : bc.said) {
      CAPTURE(part);
      CHECK(r.err.find(part) != std::string::npos);
    }
    CHECK(listing(ckpt) == before); // no checkpoint written (ckpt-20.afck of NaN, or ckpt-2^64-1)
    CHECK(r.out.find("train done") == std::string::npos);
  }
}

TEST_CASE("with checkpoint_key, actorflow-train signs its checkpoints, resumes from them, and "
          "refuses one without a valid HMAC",
          "[train][cli]") {
  // Catches: a key that signs nothing (the files carry no HMAC), a signed
  // checkpoint the job cannot resume from, and one written by someone without
  // the key (none, or another) restored.
  scratch_dir dir;
  auto ckpt = dir / "ckpt";
  auto key_file = dir / "ckpt.key";
  const std::string key = "5f0c2b7e9a1d4c3b8e6f0a2d4c6b8e0f\n";
  std::ofstream{key_file} << key;
  auto first = train(dir, job(ckpt, 5, {"checkpoint_key=" + key_file}));
  CAPTURE(first.out, first.err);
  REQUIRE(first.status == 0);
  auto written = af::train::latest(ckpt);
  REQUIRE(written);
  CHECK(slurp(*written)[12] == 1); // the header's flags: an HMAC follows the body
  CHECK_FALSE(af::train::load(*written, "another key, 32 bytes long......"));
  auto resumed = train(dir, job(ckpt, 8, {"checkpoint_key=" + key_file}));
  CAPTURE(resumed.out, resumed.err);
  REQUIRE(resumed.status == 0);
  auto ck = latest_of(ckpt, key);
  CHECK(ck.global_step == 8);
  // Someone who can write the directory but has not the key: their file
  // (finite values, a fine step, a right checksum) is not restored.
  ck.variables[0].value.mutable_data<float>()[0] += 1;
  for (std::string forger_key : {std::string{}, std::string{"a key that is not the job's one"}}) {
    CAPTURE(forger_key);
    auto forged = af::train::save(ckpt, ck, 3, forger_key);
    REQUIRE(forged);
    auto r = train(dir, job(ckpt, 12, {"checkpoint_key=" + key_file}));
    CAPTURE(r.out, r.err);
    CHECK(r.status == 1);
    CHECK(r.err.find(*forged) != std::string::npos);
    CHECK(r.err.find(forger_key.empty() ? "has no HMAC" : "fails its HMAC") != std::string::npos);
    CHECK_FALSE(fs::exists(ckpt + "/ckpt-12.afck"));
  }
  // A key file that is not there is refused before the job starts.
  auto missing = train(dir, job(ckpt, 12, {"checkpoint_key=" + dir / "nokey"}));
  CAPTURE(missing.err);
  CHECK(missing.status == 2);
  CHECK(missing.err.find("checkpoint_key '" + dir / "nokey" + "'") != std::string::npos);
}

TEST_CASE("inputs that aborted or blocked actorflow-train are refused with one line naming them",
          "[train][cli]") {
  // Catches (issue 22): std::bad_alloc aborts (exit 134) on a generated set
  // of 2e9 examples and on data=csv:/dev/zero or idx:/dev/zero,/dev/zero;
  // hidden= meaning no hidden layer; replicas_to_aggregate = 100 with 2
  // workers accepted; a FIFO as the config blocking for ever.
  scratch_dir dir;
  struct refused {
    std::vector<std::string> args;
    std::string says;
  };
  for (const auto& c : std::vector<refused>{
         {{"--set", "data=synthetic", "--set", "synthetic_examples=2000000000"},
          "more than max_data_bytes = 4294967296"},
         {{"--set", "data=csv:/dev/zero"}, "'/dev/zero': it is a character device"},
         {{"--set", "data=idx:/dev/zero,/dev/zero"}, "'/dev/zero': it is a character device"},
         {{"--set", "hidden="}, "write hidden=[] for no hidden layer"},
         {{"--set", "replicas_to_aggregate=100"},
          "replicas_to_aggregate = 100 is more than the 2 worker task(s)"},
         {{"--set", "model=linear_bias", "--set", "data=per_worker_linear", "--set",
           "batch_size=1", "--set", "synthetic_examples=5"},
          "synthetic_examples = 5 with data = \"per_worker_linear\", 2 worker task(s) and "
          "batch_size = 1: its examples are the workers' own"},
         {{"--in-graph", "--set", "model=linear_bias", "--set", "data=per_worker_linear", "--set",
           "batch_size=1", "--set", "synthetic_examples=5"},
          "synthetic_examples = 5 with data = \"per_worker_linear\", 2 worker task(s)"}}) {
    auto args = c.args;
    args.insert(args.end(), {"--set", "steps=2"});
    auto r = train(dir, args, "timeout 60 ");
    INFO(r.err);
    CHECK((r.status == 1 || r.status == 2));
    CHECK(occurrences(r.err, c.says) == 1);
  }
  // A cluster's task refuses before it connects to anything.
  {
    std::ofstream{dir / "cluster.toml"} << "[cluster]\nps = [\"127.0.0.1:1\"]\n"
                                            "worker = [\"127.0.0.1:2\", \"127.0.0.1:3\"]\n"
                                            "[train]\nreplicas_to_aggregate = 100\n";
    auto r = train(dir, {"--config", dir / "cluster.toml", "--job", "worker", "--task", "0"},
                   "timeout 30 ");
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(occurrences(r.err, "replicas_to_aggregate = 100 is more than the 2 worker task(s)")
          == 1);
  }
  // ... and with per_worker_linear's examples for another number of workers.
  {
    std::ofstream{dir / "cluster.toml"} << "[cluster]\nps = [\"127.0.0.1:1\"]\n"
                                            "worker = [\"127.0.0.1:2\", \"127.0.0.1:3\", "
                                            "\"127.0.0.1:4\"]\n"
                                            "[train]\nmodel = \"linear_bias\"\n"
                                            "data = \"per_worker_linear\"\n"
                                            "synthetic_examples = 2\nbatch_size = 1\n";
    auto r = train(dir, {"--config", dir / "cluster.toml", "--job", "worker", "--task", "1"},
                   "timeout 30 ");
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(occurrences(r.err, "synthetic_examples = 2 with data = \"per_worker_linear\", 3 "
                             "worker task(s) and batch_size = 1")
          == 1);
    CHECK(occurrences(r.err, "set synthetic_examples = 3 (worker tasks x batch_size)") == 1);
  }
  auto fifo = dir / "config.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto r = train(dir, {"--config", fifo}, "timeout 30 ");
  INFO(r.err);
  CHECK(r.status == 2);
  CHECK(occurrences(r.err, "it is a FIFO (named pipe), not a regular file") == 1);
}

/// actorflow-train on a generated set of 1.2 GB (within max_data_bytes)
/// under an address-space cap of `cap_kib`, GPUs hidden (a node's "GPU:0 is
/// not used: out of memory" is another line than the program's).
run_result train_capped(const scratch_dir& dir, long cap_kib) {
  return train(dir, {"--set", "data=synthetic", "--set", "synthetic_examples=1500000", "--set",
                     "synthetic_features=200", "--set", "steps=2"},
               "ulimit -v " + std::to_string(cap_kib) + "; CUDA_VISIBLE_DEVICES= timeout 120 ");
}

TEST_CASE("actorflow-train out of memory says so and exits 1 instead of aborting",
          "[train][cli]") {
  // Catches: std::bad_alloc on a worker's thread ended in std::terminate
  // (SIGABRT, exit 134) with only "terminate called after throwing". The
  // set is within max_data_bytes; the address space limit is not.
  scratch_dir dir;
  auto r = train_capped(dir, 2000000);
  INFO(r.err);
  CHECK(r.status == 1);
  // Once, however many threads ran out (a CI machine with many cores printed
  // it twice); where depends on the cores: a scheduler's thread, the port's
  // handshake thread, the data.
  CHECK(occurrences(r.err, "out of memory") == 1);
  CHECK(occurrences(r.err, "actorflow-train: ") == 1);
}

TEST_CASE("actorflow-train under a memory cap too small for its threads says out of memory, "
          "exits 1 and does not hang", "[train][cli]") {
  // Catches: a thread of CAF's scheduler that could not start threw out of
  // actor_system's constructor, whose unwinding then waited forever for the
  // workers it had started (status 124 here); the port's handshake thread
  // that could not start read as "cannot listen ... is another process
  // using the port?" (status 2). Caps from where the threads fail to where
  // the data does, above what the libraries need before main (the CUDA
  // build's several times the CPU build's; below it the loader fails, or
  // OpenBLAS's thread spins for its 128 MiB buffer: not this program's).
  // Probed once: Catch runs the case again for each section.
  static const long base = [] {
    scratch_dir probe;
    // --help takes ~15 ms; a cap where OpenBLAS spins ends at the timeout.
    for (long cap = 64L << 10; cap <= 4L << 20; cap += 64L << 10)
      if (train(probe, {"--help"}, "ulimit -v " + std::to_string(cap) + "; timeout 1 ").status
          == 0)
        return cap;
    return 0L;
  }();
  REQUIRE(base > 0);
  for (long above : {64L << 10, 192L << 10, 384L << 10, 640L << 10}) {
    DYNAMIC_SECTION("ulimit -v " << base + above) {
      scratch_dir dir;
      auto r = train_capped(dir, base + above);
      INFO(r.err);
      CHECK(r.status == 1);
      CHECK(occurrences(r.err, "out of memory") == 1);
      CHECK(occurrences(r.err, "is another process using the port") == 0);
    }
  }
}

TEST_CASE("window_secs: the job ends after its warm-up and window, and `train done:` gives the "
          "window's steps/s", "[train][cli][workload]") {
  // Catches: a timed job that runs on to `steps` (here 10^8: the timeout
  // ends it, status 124), workers that do not stop together (a sync worker
  // left waiting for a round), a stopped job counted as failed, a summary
  // without the window's figures. Embedded: 1 ps + 2 workers in one process.
  for (const char* mode : {"sync", "async"}) {
    DYNAMIC_SECTION(mode) {
      scratch_dir dir;
      auto r = train(dir,
                     {"--set", std::string{"mode="} + mode, "--set", "model=linear_bias", "--set",
                      "data=per_worker_linear", "--set", "synthetic_examples=2", "--set",
                      "synthetic_features=1000", "--set", "batch_size=1", "--set",
                      "steps=100000000", "--set", "optimizer=sgd", "--set", "learning_rate=0.1",
                      "--set", "log_every=20", "--set", "eval_every=0", "--set",
                      "warmup_secs=0.2", "--set", "window_secs=0.5"},
                     "timeout 120 ");
      INFO(r.out << r.err);
      REQUIRE(r.status == 0);
      auto at = r.out.find("train done: ");
      REQUIRE(at != std::string::npos);
      auto line = r.out.substr(at, r.out.find('\n', at) - at);
      CHECK(line.find("window=measured") != std::string::npos);
      auto field = [&](const std::string& key) {
        auto k = line.find(" " + key + "=");
        REQUIRE(k != std::string::npos);
        return std::stod(line.substr(k + key.size() + 2));
      };
      double steps = field("window_steps"), seconds = field("seconds"), rate = field("steps_per_s");
      CHECK(steps > 0);
      CHECK(seconds > 0);
      CHECK(rate == Approx(steps / seconds).epsilon(0.01));
      // y = 1 + i is learnt: the last reported training loss is small.
      CHECK(field("loss") < 1e-3);
      // The progress lines give the time left in the warm-up or window, not
      // an estimate from steps = 10^8 (hours of "s left").
      size_t lines = 0, in_window = 0;
      for (size_t p = r.out.find("step "); p != std::string::npos; p = r.out.find("\nstep ", p + 1)) {
        auto from = r.out[p] == '\n' ? p + 1 : p;
        auto progress = r.out.substr(from, r.out.find('\n', from) - from);
        if (progress.find("/100000000") == std::string::npos)
          continue;
        INFO(progress);
        lines += 1;
        static const std::regex left{R"(  (warm-up|window) [0-9.]+ s left$|  waiting for every worker's first step$)"};
        bool timed = std::regex_search(progress, left);
        bool estimate = progress.find(" s left") != std::string::npos && !timed;
        CHECK_FALSE(estimate);
        if (progress.find("  window ") != std::string::npos)
          in_window += 1;
      }
      CHECK(lines > 0);
      CHECK(in_window > 0);
    }
  }
}

TEST_CASE("window_secs with log_every = 0: `train done:` says loss=n/a, not a loss of 0",
          "[train][cli][workload]") {
  // Catches: a timed run with no progress report (so no training loss
  // measured) that printed loss=0, a figure the bench would take as a loss.
  scratch_dir dir;
  auto r = train(dir,
                 {"--set", "mode=sync", "--set", "model=linear_bias", "--set",
                  "data=per_worker_linear", "--set", "synthetic_examples=2", "--set",
                  "synthetic_features=1000", "--set", "batch_size=1", "--set", "steps=100000000",
                  "--set", "optimizer=sgd", "--set", "learning_rate=0.1", "--set", "log_every=0",
                  "--set", "eval_every=0", "--set", "warmup_secs=0.2", "--set", "window_secs=0.3"},
                 "timeout 120 ");
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  auto at = r.out.find("train done: ");
  REQUIRE(at != std::string::npos);
  auto line = r.out.substr(at, r.out.find('\n', at) - at);
  CHECK(line.find(" loss=n/a") != std::string::npos);
  CHECK(line.find(" loss=0") == std::string::npos);
  CHECK(line.find("window=measured") != std::string::npos);
  CHECK(r.out.find("training loss: n/a") != std::string::npos);
}
