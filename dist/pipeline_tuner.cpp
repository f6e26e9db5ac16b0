// pipeline_sync = "auto" (dist/pipeline_tuner.hpp): both kinds of sync round
// timed, the faster kept, the other timed again after a doubling hold.
#include "dist/pipeline_tuner.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace af {

namespace {

double median_of(std::vector<double> v) {
  auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

const char* kind_name(bool pipelined) {
  return pipelined ? "pipelined" : "store-and-forward";
}

} // namespace

std::string pipeline_tuner::state() const {
  return fmt::format("{}{} rounds", phase_ == phase::probing ? "timing " : "",
                     kind_name(want_pipelined_));
}

void pipeline_tuner::probe(bool pipelined) {
  transitions_ += 1;
  phase_ = phase::probing;
  want_pipelined_ = pipelined;
  seen_ = 0;
  off_kind_ = 0;
  periods_.clear();
}

std::string pipeline_tuner::decide() {
  bool pick = median_ms_[1] > 0 && median_ms_[1] < median_ms_[0] * (1 - s_.margin);
  bool stands = decided_ && pick == last_choice_;
  hold_ = stands ? std::min(hold_ * 2, s_.max_hold) : s_.first_hold;
  decided_ = true;
  last_choice_ = pick;
  transitions_ += 1;
  want_pipelined_ = pick;
  phase_ = phase::holding;
  held_ = 0;
  periods_.clear();
  if (stands)
    return {};
  return fmt::format("pipeline_sync = \"auto\" chose {} rounds: median period {:.2f} ms "
                     "pipelined, {:.2f} ms store-and-forward, over {} rounds each; the other "
                     "kind is timed again after {} rounds",
                     kind_name(pick), median_ms_[1], median_ms_[0], s_.probe, hold_);
}

std::string pipeline_tuner::round_closed(clock::time_point now, bool was_pipelined) {
  double ms = -1;
  if (have_last_)
    ms = std::chrono::duration<double, std::milli>(now - last_).count();
  last_ = now;
  have_last_ = true;
  if (++rounds_ <= s_.warm_up)
    return {};
  const size_t probe_rounds = std::max<uint32_t>(s_.probe, 1);
  if (phase_ == phase::holding) {
    held_ += 1;
    if (was_pipelined == want_pipelined_ && ms >= 0) {
      periods_.push_back(ms); // the held kind's latest periods: its figure at the next probe
      if (periods_.size() > probe_rounds)
        periods_.erase(periods_.begin());
    }
    if (held_ >= hold_) {
      // Its figure is that of its latest rounds; where too few of them came
      // (members that cannot stream joined), it has none and is timed again.
      median_ms_[want_pipelined_ ? 1 : 0] =
        periods_.size() >= probe_rounds ? median_of(periods_) : 0;
      probe(!want_pipelined_);
    }
    return {};
  }
  if (was_pipelined != want_pipelined_) {
    // The workers have not followed yet, or cannot: pushes that are not
    // streamed (shared memory, TLS) or rounds that cannot be pipelined
    // (backup workers, a norm guard) never make a pipelined one.
    off_kind_ += 1;
    if (off_kind_ < 4 * (uint64_t{s_.settle} + probe_rounds))
      return {};
    // Only a pipelined round can fail to come: the aggregator makes every
    // round store-and-forward while it wants them so.
    const bool missing = want_pipelined_;
    median_ms_[missing ? 1 : 0] = 0;
    bool had = decided_;
    auto line = decide();
    hold_ = s_.max_hold; // nothing to compare: look again only rarely
    if (!had || !line.empty())
      return fmt::format("pipeline_sync = \"auto\": no {} round came in {} rounds (pushes "
                         "that are not streamed, or rounds that cannot be pipelined); "
                         "{} rounds, looked at again after {} rounds",
                         kind_name(missing), off_kind_, kind_name(want_pipelined_), hold_);
    return {};
  }
  seen_ += 1;
  if (seen_ <= s_.settle || ms < 0)
    return {};
  periods_.push_back(ms);
  if (periods_.size() < probe_rounds)
    return {};
  median_ms_[want_pipelined_ ? 1 : 0] = median_of(periods_);
  if (median_ms_[want_pipelined_ ? 0 : 1] > 0)
    return decide();
  probe(!want_pipelined_);
  return {};
}

} // namespace af
