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
/// variable.
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
      return make_error(af_error::invalid_argument, std::move(msg));
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
  if (st.done[worker])
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}': {} said it was done and pushes again",
                                  st.spec.name, worker_name(worker)));
  return caf::none;
}

// -- rounds (sync and average) --------------------------------------------------

uint32_t active(const aggregator_actor_state& st) {
  return static_cast<uint32_t>(std::count(st.done.begin(), st.done.end(), false));
}

bool round_complete(const aggregator_actor_state& st) {
  for (size_t w = 0; w < st.arrived.size(); ++w)
    if (!st.done[w] && !st.arrived[w])
      return false;
  return true;
}

void reset_round(self_pointer self) {
  auto& st = self->state;
  std::fill(st.arrived.begin(), st.arrived.end(), false);
  st.contributions = 0;
  st.round_step = 0;
}

void answer_all(self_pointer self) {
  auto p = params(self);
  auto waiting = std::move(self->state.waiting);
  self->state.waiting.clear();
  for (auto& w : waiting) {
    if (p)
      w.promise.deliver(self->state.global_step, *p);
    else
      w.promise.deliver(p.error());
  }
}

void add_to_sum(self_pointer self, const std::vector<const float*>& parts) {
  auto& st = self->state;
  if (st.sum.size() != st.total)
    st.sum.assign(st.total, 0.0f);
  bool first = st.contributions == 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    float* dst = st.sum.data() + st.offsets[i];
    const float* src = parts[i];
    if (first)
      std::memcpy(dst, src, st.sizes[i] * sizeof(float));
    else
      for (size_t k = 0; k < st.sizes[i]; ++k)
        dst[k] += src[k];
  }
  st.contributions += 1;
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
  if (st.waiting.empty())
    return;
  if (clock_type::now() - st.round_started < std::chrono::milliseconds(st.spec.step_timeout_ms)) {
    schedule_sweep(self);
    return;
  }
  std::vector<std::string> missing;
  for (size_t w = 0; w < st.arrived.size(); ++w)
    if (!st.done[w] && !st.arrived[w])
      missing.push_back(worker_name(static_cast<uint32_t>(w)));
  auto err = make_error(af_error::timeout,
                        fmt::format("aggregator '{}' ({}) waited {} ms at global step {} for {}; "
                                    "the step is abandoned",
                                    st.spec.name, st.spec.mode, st.spec.step_timeout_ms,
                                    st.global_step, fmt::join(missing, ", ")));
  log::get()->warn("{}", describe(err));
  for (auto& w : st.waiting)
    w.promise.deliver(err);
  st.waiting.clear();
  reset_round(self);
}

/// Parks the push of `worker` until the round completes.
push_result park(self_pointer self, uint32_t worker) {
  auto& st = self->state;
  if (st.waiting.empty())
    st.round_started = clock_type::now();
  auto promise = self->make_response_promise<uint64_t, tensor>();
  st.waiting.push_back({worker, promise});
  schedule_sweep(self);
  return promise;
}

/// sync: the mean of the round's gradients, applied once.
void release_sync(self_pointer self) {
  auto& st = self->state;
  if (st.contributions > 0) {
    invalidate(self); // the cached flat parameters would make the update copy (COW)
    float scale = 1.0f / static_cast<float>(st.contributions);
    for (auto& x : st.sum)
      x *= scale;
    for (size_t i = 0; i < st.vars.size(); ++i)
      if (auto err = st.vars[i].cell->apply_gradient(st.spec.optimizer, st.sum.data() + st.offsets[i],
                                                     st.sizes[i], st.global_step)) {
        log::get()->error("aggregator '{}': {}", st.spec.name, describe(err));
        for (auto& w : st.waiting)
          w.promise.deliver(err);
        st.waiting.clear();
        reset_round(self);
        return;
      }
    st.stats.applied += 1;
  }
  st.global_step += 1;
  invalidate(self);
  reset_round(self);
  answer_all(self);
}

/// average: the mean of the round's parameters becomes every variable's value.
void release_average(self_pointer self) {
  auto& st = self->state;
  if (st.contributions > 0) {
    float scale = 1.0f / static_cast<float>(st.contributions);
    for (auto& x : st.sum)
      x *= scale;
    for (size_t i = 0; i < st.vars.size(); ++i)
      if (auto err = st.vars[i].cell->assign_floats(st.sum.data() + st.offsets[i], st.sizes[i])) {
        for (auto& w : st.waiting)
          w.promise.deliver(err);
        st.waiting.clear();
        reset_round(self);
        return;
      }
    st.stats.applied += 1;
  }
  st.global_step = std::max(st.global_step, st.round_step);
  invalidate(self);
  reset_round(self);
  answer_all(self);
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
      s.workers_done = self->state.spec.workers - active(self->state);
      return s;
    },
    [self, release](done_atom, uint32_t worker) -> caf::result<uint32_t> {
      auto& st = self->state;
      if (worker >= st.spec.workers)
        return make_error(af_error::invalid_argument,
                          fmt::format("aggregator '{}' has no worker {}", st.spec.name, worker));
      st.done[worker] = true;
      if (!st.waiting.empty() && round_complete(st))
        release(self);
      return st.spec.workers - active(st);
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
      for (size_t i = 0; i < st.vars.size(); ++i) {
        if (auto err = st.vars[i].cell->restore(in.values[i], st.slot_names, in.slots[i],
                                                "restored"))
          return err;
        if (st.vars[i].actor)
          caf::anon_send(st.vars[i].actor, released_atom::value);
      }
      st.global_step = in.global_step;
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
        return make_error(af_error::invalid_argument,
                          fmt::format("{} pushed a gradient of step {} to aggregator '{}', whose "
                                      "global step is {}",
                                      worker_name(worker), step, st.spec.name, st.global_step));
      if (st.arrived[worker])
        return make_error(af_error::already_exists,
                          fmt::format("{} pushed step {} twice to aggregator '{}'",
                                      worker_name(worker), step, st.spec.name));
      if (grads.empty()) {
        // An abstention (after a refused gradient): waits for the release,
        // adds nothing.
        st.arrived[worker] = true;
        auto r = park(self, worker);
        if (round_complete(st))
          release_sync(self);
        return r;
      }
      auto parts = unpack(self, worker, grads, "gradient");
      if (!parts)
        return std::move(parts.error());
      add_to_sum(self, *parts);
      st.arrived[worker] = true;
      auto r = park(self, worker);
      if (round_complete(st))
        release_sync(self);
      return r;
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
        return make_error(af_error::invalid_argument,
                          fmt::format("{} pushed a gradient of step {} to aggregator '{}', whose "
                                      "global step is {}",
                                      worker_name(worker), step, st.spec.name, st.global_step));
      if (!grads.empty()) {
        auto parts = unpack(self, worker, grads, "gradient");
        if (!parts)
          return std::move(parts.error());
        invalidate(self);
        for (size_t i = 0; i < st.vars.size(); ++i)
          if (auto err = st.vars[i].cell->apply_gradient(st.spec.optimizer, (*parts)[i],
                                                         st.sizes[i], st.global_step))
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

aggregator_impl_actor::behavior_type average_aggregator(self_pointer self) {
  return make_behavior(
    common_handlers(self, release_average),
    [self](push_atom, uint32_t worker, uint64_t step, std::vector<tensor>& values) -> push_result {
      auto& st = self->state;
      if (auto err = check_worker(self, worker))
        return err;
      st.stats.pushes += 1;
      if (st.arrived[worker])
        return make_error(af_error::already_exists,
                          fmt::format("{} pushed twice in one round to aggregator '{}'",
                                      worker_name(worker), st.spec.name));
      if (values.empty()) {
        st.arrived[worker] = true;
        auto r = park(self, worker);
        if (round_complete(st))
          release_average(self);
        return r;
      }
      auto parts = unpack(self, worker, values, "parameters");
      if (!parts)
        return std::move(parts.error());
      add_to_sum(self, *parts);
      st.arrived[worker] = true;
      st.round_step = std::max(st.round_step, step);
      auto r = park(self, worker);
      if (round_complete(st))
        release_average(self);
      return r;
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
    st.arrived.assign(spec.workers, false);
    st.done.assign(spec.workers, false);
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

} // namespace af
