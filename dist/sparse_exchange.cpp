#include "dist/sparse_exchange.hpp"

#include <algorithm>
#include <cstring>
#include <future>
#include <unordered_map>

#include <fmt/format.h>

#include "graph/embedding.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

/// Runs `fn(k)` for every ps k, each on its own thread when there are
/// several (their round trips overlap), and returns the first error.
template <class F>
caf::error for_each_ps(size_t n, F fn) {
  if (n == 1)
    return fn(size_t{0});
  std::vector<std::future<caf::error>> done;
  done.reserve(n);
  for (size_t k = 0; k < n; ++k)
    done.push_back(std::async(std::launch::async, fn, k));
  caf::error first;
  for (auto& f : done) // every thread is joined before returning
    if (auto err = f.get(); err && !first)
      first = std::move(err);
  return first;
}

tensor ids_tensor(const std::vector<int64_t>& ids) {
  return tensor::from_values<int64_t>({static_cast<int64_t>(ids.size())}, ids);
}

} // namespace

caf::expected<table_step> route_ids(const routed_table& t, const std::vector<int64_t>& ids) {
  table_step out;
  auto shards = t.router.shard_rows().size();
  out.local.resize(shards);
  out.place.resize(shards);
  out.index.reserve(ids.size());
  std::unordered_map<int64_t, int32_t> seen;
  seen.reserve(ids.size() * 2);
  for (size_t e = 0; e < ids.size(); ++e) {
    auto id = ids[e];
    if (!t.router.contains(id))
      return make_error(af_error::invalid_argument,
                        fmt::format("table '{}': example {} looks up id {}, not a row of the "
                                    "table: not in [0, {})",
                                    t.spec.name, e, id, t.router.total_rows()));
    auto [it, fresh] = seen.emplace(id, static_cast<int32_t>(out.unique.size()));
    if (fresh) {
      auto where = t.router.place(id);
      out.local[where.shard].push_back(where.row);
      out.place[where.shard].push_back(it->second);
      out.unique.push_back(id);
    }
    out.index.push_back(it->second);
  }
  return out;
}

caf::expected<fetched_rows> sparse_exchange::fetch(const std::vector<table_step>& steps) {
  fetched_rows out;
  out.rows.resize(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t)
    out.rows[t] = tensor(dtype::float32, {static_cast<int64_t>(steps[t].unique.size()),
                                          tables_[t].spec.width});
  // Each ps writes the distinct rows of its own shards: no two threads
  // write one row, and the buffers are taken before any thread starts.
  std::vector<float*> dst(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t)
    dst[t] = out.rows[t].mutable_data<float>();
  out.dense.resize(dense_names_.size());
  std::vector<uint64_t> bytes(ps_.size(), 0);
  auto err = for_each_ps(ps_.size(), [&](size_t k) -> caf::error {
    auto& p = ps_[k];
    for (size_t t = 0; t < tables_.size(); ++t) {
      const auto& local = steps[t].local[k];
      if (local.empty())
        continue;
      auto width = static_cast<size_t>(tables_[t].spec.width);
      auto r = p.chan->gather_rows(shard_name(tables_[t].spec.name, k), ids_tensor(local),
                                   timeout_);
      if (!r)
        return std::move(r.error());
      if (r->first.num_elements() != local.size() * width)
        return make_error(af_error::internal,
                          fmt::format("{}: {} rows of '{}' asked, {} floats came back", p.task,
                                      local.size(), tables_[t].spec.name,
                                      r->first.num_elements()));
      bytes[k] += local.size() * sizeof(int64_t) + r->first.nbytes();
      const float* src = r->first.data<float>();
      const auto& place = steps[t].place[k];
      for (size_t i = 0; i < local.size(); ++i)
        std::memcpy(dst[t] + static_cast<size_t>(place[i]) * width, src + i * width,
                    width * sizeof(float));
    }
    if (p.dense)
      for (size_t d = 0; d < dense_names_.size(); ++d) {
        auto r = p.chan->call(var_op::read, dense_names_[d], nullptr, true, 0, timeout_);
        if (!r)
          return std::move(r.error());
        bytes[k] += r->first.nbytes();
        out.dense[d] = std::move(r->first);
      }
    return caf::none;
  });
  if (err)
    return err;
  for (auto b : bytes)
    out.bytes += b;
  return out;
}

caf::expected<uint64_t> sparse_exchange::push(uint32_t worker, uint64_t step,
                                              const std::vector<table_step>& steps,
                                              const std::vector<tensor>& row_grads,
                                              const std::vector<tensor>& dense_grads,
                                              std::chrono::milliseconds wait, bool* late,
                                              uint64_t* bytes) {
  std::vector<uint64_t> global(ps_.size(), 0);
  std::vector<char> dropped(ps_.size(), 0);
  std::vector<uint64_t> sent(ps_.size(), 0);
  auto err = for_each_ps(ps_.size(), [&](size_t k) -> caf::error {
    auto& p = ps_[k];
    std::vector<tensor> ids, rows;
    // One (ids, rows) per table even when the step touched none of this
    // shard's rows: an empty push is an abstention, and sync must count
    // this worker's (zero) gradient in its mean as dense training would.
    for (size_t t = 0; t < tables_.size(); ++t) {
      auto width = static_cast<size_t>(tables_[t].spec.width);
      const auto& local = steps[t].local[k];
      const auto& place = steps[t].place[k];
      tensor g(dtype::float32, {static_cast<int64_t>(local.size()), tables_[t].spec.width});
      float* dst = g.mutable_data<float>();
      const float* src = row_grads[t].data<float>();
      for (size_t i = 0; i < local.size(); ++i)
        std::memcpy(dst + i * width, src + static_cast<size_t>(place[i]) * width,
                    width * sizeof(float));
      sent[k] += local.size() * sizeof(int64_t) + g.nbytes();
      ids.push_back(ids_tensor(local));
      rows.push_back(std::move(g));
    }
    std::vector<tensor> dense;
    if (p.dense) {
      dense = dense_grads;
      for (const auto& d : dense)
        sent[k] += d.nbytes();
    }
    bool was_late = false;
    auto r = p.chan->push_sparse(p.aggregator, worker, step, dense, ids, rows, wait, p.token,
                                 ++p.seq, &was_late);
    if (!r)
      return std::move(r.error());
    global[k] = *r;
    dropped[k] = was_late;
    return caf::none;
  });
  if (err)
    return err;
  uint64_t least = global.empty() ? 0 : global[0];
  for (auto g : global)
    least = std::min(least, g);
  if (late)
    *late = std::find(dropped.begin(), dropped.end(), 1) != dropped.end();
  if (bytes) {
    *bytes = 0;
    for (auto b : sent)
      *bytes += b;
  }
  return least;
}

} // namespace af
