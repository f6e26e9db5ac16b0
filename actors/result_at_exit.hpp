#pragma once
/// A result that an actor hands to a waiting thread only once it has ended
/// and told every actor that watches it.
///
/// Why: CAF 0.17 takes an actor off the system's count of running actors
/// first thing in its cleanup, and only then sends its down and exit
/// messages. A thread that is woken by a result set before the actor quit
/// may go on to destroy the actor system while those messages are still to
/// be sent. One sent to the BASP broker (which watches every local actor
/// whose handle went to another node) after the middleman stopped stays in
/// the broker's mailbox for good: a broker's cleanup never empties it. The
/// message holds its sender; a detached sender is then never destroyed, and
/// `~actor_system` waits for its thread forever. A worker process over
/// shared memory hung so at its end about once in 30 runs, until the
/// teardown deadline (programs/teardown_deadline.hpp) ended it.
///
/// Attach it first, when the actor starts: CAF runs an actor's attachables
/// newest first, so this one runs after every monitor and link attached
/// later. `set` keeps the first value; the actor's end delivers it, or
/// `otherwise(reason)` if none was set. Thread-safe.

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "caf/error.hpp"
#include "caf/local_actor.hpp"

namespace af {

template <class T>
class result_at_exit {
public:
  using deliver_fn = std::function<void(T)>;
  using otherwise_fn = std::function<T(const caf::error&)>;

  /// Attaches to `self` (call it before anything else may watch `self`).
  static std::shared_ptr<result_at_exit> attach(caf::local_actor* self, deliver_fn deliver,
                                                otherwise_fn otherwise) {
    auto out = std::shared_ptr<result_at_exit>(
      new result_at_exit(std::move(deliver), std::move(otherwise)));
    self->attach_functor([out](const caf::error& reason) { out->deliver(reason); });
    return out;
  }

  /// The result, delivered when the actor has ended. The first value counts.
  void set(T value) {
    std::lock_guard<std::mutex> guard{mtx_};
    if (!value_)
      value_.emplace(std::move(value));
  }

private:
  result_at_exit(deliver_fn deliver, otherwise_fn otherwise)
    : deliver_(std::move(deliver)), otherwise_(std::move(otherwise)) {
  }

  void deliver(const caf::error& reason) {
    std::optional<T> value;
    deliver_fn f;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      value = std::move(value_);
      f = std::move(deliver_);
      deliver_ = nullptr;
    }
    if (!f)
      return;
    f(value ? std::move(*value) : otherwise_(reason));
  }

  std::mutex mtx_;
  std::optional<T> value_;
  deliver_fn deliver_;
  otherwise_fn otherwise_;
};

} // namespace af
