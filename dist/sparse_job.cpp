#include "dist/sparse_job.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <limits>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "actors/blocking_ask.hpp"
#include "actors/kv_store.hpp"
#include "actors/system.hpp"
#include "core/log.hpp"
#include "dist/job_setup.hpp"
#include "dist/ps_recovery.hpp"
#include "dist/sparse_checkpoint.hpp"
#include "dist/sparse_job_detail.hpp"
#include "dist/sparse_recovery.hpp"
#include "dist/sparse_step.hpp"
#include "graph/embedding.hpp"
#include "messages/error.hpp"
#include "train/config_model.hpp"
#include "train/local.hpp"
#include "train/metrics.hpp"
#include "train/optimizer.hpp"

namespace af {

namespace sparse_job_detail {

using clock_type = std::chrono::steady_clock;
using training_detail::to_error;

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
caf::error declare(sparse_task& t, uint32_t n_ps) {
  // Before the data: drawing millions of clicks and the Zipf weights of a
  // table too large to hold took a minute and gigabytes, then was refused.
  if (auto why = train::recommender_table_problem(t.c, n_ps); !why.empty())
    return make_error(af_error::resource_exhausted, why);
  // The model, the strategy and each table's rows against the ps count need
  // the config alone: refused before the data is drawn or read, too.
  auto m = train::recommender_of(t.c);
  if (!m)
    return to_error(m.error());
  t.model = std::make_unique<train::recommender>(std::move(*m));
  auto strategy = kernels::parse_partition_strategy(t.c.partition_strategy);
  if (!strategy)
    return make_error(af_error::invalid_argument,
                      fmt::format("partition_strategy '{}': use mod or div",
                                  t.c.partition_strategy));
  for (const auto& spec : t.model->tables())
    if (spec.rows < static_cast<int64_t>(n_ps))
      return make_error(af_error::invalid_argument,
                        fmt::format("table '{}' has {} rows, fewer than the {} ps tasks it is cut "
                                    "over: give it more rows or the job fewer ps tasks",
                                    spec.name, spec.rows, n_ps));
  auto data = train::load_clicks(t.c);
  if (!data)
    return to_error(data.error());
  t.data = std::move(*data);
  if (t.data.data.train.labels.empty())
    return make_error(af_error::invalid_argument,
                      fmt::format("model '{}': data '{}' has no training examples", t.c.model,
                                  t.c.data));
  // A step takes batch_size examples a worker (sync: every worker's in one
  // global step); more than the training set repeats examples within a step.
  auto per_step = static_cast<uint64_t>(t.c.batch_size) * (t.c.mode == "sync" ? t.workers : 1);
  if (per_step > t.data.data.train.labels.size())
    return make_error(af_error::invalid_argument,
                      fmt::format("batch_size = {} ({} examples a step) is more than the {} "
                                  "training examples: lower batch_size",
                                  t.c.batch_size, per_step, t.data.data.train.labels.size()));
  auto& layout = t.layout;
  layout.ps_order.resize(n_ps);
  for (const auto& spec : t.model->tables()) {
    sparse_layout::table lt;
    auto sizes = kernels::balanced_shard_rows(spec.rows, n_ps);
    if (auto st = kernels::shard_router::make(*strategy, sizes, lt.router); !st.ok())
      return make_error(af_error::invalid_argument,
                        fmt::format("table '{}': {}", spec.name, st.error));
    for (uint32_t k = 0; k < n_ps; ++k) {
      lt.shard_vars.push_back(shard_name(spec.name, k));
      lt.shard_ps.push_back(k);
      layout.ps_order[k].push_back({true, layout.tables.size(), k});
      t.asked_ps = true;
      auto scope = t.s.device("/job:ps/task:" + std::to_string(k));
      if (!scope)
        return std::move(scope.error());
      auto v = t.s.variable(shard_name(spec.name, k), {sizes[k], spec.width},
                            shard_initializer(spec.init, *strategy, sizes, k));
      if (!v)
        return std::move(v.error());
      t.vars.push_back(*v);
    }
    layout.tables.push_back(std::move(lt));
    t.checkpoints.table_names.push_back(spec.name);
    t.checkpoints.table_rows.push_back({spec.width});
  }
  t.ps_vars.resize(n_ps);
  for (size_t i = 0; i < t.vars.size(); ++i) // n_ps shards of each table, in order
    t.ps_vars[i % n_ps].push_back(t.vars[i]);
  auto scope = t.s.device("/job:ps/task:0");
  if (!scope)
    return std::move(scope.error());
  for (const auto& p : t.model->dense_parameters()) {
    auto v = t.s.variable(p.name, p.shape, p.init);
    if (!v)
      return std::move(v.error());
    t.vars.push_back(*v);
    t.ps_vars[0].push_back(*v);
    layout.ps_order[0].push_back({false, layout.dense_vars.size(), 0});
    layout.dense_vars.push_back(p.name);
    layout.dense_ps.push_back(0);
    t.checkpoints.dense_shapes.push_back(p.shape);
  }
  auto& ck = t.checkpoints;
  ck.layout = &t.layout;
  ck.slot_names = train::slot_names(t.c.optimizer.kind);
  for (size_t k = 0; k < ck.slot_names.size(); ++k)
    ck.slot_starts.push_back(train::slot_initial_value(t.c.optimizer, k));
  // A ps writes or reads each of its shards on a thread of its own: a large
  // table's shard may take longer than a step.
  ck.timeout = std::chrono::milliseconds{t.c.init_timeout_ms};
  return caf::none;
}

/// The aggregator of ps k: sparse over its shards; on ps 0 dense over the
/// dense parameters too.
aggregator_spec spec_of(const sparse_task& t, uint32_t k) {
  // A worker that joins takes the aggregator as it runs (its config counts
  // more workers than the job started with).
  auto spec = training_detail::aggregator_spec_of(t.c, t.c.mode, t.join ? 0 : t.workers);
  spec.name = aggregator_name(k);
  for (const auto& slot : t.layout.ps_order[k]) {
    if (slot.table) {
      spec.variables.push_back(t.layout.tables[slot.index].shard_vars[slot.shard]);
      spec.sparse.push_back(spec.variables.back());
    } else {
      spec.variables.push_back(t.layout.dense_vars[slot.index]);
    }
  }
  return spec;
}

/// How long a link waits for a ps's answer: a read comes at once, a sync
/// push when its round closes (the aggregator's step_timeout_ms at most;
/// data_channel::push_sparse adds 5 s for the node's own answer then). So
/// a stopped ps (SIGSTOP) is found within that, and then waited for as one
/// that died (sparse_recovery.hpp).
std::chrono::milliseconds link_wait(const sparse_task& t) {
  return std::chrono::milliseconds{t.c.step_timeout_ms};
}

/// A link's connect bound, which is also its connection's own timeout (a
/// push waits at least that long): the push's wait, not init_timeout_ms.
std::chrono::milliseconds connect_wait(const sparse_task& t) {
  return std::min(t.timeout, link_wait(t) + std::chrono::milliseconds{5000});
}

/// Step 4 for ps k: its aggregator, the membership, and the data-plane link.
caf::error join_ps(sparse_task& t, uint32_t k) {
  auto spec = spec_of(t, k);
  auto task = static_cast<int32_t>(k);
  auto where = "/job:ps/task:" + std::to_string(k);
  auto agg = t.s.aggregator("ps", task, spec);
  if (!agg)
    return std::move(agg.error());
  auto info = t.s.ping("ps", task);
  if (!info)
    return std::move(info.error());
  if (info->data_port == 0)
    return make_error(af_error::unreachable,
                      where + " serves no data plane: a sparse job reads rows through it");
  auto host = t.s.cluster().address("ps", task)->host;
  auto chan = data_channel::connect(host, info->data_port, where, connect_wait(t), {},
                                    system_tls(t.s.system()));
  if (!chan)
    return std::move(chan.error());
  auto j = join_aggregator(t, k, *agg);
  if (!j)
    return std::move(j.error());
  ps_member m{*agg, std::move(j->token)};
  auto last_seq = j->last_seq;
  t.start_step = k == 0 ? j->global_step : std::min(t.start_step, j->global_step);
  t.ps_steps.push_back(j->global_step);
  // A member from here on: whatever fails after this is said to it (done).
  t.members.push_back(m);
  t.shards.push_back({where, spec.name, *agg, host, info->data_port, info->incarnation, {}});
  auto wait = link_wait(t);
  t.links.push_back(std::make_unique<data_plane_ps_link>(std::move(*chan), spec.name, t.task,
                                                         m.token, last_seq, wait));
  t.link_ptrs.push_back(t.links.back().get());
  return caf::none;
}

/// The chief's step 3: with a checkpoint in checkpoint_dir, every
/// aggregator is set to its global step first (so that a worker released
/// by the restored values joins at that step), then every ps restores its
/// shards and ps 0 the dense parameters; without one, the initializers run.
caf::error initialize_or_restore(sparse_task& t, uint32_t n_ps) {
  std::optional<train::checkpoint> restored;
  if (!t.c.checkpoint_dir.empty()) {
    if (auto why = train::check_checkpoint_dir(t.c.checkpoint_dir); !why.empty())
      return make_error(af_error::invalid_config, why);
    auto latest = latest_sparse_checkpoint(t.c);
    if (!latest)
      return std::move(latest.error());
    restored = std::move(*latest);
  }
  // A table's initializer fills its shard on its node; a large one takes
  // longer than one request's timeout: init_timeout_ms bounds them all.
  if (!restored)
    return t.s.initialize(t.vars, {}, std::chrono::milliseconds{t.c.init_timeout_ms});
  auto step = restored->global_step;
  for (uint32_t k = 0; k < n_ps; ++k) {
    auto agg = t.s.aggregator("ps", static_cast<int32_t>(k), spec_of(t, k));
    if (!agg)
      return std::move(agg.error());
    aggregator_state state; // no variables: the step only (the ps restore those)
    state.global_step = step;
    auto r = ask<uint64_t>(t.s, *agg, t.timeout, restore_atom::value, std::move(state));
    if (!r)
      return std::move(r.error());
  }
  if (auto err = restore_sparse_checkpoint(t.s, t.checkpoints, t.c, step, ""))
    return err;
  t.last_saved = step;
  t.saved_any = true;
  t.start_position = restored->data_position;
  log::get()->info("chief: restored the checkpoint of global step {} from {}", step,
                   sparse_tables_dir(t.c.checkpoint_dir, step));
  return caf::none;
}

/// How this worker cuts and routes the tables: what every worker of the job
/// must agree on. mod and div cut the same shard sizes, so a worker of
/// another strategy would find every variable it asks for and update other
/// ids' rows; the shapes alone cannot tell.
std::string layout_of(const train::train_config& c, uint32_t n_ps) {
  return fmt::format("partition_strategy={} users={} items={} dim={} ps={}", c.partition_strategy,
                     c.users, c.items, c.dim, n_ps);
}

/// The chief publishes its layout in its key-value store; every other
/// worker compares its own with it (bounded by init_timeout_ms) and refuses
/// to train on a different one, naming both.
caf::error agree_on_layout(sparse_task& t, uint32_t n_ps) {
  auto chief = training_detail::chief_store_of(t.s);
  if (!chief)
    return std::move(chief.error());
  kv_client kv{t.s.system(), chief->store, t.timeout};
  auto key = fmt::format("train/{}/sparse_layout", chief->incarnation);
  auto mine = layout_of(t.c, n_ps);
  // The chief's count of steps: a worker that joins with a config of more
  // workers would count fewer (sync: a global batch per step).
  auto total_key = fmt::format("train/{}/sparse_total", chief->incarnation);
  // Where the data resumes: the restored checkpoint's position (after a
  // live switch the global step no longer tells it).
  auto position_key = fmt::format("train/{}/sparse_data_position", chief->incarnation);
  if (t.chief) {
    if (auto err = kv.put(total_key, std::to_string(t.total)))
      return err;
    if (auto err = kv.put(position_key, std::to_string(t.start_position)))
      return err;
    if (auto err = kv.put(sparse_client_key(chief->incarnation),
                          t.in_graph ? "in-graph" : "between-graph"))
      return err;
    return kv.put(key, mine);
  }
  auto theirs = kv.get(key, std::chrono::milliseconds{t.c.init_timeout_ms});
  if (!theirs)
    return std::move(theirs.error());
  if (*theirs != mine)
    return make_error(af_error::invalid_argument,
                      fmt::format("worker {} cuts the tables as '{}', the chief as '{}': run every "
                                  "task of the job with one config",
                                  t.task, mine, *theirs));
  if (!t.join) { // put before the layout: there now
    auto position = kv.get(position_key, t.timeout);
    if (!position)
      return std::move(position.error());
    t.start_position = std::stoull(*position);
    return caf::none;
  }
  auto total = kv.get(total_key, t.timeout);
  if (!total)
    return std::move(total.error());
  t.total = std::stoull(*total);
  // A worker that joins a running job starts at the job's step's share
  // (sync: the global batch of that step; async: each worker's stream).
  t.start_position = train::step_per_push(t.c.mode)
                       ? t.start_step / std::max<uint32_t>(t.workers, 1)
                       : t.start_step;
  return caf::none;
}

/// With ps_recovery_timeout_ms: every link of the step goes through the
/// ps recovery (sparse_recovery.hpp, ps_recovery.hpp), the chief's
/// restoring the ps's shards (restore_lost_ps).
caf::error arm_recovery(sparse_task& t) {
  if (t.c.ps_recovery_timeout_ms == 0)
    return caf::none;
  auto chief = training_detail::chief_store_of(t.s);
  if (!chief)
    return std::move(chief.error());
  auto ctx = std::make_shared<training_detail::recovery_context>();
  ctx->s = &t.s;
  ctx->c = t.c;
  ctx->shards = t.shards;
  ctx->vars = t.ps_vars;
  for (uint32_t k = 0; k < t.shards.size(); ++k)
    ctx->specs.push_back(spec_of(t, k));
  ctx->store = chief->store;
  ctx->chief_incarnation = chief->incarnation;
  ctx->task = t.task;
  ctx->restore = [&t](size_t k, const param_shard&) {
    return restore_lost_ps(t.s, t.checkpoints, t.c, k);
  };
  t.recovery = ctx;
  return wrap_links(t, training_detail::recover_ps_of(ctx),
                    training_detail::find_aggregator_of(ctx));
}

caf::error wrap_links(sparse_task& t, sparse_recovery::recover_fn recover,
                      sparse_recovery::find_fn find) {
  auto join = [&t](size_t k, const aggregator_actor& agg)
    -> caf::expected<std::pair<std::string, uint64_t>> {
    auto j = join_aggregator(t, static_cast<uint32_t>(k), agg);
    if (!j)
      return std::move(j.error());
    return std::make_pair(std::move(j->token), j->last_seq);
  };
  auto connect = [&t](const param_shard& shard) {
    return data_channel::connect(shard.host, shard.data_port, shard.task, connect_wait(t), {},
                                 system_tls(t.s.system()));
  };
  t.recovering = std::make_unique<sparse_recovery>(std::move(recover), join, connect, t.shards,
                                                   std::move(find));
  t.recovering->rejoin_window = std::chrono::milliseconds{t.c.ps_recovery_timeout_ms};
  // The step's links become the recovering ones (the plain ones count the bytes).
  for (size_t k = 0; k < t.links.size(); ++k) {
    t.wrapped.push_back(std::make_unique<recovering_ps_link>(*t.links[k], k, *t.recovering));
    t.link_ptrs[k] = t.wrapped.back().get();
  }
  return caf::none;
}

void take_recovered(sparse_task& t) {
  if (!t.recovering)
    return;
  for (size_t k = 0; k < t.members.size(); ++k) {
    auto now = t.recovering->current(k);
    if (!now.token.empty())
      t.members[k] = {now.shard.actor, now.token};
    else
      t.members[k].actor = now.shard.actor; // looked up anew after a stop (ps_recovery.cpp)
  }
}

caf::error set_up(sparse_task& t) {
  auto n_ps = static_cast<uint32_t>(t.s.cluster().num_tasks("ps"));
  if (n_ps == 0)
    return make_error(af_error::invalid_argument,
                      fmt::format("model '{}' needs ps tasks to hold its tables: the cluster has "
                                  "none",
                                  t.c.model));
  if (auto err = declare(t, n_ps))
    return err;
  // async, ssp: every push is a global step of one worker's batch (as the
  // dense job counts them); sync: one step is every worker's batch.
  t.total = train::total_steps(t.c, t.data.data.train.labels.size(),
                               train::step_per_push(t.c.mode) ? 1 : t.workers);
  // Step 3: the chief initializes, on each shard's node, or restores the
  // latest checkpoint; the others wait.
  if (t.chief) {
    if (auto err = initialize_or_restore(t, n_ps))
      return err;
  } else if (auto err = t.s.wait_initialized(
               std::chrono::milliseconds{t.c.init_timeout_ms}, t.vars)) {
    return err;
  }
  run_set_up_hook(t);
  if (!t.self) // kept when set up again: a join again keeps its token
    t.self = std::make_unique<caf::scoped_actor>(t.s.system());
  for (uint32_t k = 0; k < n_ps; ++k)
    if (auto err = join_ps(t, k))
      return err;
  // After the joins: a worker refused here tells the aggregators it is done
  // with why, and the chief fails the job naming it instead of waiting.
  if (auto err = agree_on_layout(t, n_ps))
    return err;
  return arm_recovery(t);
}

/// Examples `picks` of `b` as a batch of their own.
void take(const train::sparse_batch& b, const std::vector<size_t>& picks, train::sparse_batch& out) {
  // Indexed writes into buffers kept from the last batch: the reads, at
  // random places of the set, overlap (a push_back's size update chained them).
  const size_t n = picks.size();
  out.ids.resize(b.ids.size());
  for (size_t t = 0; t < b.ids.size(); ++t) {
    out.ids[t].resize(n);
    const int64_t* src = b.ids[t].data();
    int64_t* dst = out.ids[t].data();
    for (size_t j = 0; j < n; ++j)
      dst[j] = src[picks[j]];
  }
  out.labels.resize(n);
  for (size_t j = 0; j < n; ++j)
    out.labels[j] = b.labels[picks[j]];
}

caf::error open_metrics(sparse_task& t, uint32_t workers) {
  if (!t.chief || (t.c.metrics.empty() && t.c.logdir.empty()))
    return caf::none;
  auto m = sparse_metrics::open(t.c, workers, t.start_step);
  if (!m)
    return std::move(m.error());
  t.metrics = std::move(*m);
  return caf::none;
}

void report_metrics(sparse_task& t, uint64_t global, uint64_t local_steps, double seconds,
                    double loss) {
  if (!t.metrics || t.members.empty())
    return;
  double examples = static_cast<double>(local_steps) * static_cast<double>(t.c.batch_size);
  // ps 0's aggregator as it runs now: a recovered ps 0 has a new one (the
  // old one's stats would fail, or wait the whole timeout, every report).
  auto ps0 = t.recovering ? t.recovering->current(0).shard.actor : t.members.front().actor;
  t.metrics->report(t.s, ps0, t.timeout, global, seconds, loss,
                    seconds > 0 ? examples / seconds : 0.0);
}

/// The held-out set scored with the tables as they are now (the chief, at the end).
caf::error score(sparse_task& t, sparse_outcome& out) {
  const auto& test = t.data.data.test;
  std::vector<float> predictions;
  predictions.reserve(test.labels.size());
  std::vector<size_t> picks;
  train::sparse_batch chunk;
  constexpr size_t chunk_size = 4096;
  for (size_t begin = 0; begin < test.labels.size(); begin += chunk_size) {
    picks.clear();
    for (size_t e = begin; e < std::min(test.labels.size(), begin + chunk_size); ++e)
      picks.push_back(e);
    take(test, picks, chunk);
    auto p = predict_sparse_remote(*t.model, t.layout, t.link_ptrs, chunk);
    if (!p)
      return std::move(p.error());
    predictions.insert(predictions.end(), p->begin(), p->end());
  }
  out.auc = train::auc(predictions, test.labels);
  out.log_loss = train::log_loss(predictions, test.labels);
  return caf::none;
}

/// The bytes every link sent and received so far.
uint64_t link_bytes(const sparse_task& t) {
  uint64_t n = 0;
  for (const auto* l : t.link_ptrs) {
    auto [sent, received] = l->bytes();
    n += sent + received;
  }
  return n;
}

/// The chief's checkpoint at `global` (once per step).
caf::error checkpoint(sparse_task& t, uint64_t global, uint64_t data_position, bool print) {
  if (t.saved_any && t.last_saved == global)
    return caf::none;
  auto path = save_sparse_checkpoint(t.s, t.checkpoints, t.c, global, data_position);
  if (!path)
    return std::move(path.error());
  t.last_saved = global;
  t.saved_any = true;
  if (print) {
    std::printf("checkpoint: global step %llu (%s)\n", static_cast<unsigned long long>(global),
                path->c_str());
    std::fflush(stdout);
  }
  return caf::none;
}

/// Step 5: the training loop, until the global step reaches `total`. The
/// chief checkpoints every checkpoint_steps / checkpoint_secs right after
/// its step returned: in sync every ps has then applied that step's round
/// and the next round waits for the chief's push, so the shards are saved
/// at one global step; in async the others go on pushing while each shard
/// is saved (each shard's file is one moment of it, not all at the same).
caf::error train_loop(sparse_task& t, uint64_t total, const sparse_job_options& o,
                      sparse_outcome& out) {
  const auto& train_set = t.data.data.train;
  train::example_order order(train_set.labels.size(), t.c.seed);
  auto batch_size = static_cast<uint64_t>(t.c.batch_size);
  auto specs = t.model->tables();
  uint64_t global = t.start_step, touched = 0, bytes0 = link_bytes(t);
  // Where this worker's data resumes: sync follows the global step's batch;
  // async and ssp each worker's own stream (data_cursor).
  t.cursor = data_cursor::start(t.c.mode == "sync", t.start_position, t.start_step);
  bool saving = t.chief && !t.c.checkpoint_dir.empty();
  // The global step and the time of the last checkpoint taken or tried
  // (one that failed while a ps recovers is tried again at the next due).
  uint64_t last_save_step = t.start_step;
  auto last_save = clock_type::now();
  double loss_sum = 0;
  uint64_t loss_count = 0;
  std::vector<size_t> picks;
  train::sparse_batch batch;
  sparse_fetch scratch; // the step's buffers, reused from step to step
  auto start = clock_type::now();
  // A stop ends this worker before its next step; it then says done, so a
  // sync round in which it has no share goes on without it.
  while (global < total && !(o.stop && o.stop->load())) {
    // A live switch told meanwhile: into sync, every ps joined again first.
    if (auto err = take_switches(t))
      return err;
    // This worker's share of global batch t.cursor.next (the workers' streams
    // interleave in async).
    order.positions((t.cursor.next * t.workers + t.task) * batch_size, batch_size, picks);
    take(train_set, picks, batch);
    if (o.step_delay.count() > 0)
      std::this_thread::sleep_for(o.step_delay);
    if (t.recovering)
      t.recovering->step.store(global);
    auto r = run_sparse_step(*t.model, t.layout, t.link_ptrs, batch, global, scratch,
                             &t.ps_steps);
    if (!r) {
      if (t.recovering) // a ps that did not come back: the cause of what else failed
        if (auto gone = t.recovering->failure())
          return gone;
      return std::move(r.error());
    }
    if (!std::isfinite(r->result.loss))
      return make_error(af_error::non_finite,
                        fmt::format("worker {}: the loss of global step {} is {}: the model "
                                    "diverged (lower learning_rate, or restore a checkpoint)",
                                    t.task, global, r->result.loss));
    // What an ideal exchange moves: each touched row and its id, out and back.
    for (size_t i = 0; i < specs.size(); ++i)
      touched += 2 * static_cast<uint64_t>(r->unique[i])
                 * (sizeof(int64_t) + sizeof(float) * static_cast<uint64_t>(specs[i].width));
    global = *std::min_element(r->global_steps.begin(), r->global_steps.end());
    t.ps_steps = r->global_steps;
    t.cursor.stepped(global);
    for (bool late : r->dropped_late)
      if (late) {
        ++out.late;
        break;
      }
    ++out.local_steps;
    if (saving && global < total
        && (train::steps_checkpoint_due(t.c.checkpoint_steps, global, last_save_step)
            || (t.c.checkpoint_secs > 0
                && std::chrono::duration<double>(clock_type::now() - last_save).count()
                     >= t.c.checkpoint_secs))) {
      if (auto err = checkpoint(t, global, t.cursor.next, o.print)) {
        // A ps may be down (its save failed): with recovery, the job goes
        // on and the next step waits for it; the latest checkpoint stays.
        if (!t.recovering)
          return err;
        log::get()->warn("chief: the checkpoint of global step {} is skipped: {}; the latest "
                         "one stays",
                         global, describe(err));
      }
      last_save_step = global;
      last_save = clock_type::now();
    }
    loss_sum += r->result.loss;
    ++loss_count;
    out.last_loss = loss_sum / static_cast<double>(loss_count);
    if (t.c.log_every > 0 && out.local_steps % t.c.log_every == 0) {
      report_metrics(t, global, out.local_steps,
                     std::chrono::duration<double>(clock_type::now() - start).count(),
                     out.last_loss);
      if (t.chief && o.print) {
        std::printf("step %llu/%llu: loss %.6f\n", static_cast<unsigned long long>(global),
                    static_cast<unsigned long long>(total), out.last_loss);
        std::fflush(stdout);
      }
      if (t.chief && o.on_progress)
        o.on_progress(global, out.local_steps,
                      std::chrono::duration<double>(clock_type::now() - start).count(),
                      out.last_loss);
      loss_sum = 0;
      loss_count = 0;
    }
  }
  out.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  out.global_step = global;
  if (out.local_steps > 0) {
    auto steps = static_cast<double>(out.local_steps);
    out.bytes_per_step = static_cast<double>(link_bytes(t) - bytes0) / steps;
    out.touched_bytes_per_step = static_cast<double>(touched) / steps;
  }
  return caf::none;
}

/// Step 6: this worker is done at every aggregator (`why`: empty if it
/// finished, else why it failed).
caf::error say_done(sparse_task& t, const std::string& why) {
  if (!why.empty()) {
    // A failed worker tells every aggregator at once and waits for none:
    // one of them may be on the ps that died (a wait for its answer would
    // hold this worker the whole timeout), and the others need only hear it.
    for (auto& m : t.members)
      caf::anon_send(m.actor, done_atom::value, t.task, m.token, why);
    return caf::none;
  }
  caf::error first;
  for (auto& m : t.members) {
    auto r = ask<uint32_t>(t.s, m.actor, t.timeout, done_atom::value, t.task, m.token, why);
    if (!r && !first)
      first = std::move(r.error());
  }
  return first;
}

/// The chief waits until every worker is done or gone at every ps, as the
/// dense job's chief does at ps 0 (dist/training.cpp): a worker says done
/// to one ps after another, and the ps stopped once ps 0 heard it would
/// leave its done to the next unanswered. Bounded by the task's timeout,
/// then it names who still pushes and goes on.
caf::error wait_for_workers(sparse_task& t, sparse_outcome& out) {
  auto deadline = clock_type::now() + t.timeout;
  for (size_t k = 0; k < t.members.size();) {
    auto stats = ask<aggregator_stats>(t.s, t.members[k].actor, t.timeout, stats_atom::value);
    if (!stats)
      return std::move(stats.error());
    if (stats->active == 0) { // every member done here: did one of them fail?
      if (auto err = training_detail::failed_workers(*stats))
        return err;
      // The workers that finished (a worker that died left), as ps 0 saw them.
      if (k == 0)
        out.workers = static_cast<uint32_t>(
          std::count_if(stats->workers.begin(), stats->workers.end(),
                        [](const auto& w) { return w.status == "done"; }));
      ++k;
      continue;
    }
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
  return caf::none;
}

/// The chief stops every ps task at the end.
void stop_ps(session& s) {
  auto n = s.cluster().num_tasks("ps");
  for (size_t k = 0; k < n; ++k)
    if (auto e = s.shutdown("ps", static_cast<int32_t>(k)))
      log::get()->warn("chief: stopping /job:ps/task:{}: {}", k, describe(e));
}

/// Steps 1 to 6 of worker `t.task` (run_sparse_worker_task's).
caf::expected<sparse_outcome> run_task(sparse_task& t, const sparse_job_options& o) {
  auto& s = t.s;
  const auto& c = t.c;
  auto err = set_up_with_recovery(t);
  if (!err)
    err = open_metrics(t, t.workers);
  if (err) {
    // The aggregators it joined stop waiting for it at once (a sync round
    // would otherwise wait step_timeout_ms for a worker that never pushes).
    if (!t.members.empty())
      say_done(t, describe(err));
    return err;
  }
  sparse_outcome out;
  out.workers = t.workers;
  out.has_truth = t.data.has_truth;
  out.truth_auc = t.data.truth_auc;
  out.truth_log_loss = t.data.truth_log_loss;
  out.train_examples = t.data.data.train.labels.size();
  out.test_examples = t.data.data.test.labels.size();
  out.auc = out.log_loss = std::numeric_limits<double>::quiet_NaN();
  err = train_loop(t, t.total, o, out);
  take_recovered(t);
  if (t.recovering)
    out.ps_recoveries = t.recovering->recoveries.load();
  if (!err && (c.log_every == 0 || out.local_steps % c.log_every != 0)) // the last row
    report_metrics(t, out.global_step, out.local_steps, out.seconds, out.last_loss);
  if (auto done = say_done(t, err ? describe(err) : std::string{}); done && !err)
    err = std::move(done);
  if (err)
    return err;
  if (!t.chief)
    return out;
  if (auto e = wait_for_workers(t, out))
    return e;
  if (!c.checkpoint_dir.empty()) {
    // At the end: the step every ps reached (async: the others' last pushes
    // too), once every worker is done.
    uint64_t global = out.global_step;
    for (size_t k = 0; k < t.members.size(); ++k) {
      auto stats = ask<aggregator_stats>(s, t.members[k].actor, t.timeout, stats_atom::value);
      if (!stats)
        return std::move(stats.error());
      global = k == 0 ? stats->global_step : std::min(global, stats->global_step);
    }
    // Unswitched, the step's share (async: of every worker's pushes);
    // after a live switch the step no longer tells it: the chief's own.
    auto data = t.cursor.switched                ? t.cursor.next
                : train::step_per_push(c.mode) ? global / std::max<uint32_t>(t.workers, 1)
                                               : global;
    if (auto e = checkpoint(t, global, data, o.print))
      return e;
  }
  if (auto e = score(t, out))
    return e;
  return out;
}

} // namespace sparse_job_detail

using namespace sparse_job_detail;

std::string sparse_client_key(uint64_t chief_incarnation) {
  return fmt::format("train/{}/sparse_client", chief_incarnation);
}

bool sparse_job(const train::train_config& c) {
  return c.model == "recommender";
}

caf::expected<sparse_outcome> run_sparse_worker_task(session& s, const train::train_config& c,
                                                     uint32_t task, const sparse_job_options& o) {
  if (auto err = refuse_mode(c)) // before check_config: it names what a sparse job needs
    return err;
  if (auto err = training_detail::check_config(c))
    return err;
  sparse_task t(s, c);
  t.task = task;
  t.workers = static_cast<uint32_t>(s.cluster().num_tasks("worker"));
  t.chief = task == 0;
  t.join = o.join;
  if (t.join && t.chief)
    return make_error(af_error::invalid_argument,
                      "--join is for a worker that joins a running job; worker 0 is the chief, "
                      "which starts it");
  t.timeout = std::chrono::milliseconds{c.init_timeout_ms};
  auto out = run_task(t, o);
  // A recovery's sessions go before the job's (its pinger is one).
  if (t.recovery)
    training_detail::close_recovery(*t.recovery);
  // A failed job's ps tasks end by themselves when the chief does
  // (programs/train_main.cpp: "the chief ended the job").
  if (t.chief && o.shutdown_ps && out)
    stop_ps(s);
  return out;
}

} // namespace af
