#pragma once
/// The rendezvous key-value store's implementation (interface:
/// messages/kv_store.hpp) and a blocking client for code that is not an actor.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "caf/actor_addr.hpp"
#include "caf/actor_system.hpp"
#include "caf/error.hpp"
#include "caf/expected.hpp"
#include "caf/typed_response_promise.hpp"

#include "actors/parked.hpp"
#include "messages/atoms.hpp"
#include "messages/kv_store.hpp"

namespace af {

/// The limits of one store (messages/kv_store.hpp): beyond them a put or get
/// gets resource_exhausted naming the limit.
struct kv_store_limits {
  static constexpr size_t max_key_bytes = 64 * 1024;
  static constexpr size_t max_value_bytes = 64 * 1024;
  static constexpr size_t max_keys = 4096;
  /// Gets parked at once for keys that have no value yet.
  static constexpr size_t max_waiters = 4096;
};

/// The store's full interface: the protocol plus its own timer.
///   (sweep)  drop the waiters past their timeout
using kv_store_server_actor = kv_store_actor::extend<caf::reacts_to<sweep_atom>>;

/// Values, and the gets waiting for a key that has none yet.
struct kv_store_state {
  std::unordered_map<std::string, std::string> values;
  /// gets, keyed by the key they wait for.
  parked_requests<std::string, std::string> waiters;

  static constexpr const char* name = "kv_store";
};

/// The behavior. A waiter is answered by the put of its key, fails with
/// af_error::timeout naming the key at its deadline, and is dropped when its
/// requester dies.
kv_store_server_actor::behavior_type
kv_store_impl(kv_store_server_actor::stateful_pointer<kv_store_state> self);

/// Spawns an empty store.
kv_store_actor spawn_kv_store(caf::actor_system& sys);

/// Blocking access to a store (local or remote) for a plain thread or a
/// detached actor. Each call uses its own hidden scoped actor, so one client
/// may serve several threads at once.
class kv_client {
public:
  /// `request_timeout` bounds a put, and a get beyond the get's own timeout
  /// (the store answers a get's timeout itself; this only catches a store
  /// that does not answer at all).
  kv_client(caf::actor_system& sys, kv_store_actor store,
            std::chrono::milliseconds request_timeout = std::chrono::seconds{30});

  /// Sets or replaces `key`.
  caf::error put(const std::string& key, const std::string& value);

  /// The value of `key`, waiting up to `timeout` for someone to put it;
  /// af_error::timeout naming the key after that.
  caf::expected<std::string> get(const std::string& key, std::chrono::milliseconds timeout);

  const kv_store_actor& store() const { return store_; }

private:
  caf::actor_system& sys_;
  kv_store_actor store_;
  std::chrono::milliseconds request_timeout_;
};

} // namespace af
