#pragma once
/// A key-value store for rendezvous (Gloo's Store, torch.distributed's
/// TCPStore): every node hosts one, reached through its node actor
/// ((kv_store) -> kv_store_actor, messages/node.hpp). The allreduce workers
/// publish their addresses in the chief's store and read each other's.
///
/// Protocol:
///   (kv_put, string key, string value)        -> (ok)   sets or replaces
///   (kv_get, string key, uint32 timeout_ms)   -> (string)
///        answered once `key` has a value (at once if it has one); after
///        `timeout_ms` af_error::timeout naming the key. A waiter that dies is
///        dropped.
/// Keys and values are at most 64 KiB each; the store holds at most 4096 keys
/// (resource_exhausted beyond).

#include <cstdint>
#include <string>

#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"

#include "messages/atoms.hpp"

namespace af {

using kv_store_actor = caf::typed_actor<
  caf::replies_to<kv_put_atom, std::string, std::string>::with<caf::ok_atom>,
  caf::replies_to<kv_get_atom, std::string, uint32_t>::with<std::string>>;

} // namespace af
