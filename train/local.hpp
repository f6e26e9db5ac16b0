#pragma once
/// Training in one process with no cluster (the reference the distributed
/// modes are tested against, and the one-process baseline of the benchmarks),
/// and the pieces the workers share with it: a replica's parameters with
/// their optimizer slots, packing parameters into one flat buffer, and the
/// feeds of a step. No CAF.

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.hpp"
#include "graph/outcome.hpp"
#include "train/config.hpp"
#include "train/data.hpp"
#include "train/model.hpp"
#include "train/optimizer.hpp"
#include "train/clicks.hpp"
#include "train/recommender.hpp"
#include "train/sparse_model.hpp"

namespace af::train {

/// The first values of `params` (their initializers; the same everywhere).
outcome<std::vector<tensor>> initial_values(const std::vector<parameter>& params);

/// A replica's own parameters and optimizer slots (average and allreduce
/// workers; the local trainer).
struct replica_state {
  std::vector<tensor> values;
  std::vector<std::vector<tensor>> slots; ///< per value, slot_names(kind) order

  static outcome<replica_state> make(std::vector<tensor> values, const optimizer_spec& opt);

  /// One optimizer update of every value with `grads` (same order and shapes)
  /// at global step `step`.
  graph_status apply(const optimizer_spec& opt, const std::vector<tensor>& grads, uint64_t step);
};

/// All `parts` (float32) as one flat float32 tensor [total]; a single part is
/// reshaped, not copied.
tensor flatten(const std::vector<tensor>& parts);

/// `flat` cut into tensors of `shapes`; a single shape is a reshape, not a
/// copy. An error if the element counts differ.
outcome<std::vector<tensor>> unflatten(const tensor& flat, const std::vector<shape_type>& shapes);

/// The feeds of one step of `r`: parameters, x, and y (labels, or regression
/// targets as [batch, 1]).
std::vector<std::pair<output, tensor>> feeds(const replica& r, const std::vector<tensor>& params,
                                             const batch& b);

/// The data a config names, split into training and held-out sets
/// (per_worker_linear: both are all of its examples).
outcome<split> load_data(const train_config& c);

/// Global steps a config asks for: `steps`, or `epochs` over the training set
/// at `workers` x batch_size examples per step.
uint64_t total_steps(const train_config& c, size_t train_examples, uint32_t workers);

struct local_result {
  std::vector<tensor> params;
  uint64_t steps = 0;
  double seconds = 0;
  double examples_per_s = 0;
  double last_loss = 0;
  double accuracy = -1; ///< held-out (classification), -1 for regression
  double test_loss = 0;
};

/// Trains the model of `c` on `data.train` for `steps` steps at `batch`
/// examples each (data order: batcher shard 0 of 1, seed c.seed), starting
/// from `init` (empty: the initializers), then evaluates on `data.test`.
outcome<local_result> train_local(const train_config& c, const split& data, uint64_t steps,
                                  size_t batch, std::vector<tensor> init = {});

/// Held-out loss and accuracy of `params` on `test` in this process.
outcome<std::pair<double, double>> evaluate_local(const train_config& c, const dataset& test,
                                                  const std::vector<tensor>& params);

// ---- A sparse model (train/sparse_model.hpp) in one process ----------------

/// A sparse model's tables and dense parameters held in this process, each
/// with its optimizer slots (a table's slots are tables of its shape).
struct sparse_state {
  replica_state tables;
  replica_state dense;

  /// Both at their initializers, slots at slot_initial_value.
  static outcome<sparse_state> make(const sparse_model& m, const optimizer_spec& opt);
};

struct sparse_local_options {
  optimizer_spec optimizer;
  size_t batch = 256;
  uint64_t steps = 0;
  uint64_t seed = 1;      ///< the examples' order (a fresh shuffle every epoch)
  uint64_t log_every = 0; ///< call `log` every N steps (0: never)
  std::function<void(uint64_t step, double loss)> log;
};

/// The order a sparse trainer takes examples in: [0, n) shuffled by one
/// mt19937_64(seed) stream, and shuffled on by it each time it runs out (a
/// fresh order every epoch). Position p of a job's stream is the same in
/// every process: a sync worker w of W takes positions [(g W + w) b, + b)
/// at global step g, so one worker takes what train_sparse_local takes.
class example_order {
public:
  example_order(size_t n, uint64_t seed);
  /// The example at position `pos`; positions may only move forward (an
  /// earlier epoch's order is gone once the stream shuffled on).
  size_t at(uint64_t pos);
  /// The examples at positions [first, first + count), as at() of each, in
  /// `out` (cleared first): one division for the batch, not two per example.
  void positions(uint64_t first, size_t count, std::vector<size_t>& out);

private:
  std::vector<size_t> order_;
  std::mt19937_64 rng_;
  uint64_t epoch_ = 0; ///< order_ holds epoch epoch_ - 1 (0: none yet)
};

struct sparse_local_result {
  sparse_state state;
  uint64_t steps = 0;
  double seconds = 0;
  double last_loss = 0;      ///< mean training loss of the last log_every steps (or the last)
  double auc = 0;            ///< held-out
  double log_loss = 0;       ///< held-out
};

/// Trains `m` on `train` as a job's worker does, in one process: each step
/// takes `batch` examples, deduplicates each table's ids, reads those rows
/// from the host tables, runs m.step, and updates only those rows with
/// train::apply_rows (sgd, momentum, adagrad, lazy adam) and the dense
/// parameters with train::apply. Then scores `test` (AUC, log-loss). An id
/// outside its table is an error naming the table, the example and the id.
outcome<sparse_local_result> train_sparse_local(sparse_model& m, const sparse_batch& train,
                                                const sparse_batch& test,
                                                const sparse_local_options& o,
                                                sparse_state init = {});

/// The model's predictions for `examples` with the parameters of `st`
/// (forward only, in batches of `batch`).
outcome<std::vector<float>> predict_sparse(sparse_model& m, const sparse_state& st,
                                           const sparse_batch& examples, size_t batch = 4096);

/// What train_recommender_local reports.
struct recommender_report {
  sparse_local_result result;
  size_t train_examples = 0;
  size_t test_examples = 0;
  bool has_truth = false;    ///< synthetic data: the planted truth's own scores below
  double truth_auc = 0;
  double truth_log_loss = 0;
};

/// The click data of a recommender job `c`: synthetic with a planted truth
/// (its own held-out scores set), or csv:PATH of user,item,label rows.
struct click_data {
  click_split data;
  bool has_truth = false;
  double truth_auc = 0;
  double truth_log_loss = 0;
};
outcome<click_data> load_clicks(const train_config& c);

/// The recommender of `c` (users x items x dim, seeded).
outcome<recommender> recommender_of(const train_config& c);

/// model = "recommender" in one process: its data (synthetic with a
/// planted truth, or csv:PATH of user,item,label rows), the model of
/// users x items x dim, trained for steps (or epochs) of batch_size with
/// the config's optimizer. `log` as in sparse_local_options.
outcome<recommender_report> train_recommender_local(
  const train_config& c, std::function<void(uint64_t step, double loss)> log = {});

} // namespace af::train
