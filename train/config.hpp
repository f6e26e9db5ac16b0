#pragma once
/// The training config (TOML): a [train] table in the cluster file or a file
/// of its own. Every key has a default; an unknown key or a bad value is an
/// error naming it (and the file).

#include <cstdint>
#include <string>
#include <vector>

#include "graph/outcome.hpp"
#include "train/optimizer.hpp"

namespace af::train {

struct train_config {
  std::string mode = "sync";       ///< sync, async, ssp, average, allreduce
  std::string model = "mlp";       ///< softmax, mlp, linear, linear_bias, recommender
  std::vector<int64_t> hidden = {128}; ///< mlp hidden layer sizes
  std::string data = "digits";     ///< digits, synthetic, synthetic_linear, per_worker_linear,
                                   ///< csv:PATH, idx:IMAGES,LABELS
  double holdout = 0.2;            ///< fraction held out for evaluation
  size_t synthetic_examples = 4096;///< synthetic
  size_t synthetic_features = 64;  ///< synthetic
  uint32_t synthetic_classes = 10; ///< synthetic
  size_t batch_size = 32;          ///< per worker
  uint64_t steps = 0;              ///< global steps (0: from epochs)
  double epochs = 30;              ///< used when steps == 0
  optimizer_spec optimizer;        ///< keys: optimizer, learning_rate, momentum, beta1, beta2,
                                   ///< epsilon, initial_accumulator, schedule, decay_steps,
                                   ///< decay_rate, min_lr
  uint32_t average_every = 4;      ///< average mode: local steps between averages
  uint64_t seed = 1;
  std::string checkpoint_dir;      ///< empty: no checkpoints
  /// A file holding an HMAC key (16 to 4096 bytes): checkpoints carry an
  /// HMAC-SHA256 under it, and one without a valid HMAC is not restored.
  /// Empty: none (the checksum finds accidents, not forgery).
  std::string checkpoint_key;
  uint64_t checkpoint_steps = 0;   ///< every N global steps (0: only at the end)
  double checkpoint_secs = 0;      ///< or every N seconds (0: not by time)
  std::string metrics;             ///< metrics CSV path (empty: none); the PNG goes beside it
  /// TensorBoard event files (docs/watching.md, "TensorBoard"; empty: none):
  /// the chief writes the job's scalars in <logdir>/train and each worker's
  /// accounting in <logdir>/worker_<i>, one event per progress report.
  std::string logdir;
  /// With logdir: histograms of each variable's values and gradients every
  /// N progress reports (0: never; the chief buckets every value on its step loop).
  uint64_t histogram_every = 0;
  uint64_t log_every = 50;         ///< progress line every N steps (0: never)
  uint64_t eval_every = 100;       ///< held-out accuracy every N steps (0: only at the end)
  uint32_t step_timeout_ms = 30000;///< how long an aggregator waits for a step's workers
  uint32_t init_timeout_ms = 60000;///< how long a worker waits for the chief's initialization
  /// How long the job waits for a ps task that died (its data-plane
  /// connection broke) to come back before it fails; the chief then restores
  /// that ps's variables from the latest checkpoint. 0: fail at once.
  uint32_t ps_recovery_timeout_ms = 60000;
  /// Steps in a row a worker may abstain from (its gradient or parameters
  /// not finite, so nothing of it applied) before it fails, and the job with
  /// it: the model has diverged or was restored broken. At least 1.
  uint64_t max_nonfinite_steps = 100;
  /// sync: the gradients a step uses (TF's SyncReplicasOptimizer
  /// replicas_to_aggregate); later ones of that step are dropped and counted.
  /// 0: every worker's. Fewer than the workers makes the rest backup workers.
  uint32_t replicas_to_aggregate = 0;
  /// sync: a step that has waited this long closes with what arrived if at
  /// least min_replicas did, else it waits on and names whom it waits for
  /// once per deadline. 0: no deadline (step_timeout_ms still bounds the wait).
  uint32_t step_deadline_ms = 0;
  uint32_t min_replicas = 1;       ///< sync with a deadline: the fewest gradients a step closes with
  /// ssp: how many steps a worker may run ahead of the slowest (0: lockstep,
  /// as sync; at least the job's steps: never waits, as async).
  uint64_t staleness = 3;
  /// sync, async, ssp: a gradient whose L2 norm is more than this many times
  /// the median of the last 32 the ps took (per ps) is scaled down to that
  /// bound, counted and logged (0: off; else at least 1).
  double grad_norm_guard = 0;
  /// Partitioned variables (TF's min_max_variable_partitioner): a variable is
  /// split along its first axis into at most max_partitions shards of at
  /// least min_slice_bytes each, spread over the ps tasks by size. 1: none.
  uint32_t max_partitions = 1;
  uint64_t min_slice_bytes = 262144;
  /// The most bytes the data set may take in memory (its features as
  /// float32), and the most a data file may hold once gunzipped: a file, a
  /// device or a generator setting that would need more is refused with its
  /// size instead of aborting the process when memory runs out. Raise it for a
  /// larger data set on a machine with the memory.
  uint64_t max_data_bytes = uint64_t{4} << 30;
  /// A run for a time (sync, async, ssp; benches): window_secs > 0 ends the
  /// job warmup_secs + window_secs after every worker's first push (or at
  /// `steps`, if sooner), and the chief reports the global steps per second
  /// of the window alone (docs/training.md, "A timed window"). 0: off.
  double warmup_secs = 0;
  double window_secs = 0;
  /// model = "recommender" (train/recommender.hpp; docs/sparse.md, "The
  /// recommendation model"): user and item tables of `dim` factors and a
  /// bias per row, cut over the ps tasks by `partition_strategy` (mod, div);
  /// data = "synthetic" draws synthetic_examples clicks with Zipf(`zipf`)
  /// ids from a planted truth, data = "csv:PATH" reads user,item,label rows.
  int64_t users = 10000;
  int64_t items = 10000;
  int64_t dim = 8;
  double zipf = 1.0;
  std::string partition_strategy = "mod";
  /// sync over a plaintext TCP data plane: each worker streams its push
  /// (wire::kind::push_streamed) and the ps averages, applies and answers
  /// it chunk by chunk as every member's copy arrives (docs/training.md
  /// "A pipelined sync round"), the same bits as without. Elsewhere (shared
  /// memory, TLS, other modes) pushes go store-and-forward. Off by default.
  bool pipeline_sync = false;
  /// pipeline_sync = "auto" (pipeline_sync is then true too): each sync
  /// aggregator times pipelined and store-and-forward rounds and asks the
  /// workers for the faster kind, timing the other again now and then
  /// (dist/pipeline_tuner.hpp; docs/training.md "A pipelined sync round").
  bool pipeline_sync_auto = false;
  /// async over a plaintext TCP data plane: each worker streams its push and
  /// the ps applies and answers it chunk by chunk as it arrives, a push
  /// waiting for the one before it to commit (docs/training.md "Pipelined
  /// async pushes"), the same bits as store-and-forward pushes in that
  /// order. Elsewhere pushes go store-and-forward. Off by default.
  bool pipeline_async = false;
  /// How a dense gradient push and its answer's parameters cross the data
  /// plane: "float32" (the default), or "bf16": each gradient rounded to
  /// bf16 with error feedback (the worker keeps what rounding left out and
  /// adds it to its next gradient), the parameters answered in bf16 (the
  /// worker computes on them rounded; the ps keeps float32): half the bytes
  /// each way (docs/training.md "bf16 on the wire"). sync, async and ssp
  /// store-and-forward pushes only: refused with pipeline_sync,
  /// pipeline_async, average, allreduce and model = "recommender".
  std::string wire_dtype = "float32";
  /// The most either may be: a week (more would overflow the clock's
  /// nanoseconds long before it means anything).
  static constexpr double max_window_secs = 7 * 24 * 3600.0;
};

/// True for the modes whose global step moves with every worker's push
/// (async, ssp); false where it moves once per round of all workers.
inline bool step_per_push(const std::string& mode) {
  return mode == "async" || mode == "ssp";
}

/// True if a checkpoint by steps is due at global step `global`, the last
/// one having been at `last` (or the job having started there): `global`
/// crossed a multiple of `every` since (0: never). Crossing, not landing on
/// one: in async and ssp the global step moves by every worker's pushes, so
/// the chief may step over every multiple (two workers pushing in turn: the
/// chief saw only odd steps, and a job checkpointing every 50 saved nothing
/// until its end).
inline bool steps_checkpoint_due(uint64_t every, uint64_t global, uint64_t last) {
  return every > 0 && global / every > last / every;
}

/// Parses the [train] table of `path` (or the whole file if it has no
/// [train] table and no [cluster] table; a cluster file without [train] gives
/// the defaults). Errors name the file, the line and the key: an unknown key
/// (with the closest known one), a wrong type, a value no key allows. Keys
/// that are each fine but not together (model "linear" without data
/// "synthetic_linear", a cosine min_lr above learning_rate, steps = 0 with
/// epochs = 0) are validate()'s: call it once every source (file, --set) is in.
outcome<train_config> load_train_config(const std::string& path);

/// From TOML text (`origin` names it in errors); as load_train_config.
outcome<train_config> parse_train_config(const std::string& text, const std::string& origin);

/// Empty if usable, else a sentence naming the bad key, its value and what
/// is allowed. Includes train::validate(optimizer).
std::string validate(const train_config& c);

/// Empty if `c` can train with `workers` worker tasks, else a sentence
/// naming the key and both numbers: replicas_to_aggregate above the workers
/// would wait for gradients that no worker sends (each pushes one per step);
/// data = "per_worker_linear" needs synthetic_examples = workers x
/// batch_size (each worker's own fixed examples, one global batch).
std::string check_workers(const train_config& c, uint32_t workers);

/// `--set key=value` overrides applied one by one over `c`. The value is
/// read as the key's type: a number (`1e3`, `0.5`, `-2` and `inf` are
/// numbers, range rules come after), a non-negative integer (`1e3` is 1000),
/// a list of layer sizes (`hidden=[64,64]` or `hidden=64,64`), or a string
/// taken as written (`data=csv:/tmp/x.csv`; surrounding quotes are dropped).
/// Every error names the override, the key, the value and what the key takes.
/// Combinations are left to validate(), as for a file.
outcome<train_config> apply_overrides(train_config c, const std::vector<std::string>& sets);

/// The config as TOML text (stored in checkpoints; parse_train_config reads it back).
std::string to_toml(const train_config& c);

} // namespace af::train
