#pragma once
/// A cancellable wait for the answer of a helper actor's request (the
/// session's run, variable ops, variable creation and initialization, the
/// wait for initialization and a node's connect, with a cancel flag: the
/// REPL's and Python's Ctrl-C).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

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

  /// The first answer wins (a helper that stopped after it settles nothing).
  void settle(caf::expected<T> v) {
    std::lock_guard<std::mutex> g{m};
    if (done)
      return;
    value = std::move(v);
    done = true;
    cv.notify_all();
  }

  /// Whether the answer came within `d` (the caller's own slices: Python's
  /// waits that look for Ctrl-C with the GIL held between them).
  bool wait_for(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock{m};
    return cv.wait_for(lock, d, [&] { return done; });
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

/// A flag no one sets: the wait of a session without a cancel flag.
inline const std::atomic<bool>& never_cancelled() {
  static const std::atomic<bool> never{false};
  return never;
}

/// The cancel flag of session options `o` (session_options::cancel), or one no one sets.
template <class Options>
const std::atomic<bool>& cancel_flag(const Options& o) {
  return o.cancel ? *o.cancel : never_cancelled();
}

namespace detail {

/// The response handler of ask_cancellable: `fn`'s own arguments (CAF
/// matches a handler by its signature, so it cannot be a generic lambda),
/// settling `r` with what `fn` returns.
template <class F>
struct settling : settling<decltype(&F::operator())> {};

template <class C, class R, class... As>
struct settling<R (C::*)(As...) const> {
  template <class T, class Fn>
  static auto make(std::shared_ptr<pending_reply<T>> r, Fn fn) {
    return [r, fn](As... xs) { r->settle(fn(std::forward<As>(xs)...)); };
  }
};

} // namespace detail

/// Asks `dest` (message `xs...`, reply within `timeout`) from a helper actor
/// and waits for the answer in 20 ms slices: `on_answer` (a lambda of the
/// reply's types, not a generic one) turns the reply into the result; an
/// error reply is the result as it is; `cancel` set ends the wait with
/// af_error::cancelled ("`what` was abandoned"), the request dropped. What
/// a blocking `self->request(...).receive(...)` does, but Ctrl-C ends it
/// within 20 ms instead of at its timeout.
template <class T, class Dest, class OnAnswer, class... Ts>
caf::expected<T> ask_cancellable(caf::actor_system& sys, const std::atomic<bool>& cancel,
                                 const char* what, const Dest& dest,
                                 std::chrono::milliseconds timeout, OnAnswer on_answer, Ts... xs) {
  if (cancel.load())
    return make_error(af_error::cancelled, std::string{what} + " was abandoned before it started");
  auto r = std::make_shared<pending_reply<T>>();
  auto helper = sys.spawn([r, dest, timeout, on_answer, msg = std::make_tuple(std::move(xs)...)](
                            caf::event_based_actor* a) mutable {
    // Alive while its request is pending (CAF keeps an actor that awaits a
    // response), gone once the answer or the timeout came.
    std::apply(
      [&](auto&... args) {
        a->request(dest, timeout, std::move(args)...)
          .then(detail::settling<OnAnswer>::make(r, on_answer),
                [r](caf::error& e) { r->settle(std::move(e)); });
      },
      msg);
  });
  // A helper stopped before its answer (the actor system shutting down)
  // ends the wait too, which would otherwise wait for it for good.
  helper->attach_functor([r, what = std::string{what}] {
    r->settle(make_error(af_error::aborted,
                         what + ": stopped before its answer (the actor system is shutting down)"));
  });
  return r->wait(cancel, helper, what);
}

} // namespace af
