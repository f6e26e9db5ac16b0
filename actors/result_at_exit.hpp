#pragma once
/// A result that an actor hands to a waiting thread only once it has ended
/// and told every actor that watches it.
///
/// Why: a thread woken by a result set before the actor quit may destroy the
/// actor system while the actor still has its down messages to send. One
/// that reaches the BASP broker after the middleman stopped stays in its
/// mailbox (CAF 0.17's broker cleanup never empties it), holding its sender:
/// a detached sender is never destroyed, and `~actor_system` waits for its
/// thread forever (docs/training.md, the teardown deadline).
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
