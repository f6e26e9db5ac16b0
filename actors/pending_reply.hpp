#pragma once
/// A cancellable wait for the answer of a helper actor's request (the
/// session's run, variable op and wait for initialization, with a cancel
/// flag: the REPL's and Python's Ctrl-C).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

#include "caf/all.hpp"

#include "messages/error.hpp"

namespace af {

/// The answer a helper actor of a cancellable request delivers, and the
/// wait for it: 20 ms slices, each checking the cancel flag.
template <class T>
struct pending_reply {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  caf::expected<T> value{caf::error{}};

  void settle(caf::expected<T> v) {
    std::lock_guard<std::mutex> g{m};
    value = std::move(v);
    done = true;
    cv.notify_all();
  }

  caf::expected<T> wait(const std::atomic<bool>& cancel, const caf::actor& helper,
                        const char* what) {
    std::unique_lock<std::mutex> lock{m};
    while (!cv.wait_for(lock, std::chrono::milliseconds{20}, [&] { return done; }))
      if (cancel.load()) {
        // Stopping the helper drops its request: nothing waits for the
        // answer, and the actor system does not wait for it at shutdown.
        caf::anon_send_exit(helper, caf::exit_reason::user_shutdown);
        return make_error(af_error::cancelled, std::string{what} + " was abandoned");
      }
    return std::move(value);
  }
};

} // namespace af
