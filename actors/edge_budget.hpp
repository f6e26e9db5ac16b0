#pragma once
/// The receiving side's bounds on edge values (issue 12; docs/wire.md
/// "Activations"): how many bytes of values an executor holds that no
/// running step has taken yet, shared between the data-plane server (which
/// reserves before it allocates) and the executor (which gives them back
/// when a step takes the value or the value is dropped), and a rate limit
/// for the logs of refused edges.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "actors/per_actor.hpp"
#include "caf/actor_addr.hpp"

namespace af {

/// Steps of one graph that edges may open on an executor before their
/// run_step comes: an early edge for another is dropped (its step then
/// fails by its timeout, naming the value it waits for). Step ids are
/// numbered per session across all its graphs, so the bound is on how many,
/// not how far ahead.
constexpr size_t max_early_steps_per_graph = 4;

/// Bytes of edge values one executor holds that no running step has taken:
/// those the data plane delivered and the executor has not handled yet, and
/// those held by steps whose run_step has not come. The data plane allows
/// 2 x its max_message_bytes per executor.
using edge_bytes_counter = std::atomic<int64_t>;

namespace detail {
inline per_actor<edge_bytes_counter>& edge_budgets() {
  static per_actor<edge_bytes_counter> table;
  return table;
}
} // namespace detail

/// The counter of executor `id` (made on the first call; by address, not
/// id: a process may run several actor systems); the executor keeps
/// it, forget_edge_bytes drops it from the registry at its exit.
inline std::shared_ptr<edge_bytes_counter> edge_bytes_of(const caf::actor_addr& id, bool make) {
  return detail::edge_budgets().get(id, make);
}

inline void forget_edge_bytes(const caf::actor_addr& id) {
  detail::edge_budgets().forget(id);
}

/// Takes `n` bytes of `budget` unless that goes over it (a value alone over
/// the budget is taken only when nothing else is held).
inline bool reserve_edge_bytes(edge_bytes_counter& c, int64_t n, int64_t budget) {
  auto held = c.load();
  do {
    if (held > 0 && held + n > budget)
      return false;
  } while (!c.compare_exchange_weak(held, held + n));
  return true;
}

/// Gives `n` bytes back (never below zero).
inline void release_edge_bytes(edge_bytes_counter& c, int64_t n) {
  auto held = c.load();
  while (!c.compare_exchange_weak(held, std::max<int64_t>(0, held - n))) {
  }
}

/// Says whether to log a refusal now: the first, then once per `every`
/// with the count of those not logged meanwhile (in `skipped`).
struct refusal_log {
  std::chrono::steady_clock::time_point last{};
  uint64_t unlogged = 0;
  bool any = false;
  bool due(uint64_t& skipped, std::chrono::seconds every = std::chrono::seconds{10}) {
    auto now = std::chrono::steady_clock::now();
    if (any && now - last < every) {
      ++unlogged;
      return false;
    }
    skipped = unlogged;
    unlogged = 0;
    any = true;
    last = now;
    return true;
  }
};

} // namespace af
