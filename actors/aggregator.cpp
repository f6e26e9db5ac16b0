#include "actors/aggregator.hpp"

#include <algorithm>
#include <cstring>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "actors/log.hpp"
#include "messages/error.hpp"
#include "train/optimizer.hpp"

namespace af {

namespace {

using self_pointer = aggregator_impl_actor::stateful_pointer<aggregator_actor_state>;
using clock_type = std::chrono::steady_clock;
using push_result = caf::result<uint64_t, tensor>;

constexpr size_t staleness_buckets = 16;

std::string worker_name(uint32_t w) {
  return fmt::format("worker {}", w);
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
      st.stats.last_refusal = msg;
      log::get()->warn("aggregator '{}': {}", st.spec.name, msg);
      return make_error(af_error::non_finite, std::move(msg));
    }
  }
  return out;
}

caf::error check_worker(self_pointer self, uint32_t worker) {
  auto& st = self->state;
  if (worker >= st.spec.workers)
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}' has workers 0..{}, got a push from worker {}",
                                  st.spec.name, st.spec.workers - 1, worker));
  if (st.round.is_done(worker))
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}': {} said it was done and pushes again",
                                  st.spec.name, worker_name(worker)));
  return caf::none;
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

void answer_all(self_pointer self, tickets waiting) {
  auto p = params(self);
  for (auto& w : waiting) {
    if (p)
      w.second.deliver(self->state.global_step, *p);
    else
      w.second.deliver(p.error());
  }
}

/// "worker 1, worker 3": the workers the round waits for.
std::string missing_names(const aggregator_actor_state& st) {
  std::vector<std::string> names;
  for (auto w : st.round.missing())
    names.push_back(worker_name(w));
  return fmt::format("{}", fmt::join(names, ", "));
}

void fail_all(tickets waiting, const caf::error& err) {
  for (auto& w : waiting)
    w.second.deliver(err);
}

void schedule_sweep(self_pointer self) {
  auto& st = self->state;
  if (st.sweep_pending || st.spec.step_timeout_ms == 0)
    return;
  st.sweep_pending = true;
  auto every = std::max<uint32_t>(10, std::min<uint32_t>(1000, st.spec.step_timeout_ms / 4));
  self->delayed_send(self, std::chrono::milliseconds(every), sweep_atom::value);
}

void sweep(self_pointer self) {
  auto& st = self->state;
  st.sweep_pending = false;
  if (!st.round.in_progress())
    return;
  if (!st.round.expired(std::chrono::milliseconds(st.spec.step_timeout_ms))) {
    schedule_sweep(self);
    return;
  }
  auto err = make_error(af_error::timeout,
                        fmt::format("aggregator '{}' ({}) waited {} ms at global step {} for {}; "
                                    "the step is abandoned",
                                    st.spec.name, st.spec.mode, st.spec.step_timeout_ms,
                                    st.global_step, missing_names(st)));
  log::get()->warn("{}", describe(err));
  fail_all(st.round.release(), err);
}

/// Parks the push of `worker` for `step` until the round completes.
push_result park(self_pointer self, uint32_t worker, uint64_t step) {
  auto& st = self->state;
  auto promise = self->make_response_promise<uint64_t, tensor>();
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
      fail_all(st.round.release(), err);
      return;
    }
    st.stats.applied += 1;
  }
  st.global_step += 1;
  invalidate(self);
  answer_all(self, st.round.release());
}

/// average: the mean of the round's parameters becomes every variable's value.
void release_average(self_pointer self) {
  auto& st = self->state;
  if (st.round.contributions() > 0) {
    auto step = st.round.step().value_or(st.global_step);
    auto what = fmt::format("average of the round at step {}", step);
    if (auto err = update_all(self, parts_of(st, st.round.mean()), what)) {
      fail_all(st.round.release(), err);
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

/// Takes `worker`'s push of `step` into the round (an empty push is an
/// abstention after a refused value: it only arrives), parks it, and
/// releases the round once every worker not done has arrived.
template <class Release>
push_result join_round(self_pointer self, uint32_t worker, uint64_t step,
                       const std::vector<tensor>& values, const char* what, Release release) {
  auto& st = self->state;
  if (!values.empty()) {
    auto parts = unpack(self, worker, values, what);
    if (!parts)
      return std::move(parts.error());
    st.round.add(*parts, st.offsets, st.sizes);
  }
  auto r = park(self, worker, step);
  if (st.round.complete())
    release(self);
  return r;
}

/// A push of a step the aggregator has not reached (sync, async).
caf::error ahead_of(const aggregator_actor_state& st, uint32_t worker, uint64_t step) {
  return make_error(af_error::invalid_argument,
                    fmt::format("{} pushed a gradient of step {} to aggregator '{}', whose "
                                "global step is {}",
                                worker_name(worker), step, st.spec.name, st.global_step));
}

// -- the behaviors ---------------------------------------------------------------

/// What every mode answers the same way.
template <class Release>
auto common_handlers(self_pointer self, Release release) {
  return std::make_tuple(
    [self](pull_atom) -> push_result {
      auto p = params(self);
      if (!p)
        return std::move(p.error());
      return {self->state.global_step, std::move(*p)};
    },
    [self](stats_atom) -> aggregator_stats {
      auto s = self->state.stats;
      s.mode = self->state.spec.mode;
      s.global_step = self->state.global_step;
      s.workers_done = self->state.spec.workers - self->state.round.active();
      return s;
    },
    [self, release](done_atom, uint32_t worker) -> caf::result<uint32_t> {
      auto& st = self->state;
      if (worker >= st.spec.workers)
        return make_error(af_error::invalid_argument,
                          fmt::format("aggregator '{}' has no worker {}", st.spec.name, worker));
      st.round.mark_done(worker);
      if (st.round.in_progress() && st.round.complete())
        release(self);
      return st.spec.workers - st.round.active();
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
      return out;
    },
    [self](restore_atom, aggregator_state& in) -> caf::result<uint64_t> {
      auto& st = self->state;
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
      if (st.round.in_progress()) {
        auto err = make_error(af_error::aborted,
                              fmt::format("aggregator '{}' ({}) was restored to global step {} "
                                          "while its round at global step {} waited for {}; that "
                                          "round is abandoned (restart the job's workers: they "
                                          "resume from the checkpoint)",
                                          st.spec.name, st.spec.mode, in.global_step,
                                          st.global_step, missing_names(st)));
        log::get()->warn("{}", describe(err));
        fail_all(st.round.release(), err);
      }
      // The job starts over from the checkpoint: workers that said they
      // were done push again, and what was counted before is history.
      st.round.reset_done();
      st.global_step = in.global_step;
      st.average_stride = 0;
      auto buckets = st.stats.staleness.size();
      st.stats = aggregator_stats{};
      st.stats.mode = st.spec.mode;
      st.stats.staleness.assign(buckets, 0);
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

aggregator_impl_actor::behavior_type sync_aggregator(self_pointer self) {
  return make_behavior(
    common_handlers(self, release_sync),
    [self](push_atom, uint32_t worker, uint64_t step, std::vector<tensor>& grads) -> push_result {
      auto& st = self->state;
      if (auto err = check_worker(self, worker))
        return err;
      st.stats.pushes += 1;
      if (step < st.global_step) {
        // TF's SyncReplicasOptimizer drops a gradient of an old step.
        st.stats.dropped_stale += 1;
        auto p = params(self);
        if (!p)
          return std::move(p.error());
        return {st.global_step, std::move(*p)};
      }
      if (step > st.global_step)
        return ahead_of(st, worker, step);
      if (st.round.has_arrived(worker))
        return make_error(af_error::already_exists,
                          fmt::format("{} pushed step {} twice to aggregator '{}'",
                                      worker_name(worker), step, st.spec.name));
      return join_round(self, worker, step, grads, "gradient", release_sync);
    });
}

aggregator_impl_actor::behavior_type async_aggregator(self_pointer self) {
  return make_behavior(
    common_handlers(self, [](self_pointer) {}),
    [self](push_atom, uint32_t worker, uint64_t step, std::vector<tensor>& grads) -> push_result {
      auto& st = self->state;
      if (auto err = check_worker(self, worker))
        return err;
      st.stats.pushes += 1;
      if (step > st.global_step)
        return ahead_of(st, worker, step);
      if (!grads.empty()) {
        auto parts = unpack(self, worker, grads, "gradient");
        if (!parts)
          return std::move(parts.error());
        auto what = fmt::format("gradient of {} (step {})", worker_name(worker), step);
        if (auto err = update_all(self, *parts, what))
          return err;
        auto staleness = std::min<uint64_t>(st.global_step - step, staleness_buckets - 1);
        st.stats.staleness[staleness] += 1;
        st.stats.applied += 1;
        st.global_step += 1;
        invalidate(self);
      }
      auto p = params(self);
      if (!p)
        return std::move(p.error());
      return {st.global_step, std::move(*p)};
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
                                    worker_name(worker), step, st.spec.name, *round_step,
                                    *round_step));
    return caf::none;
  }
  if (st.average_stride > 0 && step > st.global_step + st.average_stride)
    return make_error(af_error::invalid_argument,
                      fmt::format("{} pushed its parameters of step {} to aggregator '{}', whose "
                                  "global step is {} and whose rounds move it by {}: expected "
                                  "step {} at most",
                                  worker_name(worker), step, st.spec.name, st.global_step,
                                  st.average_stride, st.global_step + st.average_stride));
  return caf::none;
}

aggregator_impl_actor::behavior_type average_aggregator(self_pointer self) {
  return make_behavior(
    common_handlers(self, release_average),
    [self](push_atom, uint32_t worker, uint64_t step, std::vector<tensor>& values) -> push_result {
      auto& st = self->state;
      if (auto err = check_worker(self, worker))
        return err;
      st.stats.pushes += 1;
      if (st.round.has_arrived(worker))
        return make_error(af_error::already_exists,
                          fmt::format("{} pushed twice in one round to aggregator '{}'",
                                      worker_name(worker), st.spec.name));
      if (auto err = check_average_step(st, worker, step))
        return err;
      return join_round(self, worker, step, values, "parameters", release_average);
    });
}

} // namespace

caf::expected<aggregator_actor> spawn_aggregator(caf::actor_system& sys, aggregator_spec spec,
                                                 std::vector<variable_directory::entry> vars) {
  if (spec.workers == 0)
    return make_error(af_error::invalid_argument,
                      "aggregator '" + spec.name + "' needs at least one worker");
  if (vars.size() != spec.variables.size() || vars.empty())
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}' names {} variables, got {}", spec.name,
                                  spec.variables.size(), vars.size()));
  if (spec.mode != "average")
    if (auto bad = train::validate(spec.optimizer); !bad.empty())
      return make_error(af_error::invalid_argument, "aggregator '" + spec.name + "': " + bad);
  auto init = [spec, vars](self_pointer self) {
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
    st.round = aggregation_round<caf::typed_response_promise<uint64_t, tensor>>{spec.workers,
                                                                               st.total};
    st.stats.staleness.assign(staleness_buckets, 0);
  };
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
  if (spec.mode == "sync")
    return caf::actor_cast<aggregator_actor>(sys.spawn([init](self_pointer self) {
      init(self);
      return sync_aggregator(self);
    }));
  if (spec.mode == "async")
    return caf::actor_cast<aggregator_actor>(sys.spawn([init](self_pointer self) {
      init(self);
      return async_aggregator(self);
    }));
  if (spec.mode == "average")
    return caf::actor_cast<aggregator_actor>(sys.spawn([init](self_pointer self) {
      init(self);
      return average_aggregator(self);
    }));
  return make_error(af_error::invalid_argument,
                    "aggregator '" + spec.name + "': mode '" + spec.mode
                      + "' is unknown; a ps aggregates sync, async or average (allreduce needs "
                        "no ps)");
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

} // namespace af
