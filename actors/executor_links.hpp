#pragma once
/// The executor's helpers to other nodes' data planes (internal to
/// actors/executor*.cpp): one detached remote reader or edge sender per node
/// ("/job:J/task:T at host:port"), made on first use, stopped when a request
/// to it fails with none other in flight, when a peer on its node dies, or
/// when it was idle for a minute as another is made.

#include <cstdint>
#include <string>

#include "caf/actor.hpp"
#include "caf/actor_addr.hpp"

#include "actors/executor.hpp"

namespace af::exec {

using self_ptr = executor_actor::stateful_pointer<executor_state>;

/// Steady clock, in nanoseconds.
int64_t now_ns();

/// Stops helper `key` (its wait, if any, gives up at once) and forgets it.
/// `edges`: an edge sender, else a remote reader.
void drop_link(self_ptr self, bool edges, const std::string& key);

/// The helper for `key` ("/job:J/task:T at host:port"; `address`: its data
/// plane), made if there is none; counts the request about to go to it.
caf::actor use_link(self_ptr self, bool edges, const std::string& key, const std::string& address);

/// A request to helper `a` for `key` was answered (or failed: then, with
/// no other request in flight, the helper is stopped; the next request
/// makes a fresh one, on a fresh connection).
void release_link(self_ptr self, bool edges, const std::string& key, const caf::actor& a,
                  bool failed);

/// "/job:J/task:T at `address`" for the data plane of the node of `task`
/// ("/job:J/task:T", or "/job:J/task:T at host:port"): TLS then checks the
/// node's certificate is that task's.
std::string link_key(const std::string& task, const std::string& address);

/// Stops the helpers that serve the node of `peer` (an executor or a
/// variable of a registered graph that died): their waits give up.
void drop_links_to(self_ptr self, const caf::actor_addr& peer);

} // namespace af::exec
