#pragma once
/// The node actor: one per actorflow-node process (or per embedded node),
/// published at the task's address. It owns the variable registry.
///
/// Protocol:
///   (ping)                      -> (node_info)   who and what this node is, its
///        incarnation (new at every start: a client tells a restart from a
///        reconnect) and its steady clock (the client estimates the offset from
///        half the round trip, as NTP does, to put traces on one time line)
///   (get_var, variable_spec) -> (variable_actor)   get-or-create by name. Same name with the same
///        dtype and shape returns the existing actor; a mismatch is
///        shape_mismatch / dtype_mismatch naming both; a device the node does
///        not have is unknown_device.
///   (lookup, string name)       -> (variable_actor)  not_found if absent (a
///        restarted node holds none of the variables its predecessor had)
///   (list_vars)                 -> (vector<variable_info>)
///   (executor, string device)   -> (executor_actor)  e.g. "CPU:0"
///   (shutdown)                  -> (ok)  then the node stops its actors and exits
///   (aggregator, aggregator_spec) -> (aggregator_actor)  get-or-create by name
///        (messages/aggregator.hpp) over variables of this node; the same name
///        with another mode, variable list or worker count is already_exists;
///        a variable the node does not hold is not_found. Workers reach it over
///        the data plane by name.
///   (kv_store)                  -> (kv_store_actor)  the node's rendezvous store
///        (messages/kv_store.hpp)
///   (save, table_shard_request)  -> (string path)  writes the shard variable it
///        names, value and slots, as shard `shard` of its table to `dir`
///        (train/table_checkpoint.hpp), streamed from the variable's buffers
///        on a thread of its own; not_found if the node does not hold it
///   (restore, table_shard_request) -> (uint64_t version)  fills the shard
///        variable it names with its rows of the table checkpoint in `dir`
///        (any old layout: the manifest says which), value and slots, reading
///        only the old shard files' chunks that hold them
/// `devices` are local names: "CPU:0", "CPU:1", "GPU:0".

#include <cstdint>
#include <string>
#include <vector>

#include "caf/atom.hpp"
#include "caf/meta/type_name.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"

#include "messages/fwd.hpp"
#include "messages/aggregator.hpp"
#include "messages/executor.hpp"
#include "messages/kv_store.hpp"
#include "messages/variable.hpp"

namespace af {

struct node_info {
  std::string job;
  int32_t task = 0;
  std::vector<std::string> devices;  ///< "CPU:0", "GPU:0", ...
  int32_t pid = 0;
  uint16_t data_port = 0;            ///< the tensor data plane (net/data_plane.hpp); 0 = none
  uint64_t incarnation = 0;          ///< random per process start: a restarted node has a new one
  int64_t clock_ns = 0;              ///< the node's steady clock when it answered (clock offsets)
  std::vector<std::string> device_errors; ///< devices that failed to come up, with why ("GPU:1: ...")
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_info& x) {
  return f(caf::meta::type_name("node_info"), x.job, x.task, x.devices, x.pid, x.data_port,
           x.incarnation, x.clock_ns, x.device_errors);
}

/// A table shard's checkpoint, saved or restored by the node that holds the
/// shard (train/table_checkpoint.hpp): the layout is the shard's as it is now
/// (save) or as it is to be (restore).
struct table_shard_request {
  std::string dir;                      ///< the checkpoint directory, on the node's disk
  std::string variable;                 ///< the shard variable, e.g. "emb/part_1"
  std::string table;                    ///< e.g. "emb"
  uint8_t strategy = 0;                 ///< kernels::partition_strategy
  std::vector<int64_t> shard_rows;      ///< every shard's rows
  uint64_t shard = 0;                   ///< which of them `variable` is
  std::vector<std::string> slot_names;  ///< the optimizer's slots (slot_names order)
  std::vector<float> slot_starts;       ///< each slot's start where none exists
  uint64_t global_step = 0;             ///< save: written into the files; restore: theirs
  std::string run_id;                   ///< restore: the run that restores it
  /// restore: the SHA-256 (hex) of the table's manifest, as the chief
  /// checked it (its HMAC under checkpoint_key): the node refuses another
  /// manifest. Empty: not checked.
  std::string manifest_sha256;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, table_shard_request& x) {
  return f(caf::meta::type_name("table_shard_request"), x.dir, x.variable, x.table, x.strategy,
           x.shard_rows, x.shard, x.slot_names, x.slot_starts, x.global_step, x.run_id,
           x.manifest_sha256);
}

using node_actor = caf::typed_actor<
  caf::replies_to<caf::ping_atom>::with<node_info>,
  caf::replies_to<get_var_atom, variable_spec>::with<variable_actor>,
  caf::replies_to<lookup_atom, std::string>::with<variable_actor>,
  caf::replies_to<list_atom>::with<std::vector<variable_info>>,
  caf::replies_to<executor_atom, std::string>::with<executor_actor>,
  caf::replies_to<shutdown_atom>::with<caf::ok_atom>,
  caf::replies_to<aggregator_atom, aggregator_spec>::with<aggregator_actor>,
  caf::replies_to<kv_store_atom>::with<kv_store_actor>,
  caf::replies_to<save_atom, table_shard_request>::with<std::string>,
  caf::replies_to<restore_atom, table_shard_request>::with<uint64_t>>;

} // namespace af
