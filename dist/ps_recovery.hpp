#pragma once
/// Ps recovery (docs/training.md): a ps task whose process died is waited
/// for (bounded by ps_recovery_timeout_ms); the chief re-creates its
/// variables and aggregator on the new process and restores them from the
/// latest checkpoint, and says so in its key-value store, where the other
/// workers wait for that word before they push to it again. The worker actor
/// calls it through worker_setup::recover_ps. Internal to dist/.

#include <cstdint>
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
  /// A session of short timeouts for the pings while waiting: the first
  /// ping after a kill may go to the dead node's proxy, which CAF does not
  /// answer; the job's session would wait its whole request timeout.
  std::optional<session> pinger;
  /// Held while a recovery runs (on the recovery link's thread); closed
  /// once run_worker_task is done with the sessions, under the same lock.
  std::mutex mtx;
  bool closed = false;
};

/// worker_setup::recover_ps over `ctx`: the chief's recovery on task 0, the
/// other workers' elsewhere; af_error::cancelled once close_recovery ran.
std::function<caf::expected<recovered_shard>(size_t, uint64_t, const std::string&, bool)>
recover_ps_of(std::shared_ptr<recovery_context> ctx);

/// Ends `ctx`'s recoveries (under its lock): a recovery that starts later
/// fails as cancelled, and its pinger session goes now, before the job's
/// session and the actor system.
void close_recovery(recovery_context& ctx);

} // namespace af::training_detail
