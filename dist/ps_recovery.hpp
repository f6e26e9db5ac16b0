#pragma once
/// Ps recovery (docs/training.md): a ps task whose process died is waited
/// for (bounded by ps_recovery_timeout_ms); the chief re-creates its
/// variables and aggregator on the new process and restores them from the
/// latest checkpoint, and says so in its key-value store, where the other
/// workers wait for that word before they push to it again. The dense job's
/// worker actor calls it through worker_setup::recover_ps; a sparse job's
/// links through dist/sparse_recovery.hpp, its chief restoring the ps's
/// table shards its own way (recovery_context::restore). Internal to dist/.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "caf/expected.hpp"

#include "actors/kv_store.hpp"
#include "actors/session.hpp"
#include "dist/job_setup.hpp"
#include "dist/worker.hpp"
#include "train/config.hpp"

namespace af::training_detail {

/// What the chief restored a ps's state from (recovery_context::restore).
struct restored_ps {
  /// For the new aggregator's restore: its variables' values and slots, or
  /// none (the step only: the ps restored its variables itself).
  aggregator_state state;
  std::string from = "its initial values (no checkpoint yet)"; ///< the checkpoint's path
  uint64_t from_step = 0;                                       ///< its global step
  /// What was restored, for the chief's lines.
  std::string what = "its variables and their optimizer slots";
};

/// What waiting for a ps that died needs (worker_setup::recover_ps): the
/// session (used on the recovery link's thread while run_worker_task waits
/// for the worker), and, on the chief, what re-creates and restores the ps.
struct recovery_context {
  session* s = nullptr;
  train::train_config c;
  std::vector<train::parameter> params;
  std::vector<param_shard> shards;            ///< as last seen (incarnations)
  std::vector<std::vector<output>> vars;      ///< per shard
  std::vector<aggregator_spec> specs;         ///< per shard
  kv_store_actor store;                       ///< the chief's
  checkpoint_access checkpoints;              ///< the chief's
  uint64_t chief_incarnation = 0;
  uint32_t task = 0;
  /// The job's client asked it to stop (null: never): the waits for a ps
  /// end then, as the worker's steps do, instead of running out their
  /// ps_recovery_timeout_ms (a job stopped while its ps went away with it).
  std::shared_ptr<const std::atomic<bool>> stop;
  /// The chief: restores ps `k` (its variables just re-created and
  /// initialized, its new aggregator `shard.actor`) from the latest
  /// checkpoint the job's own way. Empty: the dense job's, the checkpoint's
  /// rows of the ps's pieces through `params` and `checkpoints`, handed to
  /// the aggregator (a sparse job's ps reads its own table shards instead).
  std::function<caf::expected<restored_ps>(size_t k, const param_shard& shard)> restore;
  /// A session of short timeouts for the pings while waiting: the first
  /// ping after a kill may go to the dead node's proxy, which CAF does not
  /// answer; the job's session would wait its whole request timeout.
  std::optional<session> pinger;
  /// Held while a recovery runs (on the recovery link's thread); closed
  /// once run_worker_task is done with the sessions, under the same lock.
  std::mutex mtx;
  bool closed = false;
};

/// Waits (bounded by ps_recovery_timeout_ms) until ctx.shards[k]'s ps
/// answers as a new process (pings of 500 ms through ctx.pinger, made here
/// if none yet); nullopt if the same process answers (its connection broke,
/// not the process). A non-chief gives up at once when the chief is gone:
/// the job stops then (docs/training.md). `announce`: log the recovery's
/// line first (false: the caller logged its own, as a set-up does).
caf::expected<std::optional<node_info>> wait_for_ps(recovery_context& ctx, size_t k,
                                                    const std::string& why, bool announce);

/// The key under which the chief says it restored ps `k` in its new
/// incarnation: "<global step> <checkpoint step>" (another worker's recovery
/// waits for it).
std::string restored_key(uint64_t chief_incarnation, size_t k, uint64_t ps_incarnation);

/// worker_setup::recover_ps over `ctx`: the chief's recovery on task 0, the
/// other workers' elsewhere; af_error::cancelled once close_recovery ran.
std::function<caf::expected<recovered_shard>(size_t, uint64_t, const std::string&, bool)>
recover_ps_of(std::shared_ptr<recovery_context> ctx);

/// Shard k's aggregator looked up anew through `ctx`'s session (creating
/// none; under its lock), kept in ctx.shards: a worker whose aggregator
/// took it as left (af_error::left: a ps stopped past the nodes'
/// connection_timeout_ms) joins it again through this handle, the old one
/// having gone with the broken link. af_error::cancelled once
/// close_recovery ran.
std::function<caf::expected<aggregator_actor>(size_t)>
find_aggregator_of(std::shared_ptr<recovery_context> ctx);

/// Ends `ctx`'s recoveries (under its lock): a recovery that starts later
/// fails as cancelled, and its pinger session goes now, before the job's
/// session and the actor system.
void close_recovery(recovery_context& ctx);

} // namespace af::training_detail
