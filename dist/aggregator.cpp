#include "dist/aggregator.hpp"
#include "dist/aggregator_detail.hpp"

#include <algorithm>
#include <cmath>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"
#include "train/optimizer.hpp"

namespace af {

namespace aggregator_detail {

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

namespace {

/// Takes `worker`'s push of `step` into the round (add_to_round), parks
/// it, and releases the round once enough workers have arrived: every
/// member not done, or (sync) the first replicas_to_aggregate.
template <class Release>
push_result join_round(self_pointer self, uint32_t worker, uint64_t step,
                       const push_credentials& who, const std::vector<tensor>& values,
                       const char* what, Release release) {
  auto& st = self->state;
  if (st.pipelined) // sync: its members stream their pushes (dist/aggregator_pipelined.cpp)
    return join_pipelined(self, worker, step, who, values, what);
  if (auto err = add_to_round(self, worker, who, values, what))
    return err;
  auto r = park(self, worker, step, who);
  if (st.round.complete(st.spec.mode == "sync" ? st.spec.replicas_to_aggregate : 0))
    release(self);
  return r;
}

/// What every mode answers the same way (aggregator_handlers.cpp).
auto common_handlers(self_pointer self) {
  return std::make_tuple(
    [self](pull_atom) -> caf::result<uint64_t, tensor> {
      auto lock = hold(self);
      // A table does not travel whole: a pull would copy every shard this
      // ps holds (and keep the copy until the step moves), for anyone who
      // reaches the port, since a pull carries no token.
      if (self->state.tables > 0)
        return make_error(af_error::invalid_argument,
                          fmt::format("aggregator '{}' holds tables [{}], which are not pulled "
                                      "whole: read their rows by id (gather_rows)",
                                      self->state.spec.name,
                                      fmt::join(self->state.spec.sparse, ", ")));
      auto p = params(self);
      if (!p)
        return std::move(p.error());
      return {self->state.global_step, std::move(*p)};
    },
    [self](stats_atom) -> aggregator_stats {
      auto lock = hold(self);
      return stats_of(self);
    },
    [self](closed_atom, uint32_t worker, uint64_t step,
           std::string& token) -> caf::result<uint64_t, bool> {
      auto lock = hold(self);
      return on_closed(self, worker, step, token);
    },
    [self](done_atom, uint32_t worker, std::string& token,
           std::string& error) -> caf::result<uint32_t> {
      auto lock = hold(self);
      return on_done(self, worker, token, error);
    },
    [self](join_atom, uint32_t worker, std::string& task, std::string& address,
           uint32_t batch_size, caf::actor& who) -> caf::result<uint64_t, std::string, uint64_t> {
      auto lock = hold(self);
      return on_join(self, worker, task, address, batch_size, who);
    },
    [self](switch_atom, aggregator_spec& want) -> caf::result<uint64_t> {
      auto lock = hold(self);
      return on_switch(self, want);
    },
    [self](save_atom) -> caf::result<aggregator_state> {
      auto lock = hold(self);
      return save_state(self);
    },
    [self](restore_atom, aggregator_state& in) -> caf::result<uint64_t> {
      auto lock = hold(self);
      return restore_state(self, in);
    },
    [self](sweep_atom) {
      auto lock = hold(self);
      sweep(self);
    });
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
    auto lock = hold(self);
    if (auto err = check_worker(self, worker, who))
      return err;
    return other_kind(self->state, worker, "parameters");
  };
}

/// sync: a push of either form, `apply_at_once()` applying it outside the
/// rounds (a worker on standby after a switch) and `join()` taking it into
/// the round in progress.
template <class ApplyAtOnce, class Join>
push_result sync_push(self_pointer self, uint32_t worker, uint64_t step, const push_credentials& who,
                      bool sparse, ApplyAtOnce apply_at_once, Join join) {
  auto& st = self->state;
  if (auto err = check_worker(self, worker, who))
    return err;
  if (already_taken(st, worker, who.seq))
    return answer_now(self, who, who.seq != 0 && who.seq == member(st, worker).seq_late);
  if ((st.tables > 0) != sparse)
    return wrong_form(st, worker, sparse);
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
    if (auto err = apply_at_once())
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
    return answer_now(self, who);
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
    m.seq_late = who.seq;
    return answer_now(self, who, true);
  }
  if (step > st.global_step)
    return ahead_of(st, worker, step);
  if (st.round.has_arrived(worker))
    return make_error(af_error::already_exists,
                      fmt::format("{} pushed step {} twice to aggregator '{}'",
                                  worker_name(st, worker), step, st.spec.name));
  return join();
}

aggregator_impl_actor::behavior_type sync_aggregator(self_pointer self) {
  return make_behavior(
    common_handlers(self), refuse_parameters(self),
    [self](push_atom, uint32_t worker, uint64_t step, push_credentials& who,
           std::vector<tensor>& grads) -> push_result {
      auto lock = hold(self);
      return sync_push(
        self, worker, step, who, false, [&] { return apply_now(self, worker, step, who, grads, false); },
        [&] {
          return join_round(self, worker, self->state.global_step, who, grads, "gradient",
                            release_sync);
        });
    },
    [self](push_atom, sparse_atom, uint32_t worker, uint64_t step, push_credentials& who,
           sparse_push_values& grads) -> push_result {
      auto lock = hold(self);
      return sync_push(
        self, worker, step, who, true,
        [&] { return apply_sparse_now(self, worker, step, who, grads, false); },
        [&] { return join_round_sparse(self, worker, self->state.global_step, who, grads); });
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
      auto lock = hold(self);
      if (auto err = check_worker(self, worker, who))
        return err;
      if (already_taken(self->state, worker, who.seq))
        return answer_now(self, who);
      if (self->state.tables > 0)
        return wrong_form(self->state, worker, false);
      if (auto err = take_gradient(self, worker, step))
        return err;
      // Streamed pushes in line: a push with values takes its place there.
      if (!grads.empty() && !self->state.pipelined_async.empty())
        return queue_whole_async(self, worker, step, who, grads);
      if (auto err = apply_now(self, worker, step, who, grads, true))
        return err;
      return answer_now(self, who);
    },
    [self](push_atom, sparse_atom, uint32_t worker, uint64_t step, push_credentials& who,
           sparse_push_values& grads) -> push_result {
      auto lock = hold(self);
      if (auto err = check_worker(self, worker, who))
        return err;
      if (already_taken(self->state, worker, who.seq))
        return answer_now(self);
      if (self->state.tables == 0)
        return wrong_form(self->state, worker, true);
      if (auto err = take_gradient(self, worker, step))
        return err;
      if (auto err = apply_sparse_now(self, worker, step, who, grads, true))
        return err;
      return answer_now(self);
    });
}

/// ssp: a gradient is applied at once (as async); its answer, the next
/// parameters, waits while the worker is more than `staleness` pushes ahead
/// of the slowest member still pushing (Ho et al., NIPS'13).
/// ssp: a push of either form, `apply()` applying it at once.
template <class Apply>
push_result ssp_push(self_pointer self, uint32_t worker, uint64_t step, const push_credentials& who,
                     bool sparse, Apply apply) {
  auto& st = self->state;
  if (auto err = check_worker(self, worker, who))
    return err;
  if (already_taken(st, worker, who.seq))
    return answer_now(self);
  if ((st.tables > 0) != sparse)
    return wrong_form(st, worker, sparse);
  if (auto err = take_gradient(self, worker, step))
    return err;
  for (const auto& w : st.ssp_waiting)
    if (w.worker == worker)
      return make_error(af_error::already_exists,
                        fmt::format("{} pushed again to aggregator '{}' while its last push "
                                    "waits for the slowest worker",
                                    worker_name(st, worker), st.spec.name));
  if (auto err = apply())
    return err;
  member(st, worker).stats.clock += 1;
  release_ssp(self); // this push may have been the slowest's
  if (!within_bound(st, worker)) {
    auto promise = self->make_response_promise<uint64_t, tensor, bool>();
    st.ssp_waiting.push_back({worker, promise, clock_type::now()});
    schedule_sweep(self);
    return promise;
  }
  return answer_now(self);
}

aggregator_impl_actor::behavior_type ssp_aggregator(self_pointer self) {
  return make_behavior(
    common_handlers(self), refuse_parameters(self),
    [self](push_atom, uint32_t worker, uint64_t step, push_credentials& who,
           std::vector<tensor>& grads) -> push_result {
      auto lock = hold(self);
      return ssp_push(self, worker, step, who, false,
                      [&] { return apply_now(self, worker, step, who, grads, true); });
    },
    [self](push_atom, sparse_atom, uint32_t worker, uint64_t step, push_credentials& who,
           sparse_push_values& grads) -> push_result {
      auto lock = hold(self);
      return ssp_push(self, worker, step, who, true,
                      [&] { return apply_sparse_now(self, worker, step, who, grads, true); });
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
  return join_round(self, worker, step, who, values, "parameters", release_average);
}

aggregator_impl_actor::behavior_type average_aggregator(self_pointer self) {
  return make_behavior(
    common_handlers(self),
    [self](push_atom, params_atom, uint32_t worker, uint64_t step, push_credentials& who,
           std::vector<tensor>& values) -> push_result {
      auto lock = hold(self);
      return average_push(self, worker, step, who, values, true);
    },
    [self](push_atom, uint32_t worker, uint64_t step, push_credentials& who,
           std::vector<tensor>& values) -> push_result {
      auto lock = hold(self);
      return average_push(self, worker, step, who, values, false);
    },
    [self](push_atom, sparse_atom, uint32_t worker, uint64_t, push_credentials& who,
           sparse_push_values&) -> push_result {
      auto lock = hold(self);
      if (auto err = check_worker(self, worker, who))
        return err;
      return wrong_form(self->state, worker, true); // average has no tables (check_tables)
    });
}

} // namespace

aggregator_impl_actor::behavior_type behavior_of(self_pointer self, const std::string& mode) {
  if (mode == "async")
    return async_aggregator(self);
  if (mode == "ssp")
    return ssp_aggregator(self);
  if (mode == "average")
    return average_aggregator(self);
  return sync_aggregator(self);
}

} // namespace aggregator_detail

using namespace aggregator_detail;

bool aggregator_mode(const std::string& mode) {
  return mode == "sync" || mode == "async" || mode == "ssp" || mode == "average";
}

caf::expected<aggregator_actor> spawn_aggregator(caf::actor_system& sys, aggregator_spec spec,
                                                 std::vector<variable_directory::entry> vars,
                                                 std::shared_ptr<push_gate> gate,
                                                 std::shared_ptr<plane_push_paths> paths) {
  if (spec.workers == 0)
    return make_error(af_error::invalid_argument,
                      "aggregator '" + spec.name + "' needs at least one worker");
  if (vars.size() != spec.variables.size() || vars.empty())
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}' names {} variables, got {}", spec.name,
                                  spec.variables.size(), vars.size()));
  if (auto err = check_spec(spec))
    return err;
  if (auto err = check_tables(spec, vars))
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
  auto plane = std::make_shared<aggregator_plane>();
  // Its data plane takes the common push itself, under the lock
  // (aggregator_plane.cpp); until the actor's state is up it finds no
  // actor there and hands the push over, as before.
  // A dense sync push streamed joins its pipelined round the same way
  // (aggregator_pipelined.cpp); a dense async one is applied chunk by chunk
  // (aggregator_pipelined_async.cpp).
  if (paths && !spec.sparse.empty())
    paths->sparse = plane_path(plane);
  if (paths && spec.sparse.empty())
    paths->dense = plane_dense_path(plane);
  if (paths && spec.sparse.empty())
    paths->streamed = streamed_path(plane);
  if (paths) // the aggregator's own bits, read as its pushes are answered
    paths->reply_flags = std::shared_ptr<const std::atomic<uint16_t>>(plane, &plane->reply_flags);
  return caf::actor_cast<aggregator_actor>(sys.spawn([spec, vars, gate, plane](aggregator_detail::self_pointer self) {
    auto& st = self->state;
    auto lock = std::unique_lock<std::mutex>{plane->mtx};
    st.plane = plane;
    plane->self = self;
    plane->addr = self->address();
    st.spec = spec;
    st.vars = vars;
    st.gate = gate;
    size_t round_floats = 0; // the round sums the dense variables only
    for (size_t i = 0; i < st.vars.size(); ++i) {
      st.offsets.push_back(st.total);
      auto n = static_cast<size_t>(num_elements(st.vars[i].cell->spec().shape));
      st.sizes.push_back(n);
      st.total += n;
      bool table = std::find(spec.sparse.begin(), spec.sparse.end(), spec.variables[i])
                   != spec.sparse.end();
      st.is_table.push_back(table);
      st.round_offsets.push_back(round_floats);
      if (table)
        st.tables += 1;
      else
        round_floats += n;
    }
    st.slot_names = train::slot_names(spec.optimizer.kind);
    st.guard = norm_guard{spec.grad_norm_guard};
    if (spec.pipeline_auto && spec.mode == "sync")
      st.stats.pipeline_auto = st.tuner.state();
    st.round = aggregation_round<push_ticket>{spec.workers, round_floats};
    member(st, spec.workers - 1);
    st.stats.staleness.assign(staleness_buckets, 0);
    // A member whose actor goes down (its process killed, its worker ended
    // without saying done) leaves the job at once: no step waits for it.
    // So does one whose link broke while it lives (a ps stopped past the
    // nodes' connection_timeout_ms): its pushes are refused as
    // af_error::left and it joins again, which monitors it again. That
    // holds whenever the down comes, even after it joined again (the join
    // may have reached this node through the old link's proxy, whose down
    // comes later): the next push is refused, and it joins once more.
    self->set_down_handler([self](caf::down_msg& dm) {
      auto lock = hold(self);
      auto& st = self->state;
      for (uint32_t w = 0; w < st.members.size(); ++w)
        if (st.members[w].actor && st.members[w].actor == dm.source) {
          st.members[w].actor = caf::actor_addr{};
          depart(self, w, dm.reason ? "down: " + describe(dm.reason) : "its actor ended", true);
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
  if (have.sparse != want.sparse)
    diffs.push_back(fmt::format("sparse tables [{}] vs [{}]", fmt::join(have.sparse, ", "),
                                fmt::join(want.sparse, ", ")));
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
