#include "dist/aggregator.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "caf/all.hpp"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "core/log.hpp"
#include "messages/error.hpp"
#include "train/optimizer.hpp"

namespace af {

namespace {

using self_pointer = aggregator_impl_actor::stateful_pointer<aggregator_actor_state>;
using clock_type = std::chrono::steady_clock;
using push_result = caf::result<uint64_t, tensor>;

constexpr size_t staleness_buckets = 16;
constexpr size_t max_events = 32;
/// The highest worker index a join may use (a task index is at most 65535).
constexpr uint32_t max_worker_index = 65535;

/// "worker 2 (/job:worker/task:2 at 10.0.0.3:3334)", or "worker 2" before it joined.
std::string worker_name(const aggregator_actor_state& st, uint32_t w) {
  if (w < st.members.size() && !st.members[w].stats.task.empty()) {
    const auto& m = st.members[w].stats;
    return fmt::format("worker {} ({}{}{})", w, m.task, m.address.empty() ? "" : " at ",
                       m.address);
  }
  return fmt::format("worker {}", w);
}

aggregator_member& member(aggregator_actor_state& st, uint32_t w) {
  if (w >= st.members.size()) {
    st.members.resize(w + 1);
    for (size_t i = 0; i < st.members.size(); ++i)
      st.members[i].stats.worker = static_cast<uint32_t>(i);
  }
  return st.members[w];
}

/// "3 members push" / "1 member pushes".
std::string members_pushing(uint32_t n) {
  return fmt::format("{} member{} push{}", n, n == 1 ? "" : "s", n == 1 ? "es" : "");
}

/// A membership or mode change: logged, and kept for the progress line.
void add_event(aggregator_actor_state& st, std::string what) {
  log::get()->info("aggregator '{}': {}", st.spec.name, what);
  st.stats.events.push_back(std::move(what));
  if (st.stats.events.size() > max_events)
    st.stats.events.erase(st.stats.events.begin());
  st.stats.events_total += 1;
}

/// Counts a push of `worker` (its time, for its rate and idleness).
void note_push(aggregator_actor_state& st, uint32_t worker, uint64_t step) {
  auto& m = member(st, worker);
  auto now = clock_type::now();
  if (m.stats.pushes == 0)
    m.first_push = now;
  m.last_push = now;
  m.idle_logged = false;
  m.stats.pushes += 1;
  m.stats.last_step = step;
  st.stats.pushes += 1;
}

/// The flat parameters of the current global step (made once per step).
caf::expected<tensor> params(self_pointer self) {
  auto& st = self->state;
  if (st.params_step && *st.params_step == st.global_step && !st.params.empty())
    return st.params;
  tensor flat;
  if (st.vars.size() == 1) {
    // One variable: its value is the flat buffer (shared, copy on write).
    auto v = st.vars[0].cell->apply(var_op::read, tensor{}, true);
    if (!v)
      return std::move(v.error());
    flat = v->value.reshaped({static_cast<int64_t>(st.total)});
  } else {
    flat = tensor{dtype::float32, {static_cast<int64_t>(st.total)}};
    float* dst = flat.mutable_data<float>();
    for (size_t i = 0; i < st.vars.size(); ++i)
      if (auto err = st.vars[i].cell->copy_floats(dst + st.offsets[i], st.sizes[i]))
        return err;
  }
  st.params = flat;
  st.params_step = st.global_step;
  return flat;
}

/// The answer "here is where the job stands": the global step and the parameters.
push_result answer_now(self_pointer self) {
  auto p = params(self);
  if (!p)
    return std::move(p.error());
  return {self->state.global_step, std::move(*p)};
}

void invalidate(self_pointer self) {
  self->state.params_step.reset();
  self->state.params = tensor{};
}

/// The pushed values as one pointer per variable, after checking their
/// shapes and that every element is finite. Errors name the worker and the
/// variable; a value that is not finite is af_error::non_finite.
caf::expected<std::vector<const float*>> unpack(self_pointer self, uint32_t worker,
                                                const std::vector<tensor>& values,
                                                const char* what) {
  auto& st = self->state;
  auto worker_name = [&st](uint32_t w) { return af::worker_name(st, w); };
  std::vector<const float*> out(st.vars.size());
  auto var_name = [&](size_t i) { return st.spec.variables[i]; };
  if (values.size() == 1 && st.vars.size() != 1) {
    const auto& flat = values[0];
    if (flat.type() != dtype::float32 || flat.num_elements() != st.total)
      return make_error(af_error::shape_mismatch,
                        fmt::format("{} of {} to aggregator '{}': {} flat values, expected {} "
                                    "floats (the variables {} in order)",
                                    what, worker_name(worker), st.spec.name, flat.summary(),
                                    st.total, fmt::join(st.spec.variables, ", ")));
    for (size_t i = 0; i < st.vars.size(); ++i)
      out[i] = flat.data<float>() + st.offsets[i];
  } else {
    if (values.size() != st.vars.size())
      return make_error(af_error::invalid_argument,
                        fmt::format("{} of {} to aggregator '{}': {} tensors for {} variables ({})",
                                    what, worker_name(worker), st.spec.name, values.size(),
                                    st.vars.size(), fmt::join(st.spec.variables, ", ")));
    for (size_t i = 0; i < st.vars.size(); ++i) {
      const auto& t = values[i];
      const auto& spec = st.vars[i].cell->spec();
      bool flat_ok = t.shape().size() == 1 && t.num_elements() == st.sizes[i];
      if (t.type() != dtype::float32 || (t.shape() != spec.shape && !flat_ok))
        return make_error(af_error::shape_mismatch,
                          fmt::format("{} of {} for variable '{}' is {}, the variable is "
                                      "float32{}",
                                      what, worker_name(worker), var_name(i),
                                      t.empty() ? std::string{"empty"} : t.summary(),
                                      shape_string(spec.shape)));
      out[i] = t.data<float>();
    }
  }
  for (size_t i = 0; i < st.vars.size(); ++i) {
    auto bad = train::first_non_finite(out[i], st.sizes[i]);
    if (bad < st.sizes[i]) {
      auto msg = fmt::format("{} of {} for variable '{}' is not finite (element {} is {}): "
                             "refused, the variable keeps its value",
                             what, worker_name(worker), var_name(i), bad, out[i][bad]);
      st.stats.refused += 1;
      member(st, worker).stats.refused += 1;
      st.stats.last_refusal = msg;
      log::get()->warn("aggregator '{}': {}", st.spec.name, msg);
      return make_error(af_error::non_finite, std::move(msg));
    }
  }
  return out;
}

/// Bytes of a member's token.
constexpr size_t token_bytes = 16;

/// A new member token: 128 random bits from OpenSSL's CSPRNG.
caf::expected<std::string> new_token(const aggregator_actor_state& st) {
  std::string out(token_bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1)
    return make_error(af_error::internal,
                      fmt::format("aggregator '{}': OpenSSL's RAND_bytes gave no token for a "
                                  "joining worker",
                                  st.spec.name));
  return out;
}

/// True if `token` is `m`'s (compared in constant time).
bool holds_token(const aggregator_member& m, const std::string& token) {
  return !m.token.empty() && token.size() == m.token.size()
         && CRYPTO_memcmp(token.data(), m.token.data(), token.size()) == 0;
}

/// Where the message being handled came from, for a refusal's log line: a
/// sender on another CAF node is named by its node (what it says of itself
/// is not believed); a local one (the data plane's thread, which names the
/// connection's peer) by `claimed`.
std::string origin(self_pointer self, const std::string& claimed) {
  auto sender = self->current_sender();
  if (sender && sender->node() != self->node())
    return "CAF node " + caf::to_string(sender->node());
  return claimed.empty() ? std::string{"this process"} : claimed;
}

/// A push, or a done, that does not carry the token `worker` joined with:
/// refused, logged with where it came from, and nothing changes.
caf::error stranger(self_pointer self, uint32_t worker, const char* what,
                    const std::string& from) {
  auto& st = self->state;
  bool joined = worker < st.members.size() && !st.members[worker].token.empty();
  auto msg = fmt::format("aggregator '{}' refused a {} for {} from {}: {}", st.spec.name, what,
                         worker_name(st, worker), origin(self, from),
                         joined ? "it does not carry the token that worker joined with (only "
                                  "the member that joined under an index speaks for it)"
                                : "that worker has not joined (a worker joins, and is given its "
                                  "token, before it pushes)");
  st.stats.last_refusal = msg;
  st.strangers += 1;
  if ((st.strangers & (st.strangers - 1)) == 0)
    log::get()->warn("{} ({} refused so far)", msg, st.strangers);
  return make_error(af_error::invalid_argument, std::move(msg));
}

caf::error check_worker(self_pointer self, uint32_t worker, const push_credentials& who) {
  auto& st = self->state;
  if (worker > max_worker_index || worker >= st.members.size()
      || !holds_token(st.members[worker], who.token))
    return stranger(self, worker, "push", who.from);
  bool joined = worker < st.members.size() && st.members[worker].joined;
  if (worker >= st.spec.workers && !joined)
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}' has workers 0..{} and those that joined, got a "
                                  "push from worker {}: a worker that is not in the job's config "
                                  "joins first (actorflow-train --join)",
                                  st.spec.name, st.spec.workers - 1, worker));
  if (st.round.is_done(worker))
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}': {} said it was done (or left) and pushes "
                                  "again; join again to come back",
                                  st.spec.name, worker_name(st, worker)));
  return caf::none;
}

/// True if the aggregator already took `worker`'s push number `seq` (a
/// retry after its answer was lost, perhaps across a restore): it is
/// answered with the parameters and not applied again. 0 is unnumbered.
bool already_taken(aggregator_actor_state& st, uint32_t worker, uint64_t seq) {
  auto& m = member(st, worker);
  if (seq == 0 || seq > m.seq_taken) {
    m.retries = 0; // a new push: the next episode of retries is logged afresh
    return false;
  }
  // Logged at the 1st, 2nd, 4th, ... retry of a member: a loop of them
  // (a forged push number) does not flood the log.
  m.retries += 1;
  if ((m.retries & (m.retries - 1)) == 0)
    log::get()->info("aggregator '{}': {} sent its push {} again (it took pushes up to {}); "
                     "answered, not applied twice ({} such retries so far)",
                     st.spec.name, worker_name(st, worker), seq, m.seq_taken, m.retries);
  return true;
}

// -- updates: all variables or none ---------------------------------------------

/// Checks, for every variable, what could make the update `what` fail,
/// before any variable changes: each has a value, and (sync, async) each has
/// the optimizer's slots (made here, zeros, as apply_gradient would make them
/// on first use). After it, applying can fail only for want of memory.
caf::error prepare_update(self_pointer self, const std::string& what) {
  auto& st = self->state;
  for (size_t i = 0; i < st.vars.size(); ++i)
    if (!st.vars[i].cell->info().initialized)
      return make_error(af_error::uninitialized,
                        fmt::format("aggregator '{}': variable '{}' has no value yet, so the {} "
                                    "was applied to no variable; initialize the variables (the "
                                    "chief's session does) before the workers push",
                                    st.spec.name, st.spec.variables[i], what));
  if (st.spec.mode == "average")
    return caf::none;
  for (size_t i = 0; i < st.vars.size(); ++i) {
    auto& cell = *st.vars[i].cell;
    for (const auto& slot : st.slot_names) {
      if (cell.slot(slot))
        continue;
      std::string why;
      try {
        if (auto err = cell.set_slot(slot, tensor::filled(dtype::float32, cell.spec().shape, 0)))
          why = describe(err);
      } catch (const std::bad_alloc&) {
        why = "out of memory";
      }
      if (!why.empty())
        return make_error(af_error::resource_exhausted,
                          fmt::format("aggregator '{}': making slot '{}' of variable '{}' failed "
                                      "({}), so the {} was applied to no variable",
                                      st.spec.name, slot, st.spec.variables[i], why, what));
    }
  }
  return caf::none;
}

/// Applies one update, `parts[i]` being variable i's floats: a gradient
/// (sync, async) or new values (average). Either every variable takes it or,
/// if prepare_update refuses, none does.
caf::error update_all(self_pointer self, const std::vector<const float*>& parts,
                      const std::string& what) {
  auto& st = self->state;
  if (auto err = prepare_update(self, what))
    return err;
  invalidate(self); // the cached flat parameters would make the update copy (COW)
  bool average = st.spec.mode == "average";
  for (size_t i = 0; i < st.vars.size(); ++i) {
    auto& cell = *st.vars[i].cell;
    auto err = average ? cell.assign_floats(parts[i], st.sizes[i])
                       : cell.apply_gradient(st.spec.optimizer, parts[i], st.sizes[i],
                                             st.global_step);
    if (err) {
      // Only an allocation can fail here (prepare_update checked the rest):
      // say which variables did take the update.
      std::vector<std::string> took(st.spec.variables.begin(), st.spec.variables.begin() + i);
      auto msg = fmt::format("aggregator '{}': the {} failed at variable '{}' ({}); the variables "
                             "before it [{}] took it",
                             st.spec.name, what, st.spec.variables[i], describe(err),
                             fmt::join(took, ", "));
      log::get()->error("{}", msg);
      return make_error(af_error::resource_exhausted, std::move(msg));
    }
  }
  invalidate(self);
  return caf::none;
}

// -- rounds (sync and average) --------------------------------------------------

using tickets = std::vector<std::pair<uint32_t, caf::typed_response_promise<uint64_t, tensor>>>;

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
  }
}

void answer_all(self_pointer self, tickets waiting) {
  account(self->state, waiting, true);
  auto p = params(self);
  for (auto& w : waiting) {
    if (p)
      w.second.deliver(self->state.global_step, *p);
    else
      w.second.deliver(p.error());
  }
}

/// "worker 1 (/job:worker/task:1 at h:p, last push 2.1 s ago), worker 3": whom the round waits for.
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
  account(st, waiting, false);
  for (auto& w : waiting)
    w.second.deliver(err);
}

std::chrono::milliseconds since(clock_type::time_point t, clock_type::time_point now) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - t);
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

void schedule_sweep(self_pointer self) {
  auto& st = self->state;
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
  self->delayed_send(self, every, sweep_atom::value);
}

void release_sync(self_pointer self);
void release_ssp(self_pointer self, bool all = false);

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

/// Parks the push of `worker` for `step` until the round completes.
push_result park(self_pointer self, uint32_t worker, uint64_t step, uint64_t seq) {
  auto& st = self->state;
  auto promise = self->make_response_promise<uint64_t, tensor>();
  if (!st.round.in_progress())
    st.deadline_periods = 0;
  member(st, worker).parked_since = clock_type::now();
  member(st, worker).round_seq = seq;
  st.round.arrive(worker, step, promise);
  schedule_sweep(self);
  return promise;
}

std::vector<const float*> parts_of(const aggregator_actor_state& st, const std::vector<float>& flat) {
  std::vector<const float*> out;
  for (auto offset : st.offsets)
    out.push_back(flat.data() + offset);
  return out;
}

/// sync: the mean of the round's gradients, applied once.
void release_sync(self_pointer self) {
  auto& st = self->state;
  if (st.round.contributions() > 0) {
    auto what = fmt::format("mean gradient of global step {}", st.global_step);
    if (auto err = update_all(self, parts_of(st, st.round.mean()), what)) {
      fail_all(st, st.round.release(), err);
      return;
    }
    st.stats.applied += 1;
  }
  st.global_step += 1;
  invalidate(self);
  answer_all(self, st.round.release());
  name_idle(st);
}

/// average: the mean of the round's parameters becomes every variable's value.
void release_average(self_pointer self) {
  auto& st = self->state;
  if (st.round.contributions() > 0) {
    auto step = st.round.step().value_or(st.global_step);
    auto what = fmt::format("average of the round at step {}", step);
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

/// After a member came, went or was done: what its mode may now release.
void reconsider(self_pointer self) {
  auto& st = self->state;
  if (st.spec.mode == "ssp") {
    release_ssp(self);
    return;
  }
  if (!st.round.in_progress() || !st.round.complete(st.spec.replicas_to_aggregate))
    return;
  if (st.spec.mode == "sync")
    release_sync(self);
  else if (st.spec.mode == "average")
    release_average(self);
}

/// The gradient-norm guard (spec.grad_norm_guard): a gradient whose norm is
/// over the bound is scaled down to it into `scaled`, and `parts` point
/// there; counted on its worker, and logged at its 1st, 2nd, 4th, ... time.
void guard_gradient(self_pointer self, uint32_t worker, std::vector<const float*>& parts,
                    std::vector<float>& scaled) {
  auto& st = self->state;
  if (!st.guard.enabled())
    return;
  auto n = norm_guard::norm(parts, st.sizes);
  auto median = st.guard.median();
  auto factor = st.guard.admit(n);
  if (factor >= 1)
    return;
  scaled.resize(st.total);
  for (size_t i = 0; i < parts.size(); ++i)
    for (size_t k = 0; k < st.sizes[i]; ++k)
      scaled[st.offsets[i] + k] = static_cast<float>(parts[i][k] * factor);
  parts = parts_of(st, scaled);
  auto& m = member(st, worker);
  m.stats.guarded += 1;
  if ((m.stats.guarded & (m.stats.guarded - 1)) == 0)
    log::get()->warn("aggregator '{}': the gradient of {} at global step {} has norm {:.4g}, {:.3g} "
                     "times the median {:.4g} of the recent ones: scaled down to grad_norm_guard "
                     "= {} times it ({} of its pushes so far)",
                     st.spec.name, worker_name(st, worker), st.global_step, n,
                     median > 0 ? n / median : 0.0, median, st.guard.limit(), m.stats.guarded);
}

/// Takes `worker`'s push of `step` into the round (an empty push is an
/// abstention after a refused value: it only arrives), parks it, and
/// releases the round once enough workers have arrived: every member not
/// done, or (sync) the first replicas_to_aggregate.
template <class Release>
push_result join_round(self_pointer self, uint32_t worker, uint64_t step, uint64_t seq,
                       const std::vector<tensor>& values, const char* what, Release release) {
  auto& st = self->state;
  if (!values.empty()) {
    auto parts = unpack(self, worker, values, what);
    if (!parts)
      return std::move(parts.error());
    std::vector<float> scaled;
    if (st.spec.mode != "average")
      guard_gradient(self, worker, *parts, scaled);
    st.round.add(*parts, st.offsets, st.sizes);
    member(st, worker).contributed = true;
  } else {
    member(st, worker).stats.refused += 1;
  }
  auto r = park(self, worker, step, seq);
  if (st.round.complete(st.spec.mode == "sync" ? st.spec.replicas_to_aggregate : 0))
    release(self);
  return r;
}

/// A push of the kind the mode does not take, after a live switch.
caf::error other_kind(const aggregator_actor_state& st, uint32_t worker, const char* sent) {
  return make_error(af_error::mode_changed,
                    fmt::format("aggregator '{}' runs {} now, and {} pushed {}: its worker "
                                "changes its loop to the job's mode",
                                st.spec.name, st.spec.mode, worker_name(st, worker), sent));
}

/// A push of a step the aggregator has not reached (sync, async, ssp).
caf::error ahead_of(const aggregator_actor_state& st, uint32_t worker, uint64_t step) {
  return make_error(af_error::invalid_argument,
                    fmt::format("{} pushed a gradient of step {} to aggregator '{}', whose "
                                "global step is {}",
                                worker_name(st, worker), step, st.spec.name, st.global_step));
}

// -- ssp ------------------------------------------------------------------------

/// The clock of the slowest member still pushing (UINT64_MAX if none).
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

/// Answers the held pushes the bound now lets go (all of them when a
/// switch drains the mode).
void release_ssp(self_pointer self, bool all) {
  auto& st = self->state;
  if (st.ssp_waiting.empty())
    return;
  auto p = params(self);
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
      w.promise.deliver(st.global_step, *p);
    else
      w.promise.deliver(p.error());
  }
  st.ssp_waiting = std::move(keep);
}

/// A gradient applied at once (async, ssp), with its staleness counted.
caf::error apply_now(self_pointer self, uint32_t worker, uint64_t step, uint64_t seq,
                     const std::vector<tensor>& grads, bool moves_step) {
  auto& st = self->state;
  auto& m = member(st, worker);
  if (grads.empty()) {
    m.stats.refused += 1;
    m.seq_taken = std::max(m.seq_taken, seq);
    return caf::none;
  }
  auto parts = unpack(self, worker, grads, "gradient");
  if (!parts)
    return std::move(parts.error());
  std::vector<float> scaled;
  guard_gradient(self, worker, *parts, scaled);
  auto what = fmt::format("gradient of {} (step {})", worker_name(st, worker), step);
  if (auto err = update_all(self, *parts, what))
    return err;
  auto staleness = st.global_step - step;
  st.stats.staleness[std::min<uint64_t>(staleness, staleness_buckets - 1)] += 1;
  st.stats.applied += 1;
  m.stats.applied += 1;
  if (staleness > 0)
    m.stats.stale += 1;
  m.stats.max_staleness = std::max(m.stats.max_staleness, staleness);
  m.seq_taken = std::max(m.seq_taken, seq);
  if (moves_step)
    st.global_step += 1;
  invalidate(self);
  return caf::none;
}

// -- the behaviors ---------------------------------------------------------------

aggregator_impl_actor::behavior_type behavior_of(self_pointer self, const std::string& mode);

caf::error check_spec(const aggregator_spec& spec) {
  if (!aggregator_mode(spec.mode))
    return make_error(af_error::invalid_argument,
                      "aggregator '" + spec.name + "': mode '" + spec.mode
                        + "' is unknown; a ps aggregates sync, async, ssp or average (allreduce "
                          "needs no ps)");
  if (spec.mode != "average")
    if (auto bad = train::validate(spec.optimizer); !bad.empty())
      return make_error(af_error::invalid_argument, "aggregator '" + spec.name + "': " + bad);
  if (!std::isfinite(spec.grad_norm_guard)
      || (spec.grad_norm_guard != 0 && !(spec.grad_norm_guard >= 1)))
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}': grad_norm_guard = {} must be 0 (off) or at "
                                  "least 1",
                                  spec.name, spec.grad_norm_guard));
  if (spec.min_replicas == 0)
    return make_error(af_error::invalid_argument,
                      "aggregator '" + spec.name + "': min_replicas must be at least 1");
  return caf::none;
}

/// A worker that goes away (its actor down, or done after it joined).
void depart(self_pointer self, uint32_t worker, const std::string& why) {
  auto& st = self->state;
  auto& m = member(st, worker);
  if (m.left || worker >= st.round.workers() || st.round.is_done(worker))
    return;
  m.left = true;
  st.round.mark_done(worker);
  add_event(st, fmt::format("{} left at global step {} ({}); {} on", worker_name(st, worker),
                            st.global_step, why, members_pushing(st.round.active())));
  reconsider(self);
}

/// What every mode answers the same way.
auto common_handlers(self_pointer self) {
  return std::make_tuple(
    [self](pull_atom) -> push_result {
      return answer_now(self);
    },
    [self](stats_atom) -> aggregator_stats {
      auto& st = self->state;
      auto s = st.stats;
      s.mode = st.spec.mode;
      s.global_step = st.global_step;
      s.active = st.round.active();
      s.workers_done = 0;
      auto now = clock_type::now();
      for (uint32_t w = 0; w < st.members.size(); ++w) {
        auto m = st.members[w].stats;
        bool in_round = w < st.round.workers();
        bool member_now = in_round && !st.round.is_done(w);
        bool initial = w < st.spec.workers;
        if (!member_now && (initial || st.members[w].joined))
          s.workers_done += 1;
        auto hold = std::find_if(st.ssp_waiting.begin(), st.ssp_waiting.end(),
                                 [w](const auto& h) { return h.worker == w; });
        bool held = hold != st.ssp_waiting.end();
        // A push still waiting counts its wait so far (it is added for good
        // at its release): a stuck worker shows how long it has waited.
        if (held)
          m.waited_ms += static_cast<uint64_t>(since(hold->since, now).count());
        else if (in_round && st.round.has_arrived(w))
          m.waited_ms += static_cast<uint64_t>(since(st.members[w].parked_since, now).count());
        m.status = held ? "held"
                   : member_now ? "member"
                   : st.members[w].left ? "left"
                   : (initial || st.members[w].joined) ? "done"
                                                       : "waiting";
        if (st.members[w].stats.pushes > 0) {
          m.idle_s = std::chrono::duration<double>(now - st.members[w].last_push).count();
          auto span = std::chrono::duration<double>(st.members[w].last_push
                                                    - st.members[w].first_push).count();
          if (span > 0 && m.pushes > 1)
            m.examples_per_s = static_cast<double>(m.batch_size) * static_cast<double>(m.pushes - 1) / span;
        }
        s.workers.push_back(std::move(m));
      }
      return s;
    },
    [self](done_atom, uint32_t worker, std::string& token,
           std::string& error) -> caf::result<uint32_t> {
      auto& st = self->state;
      bool joined = worker < st.members.size() && st.members[worker].joined;
      if (worker >= st.spec.workers && !joined)
        return make_error(af_error::invalid_argument,
                          fmt::format("aggregator '{}' has no worker {}", st.spec.name, worker));
      auto& m = member(st, worker);
      // Only the member itself retires an index it joined under (a process
      // refused at its join must not end the live one as it exits).
      if (!m.token.empty() && !holds_token(m, token))
        return stranger(self, worker, "done", "");
      if (!error.empty() && !st.round.is_done(worker)) {
        m.stats.error = error;
        add_event(st, fmt::format("{} failed at global step {}: {}", worker_name(st, worker),
                                  st.global_step, error));
      }
      if (worker >= st.spec.workers && !st.round.is_done(worker)) {
        depart(self, worker, "done");
      } else {
        st.round.mark_done(worker);
        reconsider(self);
      }
      return st.round.workers() - st.round.active();
    },
    [self](join_atom, uint32_t worker, std::string& task, std::string& address,
           uint32_t batch_size, caf::actor& who) -> caf::result<uint64_t, std::string, uint64_t> {
      auto& st = self->state;
      if (worker > max_worker_index)
        return make_error(af_error::invalid_argument,
                          fmt::format("aggregator '{}': worker {} cannot join: worker indices go "
                                      "up to {}",
                                      st.spec.name, worker, max_worker_index));
      auto& m = member(st, worker);
      bool was_member = worker < st.round.workers() && !st.round.is_done(worker);
      // One process per worker index: a second one (a mistyped --task, a
      // restart before the first was seen to die) would take over the first's
      // pushes and both would fail. It comes back once the first has left.
      // A live member that holds a token is joined again only by its own
      // actor (after a switch): a join without an actor, or from another
      // one, would take its index (its token) from it.
      bool same_actor = m.actor && who && m.actor == who.address();
      if (was_member && ((m.actor && who && m.actor != who.address())
                         || (!m.token.empty() && !same_actor)))
        return make_error(af_error::already_exists,
                          fmt::format("aggregator '{}': {} is a member already (it joined and "
                                      "has not left); a worker index joins again only after its "
                                      "process ended "
                                      "(a killed one is seen within the node's "
                                      "connection_timeout_ms): check --task, or wait and retry",
                                      st.spec.name, worker_name(st, worker)));
      // Its token: a new one for a new process (the old process's stops
      // working); the same one for its own actor joining again.
      if (m.token.empty() || !same_actor) {
        auto token = new_token(st);
        if (!token)
          return std::move(token.error());
        m.token = std::move(*token);
      }
      if (m.actor && who && m.actor != who.address())
        self->demonitor(m.actor);
      m.joined = true;
      m.stats.error.clear();
      m.left = false;
      m.joined_at = clock_type::now();
      m.stats.task = task;
      m.stats.address = address;
      m.stats.batch_size = batch_size;
      // ssp: a newcomer starts level with the slowest member, so it neither
      // holds the others back nor runs ahead of them.
      if (!was_member) {
        auto slowest = slowest_clock(st);
        m.stats.clock = slowest == UINT64_MAX ? 0 : slowest;
      }
      if (worker < st.round.workers() && st.round.is_standby(worker))
        log::get()->debug("aggregator '{}': {} joins the rounds again after the switch, at global "
                          "step {}",
                          st.spec.name, worker_name(st, worker), st.global_step);
      st.round.add_worker(worker); // and off standby: its next push is in the rounds
      if (who && m.actor != who.address()) {
        m.actor = who.address();
        self->monitor(who);
      }
      if (!was_member)
        add_event(st, fmt::format("{} joined at global step {}; {}", worker_name(st, worker),
                                  st.global_step, members_pushing(st.round.active())));
      return {st.global_step, m.token, m.seq_taken};
    },
    [self](switch_atom, aggregator_spec& want) -> caf::result<uint64_t> {
      auto& st = self->state;
      want.name = st.spec.name;
      if (auto err = check_spec(want))
        return err;
      auto from = st.spec.mode;
      if (from == want.mode) {
        // Only the settings: nothing to drain, the round in progress goes on.
        st.spec.replicas_to_aggregate = want.replicas_to_aggregate;
        st.spec.step_deadline_ms = want.step_deadline_ms;
        st.spec.min_replicas = want.min_replicas;
        st.spec.staleness = want.staleness;
        add_event(st, fmt::format("{} settings changed at global step {}", from,
                                  st.global_step));
        reconsider(self);
        return st.global_step;
      }
      // Drain: what the old mode holds is answered before the new one runs.
      // A round in progress closes with what arrived (none of it is lost);
      // pushes ssp held back are let go.
      if (from == "sync" && st.round.in_progress())
        release_sync(self);
      else if (from == "average" && st.round.in_progress())
        release_average(self);
      if (from == "ssp")
        release_ssp(self, true);
      // average after a switch: the workers still on gradients push plain
      // pushes, refused as the other kind until they change their loop; the
      // first round's stride is not known yet.
      st.average_by_switch = want.mode == "average";
      st.average_stride = 0;
      st.spec.mode = want.mode;
      st.spec.replicas_to_aggregate = want.replicas_to_aggregate;
      st.spec.step_deadline_ms = want.step_deadline_ms;
      st.spec.min_replicas = want.min_replicas;
      st.spec.staleness = want.staleness;
      if (want.step_timeout_ms > 0)
        st.spec.step_timeout_ms = want.step_timeout_ms;
      // sync: the rounds must pair the same steps of the workers on every
      // ps, but the ps switch one after another and a worker's step may
      // reach one before its switch and another after it. So no member
      // with an actor takes part in the rounds until it joins again: told
      // of the switch here, it joins every ps at the start of its next
      // step, and its rounds begin with that step's push everywhere.
      // Meanwhile its pushes are applied at once (no push waits for
      // another ps's worker). A member without an actor (never joined)
      // takes part at once, as before.
      st.round.clear_standby();
      if (want.mode == "sync")
        for (uint32_t w = 0; w < st.members.size() && w < st.round.workers(); ++w) {
          auto& m = st.members[w];
          if (!m.actor || st.round.is_done(w))
            continue;
          auto who = caf::actor_cast<caf::actor>(m.actor);
          if (!who)
            continue;
          st.round.set_standby(w, true);
          m.standby_pushes = 0;
          m.standby_logged = false;
          caf::anon_send(who, switch_atom::value, st.spec.name, want.mode, st.global_step);
        }
      for (auto& m : st.members) {
        // sync: each worker's first push after the switch was computed from
        // the parameters it last got, which async may have moved on from:
        // it joins the round in progress instead of being dropped as late.
        m.fresh = want.mode == "sync";
        m.stats.clock = 0; // ssp counts from the switch, level for everyone
      }
      st.stats.switches += 1;
      add_event(st, fmt::format("mode {} -> {} at global step {}", from, want.mode,
                                st.global_step));
      self->become(behavior_of(self, want.mode));
      return st.global_step;
    },
    [self](save_atom) -> caf::result<aggregator_state> {
      auto& st = self->state;
      aggregator_state out;
      out.global_step = st.global_step;
      for (size_t i = 0; i < st.vars.size(); ++i) {
        auto snap = st.vars[i].cell->snapshot(st.slot_names);
        if (!snap)
          return std::move(snap.error());
        out.names.push_back(st.spec.variables[i]);
        out.values.push_back(std::move(snap->first));
        out.slots.push_back(std::move(snap->second));
      }
      for (uint32_t w = 0; w < st.members.size(); ++w)
        if (st.members[w].seq_taken > 0) {
          out.seq_workers.push_back(w);
          out.seq_taken.push_back(st.members[w].seq_taken);
        }
      return out;
    },
    [self](restore_atom, aggregator_state& in) -> caf::result<uint64_t> {
      auto& st = self->state;
      if (in.seq_workers.size() != in.seq_taken.size()
          || std::any_of(in.seq_workers.begin(), in.seq_workers.end(),
                         [](uint32_t w) { return w > max_worker_index; }))
        return make_error(af_error::invalid_argument,
                          fmt::format("restore of aggregator '{}': the push numbers name {} "
                                      "workers and hold {} numbers (or a worker index over {}); "
                                      "nothing was restored",
                                      st.spec.name, in.seq_workers.size(), in.seq_taken.size(),
                                      max_worker_index));
      if (in.names != st.spec.variables || in.values.size() != in.names.size()
          || in.slots.size() != in.names.size())
        return make_error(af_error::invalid_argument,
                          fmt::format("restore of aggregator '{}': the checkpoint holds variables "
                                      "[{}], the job has [{}]",
                                      st.spec.name, fmt::join(in.names, ", "),
                                      fmt::join(st.spec.variables, ", ")));
      // Every variable's part is checked before any is set: a checkpoint
      // that does not fit leaves all of them as they were.
      for (size_t i = 0; i < st.vars.size(); ++i) {
        const auto& spec = st.vars[i].cell->spec();
        auto fits = [&](const tensor& t) { return t.type() == spec.type && t.shape() == spec.shape; };
        if (!fits(in.values[i]))
          return make_error(af_error::shape_mismatch,
                            fmt::format("restore of aggregator '{}': the checkpoint's '{}' is {}, "
                                        "the variable is {}{}; nothing was restored",
                                        st.spec.name, st.spec.variables[i],
                                        in.values[i].empty() ? std::string{"empty"}
                                                             : in.values[i].summary(),
                                        dtype_name(spec.type), shape_string(spec.shape)));
        if (in.slots[i].size() != st.slot_names.size()
            || !std::all_of(in.slots[i].begin(), in.slots[i].end(), fits))
          return make_error(af_error::shape_mismatch,
                            fmt::format("restore of aggregator '{}': the checkpoint's slots of "
                                        "'{}' do not match the optimizer's [{}] of {}{}; nothing "
                                        "was restored",
                                        st.spec.name, st.spec.variables[i],
                                        fmt::join(st.slot_names, ", "), dtype_name(spec.type),
                                        shape_string(spec.shape)));
      }
      for (size_t i = 0; i < st.vars.size(); ++i) {
        if (auto err = st.vars[i].cell->restore(in.values[i], st.slot_names, in.slots[i],
                                                "restored"))
          return err;
        if (st.vars[i].actor)
          caf::anon_send(st.vars[i].actor, released_atom::value);
      }
      // A round in progress was for parameters that are gone: its pushes
      // are answered now, not left to wait for workers that will push from
      // the restored step.
      auto abandon = [&](const std::string& waited_for) {
        return make_error(af_error::aborted,
                          fmt::format("aggregator '{}' ({}) was restored to global step {} "
                                      "while its round at global step {} waited for {}; that "
                                      "round is abandoned (restart the job's workers: they "
                                      "resume from the checkpoint)",
                                      st.spec.name, st.spec.mode, in.global_step,
                                      st.global_step, waited_for));
      };
      if (st.round.in_progress()) {
        auto err = abandon(missing_names(st));
        log::get()->warn("{}", describe(err));
        fail_all(st, st.round.release(), err);
      }
      if (!st.ssp_waiting.empty()) {
        auto err = abandon("the slowest worker");
        for (auto& w : st.ssp_waiting)
          w.promise.deliver(err);
        st.ssp_waiting.clear();
      }
      // The job starts over from the checkpoint: workers that said they
      // were done push again (not those that left), and what was counted
      // before is history.
      st.round.reset_done();
      for (uint32_t w = 0; w < st.members.size() && w < st.round.workers(); ++w)
        if (st.members[w].left || (w >= st.spec.workers && !st.members[w].joined))
          st.round.mark_done(w);
      for (auto& m : st.members) {
        auto keep = m.stats;
        m.stats = worker_stats{};
        m.stats.worker = keep.worker;
        m.stats.task = keep.task;
        m.stats.address = keep.address;
        m.stats.batch_size = keep.batch_size;
        m.stats.error = keep.error;
        m.contributed = false;
        m.round_seq = 0;
        m.seq_taken = 0;
      }
      // The pushes the checkpoint holds: one of them retried is not applied again.
      for (size_t i = 0; i < in.seq_workers.size(); ++i)
        member(st, in.seq_workers[i]).seq_taken = in.seq_taken[i];
      st.global_step = in.global_step;
      st.average_stride = 0;
      auto buckets = st.stats.staleness.size();
      auto events = std::move(st.stats.events);
      auto events_total = st.stats.events_total;
      st.stats = aggregator_stats{};
      st.stats.mode = st.spec.mode;
      st.stats.staleness.assign(buckets, 0);
      st.stats.events = std::move(events);
      st.stats.events_total = events_total;
      // Said in --status: a ps whose variables were reloaded is told from
      // one that kept its state (a ps restored after it died, the chief's
      // restore at start).
      add_event(st, fmt::format("restored to global step {}", st.global_step));
      invalidate(self);
      return st.global_step;
    },
    [self](sweep_atom) { sweep(self); });
}

template <class Tuple, class... Ts>
aggregator_impl_actor::behavior_type make_behavior(Tuple common, Ts... more) {
  return std::apply(
    [&](auto... hs) { return aggregator_impl_actor::behavior_type{std::move(more)..., hs...}; },
    std::move(common));
}

/// sync, async, ssp: parameters (an average worker's) are refused as the other kind.
auto refuse_parameters(self_pointer self) {
  return [self](push_atom, params_atom, uint32_t worker, uint64_t, push_credentials& who,
                std::vector<tensor>&) -> push_result {
    if (auto err = check_worker(self, worker, who))
      return err;
    return other_kind(self->state, worker, "parameters");
  };
}

aggregator_impl_actor::behavior_type sync_aggregator(self_pointer self) {
  return make_behavior(
    common_handlers(self), refuse_parameters(self),
    [self](push_atom, uint32_t worker, uint64_t step, push_credentials& who,
           std::vector<tensor>& grads) -> push_result {
      auto& st = self->state;
      if (auto err = check_worker(self, worker, who))
        return err;
      if (already_taken(st, worker, who.seq))
        return answer_now(self);
      note_push(st, worker, step);
      if (st.round.is_standby(worker)) {
        // After a switch into sync, until the worker joins again (at the
        // start of one of its steps, on every ps): applied at once, as the
        // old mode did, and the global step stays (it counts the rounds).
        // Parking it could pair its steps with the others' differently on
        // each ps, and two workers each waiting on another ps would
        // deadlock.
        if (step > st.global_step)
          return ahead_of(st, worker, step);
        if (auto err = apply_now(self, worker, step, who.seq, grads, false))
          return err;
        auto& m = member(st, worker);
        // A worker joins again at its next step: one that does not (it
        // missed the message, or an older actorflow) is never waited for.
        if (++m.standby_pushes >= 100 && !m.standby_logged) {
          m.standby_logged = true;
          log::get()->warn("aggregator '{}' (sync): {} has pushed {} times since the switch into "
                           "sync without joining again, so its gradients are applied at once, "
                           "outside the rounds (was it told of the switch? an actorflow older "
                           "than the ps does not join again: restart it)",
                           st.spec.name, worker_name(st, worker), m.standby_pushes);
        }
        return answer_now(self);
      }
      auto& m = member(st, worker);
      bool fresh = m.fresh;
      m.fresh = false;
      if (step < st.global_step && !fresh) {
        // TF's SyncReplicasOptimizer drops a gradient of an old step: its
        // step closed without it (a backup worker's, or a straggler's).
        st.stats.dropped_stale += 1;
        m.stats.late += 1;
        m.seq_taken = std::max(m.seq_taken, who.seq);
        return answer_now(self);
      }
      if (step > st.global_step)
        return ahead_of(st, worker, step);
      if (st.round.has_arrived(worker))
        return make_error(af_error::already_exists,
                          fmt::format("{} pushed step {} twice to aggregator '{}'",
                                      worker_name(st, worker), step, st.spec.name));
      return join_round(self, worker, st.global_step, who.seq, grads, "gradient", release_sync);
    });
}

/// What async and ssp check and count of a push before applying it (its
/// worker checked: check_worker).
caf::error take_gradient(self_pointer self, uint32_t worker, uint64_t step) {
  auto& st = self->state;
  note_push(st, worker, step);
  if (step > st.global_step)
    return ahead_of(st, worker, step);
  return caf::none;
}

aggregator_impl_actor::behavior_type async_aggregator(self_pointer self) {
  return make_behavior(
    common_handlers(self), refuse_parameters(self),
    [self](push_atom, uint32_t worker, uint64_t step, push_credentials& who,
           std::vector<tensor>& grads) -> push_result {
      if (auto err = check_worker(self, worker, who))
        return err;
      if (already_taken(self->state, worker, who.seq))
        return answer_now(self);
      if (auto err = take_gradient(self, worker, step))
        return err;
      if (auto err = apply_now(self, worker, step, who.seq, grads, true))
        return err;
      return answer_now(self);
    });
}

/// ssp: a gradient is applied at once (as async); its answer, the next
/// parameters, waits while the worker is more than `staleness` pushes ahead
/// of the slowest member still pushing (Ho et al., NIPS'13).
aggregator_impl_actor::behavior_type ssp_aggregator(self_pointer self) {
  return make_behavior(
    common_handlers(self), refuse_parameters(self),
    [self](push_atom, uint32_t worker, uint64_t step, push_credentials& who,
           std::vector<tensor>& grads) -> push_result {
      auto& st = self->state;
      if (auto err = check_worker(self, worker, who))
        return err;
      if (already_taken(st, worker, who.seq))
        return answer_now(self);
      if (auto err = take_gradient(self, worker, step))
        return err;
      for (const auto& w : st.ssp_waiting)
        if (w.worker == worker)
          return make_error(af_error::already_exists,
                            fmt::format("{} pushed again to aggregator '{}' while its last push "
                                        "waits for the slowest worker",
                                        worker_name(st, worker), st.spec.name));
      if (auto err = apply_now(self, worker, step, who.seq, grads, true))
        return err;
      member(st, worker).stats.clock += 1;
      release_ssp(self); // this push may have been the slowest's
      if (!within_bound(st, worker)) {
        auto promise = self->make_response_promise<uint64_t, tensor>();
        st.ssp_waiting.push_back({worker, promise, clock_type::now()});
        schedule_sweep(self);
        return promise;
      }
      return answer_now(self);
    });
}

/// average: every worker pushes after the same local steps (average_every),
/// so a round's pushes carry one step, and a round moves the global step by
/// at most what the largest completed round did. A step beyond that (a
/// buggy or hostile worker) would end the job at once: refused, and the
/// round in progress goes on without it. Before the first round completes
/// the stride is unknown and a first push's step is not bounded.
caf::error check_average_step(const aggregator_actor_state& st, uint32_t worker, uint64_t step) {
  if (auto round_step = st.round.step()) {
    if (step > *round_step)
      return make_error(af_error::invalid_argument,
                        fmt::format("{} pushed its parameters of step {} to aggregator '{}', whose "
                                    "round in progress is at step {}: expected step {} (every "
                                    "worker averages after the same local steps)",
                                    worker_name(st, worker), step, st.spec.name, *round_step,
                                    *round_step));
    return caf::none;
  }
  if (st.average_stride > 0 && step > st.global_step + st.average_stride)
    return make_error(af_error::invalid_argument,
                      fmt::format("{} pushed its parameters of step {} to aggregator '{}', whose "
                                  "global step is {} and whose rounds move it by {}: expected "
                                  "step {} at most",
                                  worker_name(st, worker), step, st.spec.name, st.global_step,
                                  st.average_stride, st.global_step + st.average_stride));
  return caf::none;
}

/// average: a push of parameters (either form; a plain push after a switch
/// into average is a gradient, refused as the other kind).
push_result average_push(self_pointer self, uint32_t worker, uint64_t step,
                         const push_credentials& who, std::vector<tensor>& values,
                         bool parameters) {
  auto& st = self->state;
  if (auto err = check_worker(self, worker, who))
    return err;
  if (already_taken(st, worker, who.seq))
    return answer_now(self);
  if (!parameters && st.average_by_switch)
    return other_kind(st, worker, "a gradient");
  note_push(st, worker, step);
  if (st.round.has_arrived(worker))
    return make_error(af_error::already_exists,
                      fmt::format("{} pushed twice in one round to aggregator '{}'",
                                  worker_name(st, worker), st.spec.name));
  if (auto err = check_average_step(st, worker, step))
    return err;
  return join_round(self, worker, step, who.seq, values, "parameters", release_average);
}

aggregator_impl_actor::behavior_type average_aggregator(self_pointer self) {
  return make_behavior(
    common_handlers(self),
    [self](push_atom, params_atom, uint32_t worker, uint64_t step, push_credentials& who,
           std::vector<tensor>& values) -> push_result {
      return average_push(self, worker, step, who, values, true);
    },
    [self](push_atom, uint32_t worker, uint64_t step, push_credentials& who,
           std::vector<tensor>& values) -> push_result {
      return average_push(self, worker, step, who, values, false);
    });
}

aggregator_impl_actor::behavior_type behavior_of(self_pointer self, const std::string& mode) {
  if (mode == "async")
    return async_aggregator(self);
  if (mode == "ssp")
    return ssp_aggregator(self);
  if (mode == "average")
    return average_aggregator(self);
  return sync_aggregator(self);
}

} // namespace

bool aggregator_mode(const std::string& mode) {
  return mode == "sync" || mode == "async" || mode == "ssp" || mode == "average";
}

caf::expected<aggregator_actor> spawn_aggregator(caf::actor_system& sys, aggregator_spec spec,
                                                 std::vector<variable_directory::entry> vars) {
  if (spec.workers == 0)
    return make_error(af_error::invalid_argument,
                      "aggregator '" + spec.name + "' needs at least one worker");
  if (vars.size() != spec.variables.size() || vars.empty())
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}' names {} variables, got {}", spec.name,
                                  spec.variables.size(), vars.size()));
  if (auto err = check_spec(spec))
    return err;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!vars[i].cell)
      return make_error(af_error::not_found,
                        fmt::format("aggregator '{}': variable '{}' is not on this node; create "
                                    "the variables first",
                                    spec.name, spec.variables[i]));
    if (vars[i].cell->spec().type != dtype::float32)
      return make_error(af_error::dtype_mismatch,
                        fmt::format("aggregator '{}': variable '{}' is {}; training updates "
                                    "float32 variables",
                                    spec.name, spec.variables[i],
                                    dtype_name(vars[i].cell->spec().type)));
  }
  return caf::actor_cast<aggregator_actor>(sys.spawn([spec, vars](self_pointer self) {
    auto& st = self->state;
    st.spec = spec;
    st.vars = vars;
    for (auto& v : st.vars) {
      st.offsets.push_back(st.total);
      auto n = static_cast<size_t>(num_elements(v.cell->spec().shape));
      st.sizes.push_back(n);
      st.total += n;
    }
    st.slot_names = train::slot_names(spec.optimizer.kind);
    st.guard = norm_guard{spec.grad_norm_guard};
    st.round = aggregation_round<caf::typed_response_promise<uint64_t, tensor>>{spec.workers,
                                                                               st.total};
    member(st, spec.workers - 1);
    st.stats.staleness.assign(staleness_buckets, 0);
    // A member whose actor goes down (its process killed, its worker ended
    // without saying done) leaves the job at once: no step waits for it.
    self->set_down_handler([self](caf::down_msg& dm) {
      auto& st = self->state;
      for (uint32_t w = 0; w < st.members.size(); ++w)
        if (st.members[w].actor && st.members[w].actor == dm.source) {
          st.members[w].actor = caf::actor_addr{};
          depart(self, w, dm.reason ? "down: " + describe(dm.reason) : "its actor ended");
        }
    });
    return behavior_of(self, spec.mode);
  }));
}

std::string aggregator_spec_difference(const aggregator_spec& have, const aggregator_spec& want) {
  std::vector<std::string> diffs;
  auto differ = [&](const char* what, const auto& a, const auto& b) {
    if (!(a == b))
      diffs.push_back(fmt::format("{} {} vs {}", what, a, b));
  };
  differ("mode", have.mode, want.mode);
  if (have.variables != want.variables)
    diffs.push_back(fmt::format("variables [{}] vs [{}]", fmt::join(have.variables, ", "),
                                fmt::join(want.variables, ", ")));
  differ("workers", have.workers, want.workers);
  differ("grad_norm_guard", have.grad_norm_guard, want.grad_norm_guard);
  if (have.mode == "sync" || want.mode == "sync") {
    differ("replicas_to_aggregate", have.replicas_to_aggregate, want.replicas_to_aggregate);
    differ("step_deadline_ms", have.step_deadline_ms, want.step_deadline_ms);
    differ("min_replicas", have.min_replicas, want.min_replicas);
  }
  if (have.mode == "ssp" || want.mode == "ssp")
    differ("staleness", have.staleness, want.staleness);
  // Averaging applies no optimizer, but its kind names the slots the
  // aggregator saves and restores for the workers' replicas.
  differ("optimizer", have.optimizer.kind, want.optimizer.kind);
  if (have.mode != "average" || want.mode != "average") {
    const auto& a = have.optimizer;
    const auto& b = want.optimizer;
    differ("optimizer lr", a.lr, b.lr);
    if (a.kind == "momentum" && b.kind == "momentum")
      differ("optimizer momentum", a.momentum, b.momentum);
    if (a.kind == "adam" && b.kind == "adam") {
      differ("optimizer beta1", a.beta1, b.beta1);
      differ("optimizer beta2", a.beta2, b.beta2);
      differ("optimizer epsilon", a.epsilon, b.epsilon);
    }
    differ("schedule", a.schedule.kind, b.schedule.kind);
    if (a.schedule.kind == "step" && b.schedule.kind == "step") {
      differ("schedule decay_steps", a.schedule.decay_steps, b.schedule.decay_steps);
      differ("schedule decay_rate", a.schedule.decay_rate, b.schedule.decay_rate);
    }
    if (a.schedule.kind == "cosine" && b.schedule.kind == "cosine") {
      differ("schedule total_steps", a.schedule.total_steps, b.schedule.total_steps);
      differ("schedule min_lr", a.schedule.min_lr, b.schedule.min_lr);
    }
  }
  return fmt::format("{}", fmt::join(diffs, ", "));
}

aggregator_services node_aggregators() {
  return {spawn_aggregator, aggregator_spec_difference};
}

} // namespace af
