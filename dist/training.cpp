#include "dist/training.hpp"
#include "actors/system.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "dist/allreduce.hpp"
#include "actors/blocking_ask.hpp"
#include "dist/chief_start.hpp"
#include "net/data_plane.hpp"
#include "actors/kv_store.hpp"
#include "core/log.hpp"
#include "messages/error.hpp"
#include "train/checkpoint.hpp"
#include "train/checkpoint_check.hpp"
#include "train/local.hpp"
#include "train/metrics.hpp"
#include "train/partition.hpp"

namespace af {

namespace {

/// A global batch (batch_size from each of `replicas`) must fit in the
/// training set: a larger one would leave the step's inputs empty, and the
/// failure would only say that a matmul had no input.
caf::error check_batch(const train::train_config& c, size_t examples, uint32_t replicas) {
  auto global = static_cast<uint64_t>(c.batch_size) * replicas;
  if (global <= examples)
    return caf::none;
  return make_error(af_error::invalid_argument,
                    fmt::format("batch_size {} x {} worker(s) = {} examples per step, more than "
                                "the {} training examples of data '{}'; lower batch_size or use "
                                "more data",
                                c.batch_size, replicas, global, examples, c.data));
}

caf::error to_error(const graph_error& e) {
  return make_error(e.code, e.what);
}

/// "  staleness median M max X histogram 0:n0 1:n1 ..." (buckets with a count).
std::string staleness_summary(const std::vector<uint64_t>& h) {
  uint64_t total = 0, max = 0;
  for (size_t s = 0; s < h.size(); ++s) {
    total += h[s];
    if (h[s] > 0)
      max = s;
  }
  if (total == 0)
    return "";
  uint64_t seen = 0, median = 0;
  for (size_t s = 0; s < h.size(); ++s) {
    seen += h[s];
    if (2 * seen >= total) {
      median = s;
      break;
    }
  }
  std::string hist;
  for (size_t s = 0; s < h.size(); ++s)
    if (h[s] > 0)
      hist += fmt::format(" {}{}:{}", s, s + 1 == h.size() ? "+" : "", h[s]);
  return fmt::format("  staleness median {} max {}{} histogram{}", median, max,
                     max + 1 == h.size() ? "+" : "", hist);
}

/// The metrics CSV's path without ".csv": the plot and the per-worker rows go beside it.
std::string metrics_stem(const std::string& csv) {
  return csv.size() > 4 && csv.substr(csv.size() - 4) == ".csv" ? csv.substr(0, csv.size() - 4) : csv;
}

/// "  late 2:5  refused 0:1  guarded 1:3": per worker, gradients that came
/// after their step closed (dropped), values refused or abstained from, and
/// gradients the norm guard scaled down; "" if none.
std::string per_worker_summary(const aggregator_stats& s) {
  std::string late, refused, guarded;
  for (const auto& w : s.workers) {
    if (w.late > 0)
      late += fmt::format(" {}:{}", w.worker, w.late);
    if (w.refused > 0)
      refused += fmt::format(" {}:{}", w.worker, w.refused);
    if (w.guarded > 0)
      guarded += fmt::format(" {}:{}", w.worker, w.guarded);
  }
  std::string out;
  if (!late.empty())
    out += "  late (dropped)" + late;
  if (!refused.empty())
    out += "  refused" + refused;
  if (!guarded.empty())
    out += "  guarded" + guarded;
  return out;
}

/// The chief's progress line and metrics rows (the job's, and one per worker
/// in <metrics stem>.workers.csv).
struct reporter {
  const train::train_config* cfg = nullptr;
  uint32_t workers = 0;
  uint64_t total = 0;
  uint64_t start = 0;
  bool print = true;
  std::optional<train::metrics_writer> metrics;
  std::FILE* per_worker = nullptr;
  uint64_t events_seen = 0;
  std::function<void(const worker_progress&)> forward;

  ~reporter() {
    if (per_worker)
      std::fclose(per_worker);
  }

  void operator()(const worker_progress& p) {
    if (print) {
      std::printf("%s\n", progress_line(*cfg, total, start, p).c_str());
      // Who joined or left (and mode switches) since the last line.
      const auto& ev = p.stats.events;
      auto total_events = p.stats.events_total;
      // Fewer than seen: ps 0 died and its aggregator is a new one (its
      // count starts again), whose events are all fresh.
      if (total_events < events_seen)
        events_seen = 0;
      auto fresh = std::min<uint64_t>(total_events > events_seen ? total_events - events_seen : 0,
                                      ev.size());
      for (size_t i = ev.size() - fresh; i < ev.size(); ++i)
        std::printf("  %s\n", ev[i].c_str());
      events_seen = std::max(events_seen, total_events);
      std::fflush(stdout);
    }
    if (per_worker) {
      for (const auto& w : p.stats.workers)
        std::fprintf(per_worker, "%llu,%.3f,%u,%s,%s,%.1f,%llu,%llu,%llu,%llu,%llu,%llu,%llu\n",
                     static_cast<unsigned long long>(p.step), p.seconds, w.worker, w.task.c_str(),
                     w.status.c_str(), w.examples_per_s, static_cast<unsigned long long>(w.pushes),
                     static_cast<unsigned long long>(w.applied),
                     static_cast<unsigned long long>(w.late),
                     static_cast<unsigned long long>(w.refused),
                     static_cast<unsigned long long>(w.stale),
                     static_cast<unsigned long long>(w.waited_ms),
                     static_cast<unsigned long long>(w.clock));
      std::fflush(per_worker);
    }
    if (metrics) {
      train::metrics_row row;
      row.step = p.step;
      row.wall_s = p.seconds;
      row.loss = p.loss;
      row.accuracy = p.accuracy;
      row.mode = cfg->mode;
      row.workers = workers;
      row.examples_per_s = p.examples_per_s * workers;
      metrics->write(row);
    }
    if (forward)
      forward(p);
  }
};

/// The variables on the ps tasks and an aggregator over each task's share.
struct ps_placement {
  std::vector<output> vars;
  std::vector<param_shard> shards;
  std::vector<std::vector<output>> shard_vars; ///< per shard: its variables
  std::vector<aggregator_spec> specs;          ///< per shard: its aggregator's
};

/// Creates one variable per piece of the partition plan (train/partition.hpp:
/// whole parameters round robin as TF's replica_device_setter with
/// max_partitions = 1, else pieces spread by size) on its ps task, and gets
/// each task's aggregator over its pieces, `name_prefix` + "ps<k>", for
/// `workers` workers in `mode` (0 workers: the aggregators as they run, for
/// a worker that joins).
caf::expected<ps_placement> place_on_ps(session& s, const train::train_config& c,
                                        const std::vector<train::parameter>& params,
                                        const std::string& name_prefix, const std::string& mode,
                                        uint32_t workers) {
  auto n_ps = static_cast<uint32_t>(s.cluster().num_tasks("ps"));
  auto plan = train::plan_partitions(params, n_ps, c.max_partitions, c.min_slice_bytes);
  if (!plan)
    return to_error(plan.error());
  // A piece starts as its rows of the parameter's first value, so a
  // partitioned job trains exactly as an unpartitioned one. A whole
  // parameter keeps its own initializer (nothing to compute here).
  std::vector<tensor> logical;
  for (const auto& p : plan->pieces)
    if (!p.whole()) {
      auto init = train::initial_values(params);
      if (!init)
        return to_error(init.error());
      logical = std::move(*init);
      break;
    }
  ps_placement out;
  for (const auto& p : plan->pieces) {
    auto scope = s.device("/job:ps/task:" + std::to_string(p.ps));
    if (!scope)
      return std::move(scope.error());
    auto init = params[p.param].init;
    if (!p.whole()) {
      auto slice = train::slice_of(p, logical[p.param]);
      if (!slice)
        return to_error(slice.error());
      init = initializer::from_tensor(std::move(*slice));
    }
    auto v = s.variable(p.name, p.shape, init);
    if (!v)
      return std::move(v.error());
    out.vars.push_back(*v);
  }
  for (uint32_t k = 0; k < n_ps; ++k) {
    auto mine = plan->on_ps(k);
    if (mine.empty())
      continue;
    auto task = static_cast<int32_t>(k);
    aggregator_spec spec;
    spec.name = name_prefix + "ps" + std::to_string(k);
    spec.mode = mode;
    spec.workers = workers;
    spec.optimizer = c.optimizer;
    spec.step_timeout_ms = c.step_timeout_ms;
    spec.replicas_to_aggregate = c.replicas_to_aggregate;
    spec.grad_norm_guard = c.grad_norm_guard;
    spec.step_deadline_ms = c.step_deadline_ms;
    spec.min_replicas = c.min_replicas;
    spec.staleness = c.staleness;
    for (auto i : mine)
      spec.variables.push_back(plan->pieces[i].name);
    auto agg = s.aggregator("ps", task, spec);
    if (!agg)
      return std::move(agg.error());
    auto info = s.ping("ps", task);
    if (!info)
      return std::move(info.error());
    param_shard shard;
    shard.task = "/job:ps/task:" + std::to_string(k);
    shard.aggregator = spec.name;
    shard.actor = *agg;
    shard.host = s.cluster().address("ps", task)->host;
    shard.data_port = info->data_port;
    shard.incarnation = info->incarnation;
    std::vector<output> vars;
    for (auto i : mine) {
      shard.pieces.push_back(plan->pieces[i]);
      vars.push_back(out.vars[i]);
    }
    out.shards.push_back(std::move(shard));
    out.shard_vars.push_back(std::move(vars));
    out.specs.push_back(spec);
  }
  return out;
}

/// The chief's key-value store and the incarnation of its node (a key
/// under it belongs to this run of the chief, not to an earlier one).
struct chief_store {
  kv_store_actor store;
  uint64_t incarnation = 0;
};

caf::expected<chief_store> chief_store_of(session& s) {
  auto store = s.kv_store("worker", 0);
  if (!store)
    return std::move(store.error());
  auto info = s.ping("worker", 0);
  if (!info)
    return std::move(info.error());
  return chief_store{*store, info->incarnation};
}

/// Where the job starts, as the chief publishes it in its key-value store for
/// the other workers: "<global step> <data position> <total steps>".
std::string start_key(uint64_t chief_incarnation) {
  return fmt::format("train/{}/start", chief_incarnation);
}

/// An error naming every worker whose done said it failed (a worker that
/// failed and joined again, and then finished, is not named), or none.
caf::error failed_workers(const aggregator_stats& stats) {
  std::vector<std::string> failed;
  for (const auto& w : stats.workers)
    if (!w.error.empty())
      failed.push_back(fmt::format("worker {}{}{}: {}", w.worker, w.task.empty() ? "" : " ",
                                   w.task, w.error));
  if (failed.empty())
    return caf::none;
  auto msg = fmt::format("the job failed: {} of its workers ended in error: {}", failed.size(),
                         fmt::join(failed, "; "));
  log::get()->error("chief: {}", msg);
  return make_error(af_error::aborted, std::move(msg));
}

/// The snapshot of every shard's aggregator as one checkpoint (the step: the
/// latest of theirs), at the data position of `position(step)`.
caf::expected<train::checkpoint> snapshot(session& s, const std::vector<param_shard>& shards,
                                          const std::vector<train::parameter>& params,
                                          const train::train_config& c,
                                          const std::function<uint64_t(uint64_t)>& position) {
  train::checkpoint ck;
  std::chrono::milliseconds timeout{c.step_timeout_ms};
  for (const auto& shard : shards) {
    auto state = ask<aggregator_state>(s, shard.actor, timeout, save_atom::value);
    if (!state)
      return std::move(state.error());
    add_variables(ck, *state, c.optimizer.kind);
    ck.global_step = std::max(ck.global_step, state->global_step);
    auto& seqs = ck.push_seqs[shard.aggregator];
    for (size_t i = 0; i < state->seq_workers.size() && i < state->seq_taken.size(); ++i)
      seqs[state->seq_workers[i]] = state->seq_taken[i];
  }
  if (auto err = assemble_variables(ck, params, shards))
    return err;
  ck.data_position = position(ck.global_step);
  ck.config = train::to_toml(c);
  return ck;
}

/// The key under which the chief says it restored ps `k` in its new
/// incarnation: "<global step> <checkpoint step>".
std::string restored_key(uint64_t chief_incarnation, size_t k, uint64_t ps_incarnation) {
  return fmt::format("train/{}/ps{}/restored/{}", chief_incarnation, k, ps_incarnation);
}

/// How this job reads and writes its checkpoints: the directory, the HMAC
/// key (checkpoint_key; empty: none) and what a checkpoint must be to be
/// restored (train::check_checkpoint).
struct checkpoint_access {
  std::string dir;
  train::checkpoint_key key;
  train::checkpoint_expectations expect;
};

/// The chief's (and allreduce's workers') checkpoint_access: the key file
/// read once, at start, so that a bad one fails the job before it trains.
caf::expected<checkpoint_access> checkpoint_access_of(const train::train_config& c,
                                                      const std::vector<train::parameter>& params,
                                                      uint64_t total, uint32_t workers) {
  checkpoint_access out;
  out.dir = c.checkpoint_dir;
  if (!c.checkpoint_key.empty()) {
    auto key = train::load_checkpoint_key(c.checkpoint_key);
    if (!key)
      return to_error(key.error());
    out.key = std::move(*key);
  }
  out.expect.params = params;
  out.expect.optimizer_kind = c.optimizer.kind;
  out.expect.max_step = train::max_checkpoint_step(total, workers);
  return out;
}

/// What waiting for a ps that died needs (worker_setup::recover_ps): the
/// session (used on the recovery link's thread while run_worker_task waits
/// for the worker), and, on the chief, what re-creates and restores the ps.
struct recovery_context {
  session* s = nullptr;
  train::train_config c;
  std::vector<train::parameter> params;
  std::vector<param_shard> shards;            ///< as last seen (incarnations)
  std::vector<std::vector<output>> vars;      ///< per shard
  std::vector<aggregator_spec> specs;         ///< per shard
  kv_store_actor store;                       ///< the chief's
  checkpoint_access checkpoints;              ///< the chief's
  uint64_t chief_incarnation = 0;
  uint32_t task = 0;
  /// A session of short timeouts for the pings while waiting: the first
  /// ping after a kill may go to the dead node's proxy, which CAF does not
  /// answer; the job's session would wait its whole request timeout.
  std::optional<session> pinger;
  /// Held while a recovery runs (on the recovery link's thread); closed
  /// once run_worker_task is done with the sessions, under the same lock.
  std::mutex mtx;
  bool closed = false;
};

/// The latest checkpoint of the job and its path, checked against the job
/// (its HMAC, its fields, finite values); none if the job has none yet.
caf::expected<std::optional<std::pair<std::string, train::checkpoint>>>
load_latest_checkpoint(const checkpoint_access& from) {
  auto latest = train::latest(from.dir);
  if (!latest)
    return to_error(latest.error());
  if (latest->empty())
    return std::optional<std::pair<std::string, train::checkpoint>>{};
  auto ck = train::load(*latest, from.key);
  if (!ck)
    return to_error(ck.error());
  if (auto st = train::check_checkpoint(*ck, *latest, from.expect); !st)
    return to_error(st.error());
  if (auto why = train::slot_mismatch(*ck, from.expect.optimizer_kind); !why.empty())
    log::get()->warn("restoring {}: {}", *latest, why);
  return std::make_optional(std::make_pair(std::move(*latest), std::move(*ck)));
}

/// Waits (bounded by ps_recovery_timeout_ms) until shard `k`'s ps answers
/// as a new process; nullopt if the same process answers (its connection
/// broke, not the process). A non-chief gives up at once when the chief is
/// gone: the job stops then (docs/training.md).
caf::expected<std::optional<node_info>> wait_for_ps(recovery_context& ctx, size_t k,
                                                    const std::string& why) {
  auto& s = *ctx.s;
  const auto& shard = ctx.shards[k];
  auto ms = ctx.c.ps_recovery_timeout_ms;
  if (!ctx.pinger) {
    // 5 s, not 1: a first connection over TLS (CAF loads the files and
    // shakes hands) may take longer than 1 s on a busy machine.
    session_options so;
    so.timeout = std::chrono::milliseconds{5000};
    so.connect_timeout = std::chrono::milliseconds{5000};
    auto p = session::make(s.system(), s.cluster(), "/job:worker/task:" + std::to_string(ctx.task),
                           so);
    if (!p)
      return std::move(p.error());
    ctx.pinger.emplace(std::move(*p));
  }
  auto& pinger = *ctx.pinger;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds{ms};
  auto addr = s.cluster().address("ps", static_cast<int32_t>(k));
  auto where = addr ? addr->to_string() : std::string{"?"};
  if (ctx.task == 0)
    log::get()->warn("chief: {} at {} is gone ({}); waiting up to {} ms (ps_recovery_timeout_ms) "
                     "for it to come back: a supervisor restarts it (systemd "
                     "Restart=on-failure, actorflow-node --restart-on-failure), or start "
                     "`actorflow-train --config F --job ps --task {}` again; then its variables "
                     "are restored from the latest checkpoint",
                     shard.task, where, why, ms, k);
  else
    log::get()->warn("worker {}: {} at {} is gone ({}); waiting up to {} ms for it to come back "
                     "and for the chief to restore it",
                     ctx.task, shard.task, where, why, ms);
  for (;;) {
    if (ctx.task != 0) {
      auto chief = pinger.ping("worker", 0);
      if (!chief || chief->incarnation != ctx.chief_incarnation) {
        auto caddr = s.cluster().address("worker", 0);
        return make_error(af_error::aborted,
                          fmt::format("the chief /job:worker/task:0 at {} is gone ({}) while {} "
                                      "was down: the job stops (no other worker takes over); "
                                      "restart every task of the job, and the chief resumes "
                                      "from the latest checkpoint",
                                      caddr ? caddr->to_string() : std::string{"?"},
                                      chief ? "it restarted" : describe(chief.error()),
                                      shard.task));
      }
    }
    // 500 ms, not the pinger's 5 s: the first ping may go to the dead
    // process's proxy before CAF saw its connection close, and CAF never
    // answers it (in the soak, 17 of 31 recoveries waited 5 s for it).
    auto info = pinger.ping("ps", static_cast<int32_t>(k), std::chrono::milliseconds{500});
    if (info && info->incarnation == shard.incarnation)
      return std::optional<node_info>{};
    if (info)
      return std::optional<node_info>{*info};
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(af_error::timeout,
                        fmt::format("{} at {} did not come back within {} ms "
                                    "(ps_recovery_timeout_ms) after it was lost ({}); the job "
                                    "stops: start the ps, then the job's tasks, which resume "
                                    "from the latest checkpoint",
                                    shard.task, where, ms, why));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

/// The chief: ps `k` died; waits for it, re-creates its variables and its
/// aggregator, restores them (values, optimizer slots) from the latest
/// checkpoint at global step `step` (the step the job pushes to it; the
/// other ps keep their state), says so in the chief's key-value store for
/// the other workers, and hands back the shard as it runs now. `held`: it
/// died while the chief held the round (worker_setup::recover_ps).
caf::expected<recovered_shard> chief_recover_ps(recovery_context& ctx, size_t k, uint64_t step,
                                                const std::string& why, bool held) {
  auto& s = *ctx.s;
  const auto& c = ctx.c;
  std::chrono::milliseconds timeout{c.step_timeout_ms};
  auto back = wait_for_ps(ctx, k, why);
  if (!back)
    return std::move(back.error());
  if (!*back)
    return recovered_shard{ctx.shards[k], step}; // the same process: push again
  auto info = **back;
  auto task = static_cast<int32_t>(k);
  log::get()->info("chief: {} is back (incarnation {}); re-creating its variables and aggregator",
                   ctx.shards[k].task, info.incarnation);
  if (auto err = s.initialize(ctx.vars[k]))
    return err;
  auto agg = s.aggregator("ps", task, ctx.specs[k]);
  if (!agg)
    return std::move(agg.error());
  param_shard shard = ctx.shards[k];
  shard.actor = *agg;
  shard.data_port = info.data_port;
  shard.incarnation = info.incarnation;
  // Its state: the latest checkpoint's rows of its pieces, else (none yet)
  // the values it was just initialized with.
  aggregator_state state;
  std::string from = "its initial values (no checkpoint yet)";
  uint64_t from_step = 0;
  bool have = false;
  if (!c.checkpoint_dir.empty()) {
    auto latest = load_latest_checkpoint(ctx.checkpoints);
    if (!latest)
      return std::move(latest.error());
    if (*latest) {
      const auto& [path, ck] = **latest;
      auto st = restored_state(ck, c.checkpoint_dir, ctx.params, shard.pieces, c.optimizer.kind,
                               shard.aggregator);
      if (!st)
        return std::move(st.error());
      state = std::move(*st);
      from = path;
      from_step = ck.global_step;
      have = true;
    }
  }
  if (!have) {
    auto st = ask<aggregator_state>(s, shard.actor, timeout, save_atom::value);
    if (!st)
      return std::move(st.error());
    state = std::move(*st);
  }
  // A surviving shard knows the workers that finished or left (the new
  // aggregator must not wait for them) and where the job's step is.
  //   async, ssp: every push moves it, so the chief's last view of this
  //     shard lags the others' by the pushes since.
  //   sync: a round the chief pushed to may have closed on the others with
  //     every worker's gradient, and another worker may have pushed its next
  //     gradient there already, while this shard's died with it. Restored at
  //     the chief's step, that worker's part for this shard went one round
  //     behind its other parts for the rest of the job (each shard is pushed
  //     at its own step), and a surviving ps ended a round past the job's
  //     steps (seen in CI: 3001 of 3000). At the survivor's step, a part
  //     pushed for an earlier step is dropped as late and answered at once,
  //     and every worker pushes the next round to every shard. Only within
  //     that one round: after a live switch the ps count their rounds apart
  //     for good, and a survivor's step further off says nothing about this
  //     shard's. Not when it died while the chief held the round (its
  //     checkpoint found it gone): no worker can be past the chief's round
  //     then, and at a survivor's step that round's update would be lost
  //     on this shard (K + 1 lost in the soak, where K would do).
  //   average: the chief's step (the round's), as before.
  std::optional<aggregator_stats> survivor;
  auto chief_step = step;
  for (size_t j = 0; j < ctx.shards.size(); ++j) {
    if (j == k)
      continue;
    auto stats = ask<aggregator_stats>(s, ctx.shards[j].actor, timeout, stats_atom::value);
    if (!stats)
      continue;
    if (train::step_per_push(stats->mode)
        || (stats->mode == "sync" && !held && stats->global_step <= chief_step + 1))
      step = std::max(step, stats->global_step);
    if (!survivor)
      survivor = std::move(*stats);
  }
  state.global_step = step;
  auto r = ask<uint64_t>(s, shard.actor, timeout, restore_atom::value, std::move(state));
  if (!r)
    return std::move(r.error());
  if (survivor)
    for (const auto& w : survivor->workers)
      if (w.status == "done" || w.status == "left")
        caf::anon_send(shard.actor, done_atom::value, w.worker, std::string{}, std::string{});
  kv_client client{s.system(), ctx.store, timeout};
  if (auto err = client.put(restored_key(ctx.chief_incarnation, k, info.incarnation),
                            fmt::format("{} {}", step, from_step)))
    return err;
  ctx.shards[k] = shard;
  auto lost = step > from_step ? step - from_step : 0;
  log::get()->warn("chief: restored {} from {} (global step {}) at global step {}: its "
                   "variables lost {} update(s); the other ps kept theirs",
                   shard.task, from, from_step, step, lost);
  std::printf("ps recovered: %s from %s checkpoint_step=%llu at global_step=%llu lost=%llu\n",
              shard.task.c_str(), from.c_str(), static_cast<unsigned long long>(from_step),
              static_cast<unsigned long long>(step), static_cast<unsigned long long>(lost));
  std::fflush(stdout);
  return recovered_shard{shard, step};
}

/// Another worker: ps `k` died; waits for it and for the chief's word that
/// it restored it, then finds its new aggregator.
caf::expected<recovered_shard> worker_recover_ps(recovery_context& ctx, size_t k, uint64_t step,
                                                 const std::string& why) {
  auto& s = *ctx.s;
  auto back = wait_for_ps(ctx, k, why);
  if (!back)
    return std::move(back.error());
  if (!*back)
    return recovered_shard{ctx.shards[k], step};
  auto info = **back;
  auto ms = std::chrono::milliseconds{ctx.c.ps_recovery_timeout_ms};
  kv_client client{s.system(), ctx.store, std::chrono::milliseconds{5000}};
  auto key = restored_key(ctx.chief_incarnation, k, info.incarnation);
  auto word = client.get(key, ms);
  if (!word)
    return make_error(af_error::timeout,
                      fmt::format("{} came back, but the chief did not say it restored it within "
                                  "{} ms (waited for '{}' in its key-value store): {}",
                                  ctx.shards[k].task, ms.count(), key, describe(word.error())));
  unsigned long long restored = 0, from = 0;
  if (std::sscanf(word->c_str(), "%llu %llu", &restored, &from) != 2)
    return make_error(af_error::internal, "the chief wrote '" + *word + "' under " + key
                                            + ", not '<global step> <checkpoint step>'");
  aggregator_spec lookup;
  lookup.name = ctx.shards[k].aggregator;
  lookup.workers = 0;
  auto agg = s.aggregator("ps", static_cast<int32_t>(k), lookup);
  if (!agg)
    return std::move(agg.error());
  param_shard shard = ctx.shards[k];
  shard.actor = *agg;
  shard.data_port = info.data_port;
  shard.incarnation = info.incarnation;
  ctx.shards[k] = shard;
  log::get()->info("worker {}: {} is back, restored by the chief at global step {}", ctx.task,
                   shard.task, restored);
  return recovered_shard{shard, restored};
}

} // namespace

std::string progress_line(const train::train_config& c, uint64_t total, uint64_t start,
                          const worker_progress& p) {
  double left = 0;
  uint64_t done = p.step > start ? p.step - start : 0;
  if (done > 0 && p.step < total)
    left = p.seconds * static_cast<double>(total - p.step) / static_cast<double>(done);
  std::string acc = p.accuracy >= 0 ? fmt::format("  held-out {:.4f}", p.accuracy) : "";
  std::string what;
  if (c.mode == "average")
    what = fmt::format(" local steps of each replica, {} averaging round{} (every {})",
                       p.rounds, p.rounds == 1 ? "" : "s", std::max<uint32_t>(1, c.average_every));
  else if (c.mode == "allreduce")
    what = " steps of each replica";
  return fmt::format("step {}/{}{}  loss {:.4f}{}  {:.0f} examples/s (this worker){}{}  {:.0f} s "
                     "left",
                     p.step, total, what, p.loss, acc, p.examples_per_s,
                     staleness_summary(p.stats.staleness), per_worker_summary(p.stats), left);
}

std::string status_report(const std::string& where, const aggregator_stats& s) {
  std::string out = fmt::format("{}: mode {}, global step {}, {} update(s) applied, {} push(es), "
                                "{} member(s) pushing",
                                where, s.mode, s.global_step, s.applied, s.pushes, s.active);
  if (s.closed_at_deadline > 0)
    out += fmt::format(", {} step(s) closed at the deadline", s.closed_at_deadline);
  if (s.switches > 0)
    out += fmt::format(", {} mode switch(es)", s.switches);
  out += "\n";
  out += fmt::format("  {:>6} {:<22} {:<7} {:>10} {:>7} {:>7} {:>6} {:>7} {:>6} {:>9} {:>7}\n",
                     "worker", "task", "status", "examples/s", "pushes", "applied", "late",
                     "refused", "stale", "waited_s", "idle_s");
  for (const auto& w : s.workers)
    out += fmt::format("  {:>6} {:<22} {:<7} {:>10.1f} {:>7} {:>7} {:>6} {:>7} {:>6} {:>9.1f} {:>7}\n",
                       w.worker, w.task.empty() ? "-" : w.task, w.status, w.examples_per_s,
                       w.pushes, w.applied, w.late, w.refused, w.stale,
                       static_cast<double>(w.waited_ms) / 1000.0,
                       w.idle_s < 0 ? std::string{"-"} : fmt::format("{:.1f}", w.idle_s));
  for (const auto& e : s.events)
    out += "  event: " + e + "\n";
  return out;
}

namespace {

/// run_worker_task; `start_said`: set once the chief published its start
/// under start_key, so that a failure before that is published (as the
/// reason) by run_worker_task.
caf::expected<train_outcome> run_task(session& s, const train::train_config& c, uint32_t task,
                                      const train_options& opts, bool& start_said) {
  if (auto bad = train::validate(c); !bad.empty())
    return make_error(af_error::invalid_argument, "training config: " + bad);
  const auto& cluster = s.cluster();
  auto workers = static_cast<uint32_t>(cluster.num_tasks("worker"));
  if (workers == 0 || task >= workers)
    return make_error(af_error::invalid_argument,
                      fmt::format("worker task {} of a cluster with {} worker tasks", task, workers));
  if (auto bad = train::check_workers(c, workers); !bad.empty())
    return make_error(af_error::invalid_config, bad);
  bool chief = task == 0;
  bool allreduce = c.mode == "allreduce";
  auto n_ps = static_cast<uint32_t>(cluster.num_tasks("ps"));
  if (!allreduce && n_ps == 0)
    return make_error(af_error::invalid_argument,
                      "mode '" + c.mode + "' needs a ps job in the cluster; allreduce needs none");
  std::chrono::milliseconds timeout{c.step_timeout_ms};

  // 1. data and parameters
  auto data = train::load_data(c);
  if (!data)
    return to_error(data.error());
  if (auto err = check_batch(c, data->train.size(), workers))
    return err;
  auto shared_data = std::make_shared<const train::split>(std::move(*data));
  const auto& train_set = shared_data->train;
  auto params = train::parameters(c.model, train_set.features, train_set.classes, c.hidden, c.seed);
  if (!params)
    return to_error(params.error());
  uint64_t total = train::total_steps(c, train_set.size(),
                                      train::step_per_push(c.mode) ? 1 : workers);

  worker_setup setup;
  setup.index = task;
  setup.workers = workers;
  setup.cfg = c;
  setup.data = shared_data;
  setup.params = *params;
  setup.total_steps = total;
  setup.timeout = timeout;
  setup.tamper = opts.tamper;
  setup.before_push = opts.before_push;
  setup.step_delay = opts.step_delay;
  setup.stop = opts.stop;
  setup.task_name = "/job:worker/task:" + std::to_string(task);
  if (auto addr = cluster.address("worker", static_cast<int32_t>(task)))
    setup.address = addr->to_string();
  if (opts.join && (chief || allreduce))
    return make_error(af_error::invalid_argument,
                      chief ? "--join is for a worker that joins a running job; worker 0 is the "
                              "chief, which starts it"
                            : "mode allreduce has no aggregator to join: its workers are fixed");

  // The latest checkpoint, if the job has one: the chief restores it to a
  // ps without state (not to one that runs the job already:
  // start_job_on_ps); in allreduce every worker does, from the shared
  // directory. The checkpoint_key is needed to write checkpoints too: a bad
  // one fails here. A latest checkpoint that cannot be read fails the chief
  // only if a ps needs it (start_job_on_ps): a running job whose every ps
  // is live does not. (A chief that fails before it published its start
  // tells the others why: run_worker_task.)
  std::optional<train::checkpoint> restored;
  std::string restored_path;
  checkpoint_access checkpoints;
  caf::error unreadable;
  if (!c.checkpoint_dir.empty() && (chief || allreduce)) {
    auto access = checkpoint_access_of(c, *params, total, workers);
    if (!access)
      return std::move(access.error());
    checkpoints = std::move(*access);
    auto latest = load_latest_checkpoint(checkpoints);
    if (!latest) {
      if (allreduce)
        return std::move(latest.error());
      unreadable = std::move(latest.error());
    } else if (*latest) {
      restored = std::move((*latest)->second);
      restored_path = (*latest)->first;
      if (allreduce)
        log::get()->info("worker {}: restoring {} (global step {})", task, restored_path,
                         restored->global_step);
    }
  }

  // 2-3. variables, aggregators, initialization
  std::shared_ptr<recovery_context> recovery; // sync, async, average: waits for a ps that died
  if (!allreduce) {
    // One name per ps for the job's life: a live switch changes the mode of
    // the aggregator behind it, and --status and --switch find it by it.
    auto placed = place_on_ps(s, c, *params, "train/", c.mode, opts.join ? 0 : workers);
    if (!placed)
      return std::move(placed.error());
    setup.shards = std::move(placed->shards);
    auto chief_info = chief_store_of(s);
    if (!chief_info)
      return std::move(chief_info.error());
    if (c.ps_recovery_timeout_ms > 0) {
      auto ctx = std::make_shared<recovery_context>();
      recovery = ctx;
      ctx->s = &s;
      ctx->c = c;
      ctx->params = *params;
      ctx->shards = setup.shards;
      ctx->vars = placed->shard_vars;
      ctx->specs = placed->specs;
      ctx->store = chief_info->store;
      ctx->checkpoints = checkpoints;
      ctx->chief_incarnation = chief_info->incarnation;
      ctx->task = task;
      setup.recover_ps = [ctx](size_t k, uint64_t step, const std::string& why,
                               bool held) -> caf::expected<recovered_shard> {
        std::lock_guard<std::mutex> guard{ctx->mtx};
        if (ctx->closed)
          return make_error(af_error::cancelled, "the worker task is over");
        return ctx->task == 0 ? chief_recover_ps(*ctx, k, step, why, held)
                              : worker_recover_ps(*ctx, k, step, why);
      };
    }
    // The store answers a get at its own deadline; the client's margin
    // only covers a round trip. A store whose node died (a chief killed or
    // failed at start) answers nothing, and CAF does not fail a request to
    // a dead remote actor: the margin is how late the others learn of it.
    kv_client client{s.system(), chief_info->store,
                     std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds{5})};
    // The chief publishes where the job starts once it has initialized or
    // restored the variables, or why it could not: the others wait for that
    // word instead of waiting init_timeout_ms for variables that a failed
    // chief will never initialize.
    std::string published;
    if (!chief) {
      auto word = client.get(start_key(chief_info->incarnation),
                             std::chrono::milliseconds{c.init_timeout_ms});
      if (!word)
        return std::move(word.error());
      if (word->rfind("failed ", 0) == 0)
        return make_error(af_error::aborted,
                          fmt::format("the chief (worker 0) could not start the job: {}",
                                      word->substr(7)));
      published = std::move(*word);
    }
    if (chief) {
      // A ps that runs the job already (the chief died and came back) is
      // taken as it is; only one without state is restored or initialized.
      ps_found found_here = ps_found::unknown;
      auto started = start_job_on_ps(s, c, *params, setup.shards, placed->shard_vars, workers,
                                     restored, restored_path, unreadable, found_here);
      if (opts.found)
        opts.found->store(found_here);
      if (!started)
        return std::move(started.error());
      setup.start_step = started->step;
      setup.start_position = started->position;
      if (auto err = client.put(start_key(chief_info->incarnation),
                                fmt::format("{} {} {}", setup.start_step, setup.start_position,
                                            total)))
        return err;
      start_said = true;
    } else {
      if (auto err = s.wait_initialized(std::chrono::milliseconds{c.init_timeout_ms},
                                        placed->vars))
        return err;
      auto stats = ask<aggregator_stats>(s, setup.shards[0].actor, timeout, stats_atom::value);
      if (!stats)
        return std::move(stats.error());
      setup.start_step = stats->global_step;
      // sync, async and ssp workers push gradients and may meet any of those
      // modes (a live switch); average workers push parameters after local
      // steps. A joiner whose config says otherwise would push the wrong kind.
      if (opts.join && (stats->mode == "average") != (c.mode == "average"))
        return make_error(af_error::invalid_argument,
                          fmt::format("the job runs mode {}, this worker's config says {}: join "
                                      "with --set mode={}",
                                      stats->mode, c.mode, stats->mode));
      // The chief's start, moved on by the steps the job took since.
      unsigned long long step0 = 0, position0 = 0, total0 = 0;
      if (std::sscanf(published.c_str(), "%llu %llu %llu", &step0, &position0, &total0) != 3)
        return make_error(af_error::internal, "the chief published its start as '" + published
                                                + "', not '<global step> <data position> <total "
                                                  "steps>'");
      // The chief's count of steps: a worker that joins with a config of
      // more workers would count fewer (sync: a global batch per step).
      total = total0;
      setup.total_steps = total;
      setup.start_position = data_position(c.mode, workers, step0, position0,
                                           setup.start_step - std::min<uint64_t>(step0, setup.start_step),
                                           setup.start_step);
    }
    if (c.mode == "average") {
      // Every replica starts from the job's slots (restored, else zeros).
      // Their pieces assembled per parameter, as a checkpoint holds them.
      train::checkpoint held;
      for (const auto& shard : setup.shards) {
        auto state = ask<aggregator_state>(s, shard.actor, timeout, save_atom::value);
        if (!state)
          return std::move(state.error());
        add_variables(held, *state, c.optimizer.kind);
      }
      if (auto err = assemble_variables(held, *params, setup.shards))
        return err;
      auto slot_names = train::slot_names(c.optimizer.kind);
      setup.initial_slots.resize(params->size());
      for (size_t i = 0; i < params->size(); ++i)
        for (auto& v : held.variables)
          if (v.name == (*params)[i].name)
            for (const auto& sn : slot_names)
              setup.initial_slots[i].push_back(std::move(v.slots[sn]));
    }
  } else {
    // allreduce: the same first values everywhere (the same seeds), or the checkpoint's.
    auto init = train::initial_values(*params);
    if (!init)
      return to_error(init.error());
    setup.initial = std::move(*init);
    if (restored) {
      // Every parameter whole: the plan of one ps with no partitions.
      auto whole = train::plan_partitions(*params, 1, 1, 1);
      if (!whole)
        return to_error(whole.error());
      auto state = restored_state(*restored, c.checkpoint_dir, *params, whole->pieces,
                                  c.optimizer.kind);
      if (!state)
        return std::move(state.error());
      setup.initial = std::move(state->values);
      setup.initial_slots = std::move(state->slots);
      setup.start_step = restored->global_step;
      setup.start_position = restored->data_position;
    }
    auto chief_info = chief_store_of(s);
    if (!chief_info)
      return std::move(chief_info.error());
    kv_client client{s.system(), chief_info->store, timeout};
    auto group = allreduce_group::create(task, workers,
                                         fmt::format("train/{}/{}", chief_info->incarnation,
                                                     setup.start_step),
                                         client, timeout,
                                         cluster.address("worker", static_cast<int32_t>(task))->host);
    if (!group)
      return std::move(group.error());
    setup.group = std::shared_ptr<allreduce_group>(std::move(*group));
  }

  // 4. the replica of the step on this worker's own device
  {
    auto scope = s.device("/job:worker/task:" + std::to_string(task));
    if (!scope)
      return std::move(scope.error());
    auto r = train::build_replica(s.builder(), *params, c.model, "replica/");
    if (!r)
      return to_error(r.error());
    setup.model = std::move(*r);
  }
  std::vector<output> fetches{setup.model.loss};
  fetches.insert(fetches.end(), setup.model.grads.begin(), setup.model.grads.end());
  auto step = s.prepare(fetches);
  if (!step)
    return std::move(step.error());
  setup.step = *step;
  if (chief) {
    std::vector<output> eval{setup.model.loss};
    if (setup.model.correct.valid())
      eval.push_back(setup.model.correct);
    auto ev = s.prepare(eval);
    if (!ev)
      return std::move(ev.error());
    setup.eval = *ev;
  }

  train_outcome outcome;
  outcome.start_step = setup.start_step;
  outcome.start_position = setup.start_position;
  auto rep = std::make_shared<reporter>();
  rep->cfg = &c;
  rep->workers = workers;
  rep->total = total;
  rep->start = setup.start_step;
  rep->print = opts.print && chief;
  rep->forward = opts.on_progress;
  if (chief && !c.metrics.empty()) {
    auto m = train::metrics_writer::open(c.metrics, setup.start_step);
    if (!m)
      return to_error(m.error());
    rep->metrics.emplace(std::move(*m));
    if (!allreduce) {
      // A resumed job appends (its earlier rows stay, as in the metrics CSV).
      auto path = metrics_stem(c.metrics) + ".workers.csv";
      std::error_code ec;
      bool fresh = setup.start_step == 0 || !std::filesystem::exists(path, ec);
      rep->per_worker = std::fopen(path.c_str(), fresh ? "w" : "a");
      if (!rep->per_worker)
        log::get()->warn("chief: cannot write {} ({}); the per-worker rows are not kept", path,
                         std::strerror(errno));
      else if (fresh)
        std::fprintf(rep->per_worker, "step,wall_s,worker,task,status,examples_per_s,pushes,"
                                      "applied,late,refused,stale,waited_ms,clock\n");
    }
  }
  setup.on_progress = [rep](const worker_progress& p) { (*rep)(p); };
  auto last_checkpoint = std::make_shared<std::string>();
  if (chief && !c.checkpoint_dir.empty())
    setup.save = [checkpoints, last_checkpoint](const train::checkpoint& ck)
      -> caf::expected<std::string> {
      // One that no job could restore is not written over a good one.
      if (auto bad = train::first_non_finite_value(ck); !bad.empty())
        return make_error(af_error::non_finite,
                          fmt::format("the checkpoint of global step {} is not written: it {}",
                                      ck.global_step, bad));
      auto where = train::save(checkpoints.dir, ck, 3, checkpoints.key);
      if (!where)
        return to_error(where.error());
      *last_checkpoint = *where;
      return *where;
    };

  // 5. train
  auto shards = setup.shards;
  auto start_step = setup.start_step;
  auto start_position = setup.start_position;
  // sync, async, ssp: the aggregators' state once every worker is done
  // (decided by the mode the job ended in: a live switch may have changed it).
  bool save_at_end = static_cast<bool>(setup.save) && !allreduce;
  auto save = setup.save;
  std::promise<caf::expected<worker_result>> finished;
  auto result = finished.get_future();
  spawn_worker(s.system(), std::move(setup), [&finished](caf::expected<worker_result> r) {
    finished.set_value(std::move(r));
  });
  auto r = result.get();
  // The recovery link may outlive the worker a little: its session goes now,
  // before this one and the actor system.
  if (recovery) {
    std::lock_guard<std::mutex> guard{recovery->mtx};
    recovery->closed = true;
    recovery->pinger.reset();
  }
  if (!r)
    return std::move(r.error());
  outcome.result = std::move(*r);
  // A ps that died and came back has a new aggregator.
  if (!outcome.result.shards.empty())
    shards = outcome.result.shards;
  if (!chief) {
    // A sync job's rounds go on without a chief that died (its aggregators
    // dropped it from the membership), so this worker can reach the end
    // alone: nothing it trained since the chief's last checkpoint is saved,
    // and the job has no result. Said, not "done": the aggregator knows
    // whether the chief finished or left (after a normal end the ps may be
    // stopped already: no answer is no news).
    if (!allreduce && !shards.empty())
      if (auto st = ask<aggregator_stats>(s, shards[0].actor, std::chrono::milliseconds{2000},
                                          stats_atom::value))
        for (const auto& w : st->workers)
          if (w.worker == 0 && w.status == "left")
            return make_error(af_error::aborted,
                              fmt::format("worker {} reached the end of the job, but the chief "
                                          "/job:worker/task:0 left it (it died) before: the steps "
                                          "trained since its last checkpoint were not saved and "
                                          "the job has no result; restart every task of the "
                                          "job, and the chief resumes from the latest "
                                          "checkpoint",
                                          task));
    outcome.checkpoint = *last_checkpoint;
    return outcome;
  }
  if (!allreduce) {
    // The other workers finish the same step (sync) or soon after (async,
    // average): wait for them, bounded, then stop the ps tasks.
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto stats = ask<aggregator_stats>(s, shards[0].actor, timeout, stats_atom::value);
      if (!stats)
        return std::move(stats.error());
      outcome.stats = *stats;
      // Every member done or gone (workers that joined included).
      if (stats->active == 0)
        break;
      if (std::chrono::steady_clock::now() >= deadline) {
        std::vector<std::string> who;
        for (const auto& w : stats->workers)
          if (w.status == "member" || w.status == "held")
            who.push_back(fmt::format("worker {} ({}, last push {:.1f} s ago)", w.worker,
                                      w.task.empty() ? "never joined" : w.task, w.idle_s));
        log::get()->warn("chief: {} still pushing {} ms after the chief finished (stopped? not "
                         "started?); stopping the ps tasks anyway",
                         fmt::join(who, ", "), timeout.count());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // sync: every shard closes the same rounds, so the shards end at one
    // step unless a live switch left them apart. A shard that ended
    // elsewhere is said, with every shard's step: the job's step below is
    // the first shard's, which may differ from the one the workers stopped
    // at.
    if (outcome.stats.mode == "sync" && shards.size() > 1) {
      std::vector<std::string> at;
      bool differ = false;
      for (const auto& shard : shards) {
        auto st = ask<aggregator_stats>(s, shard.actor, timeout, stats_atom::value);
        if (!st)
          break;
        differ = differ || st->global_step != outcome.stats.global_step;
        at.push_back(fmt::format("{} at {}", shard.task, st->global_step));
      }
      if (differ)
        log::get()->warn("chief: the sync job's ps ended at different global steps ({}); the "
                         "chief stopped at {}",
                         fmt::join(at, ", "), outcome.result.global_step);
    }
    // The job's last step (async: the others' last pushes came after the
    // chief's), which the final checkpoint records too.
    outcome.result.global_step = std::max(outcome.result.global_step, outcome.stats.global_step);
    auto final_mode = outcome.stats.mode.empty() ? c.mode : outcome.stats.mode;
    if (save_at_end && final_mode != "average") {
      auto local_steps = outcome.result.local_steps;
      auto ck = snapshot(s, shards, *params, c, [&](uint64_t g) {
        return data_position(final_mode, workers, start_step, start_position, local_steps, g);
      });
      if (!ck)
        return std::move(ck.error());
      auto where = save(*ck);
      if (!where)
        return std::move(where.error());
    }
    if (opts.shutdown_ps)
      for (uint32_t k = 0; k < n_ps; ++k)
        if (auto err = s.shutdown("ps", static_cast<int32_t>(k)))
          log::get()->warn("chief: shutting down /job:ps/task:{}: {}", k, describe(err));
    // A worker that ended in error (its done said why) fails the job: its
    // share of the steps was not trained, or something refused it.
    if (auto err = failed_workers(outcome.stats))
      return err;
  }
  outcome.checkpoint = *last_checkpoint;
  if (rep->metrics) {
    auto csv = rep->metrics->path();
    rep->metrics.reset();
    auto png = metrics_stem(csv) + ".png";
    outcome.plot = train::plot(csv, png);
  }
  return outcome;
}

} // namespace

caf::expected<train_outcome> run_worker_task(session& s, const train::train_config& c,
                                             uint32_t task, const train_options& opts) {
  bool start_said = false;
  auto out = run_task(s, c, task, opts, start_said);
  // A chief that fails before it published its start (the checkpoint does
  // not load, the ps cannot be reached, ...) says so to the workers waiting
  // for that word: they stop at once instead of after init_timeout_ms.
  // Best effort: a chief that cannot reach its own store has nobody to tell.
  // allreduce's workers do not wait for it.
  if (!out && task == 0 && !start_said && c.mode != "allreduce")
    if (auto chief_info = chief_store_of(s)) {
      kv_client client{s.system(), chief_info->store, std::chrono::milliseconds{5000}};
      if (auto err = client.put(start_key(chief_info->incarnation),
                                "failed " + describe(out.error())))
        log::get()->warn("chief: could not tell the other workers that it failed: {}",
                         describe(err));
    }
  return out;
}

} // namespace af

namespace af {

caf::expected<train_outcome> run_in_graph(session& s, const train::train_config& c,
                                          const train_options& opts) {
  if (auto bad = train::validate(c); !bad.empty())
    return make_error(af_error::invalid_argument, "training config: " + bad);
  if (!c.checkpoint_dir.empty() || !c.metrics.empty())
    log::get()->warn("in-graph: checkpoint_dir and metrics are not written in-graph yet (only "
                     "between-graph jobs write them); this run trains without them");
  if (c.mode != "sync")
    return make_error(af_error::invalid_argument,
                      "in-graph replication averages in the graph: mode must be sync, not '"
                        + c.mode + "'");
  const auto& cluster = s.cluster();
  auto towers = static_cast<uint32_t>(cluster.num_tasks("worker"));
  auto n_ps = static_cast<uint32_t>(cluster.num_tasks("ps"));
  if (towers == 0 || n_ps == 0)
    return make_error(af_error::invalid_argument,
                      "in-graph replication needs worker tasks (one replica each) and a ps job");
  std::chrono::milliseconds timeout{c.step_timeout_ms};
  auto data = train::load_data(c);
  if (!data)
    return to_error(data.error());
  if (auto err = check_batch(c, data->train.size(), towers))
    return err;
  auto params = train::parameters(c.model, data->train.features, data->train.classes, c.hidden,
                                  c.seed);
  if (!params)
    return to_error(params.error());
  uint64_t total = train::total_steps(c, data->train.size(), towers);

  // Variables on the ps tasks, initialized by this client (it is the chief),
  // and a sync aggregator of one worker (this client) on each.
  auto placed = place_on_ps(s, c, *params, "train/in-graph/", "sync", 1);
  if (!placed)
    return std::move(placed.error());
  if (auto err = s.initialize(placed->vars))
    return err;
  struct shard {
    std::unique_ptr<data_channel> chan;
    std::string name;
    std::vector<train::piece> pieces;
    std::string token; ///< its aggregator's answer to this client's join
    uint64_t seq = 0;  ///< this client's last push there
  };
  std::vector<shard> shards;
  // Its pushes speak for worker 0: it joins as it, for its token, with an
  // actor that lives as long as this job (when it ends, the membership
  // does, and the next in-graph job on these ps joins again).
  caf::scoped_actor member{s.system()};
  for (const auto& p : placed->shards) {
    auto chan = data_channel::connect(p.host, p.data_port, p.task, timeout, {},
                                      system_tls(s.system()));
    if (!chan)
      return std::move(chan.error());
    caf::error joined;
    std::string token;
    uint64_t seq = 0;
    member->request(p.actor, timeout, join_atom::value, uint32_t{0},
                    std::string{"/job:worker/task:0 (in-graph client)"}, std::string{},
                    static_cast<uint32_t>(c.batch_size * towers),
                    caf::actor_cast<caf::actor>(member.ptr()))
      .receive(
        [&](uint64_t, std::string& t, uint64_t q) {
          token = std::move(t);
          seq = q;
        },
        [&](caf::error& e) { joined = std::move(e); });
    if (joined)
      return joined;
    shards.push_back({std::move(*chan), p.aggregator, p.pieces, std::move(token), seq});
  }

  // One replica per worker task; the mean of their gradients in the graph.
  auto& g = s.builder();
  std::vector<train::replica> reps;
  for (uint32_t t = 0; t < towers; ++t) {
    auto scope = s.device("/job:worker/task:" + std::to_string(t));
    if (!scope)
      return std::move(scope.error());
    auto r = train::build_replica(g, *params, c.model, "tower" + std::to_string(t) + "/");
    if (!r)
      return to_error(r.error());
    reps.push_back(std::move(*r));
  }
  std::vector<output> fetches;
  {
    auto scope = s.device("/job:worker/task:0");
    auto inv = g.constant(tensor::scalar(1.0f / static_cast<float>(towers)));
    output loss = reps[0].loss;
    for (uint32_t t = 1; t < towers; ++t)
      loss = g.add(loss, reps[t].loss);
    fetches.push_back(g.mul(loss, inv, "mean_loss"));
    for (size_t j = 0; j < params->size(); ++j) {
      output sum = reps[0].grads[j];
      for (uint32_t t = 1; t < towers; ++t)
        sum = g.add(sum, reps[t].grads[j]);
      fetches.push_back(g.mul(sum, inv, "mean_grad/" + (*params)[j].name));
    }
  }
  std::vector<train::batcher> batches;
  for (uint32_t t = 0; t < towers; ++t)
    batches.emplace_back(data->train, c.batch_size, t, towers, c.seed);

  // The parameters, then the loop: run, push the mean, take the next parameters.
  std::vector<tensor> current(params->size());
  uint64_t global_step = 0;
  // Gradients are cut along the pieces' rows; the parameters pulled are
  // assembled from them.
  auto exchange = [&](bool pull, const std::vector<tensor>* grads) -> caf::error {
    std::vector<tensor> next(params->size());
    // Every shard gets this step's push: with more than one ps, taking the
    // first answer's step before pushing to the next made that push a step
    // ahead of its aggregator.
    uint64_t answered = UINT64_MAX;
    for (auto& sh : shards) {
      std::vector<tensor> part;
      if (grads)
        for (const auto& p : sh.pieces)
          part.push_back(train::slice_rows((*grads)[p.param], p.row_begin, p.row_end));
      auto r = sh.chan->aggregate(pull ? wire::kind::pull : wire::kind::push, sh.name, 0,
                                  global_step, part, timeout, sh.token,
                                  pull ? 0 : ++sh.seq);
      if (!r)
        return std::move(r.error());
      answered = std::min(answered, r->first);
      std::vector<shape_type> shapes;
      for (const auto& p : sh.pieces)
        shapes.push_back(p.shape);
      auto values = train::unflatten(r->second, shapes);
      if (!values)
        return to_error(values.error());
      for (size_t j = 0; j < sh.pieces.size(); ++j)
        if (auto ok = train::put_piece(sh.pieces[j], std::move((*values)[j]),
                                       next[sh.pieces[j].param]);
            !ok)
          return to_error(ok.error());
    }
    global_step = answered;
    current = std::move(next);
    return caf::none;
  };
  if (auto err = exchange(true, nullptr))
    return err;
  train_outcome outcome;
  auto t0 = std::chrono::steady_clock::now();
  double loss_sum = 0;
  uint64_t loss_n = 0;
  while (global_step < total) {
    std::vector<std::pair<output, tensor>> feeds;
    for (uint32_t t = 0; t < towers; ++t) {
      auto f = train::feeds(reps[t], current, batches[t].at(global_step));
      feeds.insert(feeds.end(), f.begin(), f.end());
    }
    auto out = s.run(fetches, feeds);
    if (!out)
      return std::move(out.error());
    loss_sum += (*out)[0].at(0);
    loss_n += 1;
    std::vector<tensor> grads(out->begin() + 1, out->end());
    if (auto err = exchange(false, &grads))
      return err;
    if (opts.print && c.log_every > 0 && (global_step % c.log_every == 0 || global_step == total)) {
      std::printf("step %llu/%llu  loss %.4f  (in-graph, %u replicas)\n",
                  static_cast<unsigned long long>(global_step),
                  static_cast<unsigned long long>(total), loss_sum / static_cast<double>(loss_n),
                  towers);
      std::fflush(stdout);
      loss_sum = 0;
      loss_n = 0;
    }
  }
  outcome.result.seconds =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  outcome.result.global_step = global_step;
  outcome.result.local_steps = global_step;
  outcome.result.params = current;
  auto ev = train::evaluate_local(c, data->test, current);
  if (!ev)
    return to_error(ev.error());
  outcome.result.test_loss = ev->first;
  outcome.result.accuracy = ev->second;
  if (opts.shutdown_ps)
    for (uint32_t k = 0; k < n_ps; ++k)
      if (auto err = s.shutdown("ps", static_cast<int32_t>(k)))
        log::get()->warn("in-graph client: shutting down /job:ps/task:{}: {}", k, describe(err));
  return outcome;
}

} // namespace af
