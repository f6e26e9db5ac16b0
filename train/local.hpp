#pragma once
/// Training in one process with no cluster (the reference the distributed
/// modes are tested against, and the one-process baseline of the benchmarks),
/// and the pieces the workers share with it: a replica's parameters with
/// their optimizer slots, packing parameters into one flat buffer, and the
/// feeds of a step. No CAF.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.hpp"
#include "graph/outcome.hpp"
#include "train/config.hpp"
#include "train/data.hpp"
#include "train/model.hpp"
#include "train/optimizer.hpp"

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

} // namespace af::train
