#pragma once
// Waiting for a condition in a test without using a sleep as the signal.

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

namespace af {

/// Polls `cond` every 10 ms until it holds (true) or `timeout` passes (false).
template <class F>
bool eventually(F cond, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// The scheduler state of thread `tid` of this process ('S': asleep in a
/// wait, 'R': running, '?': gone).
inline char thread_state(long tid) {
  std::ifstream in{"/proc/self/task/" + std::to_string(tid) + "/stat"};
  std::string line;
  std::getline(in, line);
  auto paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() ? '?' : line[paren + 2];
}

/// A blocking call run on a thread of its own, so that a test can wait until
/// it sleeps in its wait (not before it started, not after it returned), then
/// do something to the peer (SIGKILL) and time how long the call takes to
/// notice.
///
///   blocking_call<R> call{[&] { return ch->call(...); }};
///   REQUIRE(call.asleep(10s));  ...kill...  auto r = call.join();
template <class R>
class blocking_call {
public:
  template <class F>
  explicit blocking_call(F f)
    : thread_{[this, f] {
        tid_ = syscall(SYS_gettid);
        result_.emplace(f());
        ended_ = std::chrono::steady_clock::now();
        done_ = true;
      }} {}

  ~blocking_call() {
    if (thread_.joinable())
      thread_.join();
  }

  /// True once the call is asleep in its wait, within `timeout`.
  bool asleep(std::chrono::milliseconds timeout) {
    return eventually([&] { return tid_ != 0 && !done_ && thread_state(tid_) == 'S'; }, timeout);
  }

  /// Waits for the call to return; its result.
  R& join() {
    thread_.join();
    return *result_;
  }

  /// When it returned (after join()).
  std::chrono::steady_clock::time_point ended() const { return ended_; }

private:
  std::atomic<long> tid_{0};
  std::atomic<bool> done_{false};
  std::optional<R> result_; ///< set when the call returned
  std::chrono::steady_clock::time_point ended_;
  std::thread thread_;
};

} // namespace af
