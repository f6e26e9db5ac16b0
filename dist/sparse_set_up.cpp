// A sparse worker's set-up around a ps that died while it set up
// (dist/sparse_job_detail.hpp, set_up_with_recovery; docs/sparse.md, "A ps
// that dies"): with ps_recovery_timeout_ms, the ps is waited for as the
// training loop's recovery waits (dist/ps_recovery.hpp, wait_for_ps), the
// task's set-up state is dropped and the set-up runs again; the chief's
// second pass initializes or restores every ps before its first step and
// says so for the workers already waiting in their own ps recovery.
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/log.hpp"
#include "dist/job_setup.hpp"
#include "dist/ps_recovery.hpp"
#include "dist/sparse_job_detail.hpp"
#include "messages/error.hpp"

namespace af {

namespace {
sparse_set_up_hook installed_hook = nullptr;
} // namespace

void set_sparse_set_up_hook(sparse_set_up_hook hook) {
  installed_hook = hook;
}

namespace sparse_job_detail {

void run_set_up_hook(const sparse_task& t) {
  if (installed_hook)
    installed_hook(t.task, t.set_up_pass);
}

namespace {

/// Each ps's node incarnation now (a ping of 500 ms: one sent to a dead
/// node's proxy is never answered); none where it does not answer.
std::vector<std::optional<uint64_t>> incarnations(sparse_task& t) {
  auto n = t.s.cluster().num_tasks("ps");
  std::vector<std::optional<uint64_t>> out(n);
  for (size_t k = 0; k < n; ++k)
    if (auto info = t.s.ping("ps", static_cast<int32_t>(k), std::chrono::milliseconds{500}))
      out[k] = info->incarnation;
  return out;
}

/// The first ps that went away since `before`: its ping fails now, or a new
/// process answers, or it answers now and did not then. Its index and why; none if every ps is as it was.
std::optional<std::pair<size_t, std::string>>
lost_ps(sparse_task& t, const std::vector<std::optional<uint64_t>>& before) {
  auto now = incarnations(t);
  for (size_t k = 0; k < before.size() && k < now.size(); ++k) {
    if (!now[k])
      return std::make_pair(k, std::string{"it does not answer"});
    // Killed before this worker's first ping: the set-up may have found
    // its proxy dead. Set up again (once: the next pass starts with it up).
    if (!before[k])
      return std::make_pair(k, std::string{"it did not answer when the set-up began"});
    if (*now[k] != *before[k])
      return std::make_pair(k, fmt::format("it answers as a new process, incarnation {} (was {})",
                                           *now[k], *before[k]));
  }
  return std::nullopt;
}

/// Drops what a set-up made (variables, layout, memberships, links, shards,
/// per-ps steps, checkpoints, recovery), keeping the member actor: joined
/// again, it keeps its token at an aggregator that knew it.
void reset_set_up(sparse_task& t) {
  t.wrapped.clear(); // they refer to t.recovering and t.links
  t.recovering.reset();
  if (t.recovery)
    training_detail::close_recovery(*t.recovery);
  t.recovery.reset();
  t.link_ptrs.clear();
  t.links.clear();
  t.members.clear();
  t.shards.clear();
  t.ps_steps.clear();
  t.vars.clear();
  t.ps_vars.clear();
  t.layout = sparse_layout{};
  t.checkpoints = sparse_checkpoint_job{};
  t.model.reset();
  t.total = 0;
  t.start_step = 0;
  t.start_position = 0;
  t.last_saved = 0;
  t.saved_any = false;
  t.asked_ps = false;
}

/// Waits for ps `k` (gone: `why`) to answer as a new process, bounded by
/// ps_recovery_timeout_ms; the error names it and what was waited for.
caf::error wait_for_new_ps(sparse_task& t, size_t k, const std::string& why,
                           const caf::error& failed) {
  auto ms = t.c.ps_recovery_timeout_ms;
  auto where = "/job:ps/task:" + std::to_string(k);
  auto who = t.chief ? std::string{"chief"} : fmt::format("worker {}", t.task);
  log::get()->warn("{}: {} went away during set-up ({}; the set-up: {}); waiting up to {} ms "
                   "(ps_recovery_timeout_ms) for it to come back, then setting up again",
                   who, where, why, describe(failed), ms);
  training_detail::recovery_context ctx;
  ctx.s = &t.s;
  ctx.c = t.c;
  ctx.task = t.task;
  ctx.shards.resize(t.s.cluster().num_tasks("ps"));
  ctx.shards[k].task = where;
  if (!t.chief) { // a worker gives up when the chief is gone
    auto chief = training_detail::chief_store_of(t.s);
    if (!chief)
      return std::move(chief.error());
    ctx.chief_incarnation = chief->incarnation;
  }
  // Incarnation 0 is no node's: the same process answering again (its
  // connection broke) counts as back too.
  ctx.shards[k].incarnation = 0;
  auto back = training_detail::wait_for_ps(ctx, k, why, false);
  training_detail::close_recovery(ctx); // its pinger goes before the job's session
  if (!back)
    return make_error(af_error::unreachable,
                      fmt::format("{} went away during {}'s set-up ({}) and was waited for in "
                                  "vain: {}",
                                  where, who, why, describe(back.error())));
  return caf::none;
}

/// The chief, set up again after `restarted` ps came back: says, as its
/// training loop's recovery does, that it restored each (a worker already
/// past its set-up waits in its own ps recovery for that word).
caf::error say_restored(sparse_task& t, const std::vector<std::optional<uint64_t>>& first,
                        const std::vector<std::optional<uint64_t>>& now) {
  auto chief = training_detail::chief_store_of(t.s);
  if (!chief)
    return std::move(chief.error());
  kv_client kv{t.s.system(), chief->store, t.timeout};
  auto from = t.saved_any ? t.last_saved : uint64_t{0};
  for (size_t k = 0; k < now.size() && k < first.size(); ++k) {
    if (!now[k] || now[k] == first[k])
      continue;
    auto key = training_detail::restored_key(chief->incarnation, k, *now[k]);
    if (auto err = kv.put(key, fmt::format("{} {}", t.start_step, from)))
      return err;
    log::get()->info("chief: /job:ps/task:{} came back during set-up (incarnation {}): set up "
                     "again at global step {} ({})",
                     k, *now[k], t.start_step,
                     t.saved_any ? fmt::format("restored from the checkpoint of step {}", from)
                                 : std::string{"initialized: nothing had trained"});
  }
  return caf::none;
}

} // namespace

caf::error set_up_with_recovery(sparse_task& t) {
  t.set_up_pass = 1;
  if (t.c.ps_recovery_timeout_ms == 0)
    return set_up(t);
  auto first = incarnations(t);
  auto before = first;
  std::optional<std::chrono::steady_clock::time_point> recreated_by;
  for (;;) {
    auto err = set_up(t);
    if (!err) {
      if (t.chief && t.set_up_pass > 1)
        return say_restored(t, first, incarnations(t));
      return caf::none;
    }
    // Another worker, set up again before the chief re-created the
    // variables of the ps that came back: polled until the chief's second
    // pass has (bounded by ps_recovery_timeout_ms from the ps's return).
    if (!t.chief && recreated_by && is(err, af_error::gone)
        && std::chrono::steady_clock::now() < *recreated_by) {
      reset_set_up(t);
      ++t.set_up_pass;
      std::this_thread::sleep_for(std::chrono::milliseconds{100});
      continue;
    }
    // A bad CSV, a table too large, a config refused: no ps was asked yet,
    // so none is waited for (a ps that another worker's same refusal
    // already stopped would otherwise hold this one ps_recovery_timeout_ms).
    if (!t.asked_ps)
      return err;
    auto lost = lost_ps(t, before);
    if (!lost)
      return err;
    auto [k, why] = *lost;
    if (auto e = wait_for_new_ps(t, k, why, err))
      return e;
    before = incarnations(t);
    recreated_by = std::chrono::steady_clock::now()
                   + std::chrono::milliseconds{t.c.ps_recovery_timeout_ms};
    reset_set_up(t);
    ++t.set_up_pass;
  }
}

} // namespace sparse_job_detail

} // namespace af
