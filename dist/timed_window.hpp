#pragma once
/// A training job run for a time (train_config warmup_secs, window_secs;
/// docs/training.md, "A timed window"), for benches that compare steps/s
/// over the same window: the chief watches ps 0's aggregator until every
/// worker has pushed, lets warmup_secs pass, counts the global steps of the
/// next window_secs, then puts the stop word in its key-value store; every
/// worker (the chief too) stops before its next step. Every wait is bounded
/// (start_limit; the others: that, the warm-up, the window and a step's
/// timeout), and a chief that is gone ends the others' run with an error
/// that says so. Internal to dist/.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "actors/kv_store.hpp"
#include "actors/session.hpp"
#include "dist/worker.hpp"
#include "train/config.hpp"

namespace af::training_detail {

/// What the chief measured.
struct window_result {
  /// The window ran to its end (the job did not end first) with the same
  /// workers and mode as it began (its warm-up's start).
  bool measured = false;
  uint64_t steps = 0;     ///< ps 0's global steps in the window
  double seconds = 0;     ///< its length, from the two samples' midpoints
  /// Why a window that ran to its end is not the defined measurement: a
  /// worker joined, left or finished, or the mode (or its settings) changed
  /// during the warm-up or the window ("" if none did).
  std::string not_measured;
};

/// Where the chief's watch is, for its progress lines (they show the time
/// left in the warm-up or the window, not an estimate from `steps`, which a
/// timed run does not run to). Written by the watch, read by the reporter.
struct window_phase {
  enum phase : int { starting = 0, warm_up = 1, window = 2, over = 3 };
  std::atomic<int> now{starting};
  std::atomic<int64_t> until_ns{0}; ///< the phase's end, steady clock

  /// "  warm-up 3 s left", "  window 12 s left", "  waiting for every
  /// worker's first step", or "" once over.
  std::string left() const;
};

/// The key under which the chief says stop (its store, its incarnation).
std::string stop_key(uint64_t chief_incarnation);

/// The watch of one worker task: a thread of its own until close().
class timed_window {
public:
  /// Worker `task` of `workers` (0: the chief, which measures) of job `c`,
  /// whose ps 0 aggregator is `ps0`; `store`: the chief's key-value store.
  /// `user_stop`, if any, is passed on (the REPL's `train stop`).
  timed_window(session& s, const train::train_config& c, uint32_t task, uint32_t workers,
               aggregator_actor ps0, kv_store_actor store, uint64_t incarnation,
               std::shared_ptr<const std::atomic<bool>> user_stop);
  ~timed_window();
  timed_window(const timed_window&) = delete;
  timed_window& operator=(const timed_window&) = delete;

  /// The flag to give the worker (worker_setup::stop).
  std::shared_ptr<const std::atomic<bool>> stop() const { return stop_; }

  /// True once the window (not the user) stopped the worker.
  bool ended_by_time() const { return by_time_.load(); }

  /// Why the watch stopped the worker without the window's end (the chief
  /// is gone, or its stop word did not come in time), or none. Valid after
  /// close().
  caf::error failure() const { return failure_; }

  /// Ends the watch (the worker is done) and returns what the chief measured.
  window_result close();

  /// Where the watch is (the chief's; the others' stay `starting`).
  std::shared_ptr<const window_phase> phase() const { return phase_; }

private:
  void run_chief();
  void run_other();
  /// Waits until `t` (or close()); false if closed.
  bool wait_until(std::chrono::steady_clock::time_point t);
  void say_stop();
  /// The chief: the stop word for the others, and this worker stops.
  void break_off();
  /// Stops the worker for `why` (not the window's end): failure().
  void stop_for(caf::error why);
  /// How long the chief waits for every worker's first step.
  std::chrono::milliseconds start_limit() const;
  /// The others: the chief's store looked up anew (client_), through a
  /// session of this thread's own; false if the chief does not answer, or
  /// answers as another process.
  bool look_up_store();

  session& s_;
  train::train_config c_;
  uint32_t task_;
  uint32_t workers_;
  aggregator_actor ps0_;
  std::optional<kv_client> client_; ///< replaced by look_up_store()
  std::optional<session> relink_;    ///< look_up_store()'s, made on its first use
  uint64_t incarnation_;
  std::shared_ptr<const std::atomic<bool>> user_stop_;
  std::shared_ptr<std::atomic<bool>> stop_ = std::make_shared<std::atomic<bool>>(false);
  std::atomic<bool> by_time_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool closing_ = false;
  window_result result_;
  std::shared_ptr<window_phase> phase_ = std::make_shared<window_phase>();
  caf::error failure_; ///< set on the watch's thread, read after close()
  std::thread thread_;
};

} // namespace af::training_detail
