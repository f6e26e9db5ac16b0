// The distinct ids of a batch, in order of first occurrence, without an
// allocation per id: what a sparse step does for every table of every
// batch (dist/sparse_step.cpp), where std::unordered_map allocated a node
// per distinct id and freed them all again at the end of the step (a fifth
// of a worker's CPU in the 10 M-row bench was malloc and free).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace af::kernels {

/// An open-addressing set of int64 ids, each with its index among the
/// distinct ids seen since reset(). Reused across batches: reset() keeps the
/// buffers and forgets the ids in O(1) (a generation stamp per slot), so a
/// step of a steady batch size allocates nothing.
class id_dedup {
public:
  /// Forgets every id; room for up to `n` distinct ids without growing.
  void reset(size_t n) {
    size_t want = 16;
    while (want < 2 * n)
      want *= 2;
    if (want > keys_.size()) {
      keys_.assign(want, 0);
      index_.assign(want, 0);
      stamp_.assign(want, 0);
      gen_ = 0;
    }
    if (++gen_ == 0) { // wrapped: every stamp could match again
      std::fill(stamp_.begin(), stamp_.end(), 0);
      gen_ = 1;
    }
    mask_ = keys_.size() - 1;
    count_ = 0;
  }

  /// `id`'s index among the distinct ids since reset(), and whether it is
  /// new (then its index is the count of distinct ids before it). At most
  /// the `n` of reset() distinct ids.
  std::pair<int32_t, bool> insert(int64_t id) {
    for (size_t at = hash(id) & mask_;; at = (at + 1) & mask_) {
      if (stamp_[at] != gen_) {
        stamp_[at] = gen_;
        keys_[at] = id;
        index_[at] = count_;
        return {count_++, true};
      }
      if (keys_[at] == id)
        return {index_[at], false};
    }
  }

  /// The distinct ids since reset().
  size_t size() const noexcept { return static_cast<size_t>(count_); }

private:
  /// splitmix64's finalizer: ids that share their low bits (a mod-sharded
  /// table's rows, ids of a stride) spread over the slots.
  static uint64_t hash(int64_t id) noexcept {
    auto x = static_cast<uint64_t>(id);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }

  std::vector<int64_t> keys_;
  std::vector<int32_t> index_;
  std::vector<uint32_t> stamp_;
  uint32_t gen_ = 0;
  size_t mask_ = 0;
  int32_t count_ = 0;
};

} // namespace af::kernels
