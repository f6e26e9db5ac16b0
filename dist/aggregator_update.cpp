// An update to every variable of an aggregator or to none: a push unpacked
// and checked, the norm guard, a gradient applied at once (async, ssp).
#include "dist/aggregator_detail.hpp"

#include <algorithm>
#include <cstring>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af::aggregator_detail {

namespace {

/// Checks, for every variable, what could make the update `what` fail,
/// before any variable changes: each has a value, and (sync, async) each has
/// the optimizer's slots (made here, at their starts, as apply_gradient would make them
/// on first use). After it, applying can fail only for want of memory.
caf::error prepare_update(self_pointer self, const update_what& what) {
  auto& st = self->state;
  for (size_t i = 0; i < st.vars.size(); ++i)
    if (!st.vars[i].cell->initialized())
      return make_error(af_error::uninitialized,
                        fmt::format("aggregator '{}': variable '{}' has no value yet, so the {} "
                                    "was applied to no variable; initialize the variables (the "
                                    "chief's session does) before the workers push",
                                    st.spec.name, st.spec.variables[i], what.str()));
  if (st.spec.mode == "average")
    return caf::none;
  for (size_t i = 0; i < st.vars.size(); ++i) {
    auto& cell = *st.vars[i].cell;
    for (size_t k = 0; k < st.slot_names.size(); ++k) {
      const auto& slot = st.slot_names[k];
      if (cell.has_slot(slot))
        continue;
      std::string why;
      try {
        // At the slot's start, as apply_gradient makes it (adagrad's accumulator: not 0).
        auto start = train::slot_initial_value(st.spec.optimizer, k);
        if (auto err = cell.set_slot(slot, tensor::filled(dtype::float32, cell.spec().shape,
                                                          start)))
          why = describe(err);
      } catch (const std::bad_alloc&) {
        why = "out of memory";
      }
      if (!why.empty())
        return make_error(af_error::resource_exhausted,
                          fmt::format("aggregator '{}': making slot '{}' of variable '{}' failed "
                                      "({}), so the {} was applied to no variable",
                                      st.spec.name, slot, st.spec.variables[i], why, what.str()));
    }
  }
  return caf::none;
}

} // namespace

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

push_result answer_now(self_pointer self, bool dropped_late) {
  auto p = answer_params(self);
  if (!p)
    return std::move(p.error());
  return {self->state.global_step, std::move(*p), dropped_late};
}

bool fill_parts(self_pointer self, answer_parts& out) {
  auto& st = self->state;
  if (st.tables > 0)
    return false;
  out.values.resize(st.vars.size()); // no allocation once it has held them
  for (size_t i = 0; i < st.vars.size(); ++i)
    if (st.vars[i].cell->share_value(out.values[i], st.sizes[i]))
      return false; // the flat path's params() names the variable
  return true;
}

push_result answer_now(self_pointer self, const push_credentials& who, bool dropped_late) {
  // Dropped before the answer goes (the message keeps no copy): the data
  // plane's thread then finds its answer_parts its own again.
  if (auto parts = std::move(who.parts); parts && fill_parts(self, *parts)) {
    parts.reset();
    return {self->state.global_step, tensor{}, dropped_late};
  }
  return answer_now(self, dropped_late);
}

void invalidate(self_pointer self) {
  self->state.params_step.reset();
  self->state.params = tensor{};
}

caf::expected<std::vector<const float*>> unpack(self_pointer self, uint32_t worker,
                                                const std::vector<tensor>& values,
                                                const char* what, bool finite_checked) {
  auto& st = self->state;
  auto worker_name = [&st](uint32_t w) { return aggregator_detail::worker_name(st, w); };
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
  for (size_t i = 0; i < st.vars.size() && !finite_checked; ++i) {
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

namespace {

/// Applies one update to every variable, `apply(i, cell)` doing variable i's:
/// either every variable takes it or, if prepare_update refuses, none does.
template <class Apply>
caf::error update_each(self_pointer self, const update_what& what, Apply apply) {
  auto& st = self->state;
  if (auto err = prepare_update(self, what))
    return err;
  invalidate(self); // the cached flat parameters would make the update copy (COW)
  for (size_t i = 0; i < st.vars.size(); ++i) {
    if (auto err = apply(i, *st.vars[i].cell)) {
      // Only an allocation can fail here (prepare_update checked the rest):
      // say which variables did take the update.
      std::vector<std::string> took(st.spec.variables.begin(), st.spec.variables.begin() + i);
      auto msg = fmt::format("aggregator '{}': the {} failed at variable '{}' ({}); the variables "
                             "before it [{}] took it",
                             st.spec.name, what.str(), st.spec.variables[i], describe(err),
                             fmt::join(took, ", "));
      log::get()->error("{}", msg);
      return make_error(af_error::resource_exhausted, std::move(msg));
    }
  }
  invalidate(self);
  return caf::none;
}

} // namespace

caf::error update_all(self_pointer self, const std::vector<const float*>& parts,
                      const update_what& what) {
  auto& st = self->state;
  bool average = st.spec.mode == "average";
  return update_each(self, what, [&](size_t i, variable_cell& cell) {
    return average ? cell.assign_floats(parts[i], st.sizes[i])
                   : cell.apply_gradient(st.spec.optimizer, parts[i], st.sizes[i], st.global_step);
  });
}

caf::error update_all_by_mean(self_pointer self, const update_what& what, tensor* flat) {
  auto& st = self->state;
  // Several variables answer as one flat buffer: each block is copied there
  // right after its update, from cache, instead of in a pass of its own.
  float* dst = nullptr;
  if (flat != nullptr && st.vars.size() > 1) {
    try {
      *flat = tensor{dtype::float32, {static_cast<int64_t>(st.total)}};
      dst = flat->mutable_data<float>();
    } catch (const std::bad_alloc&) {
      *flat = tensor{}; // params() makes it later, or says it cannot
    }
  }
  return update_each(self, what, [&](size_t i, variable_cell& cell) {
    if (st.is_table[i]) // the members' rows, once (aggregator_sparse.cpp)
      return apply_table_mean(self, i, cell);
    auto base = st.round_offsets[i]; // the round sums only the dense variables
    variable_cell::block_updated copy;
    if (dst != nullptr)
      copy = [to = dst + base](size_t offset, size_t n, const float* values) {
        std::memcpy(to + offset, values, n * sizeof(float));
      };
    // Spread across the cores: every member of the round waits for it.
    // mean_into only reads the round, and `copy` writes its own blocks.
    return cell.apply_gradient_by(
      st.spec.optimizer,
      [&st, base](size_t offset, size_t n, float* out) {
        st.round.mean_into(base + offset, n, out);
      },
      st.sizes[i], st.global_step, copy, true);
  });
}

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

caf::error apply_now(self_pointer self, uint32_t worker, uint64_t step, const push_credentials& who,
                     const std::vector<tensor>& grads, bool moves_step) {
  auto& st = self->state;
  const uint64_t seq = who.seq;
  auto& m = member(st, worker);
  if (grads.empty()) {
    m.stats.refused += 1;
    m.seq_taken = std::max(m.seq_taken, seq);
    return caf::none;
  }
  auto parts = unpack(self, worker, grads, "gradient", who.finite_checked);
  if (!parts)
    return std::move(parts.error());
  std::vector<float> scaled;
  guard_gradient(self, worker, *parts, scaled);
  auto what = [&] { return fmt::format("gradient of {} (step {})", worker_name(st, worker), step); };
  if (auto err = update_all(self, *parts, what))
    return err;
  count_applied(self, worker, step, seq, moves_step);
  return caf::none;
}

caf::error apply_sparse_now(self_pointer self, uint32_t worker, uint64_t step,
                            const push_credentials& who, const sparse_push_values& values,
                            bool moves_step) {
  auto& st = self->state;
  auto& m = member(st, worker);
  if (values.empty()) {
    m.stats.refused += 1;
    m.seq_taken = std::max(m.seq_taken, who.seq);
    return caf::none;
  }
  // Every id of every table checked before any variable changes.
  auto parts = unpack_sparse(self, worker, values);
  if (!parts)
    return std::move(parts.error());
  guard_sparse(self, worker, *parts);
  auto what = [&] {
    return fmt::format("sparse gradient of {} (step {})", worker_name(st, worker), step);
  };
  auto err = update_each(self, what, [&](size_t i, variable_cell& cell) -> caf::error {
    if (!st.is_table[i])
      return cell.apply_gradient(st.spec.optimizer, parts->dense[i], st.sizes[i], st.global_step);
    if (parts->ids[i].num_elements() == 0)
      return caf::none;
    return cell.apply_sparse_gradient(st.spec.optimizer, parts->ids[i], parts->rows[i],
                                      st.global_step);
  });
  if (err)
    return err;
  count_applied(self, worker, step, who.seq, moves_step);
  return caf::none;
}

void count_applied(self_pointer self, uint32_t worker, uint64_t step, uint64_t seq,
                   bool moves_step) {
  auto& st = self->state;
  auto& m = member(st, worker);
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
}

caf::error other_kind(const aggregator_actor_state& st, uint32_t worker, const char* sent) {
  return make_error(af_error::mode_changed,
                    fmt::format("aggregator '{}' runs {} now, and {} pushed {}: its worker "
                                "changes its loop to the job's mode",
                                st.spec.name, st.spec.mode, worker_name(st, worker), sent));
}

caf::error ahead_of(const aggregator_actor_state& st, uint32_t worker, uint64_t step) {
  return make_error(af_error::invalid_argument,
                    fmt::format("{} pushed a gradient of step {} to aggregator '{}', whose "
                                "global step is {}",
                                worker_name(st, worker), step, st.spec.name, st.global_step));
}

} // namespace af::aggregator_detail
