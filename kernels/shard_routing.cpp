// Routing ids of a partitioned table to their shards (kernels/shard_routing.hpp):
// TF's mod and div partition strategies, and contiguous pieces of any size.
#include "kernels/shard_routing.hpp"

#include <algorithm>
#include <cstdint>

namespace af::kernels {

namespace {

/// Python's a // b for b > 0 (TF's formula is written with floor division;
/// C++ truncates toward zero, which differs for a negative a).
int64_t floor_div(int64_t a, int64_t b) {
  auto q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

std::string sizes_string(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

} // namespace

const char* to_string(partition_strategy s) {
  switch (s) {
    case partition_strategy::mod: return "mod";
    case partition_strategy::div: return "div";
    case partition_strategy::contiguous: return "contiguous";
  }
  return "?";
}

std::optional<partition_strategy> parse_partition_strategy(std::string_view s) {
  for (auto p : {partition_strategy::mod, partition_strategy::div, partition_strategy::contiguous})
    if (s == to_string(p))
      return p;
  return std::nullopt;
}

std::vector<int64_t> balanced_shard_rows(int64_t rows, int64_t shards) {
  std::vector<int64_t> out;
  if (shards <= 0 || rows < 0)
    return out;
  for (int64_t i = 0; i < shards; ++i)
    out.push_back(rows / shards + (i < rows % shards ? 1 : 0));
  return out;
}

status shard_router::make(partition_strategy strategy, std::vector<int64_t> shard_rows,
                          shard_router& out) {
  if (shard_rows.empty())
    return status::failure("a partitioned table needs at least one shard");
  int64_t total = 0;
  for (size_t i = 0; i < shard_rows.size(); ++i) {
    if (shard_rows[i] < 0)
      return status::failure("shard " + std::to_string(i) + " has "
                             + std::to_string(shard_rows[i]) + " rows");
    // Sizes from a tensor: a sum past int64 is refused, not wrapped (UB).
    if (__builtin_add_overflow(total, shard_rows[i], &total))
      return status::failure("the shard sizes " + sizes_string(shard_rows)
                             + " add up to more than 2^63 - 1 rows");
  }
  auto n = static_cast<int64_t>(shard_rows.size());
  if (strategy != partition_strategy::contiguous) {
    auto want = balanced_shard_rows(total, n);
    if (want != shard_rows)
      return status::failure(std::string{"partition_strategy "} + to_string(strategy)
                             + " needs shards of " + sizes_string(want) + " rows for "
                             + std::to_string(total) + " rows over " + std::to_string(n)
                             + " shards, got " + sizes_string(shard_rows));
  }
  shard_router r;
  r.strategy_ = strategy;
  r.total_ = total;
  r.per_ = total / n;
  r.extras_ = total % n;
  int64_t begin = 0;
  for (auto rows : shard_rows) {
    r.begin_.push_back(begin);
    begin += rows;
  }
  r.rows_ = std::move(shard_rows);
  out = std::move(r);
  return status::success();
}

shard_place shard_router::place(int64_t id) const {
  auto n = static_cast<int64_t>(rows_.size());
  switch (strategy_) {
    case partition_strategy::mod:
      return {id % n, id / n};
    case partition_strategy::div: {
      // TF's embedding_ops.py, partition_strategy == "div":
      //   p = max(id // (ids_per_partition + 1), (id - extras) // ids_per_partition)
      //   row = id % (ids_per_partition + 1) if p < extras else (id - extras) % ids_per_partition
      // (ids_per_partition is 0 only when there are fewer rows than shards:
      // then every id is in the first `extras` shards, one row each.)
      // per_ + 1 overflows only for one shard of 2^63 - 1 rows: shard 0.
      int64_t p = per_ == INT64_MAX ? 0 : floor_div(id, per_ + 1);
      if (per_ > 0)
        p = std::max(p, floor_div(id - extras_, per_));
      if (p < extras_)
        return {p, id % (per_ + 1)};
      return {p, (id - extras_) % per_};
    }
    case partition_strategy::contiguous: {
      // The last shard whose first id is <= id; empty shards share their
      // begin with the next one, and upper_bound skips past them.
      auto it = std::upper_bound(begin_.begin(), begin_.end(), id);
      auto s = static_cast<int64_t>(it - begin_.begin()) - 1;
      return {s, id - begin_[static_cast<size_t>(s)]};
    }
  }
  return {};
}

status host_route(const tensor& ids, const tensor& shard_rows, partition_strategy strategy,
                  bool want_row, tensor& out) {
  const char* op = want_row ? "row_in_shard" : "shard_of";
  if (ids.type() != dtype::int32 && ids.type() != dtype::int64)
    return status::dtype(std::string{op} + ": ids must be int32 or int64, got " + ids.summary());
  if ((shard_rows.type() != dtype::int32 && shard_rows.type() != dtype::int64)
      || shard_rows.shape().size() != 1)
    return status::dtype(std::string{op} + ": SHARD_ROWS must be a 1-D int32 or int64 tensor, got "
                         + shard_rows.summary());
  std::vector<int64_t> rows;
  for (size_t i = 0; i < shard_rows.num_elements(); ++i)
    rows.push_back(integer_at(shard_rows, i));
  shard_router router;
  if (auto st = shard_router::make(strategy, std::move(rows), router); !st.ok())
    return status::failure(std::string{op} + ": " + st.error);
  const size_t n = ids.num_elements();
  for (size_t i = 0; i < n; ++i) // every id checked before anything is written
    if (auto id = integer_at(ids, i); !router.contains(id))
      return status::failure("ids[" + std::to_string(i) + "] = " + std::to_string(id)
                             + " is not a row of the table: not in [0, "
                             + std::to_string(router.total_rows()) + ")");
  tensor result{want_row ? ids.type() : dtype::int32, ids.shape()};
  if (n > 0) {
    const bool wide = result.type() == dtype::int64;
    int32_t* narrow_out = wide ? nullptr : result.mutable_data<int32_t>();
    int64_t* wide_out = wide ? result.mutable_data<int64_t>() : nullptr;
    for (size_t i = 0; i < n; ++i) {
      auto place = router.place(integer_at(ids, i));
      auto v = want_row ? place.row : place.shard;
      if (wide)
        wide_out[i] = v;
      else
        narrow_out[i] = static_cast<int32_t>(v);
    }
  }
  out = std::move(result);
  return status::success();
}

} // namespace af::kernels
