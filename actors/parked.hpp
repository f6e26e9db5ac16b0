#pragma once
/// Requests an actor parks until what they wait for happens, their deadline
/// passes or their requester dies: a variable's wait_init (released by its
/// first value), a kv-store get (released by the put of its key). One place
/// for what both need: the response promises, monitoring each requester once
/// and forgetting it when none of its requests is left, and one pending sweep
/// message that fails the requests past their deadline with the owner's reason.
///
///   parked_requests<uint64_t, std::string> waiters;        // in the state
///   return waiters.park(self, run_id, timeout_ms);          // in a handler
///   waiters.release(self, [&](auto& run) { return ...; }, [&](auto&) { return v; });
///   [self](sweep_atom) { self->state.waiters.sweep(self, why); }
///   down handler: self->state.waiters.drop(dm.source);
///   exit handler: self->state.waiters.fail_all(why); self->quit(em.reason);
///
/// The owner's interface must accept `sweep_atom`.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "caf/actor_addr.hpp"
#include "caf/actor_cast.hpp"
#include "caf/typed_response_promise.hpp"

#include "messages/atoms.hpp"

namespace af {

template <class T, class Key>
class parked_requests {
public:
  using clock_type = std::chrono::steady_clock;

  struct entry {
    Key key;                   ///< what it waits for
    clock_type::time_point deadline;
    uint32_t timeout_ms = 0;
    caf::typed_response_promise<T> promise;
    caf::actor_addr requester; ///< monitored: its death drops its requests
  };

  size_t size() const {
    return items_.size();
  }

  /// Parks `self`'s current request for `key` for at most `timeout_ms`; the
  /// handler returns the promise. May throw std::bad_alloc (nothing parked).
  template <class Self>
  caf::typed_response_promise<T> park(Self* self, Key key, uint32_t timeout_ms) {
    entry e;
    e.key = std::move(key);
    e.timeout_ms = timeout_ms;
    e.deadline = clock_type::now() + std::chrono::milliseconds{timeout_ms};
    auto sender = self->current_sender();
    e.requester = caf::actor_cast<caf::actor_addr>(sender);
    e.promise = self->template make_response_promise<T>();
    auto deadline = e.deadline;
    auto promise = e.promise;
    bool watched = std::any_of(items_.begin(), items_.end(),
                               [&](const entry& x) { return x.requester == e.requester; });
    items_.push_back(std::move(e));
    if (sender && !watched)
      self->monitor(sender);
    schedule_sweep(self, deadline);
    return promise;
  }

  /// Answers with `value(key)` and removes every request whose key `pick`s.
  template <class Self, class Pick, class Value>
  void release(Self* self, Pick pick, Value value) {
    std::vector<caf::actor_addr> gone;
    for (auto it = items_.begin(); it != items_.end();) {
      if (pick(it->key)) {
        it->promise.deliver(value(it->key));
        gone.push_back(it->requester);
        it = items_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& who : gone)
      forget(self, who);
  }

  /// The sweep message's handler: fails each request past its deadline with
  /// `why(entry)` (a caf::error naming what it waited for), then schedules
  /// the next sweep.
  template <class Self, class Why>
  void sweep(Self* self, Why why) {
    auto now = clock_type::now();
    if (sweep_at_ && *sweep_at_ <= now)
      sweep_at_.reset();
    std::vector<caf::actor_addr> gone;
    std::optional<clock_type::time_point> next;
    for (auto it = items_.begin(); it != items_.end();) {
      if (it->deadline <= now) {
        it->promise.deliver(why(*it));
        gone.push_back(it->requester);
        it = items_.erase(it);
      } else {
        next = next ? std::min(*next, it->deadline) : it->deadline;
        ++it;
      }
    }
    for (auto& who : gone)
      forget(self, who);
    if (next)
      schedule_sweep(self, *next);
  }

  /// Fails every request with `why(entry)` at once: the owner is stopping
  /// (CAF 0.17 answers nothing for a promise its actor drops, so each
  /// requester would otherwise wait out its whole timeout).
  template <class Why>
  void fail_all(Why why) {
    for (auto& e : items_)
      e.promise.deliver(why(e));
    items_.clear();
  }

  /// Drops the requests of a requester that died: nobody is left to answer.
  void drop(const caf::actor_addr& who) {
    items_.erase(std::remove_if(items_.begin(), items_.end(),
                                [&](const entry& e) { return e.requester == who; }),
                 items_.end());
  }

private:
  /// Stops watching `who` once none of its requests is left.
  template <class Self>
  void forget(Self* self, const caf::actor_addr& who) {
    if (!who)
      return;
    if (std::none_of(items_.begin(), items_.end(), [&](const entry& e) { return e.requester == who; }))
      self->demonitor(who);
  }

  /// Makes sure a sweep message arrives by `deadline`.
  template <class Self>
  void schedule_sweep(Self* self, clock_type::time_point deadline) {
    auto now = clock_type::now();
    if (sweep_at_ && *sweep_at_ > now && *sweep_at_ <= deadline)
      return; // an earlier sweep is pending; it schedules the next one
    sweep_at_ = deadline;
    self->delayed_send(self, std::max(deadline - now, clock_type::duration::zero()),
                       sweep_atom::value);
  }

  std::vector<entry> items_;
  /// When the earliest pending sweep message fires (none if empty).
  std::optional<clock_type::time_point> sweep_at_;
};

} // namespace af
