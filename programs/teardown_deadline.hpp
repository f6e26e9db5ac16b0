#pragma once
/// A bound on a program's teardown: once its work is done and its exit
/// status known, stopping the data plane, the node and the actor system must
/// not keep the process (and, through its open connections, its peers)
/// alive. A ps whose chief died once stayed past its "stopping" line for
/// more than 20 s in a test under load; this turns such a hang into a line
/// naming the phase and an exit with the status already decided.

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

namespace af {

class teardown_deadline {
public:
  /// Starts the watchdog's thread now, before the work, while a thread can
  /// still start (under a memory cap the teardown's own may not).
  teardown_deadline() {
    try {
      watchdog_ = std::thread{[this] { watch(); }};
    } catch (const std::system_error&) {
      // No thread for it: the stop goes unbounded, the status stays.
    }
  }
  teardown_deadline(const teardown_deadline&) = delete;
  teardown_deadline& operator=(const teardown_deadline&) = delete;

  /// From now on the process has `limit` to end (this object's destruction
  /// is the end: declare it before what it bounds); `who` names it in the
  /// line, `status` is the exit status then. Only the first call counts.
  void start(const std::string& who, int status, std::chrono::milliseconds limit) {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      if (armed_)
        return;
      armed_ = true;
      who_ = who;
      status_ = status;
      limit_ = limit;
    }
    cv_.notify_all();
  }

  /// The teardown finished in time (or never began).
  ~teardown_deadline() {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      done_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable())
      watchdog_.join();
  }

private:
  void watch() {
    std::unique_lock<std::mutex> guard{mtx_};
    cv_.wait(guard, [this] { return armed_ || done_; }); // until the work is done
    if (cv_.wait_for(guard, limit_, [this] { return done_; }))
      return;
    std::fprintf(stderr,
                 "%s: stopping took more than %lld ms (the data plane's connections, the "
                 "node and the actor system's actors); exiting with status %d without "
                 "waiting further\n",
                 who_.c_str(), static_cast<long long>(limit_.count()), status_);
    // stdout's lines (a worker's "done after"), unless a thread stuck in
    // a write to a full pipe holds its lock: then they stay unwritten.
    if (::ftrylockfile(stdout) == 0) {
      std::fflush(stdout);
      ::funlockfile(stdout);
    }
    std::_Exit(status_);
  }

  std::mutex mtx_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool done_ = false;
  std::string who_;
  int status_ = 0;
  std::chrono::milliseconds limit_{0};
  std::thread watchdog_; // last: started once the rest is set up
};

} // namespace af
