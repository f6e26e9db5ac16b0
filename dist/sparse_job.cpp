#include "dist/sparse_job.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "actors/blocking_ask.hpp"
#include "actors/system.hpp"
#include "core/log.hpp"
#include "dist/job_setup.hpp"
#include "dist/sparse_exchange.hpp"
#include "graph/embedding.hpp"
#include "messages/error.hpp"
#include "train/local.hpp"
#include "train/metrics.hpp"

namespace af {

namespace {

using clock_type = std::chrono::steady_clock;
using training_detail::to_error;

/// The aggregator of ps k of a sparse job (one name per ps for the job's life).
std::string aggregator_name(size_t k) {
  return "train/sparse/ps" + std::to_string(k);
}

/// Everything a worker of the job holds once it is set up.
struct sparse_task {
  session& s;
  const train::train_config& c;
  uint32_t task = 0;
  uint32_t workers = 0;
  bool chief = false;
  std::chrono::milliseconds timeout{0};
  train::click_data data;
  std::unique_ptr<train::recommender> model;
  std::vector<output> vars;
  std::unique_ptr<sparse_exchange> exchange;
  /// Keeps this worker a member: every aggregator monitors it (a worker
  /// that goes away stops being waited for).
  std::unique_ptr<caf::scoped_actor> self;
};

caf::error refuse_mode(const train::train_config& c) {
  if (c.mode == "sync" || c.mode == "async" || c.mode == "ssp")
    return caf::none;
  return make_error(af_error::invalid_argument,
                    fmt::format("mode '{}' cannot train model '{}': its tables' gradients are "
                                "sparse, and {}; use mode sync, async or ssp",
                                c.mode, c.model,
                                c.mode == "allreduce"
                                  ? "allreduce has no ps to hold a table too large for a worker"
                                  : "averaging would move whole tables"));
}

/// Steps 1 and 2: the data, the model, the tables' routers and variables.
caf::error declare(sparse_task& t, std::vector<routed_table>& tables,
                   std::vector<std::string>& dense_names, uint32_t n_ps) {
  auto data = train::load_clicks(t.c);
  if (!data)
    return to_error(data.error());
  t.data = std::move(*data);
  if (t.data.data.train.labels.empty())
    return make_error(af_error::invalid_argument,
                      fmt::format("model '{}': data '{}' has no training examples", t.c.model,
                                  t.c.data));
  auto m = train::recommender_of(t.c);
  if (!m)
    return to_error(m.error());
  t.model = std::make_unique<train::recommender>(std::move(*m));
  auto strategy = kernels::parse_partition_strategy(t.c.partition_strategy);
  if (!strategy)
    return make_error(af_error::invalid_argument,
                      fmt::format("partition_strategy '{}': use mod or div",
                                  t.c.partition_strategy));
  std::vector<std::vector<output>> per_ps(n_ps);
  for (const auto& spec : t.model->tables()) {
    if (spec.rows < static_cast<int64_t>(n_ps))
      return make_error(af_error::invalid_argument,
                        fmt::format("table '{}' has {} rows, fewer than the {} ps tasks it is cut "
                                    "over: give it more rows or the job fewer ps tasks",
                                    spec.name, spec.rows, n_ps));
    routed_table rt;
    rt.spec = spec;
    auto sizes = kernels::balanced_shard_rows(spec.rows, n_ps);
    if (auto st = kernels::shard_router::make(*strategy, sizes, rt.router); !st)
      return to_error(st.error());
    for (uint32_t k = 0; k < n_ps; ++k) {
      auto scope = t.s.device("/job:ps/task:" + std::to_string(k));
      if (!scope)
        return std::move(scope.error());
      auto v = t.s.variable(shard_name(spec.name, k), {sizes[k], spec.width},
                            shard_initializer(spec.init, *strategy, sizes, k));
      if (!v)
        return std::move(v.error());
      t.vars.push_back(*v);
    }
    tables.push_back(std::move(rt));
  }
  auto scope = t.s.device("/job:ps/task:0");
  if (!scope)
    return std::move(scope.error());
  for (const auto& p : t.model->dense_parameters()) {
    auto v = t.s.variable(p.name, p.shape, p.init);
    if (!v)
      return std::move(v.error());
    t.vars.push_back(*v);
    dense_names.push_back(p.name);
  }
  return caf::none;
}

/// Step 4 for ps k: its aggregator (sparse over its shards, dense over the
/// dense parameters on ps 0), the data-plane link to it and the membership.
caf::expected<sparse_ps> join_ps(sparse_task& t, uint32_t k, const std::vector<routed_table>& tables,
                                 const std::vector<std::string>& dense_names) {
  auto spec = training_detail::aggregator_spec_of(t.c, t.c.mode, t.workers);
  spec.name = aggregator_name(k);
  for (const auto& rt : tables) {
    spec.variables.push_back(shard_name(rt.spec.name, k));
    spec.sparse.push_back(spec.variables.back());
  }
  if (k == 0)
    for (const auto& d : dense_names)
      spec.variables.push_back(d);
  auto task = static_cast<int32_t>(k);
  auto agg = t.s.aggregator("ps", task, spec);
  if (!agg)
    return std::move(agg.error());
  auto info = t.s.ping("ps", task);
  if (!info)
    return std::move(info.error());
  sparse_ps p;
  p.task = "/job:ps/task:" + std::to_string(k);
  p.aggregator = spec.name;
  p.actor = *agg;
  p.dense = k == 0 && !dense_names.empty();
  if (info->data_port == 0)
    return make_error(af_error::unavailable,
                      p.task + " serves no data plane: a sparse job reads rows through it");
  auto host = t.s.cluster().address("ps", task)->host;
  auto chan = data_channel::connect(host, info->data_port, p.task, t.timeout, {},
                                    system_tls(t.s.system()));
  if (!chan)
    return std::move(chan.error());
  p.chan = std::move(*chan);
  std::string address;
  if (auto addr = t.s.cluster().address("worker", static_cast<int32_t>(t.task)))
    address = addr->to_string();
  caf::error err;
  (*t.self)
    ->request(*agg, t.timeout, join_atom::value, t.task,
              "/job:worker/task:" + std::to_string(t.task), address,
              static_cast<uint32_t>(t.c.batch_size), caf::actor_cast<caf::actor>(*t.self))
    .receive(
      [&](uint64_t, std::string& token, uint64_t last_seq) {
        p.token = std::move(token);
        p.seq = last_seq;
      },
      [&](caf::error& e) { err = std::move(e); });
  if (err)
    return make_error(af_error::unavailable,
                      fmt::format("joining the aggregator of {}: {}", p.task, describe(err)));
  return p;
}

caf::error set_up(sparse_task& t) {
  auto n_ps = static_cast<uint32_t>(t.s.cluster().num_tasks("ps"));
  if (n_ps == 0)
    return make_error(af_error::invalid_argument,
                      fmt::format("model '{}' needs ps tasks to hold its tables: the cluster has "
                                  "none",
                                  t.c.model));
  std::vector<routed_table> tables;
  std::vector<std::string> dense_names;
  if (auto err = declare(t, tables, dense_names, n_ps))
    return err;
  // Step 3: the chief initializes, on each shard's node; the others wait.
  if (t.chief) {
    if (auto err = t.s.initialize(t.vars))
      return err;
  } else if (auto err = t.s.wait_initialized(
               std::chrono::milliseconds{t.c.init_timeout_ms}, t.vars)) {
    return err;
  }
  t.self = std::make_unique<caf::scoped_actor>(t.s.system());
  std::vector<sparse_ps> links;
  for (uint32_t k = 0; k < n_ps; ++k) {
    auto p = join_ps(t, k, tables, dense_names);
    if (!p)
      return std::move(p.error());
    links.push_back(std::move(*p));
  }
  t.exchange = std::make_unique<sparse_exchange>(std::move(tables), std::move(dense_names),
                                                 std::move(links), t.timeout);
  return caf::none;
}

/// The ids of examples `picks` of `b`, per table, and their labels.
void take(const train::sparse_batch& b, const std::vector<size_t>& picks,
          std::vector<std::vector<int64_t>>& ids, std::vector<float>& labels) {
  ids.resize(b.ids.size());
  for (size_t t = 0; t < b.ids.size(); ++t) {
    ids[t].clear();
    for (auto e : picks)
      ids[t].push_back(b.ids[t][e]);
  }
  labels.clear();
  for (auto e : picks)
    labels.push_back(b.labels[e]);
}

/// One forward (and with `grads`, backward) pass of `picks`: routed, rows
/// fetched, the model's step.
caf::expected<train::sparse_step_result>
forward(sparse_task& t, const train::sparse_batch& b, const std::vector<size_t>& picks,
        bool grads, std::vector<table_step>& steps, uint64_t* bytes) {
  std::vector<std::vector<int64_t>> ids;
  std::vector<float> labels;
  take(b, picks, ids, labels);
  const auto& tables = t.exchange->tables();
  steps.resize(tables.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    auto r = route_ids(tables[i], ids[i]);
    if (!r)
      return std::move(r.error());
    steps[i] = std::move(*r);
  }
  auto rows = t.exchange->fetch(steps);
  if (!rows)
    return std::move(rows.error());
  if (bytes)
    *bytes += rows->bytes;
  std::vector<std::vector<int32_t>> index;
  for (auto& st : steps)
    index.push_back(st.index);
  auto r = t.model->step(rows->rows, index, rows->dense, labels, grads);
  if (!r)
    return to_error(r.error());
  return std::move(*r);
}

/// The held-out set scored with the tables as they are now (the chief, at the end).
caf::error score(sparse_task& t, sparse_outcome& out) {
  const auto& test = t.data.data.test;
  std::vector<float> predictions;
  predictions.reserve(test.labels.size());
  std::vector<size_t> picks;
  std::vector<table_step> steps;
  constexpr size_t chunk = 4096;
  for (size_t begin = 0; begin < test.labels.size(); begin += chunk) {
    picks.clear();
    for (size_t e = begin; e < std::min(test.labels.size(), begin + chunk); ++e)
      picks.push_back(e);
    auto r = forward(t, test, picks, false, steps, nullptr);
    if (!r)
      return std::move(r.error());
    predictions.insert(predictions.end(), r->predictions.begin(), r->predictions.end());
  }
  out.auc = train::auc(predictions, test.labels);
  out.log_loss = train::log_loss(predictions, test.labels);
  return caf::none;
}

/// Step 5: the training loop, until the global step reaches `total`.
caf::error train_loop(sparse_task& t, uint64_t total, const sparse_job_options& o,
                      sparse_outcome& out) {
  const auto& train_set = t.data.data.train;
  train::example_order order(train_set.labels.size(), t.c.seed);
  auto batch = static_cast<uint64_t>(t.c.batch_size);
  bool sync = t.c.mode == "sync";
  uint64_t global = 0, moved = 0, touched = 0;
  double loss_sum = 0;
  uint64_t loss_count = 0;
  std::vector<size_t> picks;
  std::vector<table_step> steps;
  auto wait = std::chrono::milliseconds{t.c.step_timeout_ms} + t.timeout;
  auto start = clock_type::now();
  while (global < total) {
    // sync: the global batch of step `global`, this worker's share; async:
    // its own steps' shares (the workers' streams interleave).
    uint64_t g = sync ? global : out.local_steps;
    picks.clear();
    for (uint64_t j = 0; j < batch; ++j)
      picks.push_back(order.at((g * t.workers + t.task) * batch + j));
    auto r = forward(t, train_set, picks, true, steps, &moved);
    if (!r)
      return std::move(r.error());
    for (size_t i = 0; i < steps.size(); ++i)
      touched += 2 * steps[i].unique.size()
                 * (sizeof(int64_t) + sizeof(float) * t.exchange->tables()[i].spec.width);
    bool late = false;
    uint64_t sent = 0;
    auto next = t.exchange->push(t.task, global, steps, r->row_grads, r->dense_grads, wait, &late,
                                 &sent);
    if (!next)
      return std::move(next.error());
    moved += sent;
    out.late += late ? 1 : 0;
    global = *next;
    ++out.local_steps;
    loss_sum += r->loss;
    ++loss_count;
    out.last_loss = loss_sum / static_cast<double>(loss_count);
    if (t.c.log_every > 0 && out.local_steps % t.c.log_every == 0) {
      if (t.chief && o.print) {
        std::printf("step %llu/%llu: loss %.6f\n", static_cast<unsigned long long>(global),
                    static_cast<unsigned long long>(total), out.last_loss);
        std::fflush(stdout);
      }
      loss_sum = 0;
      loss_count = 0;
    }
  }
  out.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  out.global_step = global;
  if (out.local_steps > 0) {
    out.bytes_per_step = static_cast<double>(moved) / static_cast<double>(out.local_steps);
    out.touched_bytes_per_step = static_cast<double>(touched) / static_cast<double>(out.local_steps);
  }
  return caf::none;
}

/// Step 6: this worker is done at every aggregator (`why`: empty if it
/// finished, else why it failed).
caf::error say_done(sparse_task& t, const std::string& why) {
  caf::error first;
  for (auto& p : t.exchange->ps()) {
    auto r = ask<uint32_t>(t.s, p.actor, t.timeout, done_atom::value, t.task, p.token, why);
    if (!r && !first)
      first = std::move(r.error());
  }
  return first;
}

/// The chief waits until every worker is done or gone at ps 0, as the dense
/// job's chief does (dist/training.cpp): bounded by the task's timeout,
/// then it names who still pushes and goes on.
caf::error wait_for_workers(sparse_task& t) {
  const auto& ps0 = t.exchange->ps().front();
  auto deadline = clock_type::now() + t.timeout;
  for (;;) {
    auto stats = ask<aggregator_stats>(t.s, ps0.actor, t.timeout, stats_atom::value);
    if (!stats)
      return std::move(stats.error());
    if (stats->active == 0)
      return caf::none;
    if (clock_type::now() >= deadline) {
      std::vector<std::string> who;
      for (const auto& w : stats->workers)
        if (w.status == "member" || w.status == "held")
          who.push_back(fmt::format("worker {} ({})", w.worker,
                                    w.task.empty() ? "never joined" : w.task));
      log::get()->warn("chief: {} still pushing {} ms after the chief finished; going on",
                       fmt::join(who, ", "), t.timeout.count());
      return caf::none;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20)); // the dense chief's poll
  }
}

} // namespace

bool sparse_job(const train::train_config& c) {
  return c.model == "recommender";
}

caf::expected<sparse_outcome> run_sparse_worker_task(session& s, const train::train_config& c,
                                                     uint32_t task, const sparse_job_options& o) {
  if (auto err = refuse_mode(c)) // before check_config: it names what a sparse job needs
    return err;
  if (auto err = training_detail::check_config(c))
    return err;
  sparse_task t{s, c};
  t.task = task;
  t.workers = static_cast<uint32_t>(s.cluster().num_tasks("worker"));
  t.chief = task == 0;
  t.timeout = std::chrono::milliseconds{c.init_timeout_ms};
  if (auto err = set_up(t))
    return err;
  sparse_outcome out;
  out.has_truth = t.data.has_truth;
  out.truth_auc = t.data.truth_auc;
  out.truth_log_loss = t.data.truth_log_loss;
  out.train_examples = t.data.data.train.labels.size();
  out.test_examples = t.data.data.test.labels.size();
  out.auc = out.log_loss = std::numeric_limits<double>::quiet_NaN();
  auto total = train::total_steps(c, out.train_examples, t.workers);
  auto err = train_loop(t, total, o, out);
  if (auto done = say_done(t, err ? describe(err) : std::string{}); done && !err)
    err = std::move(done);
  if (err)
    return err;
  if (!t.chief)
    return out;
  if (auto e = wait_for_workers(t))
    return e;
  if (auto e = score(t, out))
    return e;
  if (o.shutdown_ps)
    for (size_t k = 0; k < t.exchange->ps().size(); ++k)
      if (auto e = s.shutdown("ps", static_cast<int32_t>(k)))
        log::get()->warn("chief: stopping /job:ps/task:{}: {}", k, describe(e));
  return out;
}

} // namespace af
