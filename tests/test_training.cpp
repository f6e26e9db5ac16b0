// Data-parallel training on an embedded cluster (1 ps + 2 workers; allreduce:
// 2 workers): accuracy per mode, exactness between modes and against one
// process, and what the aggregators refuse. The same jobs across real
// processes, with kill -9 and SIGSTOP, are in test_train_processes.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <thread>

#include "caf/all.hpp"

#include "actors/data_plane.hpp"
#include "actors/embedded_cluster.hpp"
#include "actors/training.hpp"
#include "messages/error.hpp"
#include "train/local.hpp"

using namespace af;

namespace {

struct job_run {
  std::vector<caf::expected<train_outcome>> results;
};

/// Runs `c` with 2 workers (and 1 ps unless allreduce) on an embedded cluster.
job_run run_job(const train::train_config& c, train_options opts = {}) {
  std::map<std::string, int> jobs{{"worker", 2}};
  if (c.mode != "allreduce")
    jobs["ps"] = 1;
  auto cluster = embedded_cluster::start(jobs);
  REQUIRE(cluster);
  job_run out;
  out.results.assign(2, make_error(af_error::internal, "not run"));
  opts.shutdown_ps = false;
  opts.print = false;
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w)
    threads.emplace_back([&, w] {
      auto s = (*cluster)->session_for("worker", w);
      if (!s) {
        out.results[w] = std::move(s.error());
        return;
      }
      out.results[w] = run_worker_task(*s, c, static_cast<uint32_t>(w), opts);
    });
  for (auto& t : threads)
    t.join();
  return out;
}

train::train_config digits(const std::string& mode) {
  train::train_config c;
  c.mode = mode;
  c.log_every = 0;
  c.eval_every = 0;
  c.step_timeout_ms = 20000;
  return c;
}

double max_abs_diff(const std::vector<tensor>& a, const std::vector<tensor>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].num_elements() == b[i].num_elements());
    for (size_t k = 0; k < a[i].num_elements(); ++k)
      m = std::max(m, std::abs(a[i].at(k) - b[i].at(k)));
  }
  return m;
}

} // namespace

TEST_CASE("each mode trains the digits MLP to 95% held-out accuracy on an embedded cluster",
          "[train]") {
  // Catches: an aggregator that applies nothing, twice, or with the wrong
  // sign; workers that train on the same shard; a broken all-reduce.
  for (std::string mode : {"sync", "async", "average", "allreduce"}) {
    CAPTURE(mode);
    auto run = run_job(digits(mode));
    for (auto& r : run.results)
      REQUIRE(r);
    auto& chief = *run.results[0];
    CHECK(chief.result.accuracy >= 0.95);
    CHECK(chief.result.global_step > 0);
    if (mode == "async") {
      uint64_t applied = 0;
      for (auto n : chief.stats.staleness)
        applied += n;
      CHECK(applied == chief.stats.applied); // every applied gradient has a staleness
      CHECK(applied > 0);
      // two workers interleave: some gradients were computed from older parameters
      CHECK(applied > chief.stats.staleness[0]);
    }
  }
}

TEST_CASE("sync with 2 workers at batch b equals 1 process at batch 2b; average (k=1, sgd) and "
          "allreduce equal sync",
          "[train]") {
  // Catches: gradients summed instead of averaged, a worker reading the other's
  // shard or a batch twice, averaging at the wrong time, an all-reduce that is
  // not a mean.
  auto c = digits("sync");
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.2;
  c.steps = 40;
  c.batch_size = 16;
  auto sync = run_job(c);
  REQUIRE(sync.results[0]);
  REQUIRE(sync.results[1]);
  const auto& ps = sync.results[0]->result.params;
  REQUIRE(sync.results[0]->result.global_step == 40);

  auto data = train::load_data(c);
  REQUIRE(data);
  auto local = train::train_local(c, *data, 40, 32);
  REQUIRE(local);
  CHECK(max_abs_diff(ps, local->params) < 1e-4);
  // and the run did move the parameters: equality is not both standing still
  auto init = train::initial_values(*train::parameters(c.model, 64, 10, c.hidden, c.seed));
  CHECK(max_abs_diff(ps, *init) > 1e-2);

  auto avg_cfg = c;
  avg_cfg.mode = "average";
  avg_cfg.average_every = 1;
  auto avg = run_job(avg_cfg);
  REQUIRE(avg.results[0]);
  CHECK(max_abs_diff(avg.results[0]->result.params, ps) < 1e-4);

  auto ar_cfg = c;
  ar_cfg.mode = "allreduce";
  auto ar = run_job(ar_cfg);
  REQUIRE(ar.results[0]);
  REQUIRE(ar.results[1]);
  CHECK(max_abs_diff(ar.results[0]->result.params, ps) < 1e-4);
  // every worker applied the same update: bit-identical replicas
  CHECK(ar.results[0]->result.params == ar.results[1]->result.params);
}

TEST_CASE("a NaN gradient is refused, counted and named, and never reaches a variable", "[train]") {
  // Catches: a non-finite gradient applied (the tutorial's "one machine's
  // infinite result stops everyone"), or a refusal that stalls the sync step.
  auto c = digits("sync");
  c.steps = 20;
  train_options opts;
  opts.tamper = [](uint64_t step, std::vector<tensor>& grads) {
    if (step == 3)
      grads[0].mutable_data<float>()[5] = std::nanf("");
  };
  auto run = run_job(c, opts);
  REQUIRE(run.results[0]);
  REQUIRE(run.results[1]);
  const auto& stats = run.results[0]->stats;
  CHECK(stats.refused == 2); // both workers' step-3 gradients (each tampered)
  CHECK_THAT(stats.last_refusal, Catch::Contains("worker") && Catch::Contains("hidden0/w")
                                   && Catch::Contains("element 5"));
  CHECK(run.results[0]->result.global_step == 20);
  for (const auto& p : run.results[0]->result.params)
    for (size_t k = 0; k < p.num_elements(); ++k)
      REQUIRE(std::isfinite(p.at(k)));
}

TEST_CASE("aggregators refuse a wrong shape naming the variable, time out naming the missing "
          "worker, and drop a stale gradient",
          "[train]") {
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  {
    auto scope = s->device("/job:ps/task:0");
    REQUIRE(s->variable("w", {2, 3}, initializer::constant(1)));
    REQUIRE(s->variable("b", {3}, initializer::zeros()));
  }
  REQUIRE_FALSE(s->initialize());
  aggregator_spec spec;
  spec.name = "test/sync";
  spec.mode = "sync";
  spec.variables = {"w", "b"};
  spec.workers = 2;
  spec.optimizer.lr = 1.0;
  spec.step_timeout_ms = 200;
  auto agg = s->aggregator("ps", 0, spec);
  REQUIRE(agg);
  caf::scoped_actor self{s->system()};
  auto push = [&](uint32_t worker, uint64_t step, std::vector<tensor> values) {
    caf::expected<std::pair<uint64_t, tensor>> out{make_error(af_error::internal, "none")};
    self->request(*agg, std::chrono::seconds(10), push_atom::value, worker, step, std::move(values))
      .receive([&](uint64_t g, tensor& p) { out = std::make_pair(g, std::move(p)); },
               [&](caf::error& e) { out = std::move(e); });
    return out;
  };
  SECTION("wrong shape") {
    // Catches: a gradient of another shape applied (or read out of bounds).
    auto r = push(0, 0, {tensor::filled(dtype::float32, {3, 2}, 1), tensor::filled(dtype::float32, {3}, 1)});
    REQUIRE_FALSE(r);
    CHECK(is(r.error(), af_error::shape_mismatch));
    CHECK_THAT(describe(r.error()), Catch::Contains("'w'") && Catch::Contains("worker 0"));
    // the same over the data plane, as one flat tensor of the wrong length
    auto info = s->ping("ps", 0);
    REQUIRE(info);
    auto chan = data_channel::connect("127.0.0.1", info->data_port, "ps", std::chrono::seconds(5));
    REQUIRE(chan);
    auto dr = (*chan)->aggregate(wire::kind::push, spec.name, 0, 0,
                                 {tensor::filled(dtype::float32, {7}, 1)}, std::chrono::seconds(5));
    REQUIRE_FALSE(dr);
    CHECK(is(dr.error(), af_error::shape_mismatch));
    CHECK_THAT(describe(dr.error()), Catch::Contains("float32[9]"));
    // and the connection still serves a good pull
    auto pulled = (*chan)->aggregate(wire::kind::pull, spec.name, 0, 0, {}, std::chrono::seconds(5));
    REQUIRE(pulled);
    CHECK(pulled->second.num_elements() == 9);
    CHECK(pulled->second.at(0) == 1.0);
  }
  SECTION("timeout names the missing worker") {
    // Catches: a sync step that waits forever for a worker that died.
    auto r = push(0, 0, {tensor::filled(dtype::float32, {2, 3}, 1), tensor::filled(dtype::float32, {3}, 1)});
    REQUIRE_FALSE(r);
    CHECK(is(r.error(), af_error::timeout));
    CHECK_THAT(describe(r.error()), Catch::Contains("worker 1"));
  }
  SECTION("a stale gradient is dropped and counted") {
    // Catches: an old step's gradient applied after the step moved on.
    caf::expected<std::pair<uint64_t, tensor>> first{make_error(af_error::internal, "none")};
    auto g = [] { return std::vector<tensor>{tensor::filled(dtype::float32, {2, 3}, 1),
                                             tensor::filled(dtype::float32, {3}, 1)}; };
    std::thread other{[&] {
      // its own scoped actor: one is not for two threads
      caf::scoped_actor me{s->system()};
      me->request(*agg, std::chrono::seconds(10), push_atom::value, uint32_t{1}, uint64_t{0}, g())
        .receive([&](uint64_t gs, tensor& p) { first = std::make_pair(gs, std::move(p)); },
                 [&](caf::error& e) { first = std::move(e); });
    }};
    auto mine = push(0, 0, g());
    other.join();
    REQUIRE(mine);
    REQUIRE(first);
    CHECK(mine->first == 1);
    CHECK(mine->second.at(0) == 0.0); // 1 - lr * mean(1, 1)
    auto stale = push(1, 0, g());
    REQUIRE(stale);
    CHECK(stale->first == 1);
    CHECK(stale->second.at(0) == 0.0); // not applied
    caf::expected<aggregator_stats> st{make_error(af_error::internal, "none")};
    self->request(*agg, std::chrono::seconds(5), stats_atom::value)
      .receive([&](aggregator_stats& x) { st = x; }, [&](caf::error& e) { st = e; });
    REQUIRE(st);
    CHECK(st->dropped_stale == 1);
    CHECK(st->applied == 1);
  }
}

TEST_CASE("in-graph replication (one client, a replica per worker, the mean in the graph) "
          "equals between-graph sync",
          "[train]") {
  // Catches: towers fed the same shard, a mean that is a sum, a client that
  // pushes before all towers ran.
  auto c = digits("sync");
  c.optimizer.lr = 0.2;
  c.steps = 30;
  c.batch_size = 16;
  auto between = run_job(c);
  REQUIRE(between.results[0]);
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 2}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  train_options opts;
  opts.print = false;
  opts.shutdown_ps = false;
  auto in_graph = run_in_graph(*s, c, opts);
  REQUIRE(in_graph);
  CHECK(in_graph->result.global_step == 30);
  CHECK(max_abs_diff(in_graph->result.params, between.results[0]->result.params) < 1e-4);
  c.mode = "async";
  auto refused = run_in_graph(*s, c, opts);
  REQUIRE_FALSE(refused);
  CHECK_THAT(describe(refused.error()), Catch::Contains("mode must be sync"));
}
