// One sparse step on a worker (dist/sparse_step.hpp): unique ids per table,
// routed to their shards, gathered from every ps at once, the model's step,
// and one sparse push per ps, again at once.
#include "dist/sparse_step.hpp"

#include <cstring>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "messages/error.hpp"

namespace af {

namespace {

/// A frame's bytes on the wire: its header, name and payload.
uint64_t frame_bytes(const std::string& name, uint64_t payload) {
  return sizeof(wire::header) + name.size() + payload;
}

} // namespace

caf::expected<tensor> data_plane_ps_link::gather_rows(const std::string& var, const tensor& ids) {
  auto r = channel_->gather_rows(var, ids, wait_);
  if (!r)
    return std::move(r.error());
  sent_ += frame_bytes(var, ids.nbytes());
  received_ += frame_bytes({}, r->first.nbytes());
  return std::move(r->first);
}

caf::expected<tensor> data_plane_ps_link::read(const std::string& var) {
  auto r = channel_->call(var_op::read, var, nullptr, true, 0, wait_);
  if (!r)
    return std::move(r.error());
  sent_ += frame_bytes(var, 0);
  received_ += frame_bytes({}, r->first.nbytes());
  return std::move(r->first);
}

caf::expected<std::pair<uint64_t, bool>> data_plane_ps_link::push(uint64_t step,
                                                                 const sparse_push_values& values) {
  bool late = false;
  // Each push gets the next number; one sent again after reconnect() (its
  // connection broke before the answer) keeps its own, so that a ps that
  // took it answers without applying it twice.
  auto seq = resend_ ? seq_ : ++seq_;
  resend_ = false;
  unanswered_ = true;
  auto r = channel_->push_sparse(aggregator_, worker_, step, values.dense, values.ids, values.rows,
                                 wait_, token_, seq, &late);
  if (!r)
    return std::move(r.error());
  unanswered_ = false;
  // docs/wire.md "Sparse tables": the push prefix (token, number), a count
  // per table, then the parts (ids as int64).
  uint64_t payload = 24 + 8 * values.ids.size();
  for (const auto& t : values.dense)
    payload += t.nbytes();
  for (const auto& t : values.ids)
    payload += t.num_elements() * sizeof(int64_t);
  for (const auto& t : values.rows)
    payload += t.nbytes();
  sent_ += frame_bytes(aggregator_, payload);
  received_ += frame_bytes({}, 0);
  return std::make_pair(*r, late);
}

void data_plane_ps_link::reconnect(std::unique_ptr<data_channel> channel, std::string token,
                                   uint64_t last_seq) {
  channel_ = std::move(channel);
  if (!token.empty()) {
    token_ = std::move(token);
    seq_ = last_seq;
    unanswered_ = resend_ = false;
  } else {
    resend_ = unanswered_;
  }
}

namespace {

tensor int64s(const std::vector<int64_t>& v) {
  tensor t{dtype::int64, {static_cast<int64_t>(v.size())}};
  if (!v.empty())
    std::memcpy(t.mutable_data<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

/// The first error of `errs` (by ps), named after its ps.
caf::error first_error(const std::vector<caf::error>& errs, const char* what) {
  for (size_t p = 0; p < errs.size(); ++p)
    if (errs[p])
      return make_error(af_error::aborted,
                        fmt::format("sparse step: {} of ps {} failed: {}", what, p,
                                    describe(errs[p])));
  return caf::none;
}

} // namespace

caf::expected<sparse_fetch> fetch_sparse_rows(const std::vector<train::table_spec>& specs,
                                              const sparse_layout& layout,
                                              const std::vector<sparse_ps_link*>& links,
                                              const train::sparse_batch& batch,
                                              ps_threads& threads, const sparse_lanes* lanes) {
  const size_t T = layout.tables.size();
  const size_t P = links.size();
  if (batch.ids.size() != T || specs.size() != T || layout.ps_order.size() != P)
    return make_error(af_error::invalid_argument,
                      fmt::format("sparse step: the batch has ids of {} tables, the model {} and "
                                  "the layout {} (over {} ps, {} links)",
                                  batch.ids.size(), specs.size(), T, layout.ps_order.size(), P));
  // 1. Each table's ids once (in order of first occurrence), and each
  //    unique id's shard and row there. Every id checked before any request.
  sparse_fetch f;
  auto& index = f.index;
  auto& unique = f.unique;
  auto& parts = f.parts;
  index.resize(T);
  unique.assign(T, 0);
  parts.resize(T);
  for (size_t t = 0; t < T; ++t) {
    const auto& table = layout.tables[t];
    parts[t].resize(table.shard_vars.size());
    std::unordered_map<int64_t, int32_t> seen;
    index[t].reserve(batch.ids[t].size());
    for (size_t e = 0; e < batch.ids[t].size(); ++e) {
      auto id = batch.ids[t][e];
      if (!table.router.contains(id))
        return make_error(af_error::invalid_argument,
                          fmt::format("sparse step: table '{}': ids[{}] = {} is not a row of the "
                                      "table: not in [0, {})",
                                      specs[t].name, e, id, table.router.total_rows()));
      auto [it, fresh] = seen.emplace(id, static_cast<int32_t>(unique[t]));
      if (fresh) {
        auto place = table.router.place(id);
        auto& part = parts[t].at(static_cast<size_t>(place.shard));
        part.rows.push_back(place.row);
        part.places.push_back(it->second);
        unique[t] += 1;
      }
      index[t].push_back(it->second);
    }
  }
  // 2. Every ps at once: its shards' rows, its dense parameters' values.
  auto& rows = f.rows;
  rows.resize(T);
  for (size_t t = 0; t < T; ++t)
    rows[t] = tensor{dtype::float32, {unique[t], specs[t].width}};
  auto& dense = f.dense;
  dense.resize(layout.dense_vars.size());
  // Taken before the threads: each writes rows of its own shards only.
  std::vector<float*> row_ptr(T);
  for (size_t t = 0; t < T; ++t)
    row_ptr[t] = rows[t].mutable_data<float>();
  // Slot `slot` of ps p read through `link`: a dense parameter's value, or
  // the rows of a shard into the table's unique rows.
  auto read_slot = [&](sparse_ps_link* link, const sparse_layout::slot& slot) -> caf::error {
    if (!slot.table) {
      auto v = link->read(layout.dense_vars[slot.index]);
      if (!v)
        return std::move(v.error());
      dense[slot.index] = std::move(*v);
      return caf::none;
    }
    const auto& part = parts[slot.index][slot.shard];
    if (part.rows.empty())
      return caf::none;
    auto got = link->gather_rows(layout.tables[slot.index].shard_vars[slot.shard],
                                 int64s(part.rows));
    if (!got)
      return std::move(got.error());
    const auto width = static_cast<size_t>(specs[slot.index].width);
    float* dst = row_ptr[slot.index];
    for (size_t j = 0; j < part.places.size(); ++j)
      std::memcpy(dst + static_cast<size_t>(part.places[j]) * width,
                  got->data<float>() + j * width, width * sizeof(float));
    return caf::none;
  };
  std::vector<caf::error> errs(P);
  if (lanes != nullptr) {
    // One connection per slot: every slot of every ps at once.
    std::vector<std::pair<size_t, size_t>> work; // (ps, slot)
    bool fits = lanes->size() == P;
    for (size_t p = 0; p < P && fits; ++p) {
      fits = (*lanes)[p].size() >= layout.ps_order[p].size();
      for (size_t i = 0; i < layout.ps_order[p].size(); ++i)
        work.emplace_back(p, i);
    }
    if (!fits || threads.size() < work.size())
      return make_error(af_error::invalid_argument,
                        fmt::format("sparse step: {} lanes for {} ps and {} threads for {} slots: "
                                    "a lane per slot of every ps, and a thread per lane",
                                    lanes->size(), P, threads.size(), work.size()));
    std::vector<caf::error> slot_errs(work.size());
    threads.run(work.size(), [&](size_t k) {
      auto [p, i] = work[k];
      slot_errs[k] = read_slot((*lanes)[p][i], layout.ps_order[p][i]);
    });
    for (size_t k = 0; k < work.size(); ++k)
      if (slot_errs[k] && !errs[work[k].first])
        errs[work[k].first] = std::move(slot_errs[k]);
  } else {
    threads.run(P, [&](size_t p) {
      for (const auto& slot : layout.ps_order[p])
        if (auto err = read_slot(links[p], slot)) {
          errs[p] = std::move(err);
          return;
        }
    });
  }
  if (auto err = first_error(errs, "reading rows"))
    return err;
  return f;
}

caf::expected<std::vector<float>> predict_sparse_remote(train::sparse_model& model,
                                                        const sparse_layout& layout,
                                                        const std::vector<sparse_ps_link*>& links,
                                                        const train::sparse_batch& batch,
                                                        ps_threads& threads,
                                                        const sparse_lanes* lanes) {
  auto f = fetch_sparse_rows(model.tables(), layout, links, batch, threads, lanes);
  if (!f)
    return std::move(f.error());
  auto r = model.step(f->rows, f->index, f->dense, batch.labels, false);
  if (!r)
    return make_error(r.error().code, "sparse predictions: " + r.error().what);
  return std::move(r->predictions);
}

caf::expected<sparse_step_report> run_sparse_step(train::sparse_model& model,
                                                  const sparse_layout& layout,
                                                  const std::vector<sparse_ps_link*>& links,
                                                  const train::sparse_batch& batch,
                                                  uint64_t step, ps_threads& threads,
                                                  const sparse_lanes* lanes) {
  const size_t T = layout.tables.size();
  const size_t P = links.size();
  auto specs = model.tables();
  auto f = fetch_sparse_rows(specs, layout, links, batch, threads, lanes);
  if (!f)
    return std::move(f.error());
  const auto& unique = f->unique;
  const auto& parts = f->parts;
  std::vector<caf::error> errs(P);
  // 3. The model on those rows.
  auto r = model.step(f->rows, f->index, f->dense, batch.labels, true);
  if (!r)
    return make_error(r.error().code, "sparse step: " + r.error().what);
  if (r->row_grads.size() != T || r->dense_grads.size() != layout.dense_vars.size())
    return make_error(af_error::internal,
                      fmt::format("sparse step: the model gave {} row gradients and {} dense "
                                  "ones for {} tables and {} dense parameters",
                                  r->row_grads.size(), r->dense_grads.size(), T,
                                  layout.dense_vars.size()));
  // 4. Every ps at once: its shards' row gradients (their own row ids) and
  //    its dense gradients, in its aggregator's order.
  sparse_step_report out;
  out.global_steps.assign(P, 0);
  std::vector<uint8_t> late(P, 0); // not vector<bool>: the threads write their own elements
  std::vector<const float*> grad_ptr(T);
  for (size_t t = 0; t < T; ++t) {
    if (r->row_grads[t].num_elements() != static_cast<size_t>(unique[t] * specs[t].width))
      return make_error(af_error::internal,
                        fmt::format("sparse step: the model's row gradients of table '{}' are "
                                    "{}, expected [{}, {}]",
                                    specs[t].name, r->row_grads[t].summary(), unique[t],
                                    specs[t].width));
    grad_ptr[t] = r->row_grads[t].data<float>();
  }
  threads.run(P, [&](size_t p) {
    sparse_push_values values;
    for (const auto& slot : layout.ps_order[p]) {
      if (!slot.table) {
        values.dense.push_back(r->dense_grads[slot.index]);
        continue;
      }
      const auto& part = parts[slot.index][slot.shard];
      const auto width = static_cast<size_t>(specs[slot.index].width);
      tensor g{dtype::float32, {static_cast<int64_t>(part.rows.size()), specs[slot.index].width}};
      const float* src = grad_ptr[slot.index];
      for (size_t j = 0; j < part.places.size(); ++j)
        std::memcpy(g.mutable_data<float>() + j * width,
                    src + static_cast<size_t>(part.places[j]) * width, width * sizeof(float));
      values.ids.push_back(int64s(part.rows));
      values.rows.push_back(std::move(g));
    }
    auto pushed = links[p]->push(step, values);
    if (!pushed) {
      errs[p] = std::move(pushed.error());
      return;
    }
    out.global_steps[p] = pushed->first;
    late[p] = pushed->second ? 1 : 0;
  });
  if (auto err = first_error(errs, "the push"))
    return err;
  out.dropped_late.assign(late.begin(), late.end());
  out.unique = unique;
  out.result = std::move(*r);
  return out;
}

} // namespace af
