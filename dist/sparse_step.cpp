// One sparse step on a worker (dist/sparse_step.hpp): unique ids per table,
// routed to their shards, gathered from every ps at once, the model's step,
// and one sparse push per ps, again at once: on one thread, every request
// out before any answer is read.
#include "dist/sparse_step.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>

#include <fmt/format.h>

#include "messages/error.hpp"

namespace af {

namespace {

/// A frame's bytes on the wire: its header, name and payload.
uint64_t frame_bytes(const std::string& name, uint64_t payload) {
  return sizeof(wire::header) + name.size() + payload;
}

} // namespace

caf::expected<tensor> sparse_ps_link::gather_rows(const std::string& var, const tensor& ids) {
  if (auto err = start_gather_rows(var, ids))
    return err;
  auto r = finish();
  if (!r)
    return std::move(r.error());
  return std::move(r->value);
}

caf::expected<tensor> sparse_ps_link::read(const std::string& var) {
  if (auto err = start_read(var))
    return err;
  auto r = finish();
  if (!r)
    return std::move(r.error());
  return std::move(r->value);
}

caf::expected<std::pair<uint64_t, bool>> sparse_ps_link::push(uint64_t step,
                                                             const sparse_push_values& values) {
  if (auto err = start_push(step, values))
    return err;
  auto r = finish();
  if (!r)
    return std::move(r.error());
  return std::make_pair(r->version, r->dropped_late);
}

caf::error data_plane_ps_link::start_gather_rows(const std::string& var, const tensor& ids) {
  asks_.push_back({var, ids});
  kinds_.push_back(kind::part);
  return caf::none;
}

caf::error data_plane_ps_link::start_read(const std::string& var) {
  asks_.push_back({var, tensor{}});
  kinds_.push_back(kind::part);
  return caf::none;
}

void data_plane_ps_link::flush() {
  // A frame carries at most wire::max_gather_parts reads: a phase with more
  // (a ps holding many dense variables) sends several.
  constexpr size_t most = wire::max_gather_parts;
  if (asks_.size() <= most) {
    send_batch(asks_);
  } else {
    for (size_t from = 0; from < asks_.size(); from += most) {
      auto to = std::min(asks_.size(), from + most);
      send_batch({asks_.begin() + static_cast<std::ptrdiff_t>(from),
                  asks_.begin() + static_cast<std::ptrdiff_t>(to)});
    }
  }
  asks_.clear();
}

void data_plane_ps_link::send_batch(const std::vector<data_channel::gather_ask>& asks) {
  if (asks.empty())
    return;
  const auto n = asks.size();
  caf::error err;
  uint64_t bytes = 0;
  if (n == 1) {
    const auto& a = asks.front();
    err = a.ids.empty() ? channel_->send_read(a.var, wait_)
                        : channel_->send_gather_rows(a.var, a.ids, wait_);
    bytes = frame_bytes(a.var, a.ids.nbytes());
  } else {
    err = channel_->send_gather_many(asks, wait_);
    uint64_t payload = 8 + sizeof(wire::gather_part) * n;
    for (const auto& a : asks)
      payload += a.var.size() + a.ids.nbytes();
    bytes = frame_bytes({}, (payload + 7) / 8 * 8);
  }
  // A frame that failed to go is not counted, and its reads answer with
  // the failure in their own turn: after the frames sent before it.
  if (!err)
    sent_ += bytes;
  batches_.push_back({n, std::move(err)});
}

caf::error data_plane_ps_link::start_push(uint64_t step, const sparse_push_values& values) {
  // Each push gets the next number; one sent again after reconnect() (its
  // connection broke before the answer) keeps its own, so that a ps that
  // took it answers without applying it twice.
  flush(); // the reads started before it go first
  auto seq = resend_ ? seq_ : ++seq_;
  resend_ = false;
  unanswered_ = true;
  if (auto err = channel_->send_push_sparse(aggregator_, worker_, step, values.dense, values.ids,
                                            values.rows, wait_, token_, seq))
    return err;
  kinds_.push_back(kind::push);
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
  return caf::none;
}

caf::expected<sparse_ps_link::answer> data_plane_ps_link::finish() {
  flush();
  bool push = !kinds_.empty() && kinds_.front() == kind::push;
  if (!kinds_.empty())
    kinds_.pop_front();
  if (!push && ready_.empty() && !batches_.empty()) {
    // The next frame of reads: its answer, split into one per read.
    auto n = batches_.front().reads;
    auto unsent = std::move(batches_.front().unsent);
    batches_.pop_front();
    auto r = unsent ? caf::expected<data_channel::answer>{std::move(unsent)}
                    : channel_->next_reply();
    if (r)
      received_ += frame_bytes({}, r->value.nbytes());
    if (r && n > 1) {
      auto parts = data_channel::split_gather_many(r->value, n);
      if (!parts)
        r = std::move(parts.error());
      else
        for (auto& a : *parts)
          ready_.push_back(answer{std::move(a.value), a.version, false});
    } else if (r) {
      ready_.push_back(answer{std::move(r->value), r->version, false});
    }
    if (!r)
      for (size_t i = 0; i < n; ++i)
        ready_.push_back(r.error());
  }
  if (!push && !ready_.empty()) {
    auto a = std::move(ready_.front());
    ready_.pop_front();
    if (!a && is(a.error(), af_error::timeout))
      return read_timed_out(a.error());
    return a;
  }
  auto r = channel_->next_reply();
  if (!r) {
    if (!push && is(r.error(), af_error::timeout))
      return read_timed_out(r.error());
    return std::move(r.error());
  }
  if (push)
    unanswered_ = false;
  received_ += frame_bytes({}, r->value.nbytes());
  return answer{std::move(r->value), r->version, r->dropped_late};
}

bool data_plane_ps_link::await_answer(std::chrono::steady_clock::time_point until) {
  flush(); // reads held back go out now (finish() would send them first)
  if (kinds_.empty())
    return true; // finish() fails at once
  if (kinds_.front() == kind::part
      && (!ready_.empty() || (!batches_.empty() && batches_.front().unsent)))
    return true;
  return channel_->await_reply(until);
}

caf::error data_plane_ps_link::read_timed_out(const caf::error& err) const {
  // The channel names the read's own wait (step_timeout_ms); what a user
  // can do about it is this layer's to say.
  return make_error(af_error::timeout,
                    reason_of(err)
                      + " (the read's wait is step_timeout_ms; a ps stopped with SIGSTOP, hung "
                        "or overloaded answers no read: continue it, or with "
                        "ps_recovery_timeout_ms the job waits for it as for one that died)");
}

void data_plane_ps_link::reconnect(std::unique_ptr<data_channel> channel, std::string token,
                                   uint64_t last_seq) {
  channel_ = std::move(channel);
  // Requests out on the old connection are lost with it (and reads held
  // back: the caller starts again what it still needs).
  kinds_.clear();
  asks_.clear();
  batches_.clear();
  ready_.clear();
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

void finish_as_answered(const std::vector<sparse_ps_link*>& links, const std::vector<uint8_t>& want,
                        const std::function<void(size_t)>& take) {
  std::vector<size_t> left;
  for (size_t p = 0; p < want.size(); ++p)
    if (want[p])
      left.push_back(p);
  constexpr auto slice = std::chrono::milliseconds{20};
  while (!left.empty()) {
    size_t pick = 0;
    // The first waited on, then (its slice over) the others looked at: the
    // usual step (every ps alive) costs one wait per link, no look.
    while (left.size() > 1) {
      if (links[left.front()]->await_answer(std::chrono::steady_clock::now() + slice))
        break;
      auto now = std::chrono::steady_clock::now();
      auto it = std::find_if(left.begin() + 1, left.end(),
                             [&](size_t p) { return links[p]->await_answer(now); });
      if (it != left.end()) {
        pick = static_cast<size_t>(it - left.begin());
        break;
      }
    }
    auto p = left[pick];
    left.erase(left.begin() + static_cast<std::ptrdiff_t>(pick));
    take(p);
  }
}

caf::error fetch_sparse_rows(const std::vector<train::table_spec>& specs,
                             const sparse_layout& layout, const std::vector<sparse_ps_link*>& links,
                             const train::sparse_batch& batch, sparse_fetch& f) {
  const size_t T = layout.tables.size();
  const size_t P = links.size();
  if (batch.ids.size() != T || specs.size() != T || layout.ps_order.size() != P)
    return make_error(af_error::invalid_argument,
                      fmt::format("sparse step: the batch has ids of {} tables, the model {} and "
                                  "the layout {} (over {} ps, {} links)",
                                  batch.ids.size(), specs.size(), T, layout.ps_order.size(), P));
  // 1. Each table's ids once (in order of first occurrence), and each
  //    unique id's shard and row there. Every id checked before any request.
  //    f's buffers from the last step are reused (cleared, not freed).
  auto& index = f.index;
  auto& unique = f.unique;
  auto& parts = f.parts;
  index.resize(T);
  unique.assign(T, 0);
  parts.resize(T);
  for (size_t t = 0; t < T; ++t) {
    const auto& table = layout.tables[t];
    parts[t].resize(table.shard_vars.size());
    for (auto& part : parts[t]) {
      part.rows.clear();
      part.places.clear();
    }
    index[t].clear();
    f.seen.reset(batch.ids[t].size());
    for (size_t e = 0; e < batch.ids[t].size(); ++e) {
      auto id = batch.ids[t][e];
      if (!table.router.contains(id))
        return make_error(af_error::invalid_argument,
                          fmt::format("sparse step: table '{}': ids[{}] = {} is not a row of the "
                                      "table: not in [0, {})",
                                      specs[t].name, e, id, table.router.total_rows()));
      auto [at, fresh] = f.seen.insert(id);
      if (fresh) {
        auto place = table.router.place(id);
        auto& part = parts[t].at(static_cast<size_t>(place.shard));
        part.rows.push_back(place.row);
        part.places.push_back(at);
        unique[t] += 1;
      }
      index[t].push_back(at);
    }
  }
  // 2. Every ps at once: its shards' rows, its dense parameters' values.
  auto& rows = f.rows;
  rows.resize(T);
  for (size_t t = 0; t < T; ++t)
    rows[t] = tensor{dtype::float32, {unique[t], specs[t].width}};
  auto& dense = f.dense;
  dense.resize(layout.dense_vars.size());
  std::vector<float*> row_ptr(T);
  for (size_t t = 0; t < T; ++t)
    row_ptr[t] = rows[t].mutable_data<float>();
  // Every request out first (ps by ps, each ps's slots in its order), then
  // every answer read: the ps serve them at once, on this one thread.
  std::vector<caf::error> errs(P);
  std::vector<size_t> started(P, 0); // per ps: the slots whose request went out
  for (size_t p = 0; p < P; ++p) {
    for (const auto& slot : layout.ps_order[p]) {
      caf::error err;
      if (!slot.table) {
        err = links[p]->start_read(layout.dense_vars[slot.index]);
      } else {
        const auto& part = parts[slot.index][slot.shard];
        if (part.rows.empty()) {
          started[p] += 1; // nothing to read: answered below without a request
          continue;
        }
        err = links[p]->start_gather_rows(layout.tables[slot.index].shard_vars[slot.shard],
                                          int64s(part.rows));
      }
      if (err) {
        errs[p] = std::move(err);
        break;
      }
      started[p] += 1;
    }
  }
  for (auto* link : links) // reads held back to go as one frame: out now, all of them
    link->flush();
  for (size_t p = 0; p < P; ++p) {
    for (size_t i = 0; i < started[p]; ++i) {
      const auto& slot = layout.ps_order[p][i];
      if (slot.table && parts[slot.index][slot.shard].rows.empty())
        continue;
      auto got = links[p]->finish(); // read even after an error: the link's next answer
      if (!got) {
        if (!errs[p])
          errs[p] = std::move(got.error());
        continue;
      }
      if (errs[p])
        continue;
      if (!slot.table) {
        dense[slot.index] = std::move(got->value);
        continue;
      }
      const auto& part = parts[slot.index][slot.shard];
      const auto width = static_cast<size_t>(specs[slot.index].width);
      if (got->value.type() != dtype::float32
          || got->value.num_elements() != part.rows.size() * width) {
        errs[p] = make_error(af_error::internal,
                             fmt::format("the rows of '{}' came back as {}, expected float32[{}, "
                                         "{}]",
                                         layout.tables[slot.index].shard_vars[slot.shard],
                                         got->value.summary(), part.rows.size(), width));
        continue;
      }
      float* dst = row_ptr[slot.index];
      const float* src = got->value.data<float>();
      for (size_t j = 0; j < part.places.size(); ++j)
        std::memcpy(dst + static_cast<size_t>(part.places[j]) * width, src + j * width,
                    width * sizeof(float));
    }
  }
  return first_error(errs, "reading rows");
}

caf::expected<sparse_fetch> fetch_sparse_rows(const std::vector<train::table_spec>& specs,
                                              const sparse_layout& layout,
                                              const std::vector<sparse_ps_link*>& links,
                                              const train::sparse_batch& batch) {
  sparse_fetch f;
  if (auto err = fetch_sparse_rows(specs, layout, links, batch, f))
    return err;
  return f;
}

caf::expected<std::vector<float>> predict_sparse_remote(train::sparse_model& model,
                                                        const sparse_layout& layout,
                                                        const std::vector<sparse_ps_link*>& links,
                                                        const train::sparse_batch& batch) {
  auto f = fetch_sparse_rows(model.tables(), layout, links, batch);
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
                                                  uint64_t step) {
  sparse_fetch scratch;
  return run_sparse_step(model, layout, links, batch, step, scratch);
}

caf::expected<sparse_step_report> run_sparse_step(train::sparse_model& model,
                                                  const sparse_layout& layout,
                                                  const std::vector<sparse_ps_link*>& links,
                                                  const train::sparse_batch& batch, uint64_t step,
                                                  sparse_fetch& f,
                                                  const std::vector<uint64_t>* ps_steps) {
  const size_t T = layout.tables.size();
  const size_t P = links.size();
  if (ps_steps && ps_steps->size() != P)
    return make_error(af_error::internal,
                      fmt::format("sparse step: {} steps for {} ps", ps_steps->size(), P));
  auto specs = model.tables();
  if (auto err = fetch_sparse_rows(specs, layout, links, batch, f))
    return err;
  const auto& unique = f.unique;
  const auto& parts = f.parts;
  std::vector<caf::error> errs(P);
  // 3. The model on those rows.
  auto r = model.step(f.rows, f.index, f.dense, batch.labels, true);
  if (!r)
    return make_error(r.error().code, "sparse step: " + r.error().what);
  // A loss gone to inf or NaN gives gradients the aggregators refuse as
  // "not finite", which says nothing of why nor what to do: said here,
  // before anything is pushed.
  if (!std::isfinite(r->loss))
    return make_error(af_error::non_finite,
                      fmt::format("sparse step at global step {}: the loss is {}: the model "
                                  "diverged (lower learning_rate, or restore a checkpoint); "
                                  "nothing pushed",
                                  step, r->loss));
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
  out.dropped_late.assign(P, false);
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
  // Every ps's push out, then every answer read (a sync push's answer
  // waits for the round: the ps wait for the other workers at once).
  std::vector<uint8_t> sent(P, 0);
  sparse_push_values values;
  for (size_t p = 0; p < P; ++p) {
    values.dense.clear();
    values.ids.clear();
    values.rows.clear();
    for (const auto& slot : layout.ps_order[p]) {
      if (!slot.table) {
        values.dense.push_back(r->dense_grads[slot.index]);
        continue;
      }
      const auto& part = parts[slot.index][slot.shard];
      const auto width = static_cast<size_t>(specs[slot.index].width);
      tensor g{dtype::float32, {static_cast<int64_t>(part.rows.size()), specs[slot.index].width}};
      const float* src = grad_ptr[slot.index];
      float* dst = g.mutable_data<float>();
      for (size_t j = 0; j < part.places.size(); ++j)
        std::memcpy(dst + j * width, src + static_cast<size_t>(part.places[j]) * width,
                    width * sizeof(float));
      values.ids.push_back(int64s(part.rows));
      values.rows.push_back(std::move(g));
    }
    if (auto err = links[p]->start_push(ps_steps ? (*ps_steps)[p] : step, values))
      errs[p] = std::move(err);
    else
      sent[p] = 1;
  }
  // Read as they come, not in the ps' order: a ps that died (its
  // connection's end is in) goes through its recovery at once, while
  // another's sync round may wait for a worker that waits for that very
  // recovery (the chief restores the ps): read in turn, the chief sat in
  // that round until its step_timeout_ms abandoned it, and the job failed.
  finish_as_answered(links, sent, [&](size_t p) {
    auto pushed = links[p]->finish();
    if (!pushed) {
      errs[p] = std::move(pushed.error());
      return;
    }
    out.global_steps[p] = pushed->version;
    out.dropped_late[p] = pushed->dropped_late;
  });
  if (auto err = first_error(errs, "the push"))
    return err;
  out.unique = unique;
  out.result = std::move(*r);
  return out;
}

} // namespace af
