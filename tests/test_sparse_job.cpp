// The sparse job (dist/sparse_job.hpp, issue 25): the recommender trained by
// workers over tables cut across ps tasks, rows read and pushed through the
// data plane.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>
#include <vector>

#include "dist/embedded_cluster.hpp"
#include "dist/sparse_checkpoint.hpp"
#include "dist/sparse_job.hpp"
#include "graph/embedding.hpp"
#include "kernels/shard_routing.hpp"
#include "messages/error.hpp"
#include "train/checkpoint.hpp"
#include "train/local.hpp"
#include "train/table_checkpoint.hpp"
#include "sparse_jobs.hpp"
#include "temp_dir.hpp"

using namespace af;

namespace {

using af::testing::planted_job;
using af::testing::small_job;
using af::testing::table_differences;

/// Runs `c` on an embedded cluster of `ps` ps and `workers` workers; the
/// chief's outcome, and (if asked) each table read back whole from its
/// shards, in the one-piece table's row order.
struct job_run {
  std::vector<caf::expected<sparse_outcome>> results;
  std::vector<std::vector<float>> tables; ///< [table][row * width + col]
  std::vector<float> dense;
};

job_run run_job(const train::train_config& c, int ps, int workers, bool read_back,
                const train::train_config* other = nullptr) {
  job_run out;
  auto cluster = embedded_cluster::start({{"ps", ps}, {"worker", workers}});
  REQUIRE(cluster);
  for (int w = 0; w < workers; ++w)
    out.results.emplace_back(make_error(af_error::internal, "not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      auto s = (*cluster)->session_for("worker", w);
      if (!s) {
        out.results[w] = std::move(s.error());
        return;
      }
      sparse_job_options o;
      o.shutdown_ps = false;
      o.print = false;
      out.results[w] =
        run_sparse_worker_task(*s, w > 0 && other ? *other : c, static_cast<uint32_t>(w), o);
    });
  for (auto& t : threads)
    t.join();
  if (!read_back || !out.results[0])
    return out;
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  auto model = train::recommender_of(c);
  REQUIRE(model);
  auto strategy = kernels::parse_partition_strategy(c.partition_strategy);
  for (const auto& spec : model->tables()) {
    auto sizes = kernels::balanced_shard_rows(spec.rows, ps);
    kernels::shard_router router;
    REQUIRE(kernels::shard_router::make(*strategy, sizes, router).ok());
    std::vector<tensor> shards;
    for (int k = 0; k < ps; ++k) {
      auto scope = s->device("/job:ps/task:" + std::to_string(k));
      REQUIRE(scope);
      auto v = s->variable(shard_name(spec.name, k), {sizes[k], spec.width});
      REQUIRE(v);
      auto value = s->run(*v);
      REQUIRE(value);
      shards.push_back(std::move(*value));
    }
    std::vector<float> whole(static_cast<size_t>(spec.rows * spec.width));
    for (int64_t id = 0; id < spec.rows; ++id) {
      auto at = router.place(id);
      const float* row = shards[at.shard].data<float>() + at.row * spec.width;
      std::copy(row, row + spec.width, whole.begin() + id * spec.width);
    }
    out.tables.push_back(std::move(whole));
  }
  auto scope = s->device("/job:ps/task:0");
  REQUIRE(scope);
  auto bias = s->variable("global_bias", {1});
  REQUIRE(bias);
  auto value = s->run(*bias);
  REQUIRE(value);
  out.dense = value->values<float>();
  return out;
}

} // namespace

TEST_CASE("a sync sparse job of one worker over 3 ps trains exactly what one process trains",
          "[sparse_job]") {
  // Catches: rows routed to the wrong shard or written back to the wrong
  // row, a shard's initializer giving other rows than the one-piece
  // table's, a worker's batch order that differs from the trainer's, a sync
  // round that scales or applies a sparse push differently from
  // apply_rows, or a shard that gets a push it was not sent.
  for (std::string strategy : {"mod", "div"}) {
    auto c = small_job("sync", 30);
    c.partition_strategy = strategy;
    auto run = run_job(c, 3, 1, true);
    REQUIRE(run.results[0]);
    CHECK(run.results[0]->global_step == 30);

    auto clicks = train::load_clicks(c);
    REQUIRE(clicks);
    auto m = train::recommender_of(c);
    REQUIRE(m);
    train::sparse_local_options o;
    o.optimizer = c.optimizer;
    o.batch = c.batch_size;
    o.steps = 30;
    o.seed = c.seed;
    auto local = train::train_sparse_local(*m, clicks->data.train, clicks->data.test, o);
    REQUIRE(local);
    for (size_t t = 0; t < run.tables.size(); ++t) {
      INFO(strategy << " table " << t);
      auto want = local->state.tables.values[t].values<float>();
      REQUIRE(want.size() == run.tables[t].size());
      size_t differ = 0;
      for (size_t i = 0; i < want.size(); ++i)
        differ += want[i] != run.tables[t][i]; // bit for bit: the same arithmetic
      CHECK(differ == 0);
    }
    CHECK(run.dense == local->state.dense.values[0].values<float>());
    CHECK(run.results[0]->auc == Approx(local->auc).margin(1e-9));
  }
}

TEST_CASE("a sync sparse job of 2 workers over 2 ps nears the planted truth's AUC",
          "[sparse_job]") {
  // Catches: workers that push their gradients to the wrong step, a round
  // that drops one worker's rows, or an exchange that reads stale rows: the
  // model would not learn the planted factors.
  auto c = planted_job("sync");
  auto run = run_job(c, 2, 2, false);
  REQUIRE(run.results[0]);
  REQUIRE(run.results[1]);
  const auto& o = *run.results[0];
  INFO("auc " << o.auc << " truth " << o.truth_auc);
  CHECK(o.auc > o.truth_auc - 0.03);
  CHECK(o.global_step == run.results[1]->global_step);
  // Only the touched rows travel: ids and rows, at most 1.2 x their bytes.
  CHECK(o.bytes_per_step <= 1.2 * o.touched_bytes_per_step);
  CHECK(o.bytes_per_step > 0);
}

TEST_CASE("an async sparse job of 2 workers nears the planted truth's AUC", "[sparse_job]") {
  // Catches: async pushes that are not applied (the AUC would stay at
  // chance) and workers that stop before the job's steps are done.
  auto c = planted_job("async");
  auto run = run_job(c, 2, 2, false);
  REQUIRE(run.results[0]);
  REQUIRE(run.results[1]);
  INFO("auc " << run.results[0]->auc << " truth " << run.results[0]->truth_auc);
  CHECK(run.results[0]->auc > run.results[0]->truth_auc - 0.04);
  // Every push is a global step of one worker's batch: the job's epochs
  // take total_steps(..., 1) pushes of the two workers together (catches
  // an async job that stops after 1 / workers of its epochs).
  auto total = train::total_steps(c, run.results[0]->train_examples, 1);
  CHECK(run.results[0]->global_step >= total);
  CHECK(run.results[0]->local_steps + run.results[1]->local_steps >= total);
}

TEST_CASE("a sparse job refuses by name a mode that cannot take sparse gradients, and a batch "
          "larger than its data",
          "[sparse_job]") {
  // Catches: average silently densifying whole tables (or failing later
  // with an aggregator error that names no mode).
  {
    // Catches: a batch larger than the training set run as one step of
    // repeated examples, without a word.
    auto c = small_job("sync", 5);
    c.batch_size = 4000;
    auto run = run_job(c, 1, 1, false);
    REQUIRE_FALSE(run.results[0]);
    CHECK(describe(run.results[0].error()).find("batch_size = 4000") != std::string::npos);
  }
  for (std::string mode : {"average", "allreduce"}) {
    auto c = small_job(mode, 5);
    auto run = run_job(c, 1, 1, false);
    REQUIRE_FALSE(run.results[0]);
    auto what = describe(run.results[0].error());
    INFO(what);
    CHECK(what.find("mode '" + mode + "'") != std::string::npos);
    CHECK(what.find("sync, async or ssp") != std::string::npos);
  }
}

TEST_CASE("a sparse job's checkpoint over 3 ps is restored over 2 (mod) and 4 (div) ps bit for "
          "bit, and the job goes on from its step",
          "[sparse_job][sparse_checkpoint]") {
  // Catches: a job that writes no checkpoint, a restore that leaves the
  // initializers' values (or the old layout's rows in the new shards), the
  // dense parameters not restored, aggregators that start at step 0 again.
  testing::temp_dir dir;
  auto c = small_job("sync", 20);
  c.optimizer.kind = "adagrad";
  c.optimizer.lr = 0.3;
  c.checkpoint_dir = dir.path;
  auto first = run_job(c, 3, 1, true);
  REQUIRE(first.results[0]);
  CHECK(first.results[0]->global_step == 20);
  auto latest = train::latest(dir.path);
  REQUIRE(latest);
  CHECK(std::filesystem::path(*latest).filename() == "ckpt-20.afck");
  for (auto [ps, strategy] : {std::pair<int, std::string>{2, "mod"}, {4, "div"}}) {
    INFO(ps << " ps, " << strategy);
    auto again = c;
    again.partition_strategy = strategy;
    // Another seed (other initial tables): only the restore makes them equal.
    again.seed = 7;
    auto run = run_job(again, ps, 1, true);
    REQUIRE(run.results[0]);
    CHECK(run.results[0]->global_step == 20);
    CHECK(run.results[0]->local_steps == 0); // the job's 20 steps were done
    CHECK(table_differences(first.tables, run.tables) == 0);
    CHECK(run.dense == first.dense);
  }
  // Going on: 5 more steps over 2 ps, from global step 20.
  auto more = c;
  more.steps = 25;
  auto run = run_job(more, 2, 1, false);
  REQUIRE(run.results[0]);
  CHECK(run.results[0]->local_steps == 5);
  CHECK(run.results[0]->global_step == 25);
}

TEST_CASE("a sparse job of 40 steps, checkpointing every 10, equals one of 20 steps, restored, "
          "then 20 more, bit for bit",
          "[sparse_job][sparse_checkpoint]") {
  // Catches: a checkpoint taken at another step than the one it says (the
  // chief saving while a round is applied), optimizer slots not saved or
  // not restored (adagrad), data that restarts at the first batch instead
  // of the checkpoint's step, a checkpoint that disturbs the job it is
  // taken in.
  for (std::string kind : {"sgd", "adagrad"}) {
    INFO(kind);
    testing::temp_dir straight_dir, split_dir;
    auto c = small_job("sync", 40);
    c.optimizer.kind = kind;
    c.optimizer.lr = kind == "sgd" ? 0.5 : 0.3;
    c.checkpoint_dir = straight_dir.path;
    c.checkpoint_steps = 10; // at 10, 20 (among others), 30 and 40
    auto straight = run_job(c, 3, 1, true);
    REQUIRE(straight.results[0]);
    // The newest 3 are kept, their tables with them; the oldest's go.
    CHECK_FALSE(std::filesystem::exists(sparse_tables_dir(straight_dir.path, 10)));
    CHECK_FALSE(std::filesystem::exists(straight_dir.path + "/ckpt-10.afck"));
    for (uint64_t step : {20, 30, 40})
      CHECK(std::filesystem::is_directory(sparse_tables_dir(straight_dir.path, step)));

    auto half = c;
    half.steps = 20;
    half.checkpoint_steps = 0;
    half.checkpoint_dir = split_dir.path;
    auto first = run_job(half, 3, 1, false);
    REQUIRE(first.results[0]);
    auto rest = half;
    rest.steps = 40;
    auto second = run_job(rest, 3, 1, true);
    REQUIRE(second.results[0]);
    CHECK(second.results[0]->local_steps == 20);
    CHECK(second.results[0]->global_step == 40);
    CHECK(table_differences(straight.tables, second.tables) == 0);
    CHECK(second.dense == straight.dense);
  }
}

TEST_CASE("a sparse job refuses a torn shard file of its checkpoint, naming it, and trains "
          "nothing",
          "[sparse_job][sparse_checkpoint]") {
  // Catches: a restore that reads a shard file of the wrong size (zeros or
  // garbage in the table), an error that does not say which file, a chief
  // that falls back to fresh initializers and trains over the checkpoint.
  testing::temp_dir dir;
  auto c = small_job("sync", 10);
  c.checkpoint_dir = dir.path;
  auto first = run_job(c, 3, 1, false);
  REQUIRE(first.results[0]);
  auto torn = train::table_shard_path(sparse_tables_dir(dir.path, 10), "item_emb", 1, 3);
  REQUIRE(std::filesystem::exists(torn));
  std::filesystem::resize_file(torn, std::filesystem::file_size(torn) - 100);
  auto again = c;
  again.steps = 20;
  auto run = run_job(again, 2, 1, false);
  REQUIRE_FALSE(run.results[0]);
  auto what = describe(run.results[0].error());
  INFO(what);
  CHECK(what.find(torn) != std::string::npos);
  // Nothing trained: no checkpoint after the restored one.
  auto latest = train::latest(dir.path);
  REQUIRE(latest);
  CHECK(std::filesystem::path(*latest).filename() == "ckpt-10.afck");
  CHECK_FALSE(std::filesystem::exists(sparse_tables_dir(dir.path, 20)));
}

TEST_CASE("a sparse job with a checkpoint_key restores its tables, and refuses tables whose "
          "manifest was rewritten without the key, naming it, and trains nothing",
          "[sparse_job][sparse_checkpoint]") {
  // Catches: the key's HMAC covering only the job's state file, so that a
  // shard file forged with finite rows, and its manifest rewritten to match,
  // were restored; and the chief's check of the manifest not reaching the ps
  // that read it.
  testing::temp_dir dir, keys;
  auto key = keys.path + "/checkpoint.key";
  testing::write_file(key, "0123456789abcdef0123456789abcdef");
  auto c = small_job("sync", 10);
  c.checkpoint_dir = dir.path;
  c.checkpoint_key = key;
  REQUIRE(run_job(c, 3, 1, false).results[0]);
  auto tables = sparse_tables_dir(dir.path, 10);
  SECTION("as written, it restores and trains on") {
    auto again = c;
    again.steps = 20;
    auto run = run_job(again, 3, 1, false);
    INFO((run.results[0] ? std::string{} : describe(run.results[0].error())));
    REQUIRE(run.results[0]);
    CHECK(std::filesystem::exists(sparse_tables_dir(dir.path, 20)));
  }
  SECTION("its manifest rewritten without the key") {
    auto layout = train::read_table_manifest(tables, "item_emb");
    REQUIRE(layout);
    REQUIRE(train::write_table_manifest(tables, *layout));
    auto again = c;
    again.steps = 20;
    auto run = run_job(again, 3, 1, false);
    REQUIRE_FALSE(run.results[0]);
    auto what = describe(run.results[0].error());
    INFO(what);
    CHECK(what.find(train::table_manifest_path(tables, "item_emb") + "' has no HMAC")
          != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(sparse_tables_dir(dir.path, 20)));
  }
}

TEST_CASE("the workers of a restored sparse job (sync and async, 2 workers) go on from the "
          "checkpoint's step",
          "[sparse_job][sparse_checkpoint]") {
  // Catches: a worker that joins before the chief set the aggregators'
  // step (it would push step 0 and be dropped as late), or a non-chief
  // worker that starts its data or its steps over.
  for (std::string mode : {"sync", "async"}) {
    INFO(mode);
    testing::temp_dir dir;
    auto c = small_job(mode, 20);
    c.checkpoint_dir = dir.path;
    auto first = run_job(c, 2, 2, false);
    REQUIRE(first.results[0]);
    REQUIRE(first.results[1]);
    // The step the job's last checkpoint holds: async, the aggregators'
    // least step once every worker was done, which may be past the one the
    // chief's last push saw (the other worker's last pushes came after it).
    auto latest = latest_sparse_checkpoint(c);
    REQUIRE(latest);
    REQUIRE(*latest);
    auto saved = (*latest)->global_step;
    CHECK(saved >= 20);
    CHECK(saved >= first.results[0]->global_step);
    auto more = c;
    more.steps = saved + 20;
    auto run = run_job(more, 3, 2, false);
    REQUIRE(run.results[0]);
    REQUIRE(run.results[1]);
    for (int w = 0; w < 2; ++w) {
      INFO("worker " << w);
      const auto& o = *run.results[w];
      CHECK(o.global_step >= saved + 20);
      CHECK(o.late == 0);
      if (mode == "sync")
        CHECK(o.local_steps == 20);
      else // the two share the 20 steps (one may take them all if the other starts late)
        CHECK(o.local_steps <= 20);
    }
    if (mode == "async")
      CHECK(run.results[0]->local_steps + run.results[1]->local_steps >= 20);
  }
}

TEST_CASE("a diverging sparse job ends at once with an error on every worker", "[sparse_job]") {
  // Catches: a job that trains on (or scores, and hangs in the held-out
  // AUC) with tables gone to inf and NaN, and a failed worker that waits the
  // whole timeout for every aggregator's answer to its done.
  auto c = small_job("sync", 50);
  c.optimizer.lr = 1e30;
  auto start = std::chrono::steady_clock::now();
  auto run = run_job(c, 2, 2, false);
  auto took = std::chrono::steady_clock::now() - start;
  bool told = false; // some worker says why and what to do (not only "not finite")
  for (auto& r : run.results) {
    REQUIRE_FALSE(r);
    auto what = describe(r.error());
    INFO(what);
    CHECK((what.find("not finite") != std::string::npos
           || what.find("diverged") != std::string::npos));
    told = told || what.find("lower learning_rate") != std::string::npos;
  }
  CHECK(told);
  // Not after the 20 s timeouts the job was given (a bound for a hang, not
  // a speed: the job ends within a second).
  CHECK(took < std::chrono::seconds(19));
}

TEST_CASE("a worker whose config cuts the tables otherwise than the chief's is refused, naming "
          "both, and the chief fails the job naming it", "[sparse_job]") {
  // Catches: a worker with partition_strategy div in a mod job (the same
  // shard sizes, so every variable it asks for exists) silently reading and
  // updating other ids' rows; and a sync chief that then waits its whole
  // step timeout for the refused worker and fails without saying why.
  auto c = small_job("sync", 20);
  auto other = c;
  other.partition_strategy = "div";
  auto run = run_job(c, 2, 2, false, &other);
  REQUIRE_FALSE(run.results[1]);
  auto what = describe(run.results[1].error());
  INFO(what);
  CHECK(what.find("partition_strategy=div") != std::string::npos);
  CHECK(what.find("partition_strategy=mod") != std::string::npos);
  CHECK(what.find("one config") != std::string::npos);
  REQUIRE_FALSE(run.results[0]);
  auto chief = describe(run.results[0].error());
  INFO(chief);
  CHECK(chief.find("worker 1") != std::string::npos);
  CHECK(chief.find("partition_strategy=div") != std::string::npos);
}

TEST_CASE("a worker whose click data is refused says why at once, waiting for no ps, even with "
          "a ps down", "[sparse_job]") {
  // Catches: a bad CSV row (or any refusal before a ps is asked) taken for a
  // ps lost during the set-up when some ps does not answer, as in an
  // embedded job whose other worker's same refusal already stopped the
  // cluster: the worker waited ps_recovery_timeout_ms (60 s by default) and
  // then failed naming the ps, not the file.
  af::testing::temp_dir dir;
  REQUIRE_FALSE(dir.path.empty());
  auto csv = dir / "clicks.csv";
  af::testing::write_file(csv, "user,item,label\n1,2,1\n3,4,2\n");
  auto c = small_job("sync", 5);
  c.data = "csv:" + csv;
  c.ps_recovery_timeout_ms = 1500;
  auto cluster = embedded_cluster::start({{"ps", 2}, {"worker", 1}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  REQUIRE_FALSE(s->shutdown("ps", 1)); // down before the set-up begins
  sparse_job_options o;
  o.shutdown_ps = false;
  o.print = false;
  auto r = run_sparse_worker_task(*s, c, 0, o);
  REQUIRE_FALSE(r);
  auto what = describe(r.error());
  INFO(what);
  CHECK(is(r.error(), af_error::invalid_argument));
  CHECK(what.find("clicks.csv:3: column 3 (label) = '2'") != std::string::npos);
  CHECK(what.find("ps_recovery_timeout_ms") == std::string::npos);
}

TEST_CASE("a sparse job whose tables are too large for its ps is refused before its data is "
          "loaded, between-graph and in one process", "[sparse_job]") {
  // Catches: the tables' size checked only after the clicks were drawn
  // (users = 400000000 in the embedded job: a minute and 6 GB of Zipf
  // weights and clicks, then the refusal). The data here cannot be read:
  // refused first, the error would name the file instead.
  auto c = small_job("sync", 5);
  c.data = "csv:/nonexistent/actorflow-clicks.csv";
  c.max_data_bytes = 1000; // the tables' ~4 KB a ps, over 2 ps
  auto run = run_job(c, 2, 1, false);
  REQUIRE_FALSE(run.results[0]);
  auto what = describe(run.results[0].error());
  INFO(what);
  CHECK(is(run.results[0].error(), af_error::resource_exhausted));
  CHECK(what.find("more than max_data_bytes = 1000") != std::string::npos);
  auto local = train::train_recommender_local(c, nullptr);
  REQUIRE_FALSE(local);
  INFO(local.error().what);
  CHECK(local.error().code == af_error::resource_exhausted);
  CHECK(local.error().what.find("this one process") != std::string::npos);
}

TEST_CASE("a sparse job whose table has fewer rows than its ps tasks is refused naming the table "
          "before its data is loaded", "[sparse_job]") {
  // Catches: the rows against the ps count checked only after the clicks
  // were drawn or read (items = 1 over 3 ps: seconds of data, then the
  // refusal). The data here cannot be read: refused first, the error would
  // name the file instead.
  auto c = small_job("sync", 5);
  c.data = "csv:/nonexistent/actorflow-clicks.csv";
  c.items = 1;
  auto run = run_job(c, 2, 1, false);
  REQUIRE_FALSE(run.results[0]);
  auto what = describe(run.results[0].error());
  INFO(what);
  CHECK(what.find("table 'item_emb' has 1 rows, fewer than the 2 ps tasks") != std::string::npos);
}
