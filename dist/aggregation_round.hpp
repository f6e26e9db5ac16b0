#pragma once
/// One round of an aggregator that waits for every worker (sync: one global
/// step; average: one average), with no CAF in it: which workers pushed, the
/// step they pushed for, the sum of their values, and the tickets to answer
/// once the round is released. The sync and average behaviors
/// (dist/aggregator.cpp) each keep one, with their response promises as
/// tickets; tests/test_aggregator.cpp drives it directly.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "train/elementwise.hpp"

namespace af {

template <class Ticket>
class aggregation_round {
public:
  using clock_type = std::chrono::steady_clock;

  aggregation_round() : aggregation_round(0, 0) {
    // nop
  }

  /// Bytes of values a round keeps by reference at most (add()).
  static constexpr size_t default_kept_limit = size_t{256} << 20;

  /// A round over `workers` workers whose values have `floats` elements in
  /// all, keeping at most `kept_limit` bytes of them by reference.
  aggregation_round(uint32_t workers, size_t floats, size_t kept_limit = default_kept_limit)
    : floats_(floats), kept_limit_(kept_limit), arrived_(workers, false), done_(workers, false),
      standby_(workers, false) {
    // nop
  }

  uint32_t workers() const noexcept { return static_cast<uint32_t>(arrived_.size()); }

  // -- workers that push no more ------------------------------------------------

  /// The worker pushes no more: this round and the next ones stop waiting for it.
  void mark_done(uint32_t worker) { done_.at(worker) = true; }

  bool is_done(uint32_t worker) const { return done_.at(worker); }

  /// `worker` takes part from the next completion check on (a worker that
  /// joins a running job, or comes back): the round grows to hold it.
  void add_worker(uint32_t worker) {
    if (worker >= arrived_.size()) {
      arrived_.resize(worker + 1, false);
      done_.resize(worker + 1, true);
      standby_.resize(worker + 1, false);
    }
    done_[worker] = false;
    standby_[worker] = false;
  }

  /// sync after a live switch: the rounds do not wait for `worker` (it is
  /// on standby) until it joins again (add_worker); the aggregator applies
  /// its pushes meanwhile at once, outside the rounds. A switch puts every
  /// member on standby so that each one's rounds begin at the same push on
  /// every ps: the one after its join, which it sends to all of them.
  void set_standby(uint32_t worker, bool on) { standby_.at(worker) = on; }

  bool is_standby(uint32_t worker) const { return standby_.at(worker); }

  /// No worker on standby (a switch out of sync).
  void clear_standby() { std::fill(standby_.begin(), standby_.end(), false); }

  /// Every worker pushes again (a restore starts the job over from a
  /// checkpoint: workers that had finished before it are back).
  void reset_done() { std::fill(done_.begin(), done_.end(), false); }

  /// Workers not done.
  uint32_t active() const {
    return static_cast<uint32_t>(std::count(done_.begin(), done_.end(), false));
  }

  // -- arrivals -----------------------------------------------------------------

  /// True while some push waits for the round's release.
  bool in_progress() const noexcept { return !tickets_.empty(); }

  /// True if `worker` pushed in this round (a second push of the round is refused).
  bool has_arrived(uint32_t worker) const { return arrived_.at(worker); }

  /// The step of the round's first push (none before it).
  std::optional<uint64_t> step() const noexcept { return step_; }

  /// Adds one worker's values (one pointer per part, `sizes[i]` floats of
  /// part i go at `offsets[i]` of the sum). Call it before arrive(), only for
  /// a worker that has not arrived; an abstention (a refused value) adds
  /// nothing and only arrives.
  ///
  /// With `owner`, the values are kept by reference until release() (owner
  /// keeps them alive) and summed only when the round is read (mean(),
  /// mean_into()): the sync round's release sums, averages and applies them
  /// in one pass over memory instead of a copy, an add, a scale and an apply.
  /// Without one they are summed now. Either way the sum is the same, bit
  /// for bit: the values in arrival order, added left to right.
  ///
  /// Values are kept by reference only up to kept_limit bytes in all (a
  /// round of many workers of a large model would hold workers x model):
  /// past it they are summed on arrival, those kept before them first.
  void add(const std::vector<const float*>& parts, const std::vector<size_t>& offsets,
           const std::vector<size_t>& sizes, std::shared_ptr<const void> owner = nullptr) {
    size_t bytes = 0;
    for (auto n : sizes)
      bytes += n * sizeof(float);
    if (owner && kept_bytes_ + bytes <= kept_limit_) { // after those summed: arrival order stays
      // Into a kept_value of an earlier round (spare_): its vectors' memory
      // is reused, no allocation a push.
      kept_value v;
      if (!spare_.empty()) {
        v = std::move(spare_.back());
        spare_.pop_back();
      }
      v.parts.assign(parts.begin(), parts.end());
      v.offsets.assign(offsets.begin(), offsets.end());
      v.sizes.assign(sizes.begin(), sizes.end());
      v.owner = std::move(owner);
      kept_.push_back(std::move(v));
      kept_bytes_ += bytes;
      contributions_ += 1;
      return;
    }
    materialize();
    if (sum_.size() != floats_)
      sum_.assign(floats_, 0.0f);
    bool first = summed_ == 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      float* dst = sum_.data() + offsets[i];
      const float* src = parts[i];
      if (first)
        std::memcpy(dst, src, sizes[i] * sizeof(float));
      else
        for (size_t k = 0; k < sizes[i]; ++k)
          dst[k] += src[k];
    }
    contributions_ += 1;
    summed_ += 1;
  }

  /// Records the push of `worker` for `step`, answered through `ticket` at
  /// the release. False (and nothing recorded) if the worker already pushed
  /// in this round.
  bool arrive(uint32_t worker, uint64_t step, Ticket ticket,
              clock_type::time_point now = clock_type::now()) {
    if (arrived_.at(worker))
      return false;
    if (tickets_.empty())
      started_ = now;
    if (!step_)
      step_ = step;
    arrived_[worker] = true;
    tickets_.emplace_back(worker, std::move(ticket));
    return true;
  }

  /// True once every worker not done (nor on standby) has arrived, or, with `enough` > 0,
  /// once `enough` workers have (or every one not done, if fewer are left):
  /// the first `enough` of a step make it (TF's replicas_to_aggregate).
  bool complete(uint32_t enough = 0) const {
    if (enough > 0 && arrivals() >= std::min(enough, std::max<uint32_t>(active(), 1)))
      return true;
    for (size_t w = 0; w < arrived_.size(); ++w)
      if (!done_[w] && !standby_[w] && !arrived_[w])
        return false;
    return true;
  }

  /// Workers that pushed in this round (abstentions included).
  uint32_t arrivals() const noexcept { return static_cast<uint32_t>(tickets_.size()); }

  /// When the round's first push came (meaningless before it).
  clock_type::time_point started() const noexcept { return started_; }

  /// The workers the round still waits for, in order.
  std::vector<uint32_t> missing() const {
    std::vector<uint32_t> out;
    for (size_t w = 0; w < arrived_.size(); ++w)
      if (!done_[w] && !standby_[w] && !arrived_[w])
        out.push_back(static_cast<uint32_t>(w));
    return out;
  }

  /// True if the round has waited `timeout` or longer since its first push.
  bool expired(std::chrono::milliseconds timeout,
               clock_type::time_point now = clock_type::now()) const {
    return in_progress() && now - started_ >= timeout;
  }

  // -- the values ---------------------------------------------------------------

  /// Values added this round (abstentions not counted).
  uint32_t contributions() const noexcept { return contributions_; }

  /// The mean of the values added this round, computed in place: call it
  /// once per round, and only if contributions() > 0.
  const std::vector<float>& mean() {
    materialize();
    if (contributions_ > 1) {
      float scale = 1.0f / static_cast<float>(contributions_);
      for (auto& x : sum_)
        x *= scale;
    }
    return sum_;
  }

  /// Floats [offset, offset + n) of the mean into `out`, the same values
  /// mean() gives; the range lies within one part (the parts of every value
  /// are the same: the variables). Only if contributions() > 0; any number
  /// of times, in any order, until release().
  void mean_into(size_t offset, size_t n, float* out) const {
    // The sum in arrival order (those in sum_ first), then the scale: the
    // operations mean() does, fused into as few passes as the values allow.
    const float scale = contributions_ > 1 ? 1.0f / static_cast<float>(contributions_) : 1.0f;
    const size_t sources = (summed_ > 0 ? 1 : 0) + kept_.size();
    auto source = [&](size_t j) -> const float* {
      if (summed_ > 0 && j-- == 0)
        return sum_.data() + offset;
      const auto& v = kept_[j];
      size_t i = part_of(v, offset);
      return v.parts[i] + (offset - v.offsets[i]);
    };
    // The loops are train/elementwise's (built for AVX2 too, the same bits).
    if (sources == 1) {
      train::scaled_into(source(0), scale, out, n); // scale is 1 for one contribution: a copy
      return;
    }
    const float* a = source(0);
    for (size_t j = 1; j < sources; ++j) {
      const float* b = source(j);
      if (j + 1 == sources)
        train::add_scaled_into(a, b, scale, out, n);
      else
        train::add_into(a, b, out, n);
      a = out;
    }
  }

  // -- the end of a round ---------------------------------------------------------

  /// Ends the round: hands back every parked ticket with its worker, in
  /// arrival order, for the caller to answer (with the result, or an error),
  /// and starts the next round empty. Workers stay done.
  std::vector<std::pair<uint32_t, Ticket>> release() {
    auto out = std::move(tickets_);
    tickets_.clear();
    std::fill(arrived_.begin(), arrived_.end(), false);
    contributions_ = 0;
    summed_ = 0;
    for (auto& v : kept_) { // their values go now; their vectors' memory is kept
      v.owner.reset();
      spare_.push_back(std::move(v));
    }
    kept_.clear();
    kept_bytes_ = 0;
    step_.reset();
    return out;
  }

private:
  /// One worker's values kept by reference (add() with an owner).
  struct kept_value {
    std::vector<const float*> parts;
    std::vector<size_t> offsets, sizes;
    std::shared_ptr<const void> owner;
  };

  /// The part of `v` that holds flat index `offset`.
  static size_t part_of(const kept_value& v, size_t offset) {
    for (size_t i = 0; i < v.parts.size(); ++i)
      if (offset >= v.offsets[i] && offset < v.offsets[i] + v.sizes[i])
        return i;
    return 0; // unreachable for an offset within the values
  }

  /// Adds the values kept by reference into sum_, in arrival order.
  void materialize() {
    if (kept_.empty())
      return;
    auto kept = std::move(kept_);
    kept_.clear();
    kept_bytes_ = 0;
    contributions_ -= static_cast<uint32_t>(kept.size());
    for (auto& v : kept)
      add(v.parts, v.offsets, v.sizes);
  }

  size_t floats_;
  size_t kept_limit_;
  size_t kept_bytes_ = 0; ///< of the values in kept_
  std::vector<bool> arrived_; ///< per worker, this round
  std::vector<bool> done_;    ///< per worker: pushes no more
  std::vector<bool> standby_; ///< per worker: not waited for (set_standby)
  std::vector<float> sum_;
  uint32_t contributions_ = 0;
  uint32_t summed_ = 0;          ///< contributions already in sum_ (they come first)
  std::vector<kept_value> kept_; ///< contributions by reference, after those
  std::vector<kept_value> spare_; ///< kept_ of earlier rounds, emptied (no owner)
  std::optional<uint64_t> step_;
  clock_type::time_point started_;
  std::vector<std::pair<uint32_t, Ticket>> tickets_;
};

} // namespace af
