// actorflow-train --logdir: the TensorBoard event files of a job, read back
// by tests/tensorboard_reader.py, a reader that shares no code with the
// writer (its own TFRecord framing and CRC-32C, Python's protobuf over
// summary/event.proto), so that a writer bug cannot hide behind its own
// reader. Each case names the bug it is there to catch.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "program_run.hpp"

namespace fs = std::filesystem;

namespace {

using af::test::run_result;
using af::test::slurp;

/// af::test::scratch_dir named after this file.
struct scratch_dir : af::test::scratch_dir {
  scratch_dir() : af::test::scratch_dir("tensorboard") {}
};

run_result run(const scratch_dir& dir, const std::string& program,
               const std::vector<std::string>& args) {
  return af::test::run_program(dir, program, args);
}

/// A small sync job of the embedded cluster (1 ps, 2 workers) to `steps`.
run_result train(const scratch_dir& dir, const std::string& logdir, uint64_t steps,
                 const std::vector<std::string>& more = {}) {
  std::vector<std::string> args = {"--logdir", logdir, "--set", "steps=" + std::to_string(steps),
                                   "--set", "log_every=5", "--set", "eval_every=10",
                                   "--set", "learning_rate=0.05", "--set", "hidden=[16]"};
  for (const auto& m : more)
    args.insert(args.end(), {"--set", m});
  return run(dir, ACTORFLOW_TRAIN_BINARY, args);
}

/// What the reader read: one entry per event value.
struct read_back {
  int status = -1;
  std::string err;
  struct scalar {
    std::string run;
    int file = 0;
    uint64_t step = 0;
    std::string tag;
    double value = 0;
    size_t order = 0; ///< its place in what was read
  };
  struct histo {
    std::string run, tag;
    uint64_t step = 0;
    double num = 0, bucket_total = 0;
  };
  std::vector<scalar> scalars;
  std::vector<histo> histos;
  std::vector<std::tuple<std::string, int, uint64_t>> starts;
  std::vector<size_t> start_order; ///< parallel to starts
  std::map<std::string, int> files; ///< per run

  /// The scalars TensorBoard keeps: a SessionLog START at step S drops
  /// what the run's earlier records hold at S and after.
  std::vector<scalar> kept() const {
    std::vector<scalar> out;
    for (const auto& s : scalars) {
      bool dropped = false;
      for (size_t i = 0; i < starts.size(); ++i)
        dropped = dropped || (std::get<0>(starts[i]) == s.run && start_order[i] > s.order
                              && s.step >= std::get<2>(starts[i]));
      if (!dropped)
        out.push_back(s);
    }
    return out;
  }

  /// The (step, value) of `tag` in `run`, in the order read.
  std::vector<std::pair<uint64_t, double>> series(const std::string& run,
                                                  const std::string& tag) const {
    std::vector<std::pair<uint64_t, double>> out;
    for (const auto& s : scalars)
      if (s.run == run && s.tag == tag)
        out.emplace_back(s.step, s.value);
    return out;
  }
};

read_back read_logdir(const scratch_dir& dir, const std::string& logdir) {
  auto r = run(dir, "/usr/bin/python3",
               {std::string{ACTORFLOW_SOURCE_DIR} + "/tests/tensorboard_reader.py",
                ACTORFLOW_SUMMARY_PY_DIR, logdir});
  read_back b;
  b.status = r.status;
  b.err = r.err;
  std::istringstream in{r.out};
  std::string kind;
  while (in >> kind) {
    if (kind == "scalar") {
      read_back::scalar s;
      in >> s.run >> s.file >> s.step >> s.tag >> s.value;
      s.order = b.scalars.size() + b.starts.size();
      b.scalars.push_back(s);
    } else if (kind == "histo") {
      read_back::histo h;
      int file = 0;
      double min = 0, max = 0, sum = 0;
      in >> h.run >> file >> h.step >> h.tag >> h.num >> min >> max >> sum >> h.bucket_total;
      b.histos.push_back(h);
    } else if (kind == "start") {
      std::string run;
      int file = 0;
      uint64_t step = 0;
      in >> run >> file >> step;
      b.start_order.push_back(b.scalars.size() + b.starts.size());
      b.starts.emplace_back(run, file, step);
    } else if (kind == "file") {
      std::string run, name;
      int records = 0;
      in >> run >> name >> records;
      b.files[run] += 1;
    }
  }
  return b;
}

/// The chief's progress lines: step -> (loss, held-out accuracy or -1).
std::map<uint64_t, std::pair<double, double>> printed_reports(const std::string& out) {
  std::map<uint64_t, std::pair<double, double>> reports;
  std::regex line{R"(^step (\d+)/\d+  loss ([0-9.]+)(  held-out ([0-9.]+))?)"};
  std::istringstream in{out};
  std::string l;
  while (std::getline(in, l)) {
    std::smatch m;
    if (std::regex_search(l, m, line))
      reports[std::stoull(m[1])] = {std::stod(m[2]), m[4].matched ? std::stod(m[4]) : -1.0};
  }
  return reports;
}

} // namespace

TEST_CASE("actorflow-train --logdir writes the job's scalars and each worker's accounting, "
          "read back by an independent reader",
          "[train][cli][tensorboard]") {
  // Catches: a file TensorBoard cannot read (framing, CRCs, the first
  // record), losses that are not the job's (another report's, a mean over
  // the wrong steps), a missing tag, workers' runs that are not written.
  scratch_dir dir;
  auto logdir = dir / "tb";
  auto job = train(dir, logdir, 20);
  CAPTURE(job.out, job.err);
  REQUIRE(job.status == 0);
  auto printed = printed_reports(job.out);
  REQUIRE(printed.size() >= 4);
  auto b = read_logdir(dir, logdir);
  CAPTURE(b.err);
  REQUIRE(b.status == 0);
  CHECK(b.files["train"] == 1);
  CHECK(b.files["worker_0"] == 1);
  CHECK(b.files["worker_1"] == 1);
  // Every printed report is one loss point of the same value (printed with
  // 4 decimals, written as a float).
  auto loss = b.series("train", "loss");
  REQUIRE(loss.size() == printed.size());
  for (const auto& [step, value] : loss) {
    CAPTURE(step);
    REQUIRE(printed.count(step) == 1);
    CHECK(std::abs(value - printed[step].first) <= 5.1e-5);
  }
  // Held-out accuracy where the line says one, at the end (the job's last
  // line: the case below), and nowhere else.
  size_t evaluated = 0;
  for (const auto& [step, r] : printed)
    evaluated += r.second >= 0 ? 1 : 0;
  auto accuracy = b.series("train", "heldout/accuracy");
  CHECK(accuracy.size() == evaluated + 1);
  CHECK(evaluated >= 1);
  for (const auto& [step, value] : accuracy) {
    CAPTURE(step);
    if (step != 20)
      CHECK(std::abs(value - printed[step].second) <= 5.1e-5);
  }
  for (const auto& [step, value] : b.series("train", "learning_rate"))
    CHECK(value == Approx(0.05));
  CHECK(b.series("train", "learning_rate").size() == printed.size());
  CHECK(b.series("train", "examples_per_s").size() == printed.size());
  auto steps_per_s = b.series("train", "steps_per_s");
  CHECK(steps_per_s.size() == printed.size());
  for (const auto& [step, value] : steps_per_s)
    CHECK(value > 0);
  CHECK(b.series("train", "heldout/loss").size() == evaluated + 1);
  // Each worker's pushes grow to the job's 20 steps (sync: one push per
  // step of each); nothing late or refused in a job without stragglers.
  for (std::string w : {"worker_0", "worker_1"}) {
    CAPTURE(w);
    auto pushes = b.series(w, "pushes");
    REQUIRE(pushes.size() == printed.size());
    for (size_t i = 1; i < pushes.size(); ++i)
      CHECK(pushes[i].second >= pushes[i - 1].second);
    CHECK(pushes.back().second >= 19);
    for (std::string tag : {"late", "refused", "waited_s", "applied", "examples_per_s"})
      CHECK(b.series(w, tag).size() == printed.size());
    for (const auto& [step, v] : b.series(w, "refused"))
      CHECK(v == 0);
  }
  CHECK(b.histos.empty()); // histogram_every is 0 by default
}

TEST_CASE("the job's last held-out accuracy, printed at its end, is its run's last point",
          "[train][cli][tensorboard]") {
  // Catches: the figure the job prints last ("held-out accuracy: X",
  // evaluated after its last step, not by its last report) missing from
  // TensorBoard, whose last heldout point was then an earlier report's.
  scratch_dir dir;
  for (uint64_t steps : {18, 20}) { // 20: a step of eval_every (10) too
    CAPTURE(steps);
    auto logdir = dir / ("tb" + std::to_string(steps));
    auto job = train(dir, logdir, steps);
    CAPTURE(job.out, job.err);
    REQUIRE(job.status == 0);
    std::smatch m;
    std::regex last{R"(held-out accuracy: ([0-9.]+) \()"};
    REQUIRE(std::regex_search(job.out, m, last));
    auto b = read_logdir(dir, logdir);
    CAPTURE(b.err);
    REQUIRE(b.status == 0);
    auto accuracy = b.series("train", "heldout/accuracy");
    REQUIRE(accuracy.size() == 2); // steps 10 and the end
    CHECK(accuracy.back().first == steps);
    CHECK(std::abs(accuracy.back().second - std::stod(m[1])) <= 5.1e-5);
    auto loss = b.series("train", "heldout/loss");
    REQUIRE(loss.size() == 2);
    CHECK(loss.back().first == steps);
  }
}

TEST_CASE("histogram_every writes each variable's values and gradients every N reports",
          "[train][cli][tensorboard]") {
  // Catches: histograms written at every report (or never), a variable
  // left out, a histogram whose buckets do not hold its values.
  scratch_dir dir;
  auto logdir = dir / "tb";
  auto job = train(dir, logdir, 20, {"histogram_every=2"});
  CAPTURE(job.out, job.err);
  REQUIRE(job.status == 0);
  auto b = read_logdir(dir, logdir);
  CAPTURE(b.err);
  REQUIRE(b.status == 0);
  // Reports at 5, 10, 15, 20: histograms at the 2nd and 4th.
  std::map<std::string, std::set<uint64_t>> steps;
  std::map<std::string, double> num;
  for (const auto& h : b.histos) {
    CHECK(h.run == "train");
    CHECK(h.bucket_total == h.num);
    steps[h.tag].insert(h.step);
    num[h.tag] = h.num;
  }
  std::vector<std::string> tags;
  for (std::string kind : {"values/", "gradients/"})
    for (std::string v : {"hidden0/w", "hidden0/b", "logits/w", "logits/b"})
      tags.push_back(kind + v);
  CHECK(steps.size() == tags.size());
  for (const auto& tag : tags) {
    CAPTURE(tag);
    CHECK(steps[tag] == std::set<uint64_t>{10, 20});
  }
  CHECK(num["values/hidden0/w"] == 64 * 16); // digits: 64 features, hidden=[16]
  CHECK(num["gradients/logits/b"] == 10);
}

TEST_CASE("a resumed job appends to its TensorBoard runs without writing a step twice",
          "[train][cli][tensorboard]") {
  // Catches: a resumed job that writes over its run (the first file's steps
  // lost), or writes again the steps before its checkpoint, or leaves
  // TensorBoard no START to drop what a run that died wrote past it.
  scratch_dir dir;
  auto logdir = dir / "tb";
  std::string ckpt = "checkpoint_dir=" + dir / "ckpt";
  auto first = train(dir, logdir, 10, {ckpt});
  CAPTURE(first.out, first.err);
  REQUIRE(first.status == 0);
  auto resumed = train(dir, logdir, 20, {ckpt});
  CAPTURE(resumed.out, resumed.err);
  REQUIRE(resumed.status == 0);
  auto b = read_logdir(dir, logdir);
  CAPTURE(b.err);
  REQUIRE(b.status == 0);
  CHECK(b.files["train"] == 2);
  CHECK(b.files["worker_0"] == 2);
  // No (run, tag, step) twice, across both files.
  std::set<std::tuple<std::string, std::string, uint64_t>> seen;
  for (const auto& s : b.scalars) {
    CAPTURE(s.run, s.tag, s.step);
    CHECK(seen.insert({s.run, s.tag, s.step}).second);
    if (s.file == 1)
      CHECK(s.step > 10);
  }
  std::vector<uint64_t> loss_steps;
  for (const auto& [step, v] : b.series("train", "loss"))
    loss_steps.push_back(step);
  CHECK(loss_steps == std::vector<uint64_t>{5, 10, 15, 20});
  // The second files begin with a START just after the checkpoint's step.
  CHECK(std::count(b.starts.begin(), b.starts.end(), std::make_tuple(std::string{"train"}, 1,
                                                                     uint64_t{11})) == 1);
  CHECK(std::count(b.starts.begin(), b.starts.end(),
                   std::make_tuple(std::string{"worker_0"}, 1, uint64_t{11})) == 1);
}

TEST_CASE("a job resumed from a checkpoint before its last report leaves TensorBoard one value "
          "per step",
          "[train][cli][tensorboard]") {
  // Catches: a resumed job whose new file gives TensorBoard no START to drop
  // what the run wrote past the checkpoint it resumes from (a chief that
  // died after step 20 had saved only step 10): two values of steps 15 and 20.
  scratch_dir dir;
  auto logdir = dir / "tb";
  auto ckpt = dir / "ckpt";
  auto first = train(dir, logdir, 20, {"checkpoint_dir=" + ckpt, "checkpoint_steps=10"});
  CAPTURE(first.out, first.err);
  REQUIRE(first.status == 0);
  // As if it had died before its checkpoint of step 20.
  auto latest = slurp(ckpt + "/latest");
  REQUIRE(latest.find("ckpt-20.afck") != std::string::npos);
  fs::remove(ckpt + "/ckpt-20.afck");
  latest.replace(latest.find("ckpt-20.afck"), 12, "ckpt-10.afck");
  std::ofstream{ckpt + "/latest", std::ios::trunc} << latest;
  auto resumed = train(dir, logdir, 20, {"checkpoint_dir=" + ckpt, "checkpoint_steps=10"});
  CAPTURE(resumed.out, resumed.err);
  REQUIRE(resumed.status == 0);
  auto printed = printed_reports(resumed.out);
  auto b = read_logdir(dir, logdir);
  CAPTURE(b.err);
  REQUIRE(b.status == 0);
  // The files hold steps 15 and 20 twice; what TensorBoard keeps, once, the
  // resumed job's.
  std::set<std::tuple<std::string, std::string, uint64_t>> seen;
  std::vector<uint64_t> loss_steps;
  for (const auto& s : b.kept()) {
    CAPTURE(s.run, s.tag, s.step);
    CHECK(seen.insert({s.run, s.tag, s.step}).second);
    if (s.run == "train" && s.tag == "loss") {
      loss_steps.push_back(s.step);
      if (s.step > 10) {
        CHECK(s.file == 1);
        CHECK(std::abs(s.value - printed[s.step].first) <= 5.1e-5);
      }
    }
  }
  CHECK(loss_steps == std::vector<uint64_t>{5, 10, 15, 20});
  CHECK(b.series("train", "loss").size() == 6);
}

TEST_CASE("a fresh job into a logdir an earlier job wrote leaves TensorBoard its own values only",
          "[train][cli][tensorboard]") {
  // Catches: a fresh job (no checkpoint) whose files begin with no START:
  // TensorBoard (file_version 2 purges on a START only) would keep the
  // earlier job's steps 5..20 beside this one's, two values per step drawn
  // as one zigzag line; and a START that drops the new job's own values.
  scratch_dir dir;
  auto logdir = dir / "tb";
  auto first = train(dir, logdir, 20);
  CAPTURE(first.out, first.err);
  REQUIRE(first.status == 0);
  auto again = train(dir, logdir, 20, {"learning_rate=0.01"});
  CAPTURE(again.out, again.err);
  REQUIRE(again.status == 0);
  auto printed = printed_reports(again.out);
  auto b = read_logdir(dir, logdir);
  CAPTURE(b.err);
  REQUIRE(b.status == 0);
  CHECK(b.files["train"] == 2);
  std::set<std::tuple<std::string, std::string, uint64_t>> seen;
  std::set<std::string> runs;
  size_t losses = 0;
  for (const auto& s : b.kept()) {
    CAPTURE(s.run, s.tag, s.step);
    CHECK(seen.insert({s.run, s.tag, s.step}).second);
    CHECK(s.file == 1);
    runs.insert(s.run);
    if (s.run == "train" && s.tag == "loss") {
      losses += 1;
      CHECK(std::abs(s.value - printed[s.step].first) <= 5.1e-5);
    }
  }
  CHECK(losses == printed.size());
  CHECK(runs == std::set<std::string>{"train", "worker_0", "worker_1"});
}

TEST_CASE("a job told that another job writes its logdir at once",
          "[train][cli][tensorboard]") {
  // Catches: two jobs writing one logdir at once in silence (their steps
  // interleave in each run, and each one's START drops the other's), and a
  // warning where no other job is.
  scratch_dir dir;
  auto logdir = dir / "tb";
  fs::create_directories(logdir);
  // The other job: this process holds the logdir's lock as a job would.
  auto lock = logdir + "/.actorflow-tensorboard.lock";
  int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  auto job = train(dir, logdir, 5);
  ::close(fd);
  CAPTURE(job.out, job.err);
  REQUIRE(job.status == 0);
  std::string said = "another job is writing TensorBoard runs in '" + logdir + "'";
  CHECK((job.out + job.err).find(said) != std::string::npos);
  // Alone, it is not told.
  auto alone = train(dir, logdir, 5);
  CAPTURE(alone.out, alone.err);
  REQUIRE(alone.status == 0);
  CHECK((alone.out + alone.err).find(said) == std::string::npos);
}

TEST_CASE("the sparse job (config/embeddings.toml) writes the same TensorBoard runs",
          "[train][cli][tensorboard]") {
  // Catches: logdir honoured by the dense job only (the sparse chief's
  // reporter opened only for a metrics CSV).
  scratch_dir dir;
  auto logdir = dir / "tb";
  auto job = run(dir, ACTORFLOW_TRAIN_BINARY,
                 {"--config", std::string{ACTORFLOW_SOURCE_DIR} + "/config/embeddings.toml",
                  "--logdir", logdir, "--set", "synthetic_examples=50000", "--set", "users=500",
                  "--set", "items=200", "--set", "steps=30", "--set", "log_every=10"});
  CAPTURE(job.out, job.err);
  REQUIRE(job.status == 0);
  // Its lines: "step 10/30: loss 0.683153".
  std::map<uint64_t, double> printed;
  std::regex line{R"(^step (\d+)/\d+: loss ([0-9.]+))"};
  std::istringstream in{job.out};
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, line))
      printed[std::stoull(m[1])] = std::stod(m[2]);
  }
  REQUIRE(printed.size() == 3);
  auto b = read_logdir(dir, logdir);
  CAPTURE(b.err);
  REQUIRE(b.status == 0);
  auto loss = b.series("train", "loss");
  REQUIRE(loss.size() == printed.size());
  for (const auto& [step, value] : loss) {
    CAPTURE(step);
    CHECK(std::abs(value - printed[step]) <= 1e-6);
  }
  for (std::string w : {"worker_0", "worker_1"}) {
    CAPTURE(w);
    auto pushes = b.series(w, "pushes");
    REQUIRE(pushes.size() == printed.size());
    CHECK(pushes.back().second >= 29);
  }
}

TEST_CASE("the dense in-graph job (--in-graph) writes the same TensorBoard runs and metrics "
          "CSV as a between-graph job",
          "[train][cli][tensorboard]") {
  // Catches: logdir and metrics honoured by the between-graph job only (the
  // in-graph client runs its own loop, not the worker actor that feeds the
  // chief's reporter, and wrote neither), a run or CSV whose losses are not
  // the printed ones, and the held-out figure the job prints last missing.
  scratch_dir dir;
  auto logdir = dir / "tb";
  auto csv = dir / "metrics.csv";
  auto job = run(dir, ACTORFLOW_TRAIN_BINARY,
                 {"--in-graph", "--logdir", logdir, "--set", "metrics=" + csv, "--set",
                  "steps=20", "--set", "log_every=5", "--set", "learning_rate=0.05", "--set",
                  "hidden=[16]", "--set", "histogram_every=1"});
  CAPTURE(job.out, job.err);
  REQUIRE(job.status == 0);
  CHECK(job.err.find("not written in-graph") == std::string::npos);
  // histogram_every, which it does not write, is said, not silently dropped.
  CHECK(job.err.find("histogram_every = 1 is not written by this job") != std::string::npos);
  auto printed = printed_reports(job.out); // "step 5/20  loss 0.6931  (in-graph, 2 replicas)"
  REQUIRE(printed.size() == 4);
  std::smatch m;
  std::regex last{R"(held-out accuracy: ([0-9.]+) \()"};
  REQUIRE(std::regex_search(job.out, m, last));
  auto b = read_logdir(dir, logdir);
  CAPTURE(b.err);
  REQUIRE(b.status == 0);
  CHECK(b.files["train"] == 1);
  auto loss = b.series("train", "loss");
  REQUIRE(loss.size() == printed.size());
  for (const auto& [step, value] : loss) {
    CAPTURE(step);
    REQUIRE(printed.count(step) == 1);
    CHECK(std::abs(value - printed[step].first) <= 5.1e-5);
  }
  for (std::string tag : {"learning_rate", "examples_per_s", "steps_per_s"}) {
    CAPTURE(tag);
    auto series = b.series("train", tag);
    CHECK(series.size() == printed.size());
    for (const auto& [step, value] : series)
      CHECK(value > 0);
  }
  for (const auto& [step, value] : b.series("train", "learning_rate"))
    CHECK(value == Approx(0.05));
  // Evaluated at its end only: one point, the printed one, at step 20.
  auto accuracy = b.series("train", "heldout/accuracy");
  REQUIRE(accuracy.size() == 1);
  CHECK(accuracy.back().first == 20);
  CHECK(std::abs(accuracy.back().second - std::stod(m[1])) <= 5.1e-5);
  CHECK(b.series("train", "heldout/loss").size() == 1);
  // The client pushes for worker 0: its run counts its pushes.
  auto pushes = b.series("worker_0", "pushes");
  REQUIRE(pushes.size() == printed.size());
  CHECK(pushes.back().second >= 19);
  // The CSV: a row per report, the printed loss, sync, 2 replicas.
  std::istringstream rows{slurp(csv)};
  std::string header, row;
  REQUIRE(std::getline(rows, header));
  CHECK(header == "step,wall_s,loss,accuracy,mode,workers,examples_per_s");
  size_t n = 0;
  while (std::getline(rows, row)) {
    CAPTURE(row);
    std::vector<std::string> cols;
    std::istringstream fields{row};
    for (std::string col; std::getline(fields, col, ',');)
      cols.push_back(col);
    REQUIRE(cols.size() == 7);
    auto step = std::stoull(cols[0]);
    REQUIRE(printed.count(step) == 1);
    CHECK(std::abs(std::stod(cols[2]) - printed[step].first) <= 5.1e-5);
    CHECK(cols[4] == "sync");
    CHECK(cols[5] == "2");
    n += 1;
  }
  CHECK(n == printed.size());
  CHECK(fs::exists(dir / "metrics.workers.csv"));
}

TEST_CASE("the independent reader refuses an event file with a wrong CRC",
          "[train][cli][tensorboard]") {
  // Catches: a reader that does not check what it reads (then the cases
  // above would pass over any framing).
  scratch_dir dir;
  auto logdir = dir / "tb";
  auto job = train(dir, logdir, 5);
  CAPTURE(job.out, job.err);
  REQUIRE(job.status == 0);
  REQUIRE(read_logdir(dir, logdir).status == 0);
  fs::path file;
  for (const auto& e : fs::directory_iterator{fs::path{logdir} / "train"})
    file = e.path();
  auto bytes = slurp(file.string());
  REQUIRE(bytes.size() > 40);
  bytes[bytes.size() - 6] ^= 0x01; // in the last record's data
  std::ofstream{file, std::ios::binary | std::ios::trunc} << bytes;
  auto b = read_logdir(dir, logdir);
  CHECK(b.status == 1);
  CHECK(b.err.find("CRC") != std::string::npos);
}

TEST_CASE("actorflow-train refuses a logdir it cannot write before it trains",
          "[train][cli][tensorboard]") {
  // Catches: an unwritable logdir found only by the chief once the cluster
  // runs (or never: a job that trains and writes no events).
  scratch_dir dir;
  std::ofstream{dir / "file"} << "x";
  auto logdir = dir / "file/tb";
  auto r = train(dir, logdir, 5);
  CAPTURE(r.out, r.err);
  CHECK(r.status == 2);
  CHECK(r.err.find("TensorBoard logdir '" + logdir + "'") != std::string::npos);
  CHECK(r.out.find("embedded cluster") == std::string::npos); // nothing was started
  // A logdir that is a file is called one (not "cannot create it: Not a directory").
  auto file = train(dir, dir / "file", 5);
  CAPTURE(file.out, file.err);
  CHECK(file.status == 2);
  CHECK(file.err.find("TensorBoard logdir '" + dir / "file" + "': it is a file, not a folder")
        != std::string::npos);
  // A file where its run folder goes: refused before the cluster starts
  // (the chief refused it once it ran, and the job waited a minute for it).
  fs::create_directories(dir / "runs");
  std::ofstream{dir / "runs/train"} << "x";
  auto runs = train(dir, dir / "runs", 5);
  CAPTURE(runs.out, runs.err);
  CHECK(runs.status == 2);
  CHECK(runs.err.find("'" + dir / "runs/train" + "', its job's run folder, is a file")
        != std::string::npos);
  CHECK(runs.out.find("embedded cluster") == std::string::npos);
  // The in-graph and sparse jobs check it too, before their clusters start
  // (they wrote runs once their chiefs ran, and said "cannot create the
  // run folder '.../train': Not a directory" for a logdir that is a file).
  auto file_says = "TensorBoard logdir '" + dir / "file" + "': it is a file, not a folder";
  auto in_graph = run(dir, ACTORFLOW_TRAIN_BINARY,
                      {"--in-graph", "--logdir", dir / "file", "--set", "steps=5"});
  CAPTURE(in_graph.out, in_graph.err);
  CHECK(in_graph.status == 2);
  CHECK(in_graph.err.find(file_says) != std::string::npos);
  CHECK(in_graph.out.find("embedded cluster") == std::string::npos);
  auto sparse = run(dir, ACTORFLOW_TRAIN_BINARY,
                    {"--config", std::string{ACTORFLOW_SOURCE_DIR} + "/config/embeddings.toml",
                     "--logdir", dir / "file", "--set", "steps=5"});
  CAPTURE(sparse.out, sparse.err);
  CHECK(sparse.status == 2);
  CHECK(sparse.err.find(file_says) != std::string::npos);
}
