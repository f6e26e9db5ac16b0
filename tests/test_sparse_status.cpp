// A sparse job's accounting and its processes (issue 25): `actorflow-train
// --status` against its aggregators (train/sparse/ps<k>), a row per worker
// per ps, the metrics CSV, the in-graph client's CLI, a worker that joins a
// running job (--join), and a live switch (--switch: between-graph it
// switches, in-graph it is refused).
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <regex>
#include <string>
#include <thread>

#include "dist/embedded_cluster.hpp"
#include "dist/sparse_in_graph.hpp"
#include "dist/sparse_job.hpp"
#include "dist/train_client.hpp"
#include "messages/error.hpp"
#include "sparse_jobs.hpp"
#include "train_job.hpp"

using namespace af;
using namespace af::testing;

namespace {

/// Runs `c` on `cluster`: workers 0 and 1 between-graph, each on its own
/// thread, or (`in_graph`) one client with a replica each; their outcomes
/// (in-graph: the client's, and an empty one for worker 1).
std::vector<caf::expected<sparse_outcome>> run_two(embedded_cluster& cluster,
                                                   const train::train_config& c,
                                                   const sparse_job_options& o, bool in_graph) {
  std::vector<caf::expected<sparse_outcome>> results;
  for (int w = 0; w < 2; ++w)
    results.emplace_back(make_error(af_error::internal, "not run"));
  if (in_graph) {
    auto s = cluster.session_for("worker", 0);
    if (!s) {
      results[0] = std::move(s.error());
      return results;
    }
    results[0] = run_sparse_in_graph(*s, c, o);
    results[1] = sparse_outcome{};
    return results;
  }
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w)
    threads.emplace_back([&, w] {
      auto s = cluster.session_for("worker", w);
      if (!s) {
        results[w] = std::move(s.error());
        return;
      }
      results[w] = run_sparse_worker_task(*s, c, static_cast<uint32_t>(w), o);
    });
  for (auto& t : threads)
    t.join();
  return results;
}

/// The status_row of `worker` under ps `ps`, if --status printed one.
const status_row* row_of(const std::vector<status_row>& rows, int ps, uint32_t worker) {
  for (const auto& r : rows)
    if (r.ps == ps && r.worker == worker)
      return &r;
  return nullptr;
}

/// The [train] table of a sparse job that runs until it is killed.
const char* long_sparse_job = R"(model = "recommender"
data = "synthetic"
mode = "sync"
users = 300
items = 200
dim = 4
synthetic_examples = 20000
batch_size = 32
steps = 10000000
epochs = 0
log_every = 20
optimizer = "sgd"
learning_rate = 0.05
)";

/// One ps's report in a --status output: its header line's counts.
struct ps_report {
  std::string mode;
  uint64_t global_step = 0, applied = 0, pushes = 0;
};

/// The header of ps `ps`'s report ("/job:ps/task:K: mode M, global step G,
/// A update(s) applied, P push(es), ...").
std::optional<ps_report> ps_header(const std::string& out, int ps) {
  std::regex re{"/job:ps/task:" + std::to_string(ps)
                + R"(: mode (\w+), global step (\d+), (\d+) update\(s\) applied, (\d+) push\(es\))"};
  std::smatch m;
  if (!std::regex_search(out, m, re))
    return std::nullopt;
  return ps_report{m[1].str(), std::stoull(m[2].str()), std::stoull(m[3].str()),
                   std::stoull(m[4].str())};
}

/// The global step of the sparse chief's last progress line ("step G/T: loss ...").
std::optional<uint64_t> sparse_progress(const std::string& out) {
  static const std::regex re{R"((?:^|\n)step (\d+)/\d+: )"};
  auto s = last_match(out, re);
  return s ? std::optional<uint64_t>{std::stoull(*s)} : std::nullopt;
}

} // namespace

TEST_CASE("job_status_text finds a sparse job's aggregators and gives a row per worker per ps, "
          "between-graph and in-graph",
          "[sparse_job][sparse_status]") {
  // Catches: --status looking for the dense job's aggregators (train/ps<k>)
  // and finding none, and sparse pushes that the aggregators' per-worker
  // accounting does not count.
  for (bool in_graph : {false, true}) {
    for (std::string mode : {"sync", "async"}) {
      INFO((in_graph ? "in-graph " : "between-graph ") << mode);
      auto c = small_job(mode, 20);
      auto cluster = embedded_cluster::start({{"ps", 2}, {"worker", 2}});
      REQUIRE(cluster);
      sparse_job_options o;
      o.shutdown_ps = false;
      o.print = false;
      auto results = run_two(**cluster, c, o, in_graph);
      REQUIRE(results[0]);
      REQUIRE(results[1]);
      auto s = (*cluster)->session_for("worker", 0);
      REQUIRE(s);
      auto dense = job_status_text(*s, std::chrono::seconds(10));
      CHECK_FALSE(dense); // no train/ps<k> here
      auto text = job_status_text(*s, std::chrono::seconds(10), sparse_aggregator_prefix);
      REQUIRE(text);
      INFO(*text);
      CHECK(text->find("/job:ps/task:0: mode " + mode) != std::string::npos);
      CHECK(text->find("/job:ps/task:1: mode " + mode) != std::string::npos);
      auto rows = parse_status(*text);
      // in-graph sync: the client is the one member; otherwise a member per worker.
      uint32_t members = in_graph && mode == "sync" ? 1 : 2;
      for (int ps = 0; ps < 2; ++ps) {
        uint64_t pushes = 0;
        for (uint32_t w = 0; w < members; ++w) {
          INFO("ps " << ps << " worker " << w);
          const auto* r = row_of(rows, ps, w);
          REQUIRE(r != nullptr);
          CHECK(r->status == "done");
          CHECK(r->task == "/job:worker/task:" + std::to_string(w));
          CHECK(r->refused == 0);
          if (!in_graph)
            CHECK(r->pushes == results[w]->local_steps);
          pushes += r->pushes;
        }
        CHECK(row_of(rows, ps, members) == nullptr);
        // In-graph, the client saw every push: sync, one merged push a
        // global step; async, a push is a global step.
        if (in_graph)
          CHECK(pushes == results[0]->global_step);
      }
    }
  }
}

TEST_CASE("actorflow-train --status prints a row per worker of a live sparse job, from every ps",
          "[sparse_job][sparse_status][processes]") {
  // Catches: a sparse config's --status refused, or looking up the dense
  // job's aggregators and failing with not_found while the job runs.
  temp_dir dir;
  job_spec spec;
  spec.ps_tasks = 2;
  spec.workers = 2;
  spec.train_table = long_sparse_job;
  auto job = train_job::start(dir.path, spec);
  // Running: the chief printed a progress line (a step every worker pushed).
  bool running = job->wait_until(
    [&] { return job->chief().output().find("\nstep 20/") != std::string::npos; }, 60s);
  INFO(job->describe());
  REQUIRE(running);
  auto status = job->client({"--status"}, 30s);
  INFO("--status:\n" << status.output);
  CHECK(status.exit_code == 0);
  auto rows = parse_status(status.output);
  for (int ps = 0; ps < 2; ++ps)
    for (uint32_t w = 0; w < 2; ++w) {
      INFO("ps " << ps << " worker " << w);
      const auto* r = row_of(rows, ps, w);
      REQUIRE(r != nullptr);
      CHECK(r->status == "member");
      CHECK(r->task == "/job:worker/task:" + std::to_string(w));
      CHECK(r->pushes >= 20);
    }
  job->kill_all();
}

// Catches a --status that fails whole when one ps does not answer (it
// printed only that ps's error, or waited on it past its bound), and one
// that does not name that ps (the attack's new-user pass).
TEST_CASE("actorflow-train --status with one ps stopped prints the other ps's rows and names the "
          "stopped one, within a bounded wait",
          "[sparse_job][sparse_status][processes]") {
  temp_dir dir;
  job_spec spec;
  spec.ps_tasks = 2;
  spec.workers = 2;
  spec.train_table = long_sparse_job;
  spec.sets = {"step_timeout_ms=2000"};
  auto job = train_job::start(dir.path, spec);
  bool running = job->wait_until(
    [&] { return job->chief().output().find("\nstep 20/") != std::string::npos; }, 60s);
  INFO(job->describe());
  REQUIRE(running);
  job->process("ps", 1).signal(SIGSTOP);
  auto t0 = std::chrono::steady_clock::now();
  auto status = job->client({"--status"}, 60s);
  auto took = std::chrono::steady_clock::now() - t0;
  job->process("ps", 1).signal(SIGCONT);
  INFO("--status:\n" << status.output);
  CHECK(status.exit_code == 1); // one ps did not answer
  auto rows = parse_status(status.output);
  for (uint32_t w = 0; w < 2; ++w) {
    INFO("worker " << w);
    CHECK(row_of(rows, 0, w) != nullptr);
    CHECK(row_of(rows, 1, w) == nullptr);
  }
  auto named = status.output.find("/job:ps/task:1");
  CHECK(named != std::string::npos);
  CHECK(status.output.find("no report from it: is it stopped, hung or gone?", named)
        != std::string::npos);
  // Its lookup and its stats, each bounded by step_timeout_ms (2 s), and
  // the client's start: far below the 60 s this waits.
  CHECK(took < std::chrono::seconds(20));
  job->kill_all();
}

TEST_CASE("actorflow-train --in-graph trains a sparse config on an embedded cluster of its shape",
          "[sparse_job][sparse_in_graph][processes]") {
  // Catches: --in-graph refused for a sparse model, or run as the dense
  // client (which cannot build a recommender), or a replica count other
  // than the config's workers.
  temp_dir dir;
  auto path = dir.path + "/embeddings.toml";
  {
    std::ofstream f{path};
    f << "[cluster]\nps = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n"
         "worker = [\"127.0.0.1:3\", \"127.0.0.1:4\", \"127.0.0.1:5\"]\n\n[train]\n"
      << long_sparse_job;
  }
  auto r = run_command({ACTORFLOW_TRAIN_BINARY, "--config", path, "--in-graph", "--set",
                        "steps=60"},
                       std::chrono::seconds{120});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("embedded cluster (2 ps + 3 workers), in-graph") != std::string::npos);
  CHECK(r.output.find("(in-graph, 3 replicas)") != std::string::npos);
  CHECK(r.output.find("train done: mode=sync workers=3 global_step=60 ") != std::string::npos);
  CHECK(r.output.find("held-out: auc=") != std::string::npos);
}

namespace {

/// The metrics CSV's rows: (step, mode, workers) of each, after its header.
struct metrics_line {
  uint64_t step = 0;
  std::string mode;
  uint32_t workers = 0;
  double loss = 0;
};

std::vector<metrics_line> read_metrics(const std::string& path, std::string& header) {
  std::ifstream f{path};
  std::vector<metrics_line> out;
  std::getline(f, header);
  for (std::string line; std::getline(f, line);) {
    std::vector<std::string> cells;
    std::stringstream ls{line};
    for (std::string cell; std::getline(ls, cell, ',');)
      cells.push_back(cell);
    if (cells.size() != 7)
      continue;
    out.push_back({std::stoull(cells[0]), cells[4],
                   static_cast<uint32_t>(std::stoul(cells[5])), std::stod(cells[2])});
  }
  return out;
}

} // namespace

TEST_CASE("a sparse job's chief writes the metrics CSV and a row per worker beside it, "
          "between-graph and in-graph",
          "[sparse_job][sparse_status]") {
  // Catches: metrics = "..." ignored by a sparse job (no file, as before),
  // rows at other steps than every log_every, per-worker rows without the
  // sparse members' pushes.
  for (bool in_graph : {false, true}) {
    INFO((in_graph ? "in-graph" : "between-graph"));
    temp_dir dir;
    auto c = small_job(in_graph ? "async" : "sync", 20);
    c.steps = 20;
    c.log_every = 5;
    c.metrics = dir.path + "/m.csv";
    auto cluster = embedded_cluster::start({{"ps", 2}, {"worker", 2}});
    REQUIRE(cluster);
    sparse_job_options o;
    o.shutdown_ps = false;
    o.print = false;
    auto results = run_two(**cluster, c, o, in_graph);
    REQUIRE(results[0]);
    REQUIRE(results[1]);
    std::string header;
    auto rows = read_metrics(c.metrics, header);
    CHECK(header == "step,wall_s,loss,accuracy,mode,workers,examples_per_s");
    REQUIRE_FALSE(rows.empty());
    std::vector<uint64_t> steps;
    for (const auto& r : rows) {
      steps.push_back(r.step);
      CHECK(r.mode == c.mode);
      CHECK(r.workers == 2);
      CHECK(r.loss > 0);
    }
    // Between-graph sync: a report every 5 global steps. In-graph async:
    // every 5 turns of the two replicas, a push each (10 global steps).
    CHECK(steps == (in_graph ? std::vector<uint64_t>{10, 20} : std::vector<uint64_t>{5, 10, 15, 20}));
    auto workers = read_worker_rows(dir.path + "/m.workers.csv");
    auto reports = reports_of(workers);
    REQUIRE(reports.size() == rows.size());
    const auto& last = reports.back();
    REQUIRE(last.size() == 2);
    for (uint32_t w = 0; w < 2; ++w) {
      INFO("worker " << w);
      CHECK(last[w].worker == w);
      CHECK(last[w].task == "/job:worker/task:" + std::to_string(w));
      CHECK(last[w].pushes > 0);
    }
  }
}

TEST_CASE("a worker process joins a running sparse sync job with --join, its pushes are "
          "applied, and the job ends at the chief's steps",
          "[sparse_job][elastic][processes]") {
  // Catches: --join refused for a sparse model, a joiner that asks for an
  // aggregator of its own worker count (refused, or a second one), one that
  // counts the job's steps for its own config's workers (sync: it would
  // stop early, or push alone after the others ended), and a chief that
  // ends without waiting for it.
  temp_dir dir;
  job_spec spec;
  spec.ps_tasks = 2;
  spec.workers = 2;
  spec.spare_workers = 1;
  // epochs, not steps: the joiner's config (3 workers) would count 2/3 of
  // the chief's steps. About 7 s at 3,000 steps/s: the job outlasts a
  // newcomer's start (a process, its data, the chief's word).
  std::string table = long_sparse_job;
  table.replace(table.find("steps = 10000000\nepochs = 0"), 27, "steps = 0\nepochs = 80");
  spec.train_table = table + "metrics = \"" + dir.path + "/m.csv\"\n";
  auto job = train_job::start(dir.path, spec);
  if (!job->wait_until([&] { return job->chief().output().find("\nstep ") != std::string::npos; },
                       30s))
    FAIL("no progress line from the chief within 30 s:\n" << job->describe());
  auto& joined = job->join(2);
  auto running = job->wait_all_exit(std::chrono::seconds{120});
  INFO(job->describe());
  CHECK(running.empty());
  for (const auto& t : job->tasks())
    CHECK(t.process->exit_code() == 0);
  // The chief's count: 80 epochs of 16,000 examples in global batches of 2 x 32.
  CHECK(job->chief().output().find("train done: mode=sync workers=2 global_step=20000 ")
        != std::string::npos);
  static const std::regex done{R"(/job:worker/task:2: done after (\d+) local steps)"};
  std::smatch m;
  auto out = joined.output();
  REQUIRE(std::regex_search(out, m, done));
  auto local = std::stoull(m[1].str());
  // It pushed from the step it joined at to the chief's last (sync: every
  // step after its join is one of its own). It joins ps 0, then ps 1: a
  // round may close in between, and it starts at the least of the two.
  static const std::regex at{
    R"(aggregator 'train/sparse/ps\d': worker 2 \(/job:worker/task:2 at [0-9.:]+\) joined at global step (\d+))"};
  uint64_t joined_at = UINT64_MAX;
  for (int k = 0; k < 2; ++k) {
    auto ps_out = job->process("ps", k).output();
    std::smatch j;
    REQUIRE(std::regex_search(ps_out, j, at));
    joined_at = std::min<uint64_t>(joined_at, std::stoull(j[1].str()));
  }
  CHECK(joined_at + local == 20000);
  // ps 0 applied its pushes: its row in the chief's last report.
  auto reports = reports_of(read_worker_rows(dir.path + "/m.workers.csv"));
  REQUIRE_FALSE(reports.empty());
  const worker_row* newcomer = nullptr;
  for (const auto& r : reports.back())
    if (r.worker == 2)
      newcomer = &r;
  REQUIRE(newcomer != nullptr);
  CHECK(newcomer->task == "/job:worker/task:2");
  CHECK(newcomer->applied > 0);
  CHECK(newcomer->refused == 0);
}

// Catches: --switch refused for a sparse job (it was, by name), or looking
// up the dense job's aggregators; a sparse worker that never joins the
// rounds again after a switch into sync (its member a scoped actor that read
// no message: on standby at every ps, its pushes applied at once and the
// global step still, sync in name only, the job never ending); a round that
// applies each worker's rows apart instead of once merged; pushes lost or
// applied twice across the switches.
TEST_CASE("a between-graph sparse job of 2 ps and 2 worker processes switched async -> sync -> "
          "async with --switch applies one merged update per sync round on each ps and ends "
          "with every worker's pushes counted",
          "[sparse_job][sparse_switch][processes]") {
  temp_dir dir;
  job_spec spec;
  spec.ps_tasks = 2;
  spec.workers = 2;
  std::string table = long_sparse_job;
  table.replace(table.find("mode = \"sync\""), 13, "mode = \"async\"");
  // Paced (2 ms a step: at most ~1,000 async steps/s, ~500 sync rounds/s):
  // the job outlasts three clients' starts, and ends seconds after them.
  table.replace(table.find("steps = 10000000"), 16, "steps = 8000");
  spec.train_table = table + "metrics = \"" + dir.path + "/m.csv\"\n";
  spec.worker_args = {{0, {"--step-delay-ms", "2"}}, {1, {"--step-delay-ms", "2"}}};
  auto job = train_job::start(dir.path, spec);
  if (!job->wait_until([&] { return sparse_progress(job->chief().output()).has_value(); }, 30s))
    FAIL("no progress line from the chief within 30 s:\n" << job->describe());

  auto to_sync = job->client({"--switch", "sync"}, 30s);
  INFO("--switch sync:\n" << to_sync.output);
  REQUIRE(to_sync.exit_code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(to_sync.output, m,
                            std::regex{R"(/job:ps/task:0: now sync, at global step (\d+))"}));
  auto switched_at = std::stoull(m[1].str());
  CHECK(to_sync.output.find("/job:ps/task:1: now sync, at global step") != std::string::npos);
  // In sync the global step moves by one a round of both workers' pushes:
  // a worker left on standby would leave it where the switch found it.
  auto rounds = [&](uint64_t past) {
    return job->wait_until(
      [&] { return sparse_progress(job->chief().output()).value_or(0) >= past; }, 30s);
  };
  if (!rounds(switched_at + 40))
    FAIL("the global step did not move 40 rounds past the switch into sync (at "
         << switched_at << ") within 30 s:\n" << job->describe());
  // Two snapshots in sync (each ps's stats are one consistent answer): every
  // round between them applied one merged update and took one push of each
  // worker (a push may wait in the round in progress at either snapshot).
  auto first = job->client({"--status"}, 30s);
  INFO("--status 1:\n" << first.output);
  REQUIRE(first.exit_code == 0);
  auto at_first = ps_header(first.output, 0);
  REQUIRE(at_first);
  if (!rounds(at_first->global_step + 40))
    FAIL("the global step did not move 40 rounds in sync within 30 s:\n" << job->describe());
  auto second = job->client({"--status"}, 30s);
  INFO("--status 2:\n" << second.output);
  REQUIRE(second.exit_code == 0);
  auto rows1 = parse_status(first.output);
  auto rows2 = parse_status(second.output);
  for (int ps = 0; ps < 2; ++ps) {
    INFO("ps " << ps);
    auto a = ps_header(first.output, ps);
    auto b = ps_header(second.output, ps);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->mode == "sync");
    CHECK(b->mode == "sync");
    auto rounds_between = static_cast<int64_t>(b->global_step - a->global_step);
    CHECK(rounds_between >= 20);
    CHECK(b->applied - a->applied == b->global_step - a->global_step); // one update a round
    auto pushes = static_cast<int64_t>(b->pushes - a->pushes);
    CHECK(std::abs(pushes - 2 * rounds_between) <= 2);
    for (uint32_t w = 0; w < 2; ++w) {
      INFO("worker " << w);
      const auto* r1 = row_of(rows1, ps, w);
      const auto* r2 = row_of(rows2, ps, w);
      REQUIRE(r1 != nullptr);
      REQUIRE(r2 != nullptr);
      CHECK(r2->status == "member");
      auto own = static_cast<int64_t>(r2->pushes - r1->pushes);
      CHECK(std::abs(own - rounds_between) <= 1);
      CHECK(r2->late == 0);
    }
  }

  auto to_async = job->client({"--switch", "async"}, 30s);
  INFO("--switch async:\n" << to_async.output);
  REQUIRE(to_async.exit_code == 0);
  CHECK(to_async.output.find("/job:ps/task:1: now async, at global step") != std::string::npos);
  auto running = job->wait_all_exit(std::chrono::seconds{120});
  INFO(job->describe());
  CHECK(running.empty());
  for (const auto& t : job->tasks())
    CHECK(t.process->exit_code() == 0);
  const auto& out = job->chief().output();
  CHECK(out.find("train done: mode=async workers=2 global_step=") != std::string::npos);
  for (int ps = 0; ps < 2; ++ps)
    CHECK(job->process("ps", ps).output().find("without joining again") == std::string::npos);
  static const std::regex done{R"(/job:worker/task:1: done after (\d+) local steps)"};
  auto w1 = job->process("worker", 1).output();
  REQUIRE(std::regex_search(w1, m, done));
  CHECK(std::stoull(m[1].str()) > 0);
  // ps 0's last report, in async: each worker's pushes applied once, none
  // lost, late or refused across the two switches.
  auto reports = reports_of(read_worker_rows(dir.path + "/m.workers.csv"));
  REQUIRE_FALSE(reports.empty());
  REQUIRE(reports.back().size() == 2);
  for (const auto& r : reports.back()) {
    INFO("worker " << r.worker << ": pushes " << r.pushes << " applied " << r.applied << " late "
                   << r.late << " refused " << r.refused);
    CHECK(r.pushes > 0);
    CHECK(r.pushes == r.applied + r.late + r.refused);
    CHECK(r.late == 0);
    CHECK(r.refused == 0);
  }
}

TEST_CASE("actorflow-train --job worker --task 0 --in-graph drives a replica per worker of the "
          "config against ps processes, refuses a live switch naming why, and stops them at "
          "the end",
          "[sparse_job][sparse_in_graph][sparse_switch][processes]") {
  // Catches: the in-graph client refused with --job (the dense client's
  // rule), run as a between-graph worker instead (the ps would wait for a
  // worker 1 that never starts), or leaving the ps tasks running; and a
  // --switch that switches an in-graph job (into sync its replicas, taking
  // turns on one thread, would each wait for the next one's push: the job
  // would hang until step_timeout_ms) or is refused without saying why.
  temp_dir dir;
  auto path = dir.path + "/job.toml";
  // Four ports, none twice (free_loopback_port repeats none of its last
  // 256): a config with an address twice is refused by every process.
  auto addr = [] { return "\"127.0.0.1:" + std::to_string(free_loopback_port()) + "\""; };
  {
    std::ofstream f{path};
    f << "[cluster]\nps = [" << addr() << ", " << addr() << "]\nworker = [" << addr() << ", "
      << addr() << "]\n\n[train]\n"
      << long_sparse_job;
  }
  // About 10 s (2 ms a replica's step): --switch's client lands in it, on
  // a loaded machine too.
  std::vector<std::string> sets{"--set", "steps=5000", "--set", "mode=async"};
  auto argv = [&](const std::string& job, int task, bool in_graph) {
    std::vector<std::string> a{ACTORFLOW_TRAIN_BINARY, "--config", path, "--job", job,
                               "--task", std::to_string(task)};
    a.insert(a.end(), sets.begin(), sets.end());
    if (in_graph) {
      a.push_back("--in-graph");
      a.push_back("--step-delay-ms");
      a.push_back("2");
    }
    return a;
  };
  background_process ps0{argv("ps", 0, false)};
  background_process ps1{argv("ps", 1, false)};
  background_process client{argv("worker", 0, true)};
  // One bound for all the waits below, within ctest's 120 s for this case
  // (tests/CMakeLists.txt): a hang ends in the checks, which print every
  // process's output, not in ctest's kill, which prints none of it (the
  // waits alone once added up to 270 s).
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds{100};
  auto left = [&](std::chrono::milliseconds most) {
    auto now = std::chrono::steady_clock::now();
    using ms = std::chrono::milliseconds;
    return std::min(most, now < end ? std::chrono::duration_cast<ms>(end - now) : ms{0});
  };
  // Every process's output, for any check that fails (CI keeps only what
  // the test printed).
  auto all_output = [&] {
    ps0.read_output(std::chrono::milliseconds{0});
    ps1.read_output(std::chrono::milliseconds{0});
    return "client:\n" + client.output() + "\nps 0:\n" + ps0.output() + "\nps 1:\n"
           + ps1.output();
  };
  if (!client.wait_for("\nstep ", left(std::chrono::seconds{60})))
    FAIL("no progress line from the in-graph client within 60 s:\n" << all_output());
  background_process to_sync{{ACTORFLOW_TRAIN_BINARY, "--config", path, "--switch", "sync"}};
  auto switch_code = to_sync.wait_exit(left(std::chrono::seconds{30}));
  INFO("--switch sync:\n" << to_sync.output());
  INFO("when --switch ended, " << all_output());
  CHECK(switch_code == 1);
  CHECK(to_sync.output().find("switch to sync: this sparse job runs in-graph (one client whose "
                              "replicas take turns on one thread): a sync round of its replicas "
                              "could never fill")
        != std::string::npos);
  CHECK(to_sync.output().find("--set mode=sync") != std::string::npos);
  // The ps tasks' output is read meanwhile too: one blocked on a full pipe
  // would hold the client's steps.
  std::optional<int> code;
  while (!(code = client.exit_code()) && std::chrono::steady_clock::now() < end) {
    client.read_output(std::chrono::milliseconds{50});
    ps0.read_output(std::chrono::milliseconds{0});
    ps1.read_output(std::chrono::milliseconds{0});
  }
  client.read_output(std::chrono::milliseconds{0}); // what it printed last
  auto ps0_code = ps0.wait_exit(left(std::chrono::seconds{30}));
  auto ps1_code = ps1.wait_exit(left(std::chrono::seconds{30}));
  INFO("client:\n" << client.output() << "\nps 0:\n" << ps0.output() << "\nps 1:\n"
                   << ps1.output());
  CHECK(code == 0);
  CHECK(client.output().find("(in-graph, 2 replicas)") != std::string::npos);
  CHECK(client.output().find("train done: mode=async workers=2 global_step=5000 ")
        != std::string::npos);
  // async: a member per replica at each ps.
  CHECK(ps0.output().find("async aggregator 'train/sparse/ps0' for 2 workers") != std::string::npos);
  CHECK(ps0_code == 0);
  CHECK(ps1_code == 0);
  CHECK(ps0.output().find("the chief ended the job") != std::string::npos);
}
