#pragma once
/// Ctrl-C in the module's waits (python/interrupt.cpp): a Session's calls
/// (run, wait_initialized, device_of, close and the wait for the session's
/// lock) take SIGINT through the session's cancel flag
/// (session_options::cancel) while the GIL is released, and raise
/// KeyboardInterrupt once they return.

#include <atomic>
#include <mutex>

#include "python/bindings.hpp"

namespace af::python {

/// One call's Ctrl-C, in three steps: decided with the GIL held (the main
/// thread, Python's default handler), armed and disarmed with the session's
/// lock held (the GIL released), so that the session's one cancel flag is
/// reset and watched only by the call that holds the session: a run of
/// another thread neither clears a Ctrl-C meant for this one nor gets it.
class interruptible_wait {
public:
  /// GIL held: decides whether this wait takes Ctrl-C.
  interruptible_wait();
  interruptible_wait(const interruptible_wait&) = delete;
  interruptible_wait& operator=(const interruptible_wait&) = delete;
  ~interruptible_wait() { disarm(); }

  /// GIL released: takes the session's lock `m`. While another thread
  /// holds it (a long run), the wait goes in 20 ms slices, and on the main
  /// thread Ctrl-C ends it: the lock is then not taken and seen() is true.
  std::unique_lock<std::timed_mutex> lock(std::timed_mutex& m);

  /// The session's lock held: a fresh `cancel`, and Ctrl-C sets it.
  void arm(std::atomic<bool>& cancel);

  /// The session's lock still held: Ctrl-C goes to Python again; whether it came.
  void disarm();

  /// Whether Ctrl-C came during the call.
  bool seen() const { return seen_; }

private:
  bool eligible_ = false, installed_ = false, seen_ = false;
  std::atomic<bool> waiting_{false}; ///< Ctrl-C while lock() waited
};

/// KeyboardInterrupt for a Ctrl-C that came during a call (it wins over the
/// call's own end: a wait that does not watch the cancel flag ended in
/// another error seconds later, and the Ctrl-C was lost). The call's error,
/// if any other than the cancel, is the KeyboardInterrupt's __context__.
[[noreturn]] void raise_interrupt(const caf::error& err);

} // namespace af::python
