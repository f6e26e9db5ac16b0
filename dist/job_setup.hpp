#pragma once
/// What a worker task of a training job (dist/training.hpp) and an in-graph
/// client (run_in_graph) set up before they train: the job's data and
/// parameters, the variables and aggregators on the ps tasks, the chief's
/// key-value store, and access to the job's checkpoints. Internal to dist/.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "caf/error.hpp"
#include "caf/expected.hpp"

#include "actors/kv_store.hpp"
#include "actors/session.hpp"
#include "dist/worker.hpp"
#include "graph/outcome.hpp"
#include "train/checkpoint.hpp"
#include "train/checkpoint_check.hpp"
#include "train/config.hpp"
#include "train/data.hpp"
#include "train/model.hpp"

namespace af::training_detail {

/// A graph library error as a caf::error with the same code and text.
caf::error to_error(const graph_error& e);

/// The config checked as a whole (train::validate), before anything runs.
caf::error check_config(const train::train_config& c);

/// The job's data, its model's parameters and its step count.
struct job_data {
  std::shared_ptr<const train::split> data;
  std::vector<train::parameter> params;
  uint64_t total = 0; ///< train::total_steps
};

/// Loads the job's data for `replicas` replicas (check_batch), makes its
/// parameters, and counts its steps as train::total_steps with `per_step`
/// batches of the training set consumed per global step.
caf::expected<job_data> load_job(const train::train_config& c, uint32_t replicas,
                                 uint32_t per_step);

/// The aggregator spec of `c` for `mode` and `workers` (the name is the caller's).
aggregator_spec aggregator_spec_of(const train::train_config& c, const std::string& mode,
                                   uint32_t workers);

/// The variables on the ps tasks and an aggregator over each task's share.
struct ps_placement {
  std::vector<output> vars;
  std::vector<param_shard> shards;
  std::vector<std::vector<output>> shard_vars; ///< per shard: its variables
  std::vector<aggregator_spec> specs;          ///< per shard: its aggregator's
};

/// Creates one variable per piece of the partition plan (train/partition.hpp:
/// whole parameters round robin as TF's replica_device_setter with
/// max_partitions = 1, else pieces spread by size) on its ps task, and gets
/// each task's aggregator over its pieces, `name_prefix` + "ps<k>", for
/// `workers` workers in `mode` (0 workers: the aggregators as they run, for
/// a worker that joins).
caf::expected<ps_placement> place_on_ps(session& s, const train::train_config& c,
                                        const std::vector<train::parameter>& params,
                                        const std::string& name_prefix, const std::string& mode,
                                        uint32_t workers);

/// The chief's key-value store and the incarnation of its node (a key
/// under it belongs to this run of the chief, not to an earlier one).
struct chief_store {
  kv_store_actor store;
  uint64_t incarnation = 0;
};

/// The chief's key-value store, through `s`.
caf::expected<chief_store> chief_store_of(session& s);

/// Where the job starts, as the chief publishes it in its key-value store for
/// the other workers: "<global step> <data position> <total steps>".
std::string start_key(uint64_t chief_incarnation);

/// How this job reads and writes its checkpoints: the directory, the HMAC
/// key (checkpoint_key; empty: none) and what a checkpoint must be to be
/// restored (train::check_checkpoint).
struct checkpoint_access {
  std::string dir;
  train::checkpoint_key key;
  train::checkpoint_expectations expect;
};

/// The chief's (and allreduce's workers') checkpoint_access: the key file
/// read once, at start, so that a bad one fails the job before it trains.
caf::expected<checkpoint_access> checkpoint_access_of(const train::train_config& c,
                                                      const std::vector<train::parameter>& params,
                                                      uint64_t total, uint32_t workers);

/// The latest checkpoint of the job and its path, checked against the job
/// (its HMAC, its fields, finite values); none if the job has none yet.
caf::expected<std::optional<std::pair<std::string, train::checkpoint>>>
load_latest_checkpoint(const checkpoint_access& from);

/// An error naming every worker whose done said it failed (a worker that
/// failed and joined again, and then finished, is not named), or none.
caf::error failed_workers(const aggregator_stats& stats);

} // namespace af::training_detail
