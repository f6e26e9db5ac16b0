#include "dist/ps_recovery.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "actors/blocking_ask.hpp"
#include "dist/chief_start.hpp"
#include "core/log.hpp"
#include "messages/error.hpp"
#include "train/checkpoint.hpp"

namespace af::training_detail {

namespace {

/// `old` as it runs again: its new aggregator `agg`, on the node that came
/// back (`info`: its data port and incarnation).
param_shard renewed(const param_shard& old, const aggregator_actor& agg, const node_info& info) {
  param_shard shard = old;
  shard.actor = agg;
  shard.data_port = info.data_port;
  shard.incarnation = info.incarnation;
  return shard;
}

/// Shard `k`'s ps answered again as the same process (it was stopped, or
/// its connection broke), which the job pushes to again at `step`: its
/// aggregator looked up anew (creating none), for a stop that outlasted the
/// nodes' connection_timeout_ms broke this node's CAF link to it, and the
/// old handle went with it (its requests reach nothing: stats, done). If
/// the lookup fails the old handle stays: the pushes go by the data plane.
caf::expected<aggregator_actor> look_up_again(recovery_context& ctx, size_t k) {
  aggregator_spec lookup;
  lookup.name = ctx.shards[k].aggregator;
  lookup.workers = 0;
  auto agg = ctx.s->aggregator("ps", static_cast<int32_t>(k), lookup);
  if (agg)
    ctx.shards[k].actor = *agg;
  return agg;
}

/// Cancelled, naming the ps waited for, if the job's client asked it to stop.
caf::error stopped(const recovery_context& ctx, const std::string& ps) {
  if (!ctx.stop || !ctx.stop->load())
    return caf::none;
  return make_error(af_error::cancelled,
                    fmt::format("its client stopped the job while worker {} waited for {}",
                                ctx.task, ps));
}

recovered_shard same_process(recovery_context& ctx, size_t k, uint64_t step) {
  look_up_again(ctx, k);
  return recovered_shard{ctx.shards[k], step};
}

} // namespace

caf::expected<std::optional<node_info>> wait_for_ps(recovery_context& ctx, size_t k,
                                                    const std::string& why, bool announce) {
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
  // !announce: the caller said why it waits (dist/sparse_set_up.cpp).
  if (announce && ctx.task == 0)
    log::get()->warn("chief: {} at {} is gone ({}); waiting up to {} ms (ps_recovery_timeout_ms) "
                     "for it to come back: a supervisor restarts it (systemd "
                     "Restart=on-failure, actorflow-node --restart-on-failure), or start "
                     "`actorflow-train --config F --job ps --task {}` again; then its variables "
                     "are restored from the latest checkpoint",
                     shard.task, where, why, ms, k);
  else if (announce)
    log::get()->warn("worker {}: {} at {} is gone ({}); waiting up to {} ms for it to come back "
                     "and for the chief to restore it",
                     ctx.task, shard.task, where, why, ms);
  for (;;) {
    if (auto err = stopped(ctx, shard.task))
      return err;
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

std::string restored_key(uint64_t chief_incarnation, size_t k, uint64_t ps_incarnation) {
  return fmt::format("train/{}/ps{}/restored/{}", chief_incarnation, k, ps_incarnation);
}

namespace {

/// The dense job's restore of a ps (recovery_context::restore empty): the
/// latest checkpoint's rows of its pieces, else (none yet) the values it was
/// just initialized with, for its new aggregator `shard.actor`.
caf::expected<restored_ps> dense_restore(recovery_context& ctx, const param_shard& shard) {
  auto& s = *ctx.s;
  const auto& c = ctx.c;
  restored_ps out;
  if (!c.checkpoint_dir.empty()) {
    auto latest = load_latest_checkpoint(ctx.checkpoints);
    if (!latest)
      return std::move(latest.error());
    if (*latest) {
      const auto& [path, ck] = **latest;
      auto st = restored_state(ck, c.checkpoint_dir, ctx.params, shard.pieces, c.optimizer,
                               shard.aggregator);
      if (!st)
        return std::move(st.error());
      out.state = std::move(*st);
      out.from = path;
      out.from_step = ck.global_step;
      return out;
    }
  }
  auto st = ask<aggregator_state>(s, shard.actor, std::chrono::milliseconds{c.step_timeout_ms},
                                  save_atom::value);
  if (!st)
    return std::move(st.error());
  out.state = std::move(*st);
  return out;
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
  auto back = wait_for_ps(ctx, k, why, true);
  if (!back)
    return std::move(back.error());
  if (!*back)
    return same_process(ctx, k, step); // push again
  auto info = **back;
  auto task = static_cast<int32_t>(k);
  log::get()->info("chief: {} is back (incarnation {}); re-creating its variables and aggregator",
                   ctx.shards[k].task, info.incarnation);
  if (auto err = s.initialize(ctx.vars[k]))
    return err;
  auto agg = s.aggregator("ps", task, ctx.specs[k]);
  if (!agg)
    return std::move(agg.error());
  auto shard = renewed(ctx.shards[k], *agg, info);
  auto got = ctx.restore ? ctx.restore(k, shard) : dense_restore(ctx, shard);
  if (!got)
    return std::move(got.error());
  auto& state = got->state;
  const auto& from = got->from;
  auto from_step = got->from_step;
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
  log::get()->warn("chief: restored {} of {} from {} (global step {}) at global step {}: "
                   "they lost the {} update(s) since, as in TF when a ps restarts; the other "
                   "ps kept theirs",
                   got->what, shard.task, from, from_step, step, lost);
  std::printf("ps recovered: %s from %s checkpoint_step=%llu at global_step=%llu lost=%llu "
              "(restored: %s; they lost the updates since the checkpoint)\n",
              shard.task.c_str(), from.c_str(), static_cast<unsigned long long>(from_step),
              static_cast<unsigned long long>(step), static_cast<unsigned long long>(lost),
              got->what.c_str());
  std::fflush(stdout);
  return recovered_shard{shard, step};
}

/// Another worker: ps `k` died; waits for it and for the chief's word that
/// it restored it, then finds its new aggregator.
caf::expected<recovered_shard> worker_recover_ps(recovery_context& ctx, size_t k, uint64_t step,
                                                 const std::string& why) {
  auto& s = *ctx.s;
  auto back = wait_for_ps(ctx, k, why, true);
  if (!back)
    return std::move(back.error());
  if (!*back)
    return same_process(ctx, k, step);
  auto info = **back;
  auto ms = std::chrono::milliseconds{ctx.c.ps_recovery_timeout_ms};
  kv_client client{s.system(), ctx.store, std::chrono::milliseconds{5000}};
  auto key = restored_key(ctx.chief_incarnation, k, info.incarnation);
  // In slices, so that a stop of the job ends the wait.
  auto until = std::chrono::steady_clock::now() + ms;
  auto word = client.get(key, std::chrono::milliseconds{0});
  while (!word && is(word.error(), af_error::timeout) && std::chrono::steady_clock::now() < until) {
    if (auto err = stopped(ctx, ctx.shards[k].task))
      return err;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      until - std::chrono::steady_clock::now());
    word = client.get(key, std::min(left, std::chrono::milliseconds{200}));
  }
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
  auto shard = renewed(ctx.shards[k], *agg, info);
  ctx.shards[k] = shard;
  log::get()->info("worker {}: {} is back, restored by the chief at global step {}", ctx.task,
                   shard.task, restored);
  return recovered_shard{shard, restored};
}

} // namespace

std::function<caf::expected<recovered_shard>(size_t, uint64_t, const std::string&, bool)>
recover_ps_of(std::shared_ptr<recovery_context> ctx) {
  return [ctx](size_t k, uint64_t step, const std::string& why,
               bool held) -> caf::expected<recovered_shard> {
    std::lock_guard<std::mutex> guard{ctx->mtx};
    if (ctx->closed)
      return make_error(af_error::cancelled, "the worker task is over");
    return ctx->task == 0 ? chief_recover_ps(*ctx, k, step, why, held)
                          : worker_recover_ps(*ctx, k, step, why);
  };
}

std::function<caf::expected<aggregator_actor>(size_t)>
find_aggregator_of(std::shared_ptr<recovery_context> ctx) {
  return [ctx](size_t k) -> caf::expected<aggregator_actor> {
    std::lock_guard<std::mutex> guard{ctx->mtx};
    if (ctx->closed)
      return make_error(af_error::cancelled, "the worker task is over");
    return look_up_again(*ctx, k);
  };
}

void close_recovery(recovery_context& ctx) {
  std::lock_guard<std::mutex> guard{ctx.mtx};
  ctx.closed = true;
  ctx.pinger.reset();
}

} // namespace af::training_detail
