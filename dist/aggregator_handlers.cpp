// What every mode of an aggregator answers the same way: stats, done, join,
// a live switch, save and restore.
#include "dist/aggregator_detail.hpp"

#include <algorithm>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af::aggregator_detail {

aggregator_stats stats_of(self_pointer self) {
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
}

caf::result<uint32_t> on_done(self_pointer self, uint32_t worker, const std::string& token,
                              const std::string& error) {
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
}

caf::result<uint64_t, bool> on_closed(self_pointer self, uint32_t worker, uint64_t step,
                                      const std::string& token) {
  auto& st = self->state;
  if (worker > max_worker_index || worker >= st.members.size()
      || !holds_token(st.members[worker], token))
    return stranger(self, worker, "closed query", "");
  auto& m = st.members[worker];
  // The sync push handler's rule for a late gradient (aggregator.cpp): a
  // worker on standby after a switch, or whose next push is fresh, is
  // taken whatever its step; one that is done is refused, not dropped.
  bool member_now = worker < st.round.workers() && !st.round.is_done(worker)
                    && !st.round.is_standby(worker);
  bool closed = st.spec.mode == "sync" && member_now && !m.fresh && step < st.global_step;
  if (closed) {
    m.stats.skipped += 1; // told so, the worker does not push this step here
    m.last_skipped = clock_type::now();
  }
  return {st.global_step, closed};
}

caf::result<uint64_t, std::string, uint64_t> on_join(self_pointer self, uint32_t worker,
                                                     const std::string& task,
                                                     const std::string& address,
                                                     uint32_t batch_size, caf::actor& who) {
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
  if (st.gate)
    st.gate->admit(worker, m.token);
  if (m.actor && who && m.actor != who.address())
    self->demonitor(m.actor);
  m.joined = true;
  m.stats.error.clear();
  m.left = false;
  m.link_down = false;
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
}

caf::result<uint64_t> on_switch(self_pointer self, aggregator_spec& want) {
  auto& st = self->state;
  want.name = st.spec.name;
  if (auto err = check_spec(want))
    return err;
  auto from = st.spec.mode;
  if (st.tables > 0 && want.mode == "average")
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}': cannot switch to average: its tables [{}] "
                                  "take sparse gradients, which averaging (like allreduce) "
                                  "cannot; stay in sync, async or ssp",
                                  st.spec.name, fmt::join(st.spec.sparse, ", ")));
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
  if (from == "sync" && st.pipelined) {
    // A pipelined round cannot close with what arrived (its chunks need
    // every member's): it is abandoned, no variable changed, and its members
    // hear the new mode, as a push of the other kind does.
    auto err = make_error(af_error::mode_changed,
                          fmt::format("aggregator '{}' switched from sync to {} during the "
                                      "pipelined round of global step {}: the round is "
                                      "abandoned, no variable changed",
                                      st.spec.name, want.mode, st.global_step));
    fail_all(st, st.round.release(), err);
    st.plane->answered.notify_all();
  } else if (from == "sync" && st.round.in_progress()) {
    release_sync(self);
  }
  if (from == "async")
    abort_streamed_async(st, make_error(af_error::mode_changed,
                                        fmt::format("aggregator '{}' switched from async to {} "
                                                    "while the push was streamed: the push is "
                                                    "abandoned, no variable changed",
                                                    st.spec.name, want.mode)));
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
  if (st.spec.pipeline_auto) {
    // pipeline_sync = "auto" tunes sync rounds only: back in sync it times
    // both kinds anew (the workers stream first); out of it no push is
    // asked to go whole (pipeline_async streams as it is set).
    st.tuner.restart();
    st.plane->reply_flags.store(0, std::memory_order_relaxed);
    st.stats.pipeline_auto = want.mode == "sync" ? st.tuner.state() : "";
  }
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
  // takes part at once, as before. Every member with an actor is told of
  // every switch (a sparse worker's data stream follows the mode it runs
  // in: dist/worker_loop.hpp's data_cursor); only one into sync asks
  // something of it.
  st.round.clear_standby();
  for (uint32_t w = 0; w < st.members.size() && w < st.round.workers(); ++w) {
    auto& m = st.members[w];
    if (!m.actor || st.round.is_done(w))
      continue;
    auto who = caf::actor_cast<caf::actor>(m.actor);
    if (!who)
      continue;
    if (want.mode == "sync") {
      st.round.set_standby(w, true);
      m.standby_pushes = 0;
      m.standby_logged = false;
    }
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
}

caf::result<aggregator_state> save_state(self_pointer self) {
  auto& st = self->state;
  aggregator_state out;
  out.global_step = st.global_step;
  // A slot not made yet is saved at its start (adagrad's accumulator: not 0).
  std::vector<float> initial;
  for (size_t k = 0; k < st.slot_names.size(); ++k)
    initial.push_back(train::slot_initial_value(st.spec.optimizer, k));
  for (size_t i = 0; i < st.vars.size(); ++i) {
    auto snap = st.vars[i].cell->snapshot(st.slot_names, initial);
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
}

caf::result<uint64_t> restore_state(self_pointer self, aggregator_state& in) {
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
  // No variables at all: the step and the push numbers only, the variables
  // being restored by their node (a sparse job's table shards, too large to
  // travel in one message: dist/sparse_checkpoint.hpp).
  bool step_only = in.names.empty() && in.values.empty() && in.slots.empty();
  if (!step_only
      && (in.names != st.spec.variables || in.values.size() != in.names.size()
          || in.slots.size() != in.names.size()))
    return make_error(af_error::invalid_argument,
                      fmt::format("restore of aggregator '{}': the checkpoint holds variables "
                                  "[{}], the job has [{}]",
                                  st.spec.name, fmt::join(in.names, ", "),
                                  fmt::join(st.spec.variables, ", ")));
  // Every variable's part is checked before any is set: a checkpoint
  // that does not fit leaves all of them as they were.
  for (size_t i = 0; !step_only && i < st.vars.size(); ++i) {
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
  for (size_t i = 0; !step_only && i < st.vars.size(); ++i) {
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
  abort_streamed_async(st, abandon("the rest of a streamed push"));
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
}

} // namespace af::aggregator_detail
