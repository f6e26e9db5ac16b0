#pragma once
/// `[train] pipeline_sync = "auto"`: which kind of sync round an aggregator
/// asks its workers for, chosen by timing both, with no CAF in it.
///
/// A pipelined round (dist/pipelined_round.hpp) overlaps the two directions
/// of each worker's connection with the ps's update; it wins where the link
/// is the limit (1.64 - 1.86 x store-and-forward on the namespace test bed),
/// and loses where the CPU is, as on one host with fewer cores than
/// processes (about 0.85 x on a 2-vCPU VM: docs/performance.md). Which one a
/// cluster is cannot be known from its config, so the aggregator times the
/// rounds: it runs `probe` rounds of each kind (after `settle` rounds to let
/// the workers follow), keeps the one whose median period between commits
/// is shorter, and times the other again after a hold that doubles each
/// time the choice stands (so a changed machine is noticed, at a cost that
/// shrinks); the held kind's figure is then that of its latest rounds. The
/// workers follow the choice from their next push: each push reply says
/// which kind it should be (wire::reply_flags::whole_pushes).
/// tests/test_pipeline_tuner.cpp drives it with a fake clock.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace af {

class pipeline_tuner {
public:
  using clock = std::chrono::steady_clock;

  struct settings {
    /// A job's first rounds, never timed (buffers, pages and the sockets'
    /// windows still grow).
    uint32_t warm_up = 10;
    /// Rounds of a kind not timed after it is asked for (the workers learn
    /// it from the replies of the round before; the first is a mix).
    uint32_t settle = 2;
    /// Rounds of a kind timed (their median is its figure). On a 2-vCPU VM
    /// a round's period moves by 10 - 20 % from one to the next: medians of
    /// 8 picked the slower kind in about one timing of 8 (twenty-second
    /// session).
    uint32_t probe = 16;
    /// Rounds the choice holds before the other kind is timed again; it
    /// doubles each time the choice stands, up to max_hold.
    uint64_t first_hold = 256;
    uint64_t max_hold = 16384;
    /// Pipelined is kept only where its median period is this much shorter
    /// (a tie goes to store-and-forward, which costs less CPU; where the
    /// link is the limit pipelined is 30 - 45 % shorter).
    double margin = 0.05;
  };

  pipeline_tuner() = default;
  explicit pipeline_tuner(settings s) : s_(s) {
    // nop
  }

  /// Whether the rounds the tuner wants now are pipelined.
  bool pipelined() const noexcept { return want_pipelined_; }

  /// Starts over, timing pipelined rounds first (an aggregator that
  /// switched back into sync: what it timed before may not hold).
  void restart() { *this = pipeline_tuner{s_}; }

  /// A sync round committed at `now`, pipelined or store-and-forward.
  /// Returns a line for the log when it decided (empty otherwise).
  std::string round_closed(clock::time_point now, bool was_pipelined);

  /// How many times what it does (state()) has changed.
  uint64_t transitions() const noexcept { return transitions_; }

  /// What it does now: "timing pipelined rounds", "store-and-forward
  /// rounds", ... (aggregator_stats::pipeline_auto).
  std::string state() const;

  /// Medians (ms) last measured: pipelined, store-and-forward (0: none yet).
  double pipelined_ms() const noexcept { return median_ms_[1]; }
  double whole_ms() const noexcept { return median_ms_[0]; }

private:
  enum class phase { probing, holding };

  /// Starts timing kind `pipelined` (probing).
  void probe(bool pipelined);
  /// Both kinds timed: keeps the faster, holds it.
  std::string decide();

  settings s_;
  phase phase_ = phase::probing;
  bool want_pipelined_ = true;
  bool have_last_ = false;
  uint64_t rounds_ = 0;            ///< every round closed (warm_up)
  clock::time_point last_;
  uint32_t seen_ = 0;              ///< rounds of the probed kind since the probe began
  uint64_t off_kind_ = 0;          ///< rounds of the other kind since the probe began
  std::vector<double> periods_;    ///< ms, the probed (or held) kind's
  double median_ms_[2] = {0, 0};   ///< [0]: store-and-forward, [1]: pipelined
  uint64_t held_ = 0;
  uint64_t hold_ = 0;              ///< 0: no decision yet
  bool decided_ = false;
  bool last_choice_ = false;
  uint64_t transitions_ = 0;
};

} // namespace af
