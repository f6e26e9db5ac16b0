#pragma once
/// Checkpoints of a sparse job (dist/sparse_job.hpp; docs/sparse.md "The
/// sparse job"): no process holds a whole table, so none writes one. The
/// chief asks every ps to write the shards it holds (value and optimizer
/// slots, train/table_checkpoint.hpp, through the node's (save,
/// table_shard_request)), all at once, then writes each table's manifest,
/// then the job's state: a train/checkpoint.hpp file (global step, data
/// position, config; no variables) written last, with `latest` naming it.
/// So `latest` names only a checkpoint whose every file is in place.
///
/// Layout of checkpoint_dir:
///   tables-<step>/<table>.shard-<k>-of-<n>.aftab, <table>.manifest
///                   every table's shards, and each dense parameter as a
///                   table of one shard (ps 0 holds them all)
///   ckpt-<step>.afck, latest   the job's state (train::save, keeps 3; the
///                   tables-<step> directories of the checkpoints it
///                   removed are removed with them)
///
/// A restore reads the old layout from each manifest, so a job saved over
/// 3 ps (mod) resumes over 2 or 4 (mod or div): each ps fills its new
/// shards from the old files' chunks that hold their rows (the node's
/// (restore, table_shard_request)). The directory must be one every ps and
/// the chief see at the same path (a shared file system, or one host).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "caf/expected.hpp"

#include "actors/session.hpp"
#include "dist/ps_recovery.hpp"
#include "dist/sparse_step.hpp"
#include "train/checkpoint.hpp"
#include "train/config.hpp"

namespace af {

/// What a sparse job's checkpoint holds, as the job lays it out now.
struct sparse_checkpoint_job {
  const sparse_layout* layout = nullptr;
  std::vector<std::string> table_names;  ///< per layout table
  std::vector<shape_type> table_rows;    ///< per layout table: a row's shape (dims after the first)
  std::vector<shape_type> dense_shapes;  ///< per dense parameter: its shape (rank 1 or more)
  std::vector<std::string> slot_names;   ///< the optimizer's (train::slot_names)
  std::vector<float> slot_starts;        ///< train::slot_initial_value of each
  std::chrono::milliseconds timeout{0};  ///< for each ps's save or restore of its shards
};

/// `<checkpoint_dir>/tables-<step>`: the table files of the checkpoint at `step`.
std::string sparse_tables_dir(const std::string& checkpoint_dir, uint64_t step);

/// The chief's checkpoint at `global_step`: every ps writes its shards at
/// once (the call returns when all have, or names the first that failed),
/// then the manifests, then the state file (train::save: atomic, `latest`
/// updated last). Returns the state file's path. The caller makes the step
/// consistent: in sync, it saves between rounds (no update can happen while
/// the chief, a worker every round waits for, is here).
caf::expected<std::string> save_sparse_checkpoint(session& s, const sparse_checkpoint_job& j,
                                                  const train::train_config& c,
                                                  uint64_t global_step, uint64_t data_position);

/// The state of the latest checkpoint in c.checkpoint_dir (its key
/// checked), or nothing if there is none; errors name the file.
caf::expected<std::optional<train::checkpoint>>
latest_sparse_checkpoint(const train::train_config& c);

/// Every ps restores its shards of every table, and ps 0 the dense
/// parameters, from the checkpoint at `step` in c.checkpoint_dir (any old
/// layout), all at once; `run_id` marks the values (wait_initialized). With
/// `only_ps`, that ps alone (one that died and came back: the others keep
/// their live state). With c.checkpoint_key, each table's manifest must
/// carry its HMAC, and through it every shard file's rows are checked
/// (train/table_checkpoint.hpp). Errors name the file.
caf::error restore_sparse_checkpoint(session& s, const sparse_checkpoint_job& j,
                                     const train::train_config& c, uint64_t step,
                                     const std::string& run_id,
                                     std::optional<size_t> only_ps = std::nullopt);

/// The chief's restore of ps `k` once it came back after it died
/// (training_detail::recovery_context::restore): that ps alone reads its
/// shards of every table, and ps 0 the dense parameters, from the latest
/// checkpoint's files (values and slots); the other ps keep their live
/// state. Without a checkpoint yet, the values it was just initialized with.
caf::expected<training_detail::restored_ps> restore_lost_ps(session& s,
                                                            const sparse_checkpoint_job& j,
                                                            const train::train_config& c,
                                                            size_t k);

} // namespace af
