#pragma once
/// How the chief (worker 0) of a between-graph job (sync, async, ssp,
/// average) starts the job on its ps tasks (docs/training.md, "A chief that
/// comes back"):
///
///   - a ps task that holds the job's state already (its variables are
///     initialized: it ran the job with an earlier incarnation of the chief,
///     which died) is taken as it is: nothing it applied is lost, and the job
///     goes on from its global step, as a worker that joins (--join) does;
///   - a ps task that lost its state (a new process, never initialized) is
///     restored from the latest checkpoint, or initialized when the job has
///     none; next to live ps tasks, at their global step (as the chief
///     restores a ps that dies while it runs);
///   - every ps without state, with a checkpoint: the job resumes from it.
///
/// The latest checkpoint is needed only for a ps without state: a chief
/// that cannot read it (torn, refused) takes a job whose every ps is live
/// without it, and says so.
///
/// What the other workers need (the global step and the data position the
/// job starts at) comes back; run_worker_task publishes it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "caf/expected.hpp"

#include "actors/session.hpp"
#include "dist/worker.hpp"
#include "messages/aggregator.hpp"
#include "train/checkpoint.hpp"
#include "train/config.hpp"
#include "train/model.hpp"

namespace af {

/// The checkpoint's values and slots (train::slot_names order; a slot it
/// lacks starts at train::slot_initial_value of `optimizer`) of each of
/// `pieces`: their rows of the logical variables the checkpoint holds, so a
/// job resumes on any number of ps tasks and partitions. With its global
/// step.
caf::expected<aggregator_state> restored_state(const train::checkpoint& ck, const std::string& dir,
                                               const std::vector<train::parameter>& params,
                                               const std::vector<train::piece>& pieces,
                                               const train::optimizer_spec& optimizer,
                                               const std::string& aggregator = {});

/// What the chief found on its ps tasks (train_options::found).
enum class ps_found {
  unknown, ///< it has not looked yet (it failed before)
  new_job, ///< no ps held the job's state: the chief started the job (or resumed it) itself
  running, ///< some ps ran the job already: the job was running before this chief came
};

/// Where the chief starts the job.
struct chief_start {
  uint64_t step = 0;     ///< the global step (ps 0's aggregator)
  uint64_t position = 0; ///< the data position (data_position)
  bool taken = false;    ///< some ps ran the job already: taken as it is
};

/// Starts the job on `shards` (their variables `shard_vars`, per shard) as
/// said above. `restored`: the job's latest checkpoint, if any, read from
/// `restored_path`; `unreadable`: why the latest checkpoint could not be
/// read (none if it was, or the job has none), an error only when a ps needs
/// it. `found` is set as soon as it knows whether the job was running (also
/// when it fails after that).
/// Prints "chief: took the running job at global_step=G ..." when it takes a
/// live job.
caf::expected<chief_start>
start_job_on_ps(session& s, const train::train_config& c,
                const std::vector<train::parameter>& params,
                const std::vector<param_shard>& shards,
                const std::vector<std::vector<output>>& shard_vars, uint32_t workers,
                const std::optional<train::checkpoint>& restored,
                const std::string& restored_path, const caf::error& unreadable, ps_found& found);

} // namespace af
