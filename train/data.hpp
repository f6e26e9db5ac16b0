#pragma once
/// Data for training, no CAF: readers for CSV and IDX (MNIST's format), a
/// synthetic generator with a known target, the bundled UCI digits, a fixed
/// held-out split, and deterministic, seeded, sharded batching.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/outcome.hpp"
#include "core/tensor.hpp"

namespace af::train {

/// Examples in memory: x row-major [size, features] float32; y int32 labels
/// in [0, classes) (classification) or, for regression targets, y empty and
/// `targets` [size] float32.
struct dataset {
  std::string name;          ///< where it came from, for messages
  size_t features = 0;
  uint32_t classes = 0;      ///< 0 for regression
  std::vector<float> x;
  std::vector<int32_t> y;
  std::vector<float> targets;
  /// Example k belongs to worker k (k mod the workers): the batcher keeps the
  /// examples in order instead of shuffling them (per_worker_linear).
  bool fixed_order = false;
  size_t size() const { return features ? x.size() / features : 0; }
};

/// The most classes a CSV's labels may name unless the caller says otherwise:
/// the model allocates a row of weights per class, so one stray label of
/// 10^12 must be refused at load, not become a terabyte-sized layer.
constexpr uint32_t default_max_classes = 65536;

/// CSV: one example per line, the features, then the label as the last
/// column (an integer class in [0, max_classes)). No header unless
/// `has_header`. Gzip files (.gz) are read too. Errors name the file, the
/// line, the column and the value. `scale` multiplies every feature
/// (digits: 1/16).
/// The most bytes a data file (once gunzipped) and the set read from it (as
/// float32) may take unless the caller says otherwise: train_config's
/// max_data_bytes. A file over it, or one that is not a regular file (a FIFO,
/// /dev/zero), is refused with an error naming it and the limit.
constexpr uint64_t default_max_data_bytes = uint64_t{4} << 30;

outcome<dataset> read_csv(const std::string& path, bool has_header = false, float scale = 1.0f,
                          uint32_t max_classes = default_max_classes,
                          uint64_t max_bytes = default_max_data_bytes);

/// IDX (MNIST): an images file (magic 0x00000803, u8 [n, rows, cols]) and a
/// labels file (0x00000801, u8 [n]); pixels are scaled to [0, 1].
outcome<dataset> read_idx(const std::string& images, const std::string& labels,
                          uint64_t max_bytes = default_max_data_bytes);

/// The UCI optical handwritten digits bundled in data/ (1,797 8x8 images,
/// 10 classes, pixels scaled to [0, 1]). `data_dir` is the folder that holds
/// digits.csv.gz; empty: the first of data_search_path() that has it. The
/// error when none has it names every place looked.
outcome<dataset> load_digits(const std::string& data_dir = "");

/// Where load_digits("") looks, in order: the environment variable
/// ACTORFLOW_DATA_DIR (`env_dir`, when set), beside the executable
/// (`exe_path`'s folder: ../share/actorflow/data, ../data, ./data, for an
/// installed, a built and a copied binary), the source tree this library was
/// built from, and ./data of the working directory. Empty arguments are
/// skipped; load_digits passes getenv's value and /proc/self/exe.
std::vector<std::string> data_search_path(const std::string& env_dir,
                                          const std::string& exe_path);

/// The random linear teacher behind the synthetic sets: w [features, outputs]
/// row-major and b [outputs], drawn from `seed` (the same seed, the same
/// teacher, on every machine: the generators use their own Box-Muller on
/// std::mt19937_64, not std:: distributions).
struct linear_teacher {
  size_t features = 0;
  size_t outputs = 0;
  std::vector<float> w;
  std::vector<float> b;
};

/// The teacher of synthetic_classification(..., classes, seed) (outputs =
/// classes) or of synthetic_linear(..., seed) (outputs = 1; its b is unused).
linear_teacher synthetic_teacher(size_t features, size_t outputs, uint64_t seed);

/// Synthetic classification from a fixed random teacher: x ~ N(0, 1) of
/// `features`, label = argmax(x W + b) of a linear teacher with `classes`
/// classes; the same seed gives the same examples (and more examples extend
/// fewer: the first n are the same).
dataset synthetic_classification(size_t examples, size_t features, uint32_t classes,
                                 uint64_t seed);

/// Synthetic linear regression: target = x . w with a fixed random w (seeded),
/// x ~ N(0, 1); no bias (the "linear" model has none) and no noise, so the
/// exact solution w is known (synthetic_teacher(features, 1, seed)).
dataset synthetic_linear(size_t examples, size_t features, uint64_t seed);

/// The 1 M workload's data (docs/training.md, "The 1 M workload"): one
/// example per worker, `workers` of them, fixed_order. Example i is worker
/// i's: x of `features` entries uniform in [-1, 1] times sqrt(3 / features),
/// so that |x|^2 is about 1 (plain SGD at lr 0.1 on (x.w + b - y)^2 then
/// converges), drawn from `seed` (example i is the same whatever `workers`);
/// target y = 1 + i.
dataset per_worker_linear(size_t workers, size_t features, uint64_t seed);

/// Splits off a fixed held-out set: the last `fraction` of a seeded
/// permutation of the examples (the same seed, the same split).
struct split {
  dataset train;
  dataset test;
};
split holdout(const dataset& all, double fraction, uint64_t seed);

/// A batch: x [batch, features] float32 and y [batch] int32 (or targets
/// [batch] float32 for regression).
struct batch {
  tensor x;
  tensor y;
  uint64_t first_example = 0; ///< position in the epoch's order (for checkpoints)
};

/// Deterministic, seeded batching of `data` for worker `shard` of `shards`.
/// Each epoch is a permutation of all examples (seed + epoch); the epoch's
/// order is cut into global batches of `batch_size * shards` examples and
/// worker `shard` takes the `shard`-th slice of each. So sync training of 2
/// workers at batch b sees, at each step, exactly the examples 1 worker at
/// batch 2b sees (the exactness tests depend on it). A global batch that would
/// run past the epoch's end is skipped: every batch is full.
///
/// `data` must outlive the batcher. at() caches the current epoch's order, so
/// one batcher serves one thread; copies are independent.
class batcher {
public:
  batcher(const dataset& data, size_t batch_size, uint32_t shard, uint32_t shards, uint64_t seed,
          bool shuffle = true);

  /// Empty if a batcher of these arguments has batches, else a sentence
  /// saying what is wrong (batch size 0, shard out of range, fewer examples
  /// than one global batch). Such a batcher's at() returns empty tensors.
  static std::string check(const dataset& data, size_t batch_size, uint32_t shard,
                           uint32_t shards);

  /// The batch of local step `step` (0-based; epochs follow each other).
  /// Allocates only the batch's two tensors (the epoch's order is computed
  /// once per epoch into a buffer that is reused); a fixed_order set of one
  /// step per epoch gives the same batch every step, allocated once.
  batch at(uint64_t step) const;

  /// Steps in one epoch (0 if check() is not empty).
  uint64_t steps_per_epoch() const;

private:
  const dataset* data_;
  size_t batch_size_;
  uint32_t shard_;
  uint32_t shards_;
  uint64_t seed_;
  bool shuffle_;
  mutable uint64_t cached_epoch_ = UINT64_MAX;
  mutable std::vector<uint32_t> order_;
  /// The batch of a fixed_order set with one step per epoch: every step's
  /// (a tensor shares its bytes), built once.
  mutable batch same_;
};

/// All of `data` as one batch (held-out evaluation).
batch whole(const dataset& data);

} // namespace af::train
