#pragma once
/// The node's side of table checkpoints (messages/node.hpp's save and
/// restore of a table_shard_request): the ps that holds a shard writes it
/// and reads it back itself, through train/table_checkpoint.hpp, so no
/// process ever holds the whole table. The file I/O runs on a detached actor
/// of its own (one per request), not on the node's thread: a shard of
/// gigabytes takes seconds to write.

#include <memory>
#include <string>

#include "caf/fwd.hpp"
#include "caf/typed_actor.hpp"

#include "actors/variable.hpp"
#include "messages/node.hpp"

namespace af {

/// One request's worker: answers one save or restore, then ends.
using table_shard_worker = caf::typed_actor<
  caf::replies_to<save_atom, table_shard_request>::with<std::string>,
  caf::replies_to<restore_atom, table_shard_request>::with<uint64_t>>;

/// A worker for the shard variable `cell` (detached: blocking file I/O);
/// after a restore it tells `actor` (may be null), whose wait_init waiters
/// the restored value releases.
table_shard_worker spawn_table_shard_worker(caf::actor_system& sys,
                                            std::shared_ptr<variable_cell> cell,
                                            variable_cell_actor actor);

} // namespace af
