// Sparse pushes (messages/aggregator.hpp's push, sparse): an aggregator whose
// spec names tables takes their gradients as the rows a step touched, checks
// every id before anything changes, and applies them through
// variable_cell::apply_sparse_gradient: at once (async, ssp), or once per
// sync round, the members' rows concatenated and scaled to their mean.
#include "dist/aggregator_detail.hpp"

#include <algorithm>
#include <cmath>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "core/log.hpp"
#include "kernels/sparse.hpp"
#include "messages/error.hpp"
#include "train/optimizer.hpp"

namespace af::aggregator_detail {

namespace {

/// A non-finite gradient of a sparse push: counted and refused as unpack does.
caf::error refuse_non_finite(self_pointer self, uint32_t worker, const std::string& var,
                             size_t bad, float value) {
  auto& st = self->state;
  auto msg = fmt::format("gradient of {} for variable '{}' is not finite (element {} is {}): "
                         "refused, the variable keeps its value",
                         worker_name(st, worker), var, bad, value);
  st.stats.refused += 1;
  member(st, worker).stats.refused += 1;
  st.stats.last_refusal = msg;
  log::get()->warn("aggregator '{}': {}", st.spec.name, msg);
  return make_error(af_error::non_finite, std::move(msg));
}

/// Table `i`'s ids and rows of a push checked: dtypes, shapes, every id in range.
caf::error check_table_part(self_pointer self, uint32_t worker, size_t i, const tensor& ids,
                            const tensor& rows) {
  auto& st = self->state;
  const auto& spec = st.vars[i].cell->spec();
  auto refuse = [&](af_error code, const std::string& why) {
    return make_error(code, fmt::format("sparse gradient of {} for table '{}' on {}: {}; "
                                        "refused, no variable changed",
                                        worker_name(st, worker), st.spec.variables[i],
                                        spec.device.empty() ? std::string{"this node"}
                                                            : spec.device,
                                        why));
  };
  if (ids.empty() || ids.shape().size() != 1
      || (ids.type() != dtype::int32 && ids.type() != dtype::int64))
    return refuse(af_error::invalid_argument,
                  "ids " + (ids.empty() ? std::string{"empty"} : ids.summary())
                    + ", expected 1-D int32 or int64");
  shape_type want{ids.shape()[0]};
  want.insert(want.end(), spec.shape.begin() + 1, spec.shape.end());
  if (rows.type() != dtype::float32 || rows.shape() != want)
    return refuse(af_error::shape_mismatch,
                  "rows " + (rows.empty() ? std::string{"empty"} : rows.summary())
                    + ", expected float32" + shape_string(want));
  if (auto bad = kernels::check_ids(ids, spec.shape[0], "indices"); !bad.ok())
    return refuse(af_error::invalid_argument, bad.error);
  return caf::none;
}

} // namespace

caf::expected<sparse_parts> unpack_sparse(self_pointer self, uint32_t worker,
                                          const sparse_push_values& values) {
  auto& st = self->state;
  const size_t n = st.vars.size();
  sparse_parts out;
  out.dense.assign(n, nullptr);
  out.ids.resize(n);
  out.rows.resize(n);
  const size_t dense_vars = n - st.tables;
  size_t dense_total = 0;
  for (size_t i = 0; i < n; ++i)
    if (!st.is_table[i])
      dense_total += st.sizes[i];
  if (values.ids.size() != st.tables || values.rows.size() != st.tables)
    return make_error(af_error::invalid_argument,
                      fmt::format("sparse gradient of {} to aggregator '{}': {} ids and {} rows "
                                  "for its {} tables [{}]",
                                  worker_name(st, worker), st.spec.name, values.ids.size(),
                                  values.rows.size(), st.tables,
                                  fmt::join(st.spec.sparse, ", ")));
  // The dense variables: one tensor each, or one flat tensor of them all.
  bool flat = values.dense.size() == 1 && dense_vars != 1;
  if (!flat && values.dense.size() != dense_vars)
    return make_error(af_error::invalid_argument,
                      fmt::format("sparse gradient of {} to aggregator '{}': {} dense tensors for "
                                  "its {} dense variables",
                                  worker_name(st, worker), st.spec.name, values.dense.size(),
                                  dense_vars));
  if (flat && (values.dense[0].type() != dtype::float32
               || values.dense[0].num_elements() != dense_total))
    return make_error(af_error::shape_mismatch,
                      fmt::format("sparse gradient of {} to aggregator '{}': {} flat dense values, "
                                  "expected {} floats",
                                  worker_name(st, worker), st.spec.name,
                                  values.dense[0].summary(), dense_total));
  size_t d = 0, t = 0, offset = 0;
  for (size_t i = 0; i < n; ++i) {
    if (st.is_table[i]) {
      if (auto err = check_table_part(self, worker, i, values.ids[t], values.rows[t]))
        return err;
      out.ids[i] = values.ids[t];
      out.rows[i] = values.rows[t];
      ++t;
      continue;
    }
    if (flat) {
      out.dense[i] = values.dense[0].data<float>() + offset;
      offset += st.sizes[i];
      continue;
    }
    const auto& g = values.dense[d++];
    const auto& spec = st.vars[i].cell->spec();
    bool flat_ok = g.shape().size() == 1 && g.num_elements() == st.sizes[i];
    if (g.type() != dtype::float32 || (g.shape() != spec.shape && !flat_ok))
      return make_error(af_error::shape_mismatch,
                        fmt::format("gradient of {} for variable '{}' is {}, the variable is "
                                    "float32{}",
                                    worker_name(st, worker), st.spec.variables[i],
                                    g.empty() ? std::string{"empty"} : g.summary(),
                                    shape_string(spec.shape)));
    out.dense[i] = g.data<float>();
  }
  for (size_t i = 0; i < n; ++i) {
    const float* p = st.is_table[i] ? out.rows[i].data<float>() : out.dense[i];
    size_t count = st.is_table[i] ? out.rows[i].num_elements() : st.sizes[i];
    auto bad = train::first_non_finite(p, count);
    if (bad < count)
      return refuse_non_finite(self, worker, st.spec.variables[i], bad, p[bad]);
  }
  return out;
}

void guard_sparse(self_pointer self, uint32_t worker, sparse_parts& parts) {
  auto& st = self->state;
  if (!st.guard.enabled())
    return;
  double sum = 0;
  for (size_t i = 0; i < st.vars.size(); ++i) {
    const float* p = st.is_table[i] ? parts.rows[i].data<float>() : parts.dense[i];
    size_t count = st.is_table[i] ? parts.rows[i].num_elements() : st.sizes[i];
    for (size_t k = 0; k < count; ++k)
      sum += static_cast<double>(p[k]) * static_cast<double>(p[k]);
  }
  auto norm = std::sqrt(sum);
  auto median = st.guard.median();
  auto factor = st.guard.admit(norm);
  if (factor >= 1)
    return;
  size_t dense_total = 0;
  for (size_t i = 0; i < st.vars.size(); ++i)
    if (!st.is_table[i])
      dense_total += st.sizes[i];
  parts.scaled.resize(dense_total);
  size_t at = 0;
  for (size_t i = 0; i < st.vars.size(); ++i) {
    if (st.is_table[i]) {
      tensor scaled{dtype::float32, parts.rows[i].shape()};
      const float* src = parts.rows[i].data<float>();
      float* dst = scaled.mutable_data<float>();
      for (size_t k = 0; k < scaled.num_elements(); ++k)
        dst[k] = static_cast<float>(src[k] * factor);
      parts.rows[i] = std::move(scaled);
      continue;
    }
    float* dst = parts.scaled.data() + at;
    for (size_t k = 0; k < st.sizes[i]; ++k)
      dst[k] = static_cast<float>(parts.dense[i][k] * factor);
    parts.dense[i] = dst;
    at += st.sizes[i];
  }
  auto& m = member(st, worker);
  m.stats.guarded += 1;
  if ((m.stats.guarded & (m.stats.guarded - 1)) == 0)
    log::get()->warn("aggregator '{}': the sparse gradient of {} at global step {} has norm "
                     "{:.4g}, {:.3g} times the median {:.4g} of the recent ones: scaled down to "
                     "grad_norm_guard = {} times it ({} of its pushes so far)",
                     st.spec.name, worker_name(st, worker), st.global_step, norm,
                     median > 0 ? norm / median : 0.0, median, st.guard.limit(),
                     m.stats.guarded);
}

caf::error add_to_round_sparse(self_pointer self, uint32_t worker, sparse_push_values& values) {
  auto& st = self->state;
  auto& m = member(st, worker);
  if (!values.empty()) {
    auto parts = unpack_sparse(self, worker, values);
    if (!parts)
      return std::move(parts.error());
    guard_sparse(self, worker, *parts);
    // The dense variables join the round's sum (kept by reference, as a
    // dense push's); the tables' rows wait on the member for the release.
    std::vector<const float*> dense;
    std::vector<size_t> offsets, sizes;
    for (size_t i = 0; i < st.vars.size(); ++i)
      if (!st.is_table[i]) {
        dense.push_back(parts->dense[i]);
        offsets.push_back(st.round_offsets[i]);
        sizes.push_back(st.sizes[i]);
      }
    // Moved, not copied: a moved tensor or vector keeps its buffer, so
    // `dense` (and the rows kept below) stay valid.
    auto owner = std::make_shared<std::pair<sparse_push_values, std::vector<float>>>(
      std::move(values), std::move(parts->scaled));
    st.round.add(dense, offsets, sizes, std::move(owner));
    m.round_ids = std::move(parts->ids);
    m.round_rows = std::move(parts->rows);
    m.contributed = true;
  } else {
    m.stats.refused += 1;
  }
  return caf::none;
}

push_result join_round_sparse(self_pointer self, uint32_t worker, uint64_t step,
                              const push_credentials& who, sparse_push_values& values) {
  auto& st = self->state;
  if (auto err = add_to_round_sparse(self, worker, values))
    return err;
  auto r = park(self, worker, step, who);
  if (st.round.complete(st.spec.replicas_to_aggregate))
    release_sync(self);
  return r;
}

caf::error apply_table_mean(self_pointer self, size_t i, variable_cell& cell) {
  auto& st = self->state;
  const auto& spec = cell.spec();
  int64_t n = 0;
  for (const auto& m : st.members)
    if (m.contributed && i < m.round_ids.size() && !m.round_ids[i].empty())
      n += static_cast<int64_t>(m.round_ids[i].num_elements());
  if (n == 0)
    return caf::none; // no member touched the table this round
  const size_t row = st.sizes[i] / static_cast<size_t>(spec.shape[0] > 0 ? spec.shape[0] : 1);
  shape_type shape{n};
  shape.insert(shape.end(), spec.shape.begin() + 1, spec.shape.end());
  tensor ids{dtype::int64, {n}};
  tensor rows{dtype::float32, shape};
  // The mean dense sync applies: each member's rows times 1 / contributions
  // (abstentions not counted); repeated ids add up in apply_sparse_gradient.
  const auto contributions = st.round.contributions();
  const float scale = contributions > 1 ? 1.0f / static_cast<float>(contributions) : 1.0f;
  auto* id_out = ids.mutable_data<int64_t>();
  auto* row_out = rows.mutable_data<float>();
  for (const auto& m : st.members) {
    if (!m.contributed || i >= m.round_ids.size() || m.round_ids[i].empty())
      continue;
    const auto& mid = m.round_ids[i];
    const size_t k = mid.num_elements();
    for (size_t j = 0; j < k; ++j)
      *id_out++ = kernels::integer_at(mid, j);
    const float* src = m.round_rows[i].data<float>();
    for (size_t j = 0; j < k * row; ++j)
      *row_out++ = src[j] * scale;
  }
  return cell.apply_sparse_gradient(st.spec.optimizer, ids, rows, st.global_step);
}

caf::error wrong_form(const aggregator_actor_state& st, uint32_t worker, bool sparse_sent) {
  if (sparse_sent)
    return make_error(af_error::invalid_argument,
                      fmt::format("{} sent a sparse push to aggregator '{}' ({}), which has no "
                                  "tables{}: push its gradients dense",
                                  worker_name(st, worker), st.spec.name, st.spec.mode,
                                  st.spec.mode == "average" ? " (average takes parameters)" : ""));
  return make_error(af_error::invalid_argument,
                    fmt::format("{} sent a dense push to aggregator '{}', whose tables [{}] take "
                                "sparse gradients: push (ids, rows) for them (push, sparse)",
                                worker_name(st, worker), st.spec.name,
                                fmt::join(st.spec.sparse, ", ")));
}

caf::expected<tensor> answer_params(self_pointer self) {
  if (self->state.tables > 0)
    return tensor{};
  return params(self);
}

caf::error check_tables(const aggregator_spec& spec,
                        const std::vector<variable_directory::entry>& vars) {
  if (spec.sparse.empty())
    return caf::none;
  if (spec.mode == "average")
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}': average mode cannot take sparse gradients "
                                  "(tables [{}]): averaging, like allreduce, exchanges whole "
                                  "parameters; train a job with tables in sync, async or ssp",
                                  spec.name, fmt::join(spec.sparse, ", ")));
  for (const auto& name : spec.sparse) {
    auto it = std::find(spec.variables.begin(), spec.variables.end(), name);
    if (it == spec.variables.end())
      return make_error(af_error::invalid_argument,
                        fmt::format("aggregator '{}': sparse table '{}' is not one of its "
                                    "variables [{}]",
                                    spec.name, name, fmt::join(spec.variables, ", ")));
    auto i = static_cast<size_t>(it - spec.variables.begin());
    if (i < vars.size() && vars[i].cell && vars[i].cell->spec().shape.empty())
      return make_error(af_error::invalid_argument,
                        fmt::format("aggregator '{}': table '{}' is a scalar; a table has rows",
                                    spec.name, name));
  }
  return caf::none;
}

} // namespace af::aggregator_detail
