// Rounds (sync and average: released, answered, failed, swept at their
// deadlines and timeouts) and ssp's staleness bound.
#include "dist/aggregator_detail.hpp"

#include <algorithm>
#include <optional>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "core/log.hpp"
#include "core/wire_format.hpp"
#include "messages/error.hpp"

namespace af::aggregator_detail {

namespace {

/// Counts, for each ticket's worker, the time its push waited and whether
/// its values were used.
void account(aggregator_actor_state& st, const tickets& waiting, bool applied) {
  auto now = clock_type::now();
  for (const auto& w : waiting) {
    auto& m = member(st, w.first);
    m.stats.waited_ms += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now - m.parked_since).count());
    if (applied && m.contributed)
      m.stats.applied += 1;
    if (applied)
      m.seq_taken = std::max(m.seq_taken, m.round_seq);
    m.contributed = false;
    m.round_seq = 0;
    m.round_ids.clear(); // a sparse push's rows: applied, or abandoned with the round
    m.round_rows.clear();
  }
  st.round_promises = 0; // `waiting` is the whole round, released
  st.round_flat = 0;
}

/// sync with backup workers: steps go on without a member that stopped
/// pushing; it is named once (per silence) when it has been quiet for
/// longer than a deadline (or a second) while the job moved 2+ steps.
void name_idle(aggregator_actor_state& st) {
  auto now = clock_type::now();
  auto quiet = std::chrono::milliseconds{std::max<uint32_t>(1000, st.spec.step_deadline_ms)};
  for (uint32_t w = 0; w < st.members.size() && w < st.round.workers(); ++w) {
    auto& m = st.members[w];
    if (st.round.is_done(w) || m.idle_logged)
      continue;
    auto last = m.stats.pushes > 0 ? m.last_push : m.joined_at;
    last = std::max(last, m.last_skipped); // a backup worker that skips its steps is alive
    if (last == clock_type::time_point{} || now - last < quiet
        || st.global_step < m.stats.last_step + 2)
      continue;
    m.idle_logged = true;
    log::get()->warn("aggregator '{}' ({}): {} has pushed nothing for {:.1f} s (its last push was "
                     "for step {}, the job is at step {}); the steps go on without it ({})",
                     st.spec.name, st.spec.mode, worker_name(st, w),
                     std::chrono::duration<double>(now - last).count(), m.stats.last_step,
                     st.global_step,
                     st.spec.replicas_to_aggregate > 0
                       ? fmt::format("each uses its first {} of {} gradients",
                                     st.spec.replicas_to_aggregate, st.round.active())
                       : fmt::format("each closes at its {} ms deadline", st.spec.step_deadline_ms));
  }
}

/// sync: the round's deadlines. One that passes with at least min_replicas
/// arrived closes the step with them; else it names whom the step waits for.
void check_deadline(self_pointer self) {
  auto& st = self->state;
  if (st.spec.mode != "sync" || st.spec.step_deadline_ms == 0 || !st.round.in_progress())
    return;
  auto now = clock_type::now();
  std::chrono::milliseconds deadline{st.spec.step_deadline_ms};
  auto waited = since(st.round.started(), now);
  if (waited < deadline * (st.deadline_periods + 1))
    return;
  st.deadline_periods = static_cast<uint64_t>(waited / deadline);
  if (st.round.arrivals() >= st.spec.min_replicas) {
    st.stats.closed_at_deadline += 1;
    log::get()->debug("aggregator '{}': step {} closes at its deadline ({} ms) with {} of {} "
                      "gradients; missing {}",
                      st.spec.name, st.global_step, st.spec.step_deadline_ms,
                      st.round.arrivals(), st.round.active(), missing_names(st));
    release_sync(self);
    return;
  }
  log::get()->warn("aggregator '{}' (sync) has waited {} ms at global step {} with {} of the "
                   "min_replicas {} gradients; waiting for {}",
                   st.spec.name, waited.count(), st.global_step, st.round.arrivals(),
                   st.spec.min_replicas, missing_names(st));
}

} // namespace

void answer_all(self_pointer self, tickets waiting) {
  account(self->state, waiting, true);
  answer_tickets(self, waiting);
}

void answer_tickets(self_pointer self, tickets& waiting) {
  static const tensor none; // the params of an answer that went into its parts
  std::optional<caf::expected<tensor>> p; // the flat parameters, made only if a ticket takes them
  for (auto& w : waiting) {
    // The ticket's pointer is dropped before the answer goes: the data
    // plane's thread finds its answer_parts its own again, and reuses them.
    if (auto parts = std::move(w.second.parts); parts && fill_parts(self, *parts)) {
      parts.reset();
      w.second.deliver(self->state.global_step, none, false);
      continue;
    }
    if (!p)
      p = answer_params(self);
    if (*p)
      w.second.deliver(self->state.global_step, **p, false);
    else
      w.second.deliver(p->error());
  }
}

std::string missing_names(const aggregator_actor_state& st) {
  std::vector<std::string> names;
  auto now = clock_type::now();
  for (auto w : st.round.missing()) {
    auto name = worker_name(st, w);
    if (w < st.members.size() && st.members[w].stats.pushes > 0)
      name += fmt::format(" (last push {:.1f} s ago, at step {})",
                          std::chrono::duration<double>(now - st.members[w].last_push).count(),
                          st.members[w].stats.last_step);
    names.push_back(std::move(name));
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

void fail_all(aggregator_actor_state& st, tickets waiting, const caf::error& err) {
  if (st.pipelined) { // its tickets are the round's: it ends with them, changing nothing
    st.pipelined->abort(err);
    st.pipelined = nullptr;
  }
  account(st, waiting, false);
  for (auto& w : waiting)
    w.second.deliver(err);
}

std::chrono::milliseconds since(clock_type::time_point t, clock_type::time_point now) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - t);
}

void schedule_sweep(self_pointer self) {
  schedule_sweep(self->state, self->address());
}

void schedule_sweep(aggregator_actor_state& st, const caf::actor_addr& addr) {
  if (st.sweep_pending || st.spec.step_timeout_ms == 0)
    return;
  st.sweep_pending = true;
  auto every = std::chrono::milliseconds{
    std::max<uint32_t>(10, std::min<uint32_t>(1000, st.spec.step_timeout_ms / 4))};
  if (st.spec.mode == "sync" && st.spec.step_deadline_ms > 0 && st.round.in_progress()) {
    // Wake at the round's next deadline (each is acted on once).
    auto due = st.round.started()
               + std::chrono::milliseconds{st.spec.step_deadline_ms} * (st.deadline_periods + 1);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(due - clock_type::now());
    every = std::max(std::chrono::milliseconds{1}, std::min(every, left));
  }
  // From the actor or a data-plane thread: the clock is the system's.
  if (auto me = caf::actor_cast<aggregator_impl_actor>(addr))
    caf::delayed_anon_send(me, every, sweep_atom::value);
  else
    st.sweep_pending = false; // the actor is gone: nothing to sweep
}

void sweep(self_pointer self) {
  auto& st = self->state;
  st.sweep_pending = false;
  auto now = clock_type::now();
  std::chrono::milliseconds timeout{st.spec.step_timeout_ms};
  if (st.spec.mode == "ssp") {
    // Pushes held back by the bound: named once after a second, failed at the timeout.
    std::vector<aggregator_actor_state::ssp_wait> keep;
    for (auto& w : st.ssp_waiting) {
      auto waited = since(w.since, now);
      auto why = [&] {
        uint64_t slowest = UINT64_MAX;
        uint32_t who = 0;
        for (uint32_t v = 0; v < st.members.size() && v < st.round.workers(); ++v)
          if (!st.round.is_done(v) && st.members[v].stats.clock < slowest) {
            slowest = st.members[v].stats.clock;
            who = v;
          }
        return fmt::format("{} is at clock {}, more than staleness {} ahead of {} (clock {})",
                           worker_name(st, w.worker), member(st, w.worker).stats.clock,
                           st.spec.staleness, worker_name(st, who), slowest);
      };
      if (waited >= timeout) {
        auto err = make_error(af_error::timeout,
                              fmt::format("aggregator '{}' (ssp) held a push for {} ms: {}; its "
                                          "gradient was applied, only this answer is given up "
                                          "(do not push it again)",
                                          st.spec.name, waited.count(), why()));
        log::get()->warn("{}", describe(err));
        member(st, w.worker).stats.waited_ms += static_cast<uint64_t>(waited.count());
        w.promise.deliver(err);
        continue;
      }
      if (!w.logged && waited >= std::chrono::seconds{1}) {
        w.logged = true;
        log::get()->warn("aggregator '{}' (ssp): {}; its push waits", st.spec.name, why());
      }
      keep.push_back(std::move(w));
    }
    st.ssp_waiting = std::move(keep);
    if (!st.ssp_waiting.empty())
      schedule_sweep(self);
    return;
  }
  if (st.spec.mode == "async")
    sweep_async_line(self);
  if (!st.round.in_progress())
    return;
  if (!st.round.expired(timeout)) {
    check_deadline(self);
    if (st.round.in_progress())
      schedule_sweep(self);
    return;
  }
  auto err = make_error(af_error::timeout,
                        fmt::format("aggregator '{}' ({}) waited {} ms at global step {} for {}; "
                                    "the step is abandoned",
                                    st.spec.name, st.spec.mode, st.spec.step_timeout_ms,
                                    st.global_step, missing_names(st)));
  log::get()->warn("{}", describe(err));
  fail_all(st, st.round.release(), err);
}

caf::error add_to_round(self_pointer self, uint32_t worker, const push_credentials& who,
                        const std::vector<tensor>& values, const char* what) {
  auto& st = self->state;
  if (values.empty()) { // an abstention after a refused value: it only arrives
    member(st, worker).stats.refused += 1;
    return caf::none;
  }
  auto parts = unpack(self, worker, values, what, who.finite_checked);
  if (!parts)
    return std::move(parts.error());
  std::vector<float> scaled;
  if (st.spec.mode != "average")
    guard_gradient(self, worker, *parts, scaled);
  // sync keeps the values by reference: its release sums, averages and
  // applies them in one pass (aggregation_round::add)
  // (One tensor, as the data plane's push: its buffer, without a copy of the
  // vector and the shape.)
  std::shared_ptr<const void> owner;
  if (st.spec.mode == "sync" && scaled.empty() && values.size() == 1)
    owner = values[0].buffer_owner();
  if (st.spec.mode == "sync" && !owner)
    owner = scaled.empty()
              ? std::shared_ptr<const void>{std::make_shared<std::vector<tensor>>(values)}
              : std::shared_ptr<const void>{std::make_shared<std::vector<float>>(std::move(scaled))};
  st.round.add(*parts, st.offsets, st.sizes, std::move(owner));
  member(st, worker).contributed = true;
  return caf::none;
}

void park_ticket(aggregator_actor_state& st, uint32_t worker, uint64_t step, uint64_t seq,
                 push_ticket ticket) {
  if (!st.round.in_progress())
    st.deadline_periods = 0;
  member(st, worker).parked_since = clock_type::now();
  member(st, worker).round_seq = seq;
  st.round.arrive(worker, step, std::move(ticket));
}

push_result park(self_pointer self, uint32_t worker, uint64_t step, const push_credentials& who) {
  auto& st = self->state;
  auto promise = self->make_response_promise<uint64_t, tensor, bool>();
  push_ticket ticket;
  ticket.promise = promise;
  ticket.parts = std::move(who.parts); // the message keeps no copy: see answer_all
  if (!ticket.parts)
    st.round_flat += 1;
  park_ticket(st, worker, step, who.seq, std::move(ticket));
  st.round_promises += 1;
  schedule_sweep(self);
  return promise;
}

std::vector<const float*> parts_of(const aggregator_actor_state& st, const std::vector<float>& flat) {
  std::vector<const float*> out;
  for (auto offset : st.offsets)
    out.push_back(flat.data() + offset);
  return out;
}

namespace {

/// Takes every member of the pipelined sync round that is done having sent
/// none of its push out of it, as an abstention (pipelined_round::abstain).
void leave_done(aggregator_actor_state& st) {
  if (!st.pipelined || st.spec.mode != "sync")
    return;
  auto round = st.pipelined;
  auto members = round->members(); // a copy: abstain() takes one out
  for (auto w : members)
    if (st.round.is_done(w) && round->abstain(w))
      log::get()->debug("aggregator '{}': {} is done; the pipelined round of global step {} "
                        "goes on without it",
                        st.spec.name, worker_name(st, w), st.global_step);
}

/// Why the aggregator's settings allow no pipelined round (empty: they do;
/// aggregator_pipelined.cpp's pipelinable() has the same rules).
std::string why_store_and_forward(const aggregator_actor_state& st) {
  if (st.tables > 0)
    return "its tables take sparse pushes";
  if (st.guard.enabled())
    return "grad_norm_guard needs the whole gradient first";
  if (st.spec.replicas_to_aggregate > 0 || st.spec.step_deadline_ms > 0)
    return "backup workers (replicas_to_aggregate, step_deadline_ms) close a step without some "
           "members";
  return {};
}

/// pipeline_sync = "auto": a sync round of the kind `pipelined` committed;
/// the tuner times it, and the replies ask for the kind it wants next.
void tune(aggregator_actor_state& st, bool pipelined) {
  if (!st.spec.pipeline_auto || st.spec.mode != "sync")
    return;
  if (auto why = why_store_and_forward(st); !why.empty()) {
    // Nothing to time: every push whole, said once (and again if the
    // settings change back and forth).
    auto text = "store-and-forward rounds (" + why + ")";
    if (st.stats.pipeline_auto != text) {
      log::get()->info("aggregator '{}': pipeline_sync = \"auto\": {}", st.spec.name, text);
      st.stats.pipeline_auto = std::move(text);
      st.plane->reply_flags.store(wire::reply_flags::whole_pushes, std::memory_order_relaxed);
      st.tuner.restart(); // timed afresh if the settings ever allow pipelining
    }
    return;
  }
  auto before = st.tuner.transitions();
  auto line = st.tuner.round_closed(clock_type::now(), pipelined);
  if (!line.empty())
    log::get()->info("aggregator '{}': {}", st.spec.name, line);
  if (st.tuner.transitions() == before && st.stats.pipeline_auto == st.tuner.state())
    return;
  st.plane->reply_flags.store(st.tuner.pipelined() ? 0 : wire::reply_flags::whole_pushes,
                              std::memory_order_relaxed);
  st.stats.pipeline_auto = st.tuner.state();
}

} // namespace

void release_sync(self_pointer self) {
  auto& st = self->state;
  if (st.pipelined) {
    // A pipelined round is released by its last chunk (commit_pipelined).
    // A member that is done having sent none of its push (a worker its
    // client stopped before its step, as a timed window's end does) leaves
    // the round as an abstention does: no chunk needed it yet, and the mean
    // goes on without it, as the store-and-forward round's does. One that
    // left part way cannot complete it.
    auto round = st.pipelined;
    leave_done(st);
    for (auto w : round->members())
      if (st.round.is_done(w)) {
        auto err = make_error(af_error::aborted,
                              fmt::format("aggregator '{}': {} left during the pipelined round "
                                          "of global step {}; the step is abandoned, no "
                                          "variable changed",
                                          st.spec.name, worker_name(st, w), st.global_step));
        log::get()->warn("{}", describe(err));
        fail_all(st, st.round.release(), err);
        return;
      }
    // The chunks that waited for it only are applied now; the last one commits.
    if (round->applied() == round->chunks() && st.pipelined == round)
      commit_pipelined(self);
    st.plane->answered.notify_all();
    return;
  }
  tensor flat; // the parameters the round answers with, made during the update
  if (st.round.contributions() > 0) {
    // Formatted only for an error message (not once a round).
    auto what = [&st] { return fmt::format("mean gradient of global step {}", st.global_step); };
    // With tables the answer carries no parameters: none are made. Nor
    // where every ticket takes the variables' own tensors (answer_parts:
    // this node's data plane writes them straight into the answer slot or
    // the socket), which saves a copy of the whole model a round.
    bool make_flat = st.tables == 0 && st.round_flat > 0;
    if (auto err = update_all_by_mean(self, what, make_flat ? &flat : nullptr)) {
      fail_all(st, st.round.release(), err);
      return;
    }
    st.stats.applied += 1;
    tune(st, false);
  }
  st.global_step += 1;
  invalidate(self);
  if (!flat.empty()) { // params() of this step, without another pass
    st.params = std::move(flat);
    st.params_step = st.global_step;
  }
  answer_all(self, st.round.release());
  name_idle(st);
}

void commit_pipelined(self_pointer self) {
  auto& st = self->state;
  if (auto err = st.pipelined->commit()) {
    log::get()->warn("aggregator '{}': the pipelined round of global step {} is abandoned: {}",
                     st.spec.name, st.global_step, describe(err));
    fail_all(st, st.round.release(), err);
    return;
  }
  st.pipelined = nullptr;
  st.stats.applied += 1;
  st.stats.pipelined_rounds += 1;
  tune(st, true);
  st.global_step += 1;
  invalidate(self);
  // The streaming members' answers are the round's new values, which they
  // write themselves: their tickets only learn the step. An abstention's
  // promise takes the parameters, as answer_all gives them.
  static const tensor none;
  auto waiting = st.round.release();
  account(st, waiting, true);
  tickets promised;
  for (auto& w : waiting)
    if (w.second.wait)
      w.second.deliver(st.global_step, none, false);
    else
      promised.push_back(std::move(w));
  answer_tickets(self, promised);
  name_idle(st);
}

void release_average(self_pointer self) {
  auto& st = self->state;
  if (st.round.contributions() > 0) {
    auto step = st.round.step().value_or(st.global_step);
    auto what = [step] { return fmt::format("average of the round at step {}", step); };
    if (auto err = update_all(self, parts_of(st, st.round.mean()), what)) {
      fail_all(st, st.round.release(), err);
      return;
    }
    st.stats.applied += 1;
  }
  // The round's step is passed even when every worker abstained (nothing
  // to average): the workers push the next round from it, and a global
  // step left behind would make the stride check refuse them all.
  if (auto step = st.round.step(); step && *step > st.global_step) {
    st.average_stride = std::max(st.average_stride, *step - st.global_step);
    st.global_step = *step;
  }
  invalidate(self);
  answer_all(self, st.round.release());
}

void reconsider(self_pointer self) {
  auto& st = self->state;
  if (st.spec.mode == "ssp") {
    release_ssp(self);
    return;
  }
  // A member of a pipelined round that is done before it pushed leaves it
  // at once, not only when its being done completes the round: a round
  // that a later streamed push completes is released by its last chunk,
  // never here, and would wait for the done member's chunks for ever.
  leave_done(st);
  if (!st.round.in_progress() || !st.round.complete(st.spec.replicas_to_aggregate))
    return;
  if (st.spec.mode == "sync")
    release_sync(self);
  else if (st.spec.mode == "average")
    release_average(self);
}

uint64_t slowest_clock(const aggregator_actor_state& st) {
  uint64_t out = UINT64_MAX;
  for (uint32_t w = 0; w < st.members.size() && w < st.round.workers(); ++w)
    if (!st.round.is_done(w))
      out = std::min(out, st.members[w].stats.clock);
  return out;
}

bool within_bound(const aggregator_actor_state& st, uint32_t worker) {
  auto slowest = slowest_clock(st);
  auto clock = st.members[worker].stats.clock;
  return slowest == UINT64_MAX || clock <= slowest || clock - slowest <= st.spec.staleness;
}

void release_ssp(self_pointer self, bool all) {
  auto& st = self->state;
  if (st.ssp_waiting.empty())
    return;
  auto p = answer_params(self);
  auto now = clock_type::now();
  std::vector<aggregator_actor_state::ssp_wait> keep;
  for (auto& w : st.ssp_waiting) {
    // A held worker that left is answered too (nobody waits for its answer,
    // but its promise should not outlive it).
    if (!all && !st.round.is_done(w.worker) && !within_bound(st, w.worker)) {
      keep.push_back(std::move(w));
      continue;
    }
    member(st, w.worker).stats.waited_ms += static_cast<uint64_t>(since(w.since, now).count());
    if (p)
      w.promise.deliver(st.global_step, *p, false);
    else
      w.promise.deliver(p.error());
  }
  st.ssp_waiting = std::move(keep);
}

} // namespace af::aggregator_detail
