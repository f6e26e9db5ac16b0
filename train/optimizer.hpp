#pragma once
/// Optimizers and learning-rate schedules, on plain float buffers, no CAF:
/// one piece of code serves the variable actor (actors/variable.hpp applies a
/// gradient where the variable lives, its slots beside the value) and the
/// workers that keep their own replica (average and allreduce modes).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/outcome.hpp"

namespace af::train {

/// How the learning rate moves with the global step.
struct schedule_spec {
  std::string kind = "constant"; ///< constant, step, cosine
  uint64_t decay_steps = 1000;   ///< step: multiply by decay_rate every decay_steps
  double decay_rate = 0.1;       ///< step
  uint64_t total_steps = 0;      ///< cosine: lr falls to min_lr over total_steps (0: never decays)
  double min_lr = 0;             ///< cosine
};

/// TF's GradientDescentOptimizer, MomentumOptimizer, AdagradOptimizer and
/// AdamOptimizer (applied to a sparse gradient: LazyAdamOptimizer, below).
struct optimizer_spec {
  std::string kind = "sgd"; ///< sgd, momentum, adagrad, adam
  double lr = 0.1;
  double momentum = 0.9;    ///< momentum
  double beta1 = 0.9;       ///< adam
  double beta2 = 0.999;     ///< adam
  double epsilon = 1e-8;    ///< adam
  schedule_spec schedule;
  /// adagrad: the accumulator's first value (TF's default); the job config's
  /// `initial_accumulator`. Every slot made where none was (a first update, a
  /// checkpoint without it) starts here: slot_initial_value.
  double initial_accumulator = 0.1;
};

/// Empty if `spec` is usable, else a sentence naming the bad field.
std::string validate(const optimizer_spec& spec);

/// The learning rate at global step `step` (0-based: the step being applied).
double learning_rate(const optimizer_spec& spec, uint64_t step);

/// The slots `kind` keeps beside a variable: {} (sgd), {"momentum"},
/// {"accumulator"} (adagrad), {"m", "v"} (adam).
std::vector<std::string> slot_names(const std::string& kind);

/// The value slot `slot` (slot_names order) starts at: adagrad's
/// accumulator spec.initial_accumulator, every other slot 0.
float slot_initial_value(const optimizer_spec& spec, size_t slot);

/// The constants of one update at one global step, computed once however
/// many elements or rows it updates: the learning rate of the schedule and,
/// for Adam, the bias-corrected rate.
struct step_constants {
  enum class method : uint8_t { sgd, momentum, adagrad, adam };
  method kind = method::sgd;
  float lr = 0;
  float momentum = 0; ///< momentum
  float beta1 = 0;    ///< adam
  float beta2 = 0;    ///< adam
  float epsilon = 0;  ///< adam
  float adam_lr = 0;  ///< adam: lr * sqrt(1 - beta2^t) / (1 - beta1^t), t = step + 1
};

/// The constants of `spec` at global step `step` (0-based).
step_constants constants_at(const optimizer_spec& spec, uint64_t step);

/// One update of `n` floats of `var` with `grad`: the one formula of each
/// optimizer, which the dense and the sparse updates below both run.
/// `slots` has one buffer of n floats per slot_names(kind), in that order.
void apply(const step_constants& c, float* var, float* const* slots, const float* grad, size_t n);

/// One update of `n` floats of `var` with `grad`, at global step `step`
/// (0-based; Adam's bias correction uses step + 1). `slots` has one buffer of
/// n floats per slot_names(kind), in that order, at slot_initial_value at the
/// start.
void apply(const optimizer_spec& spec, float* var, float* const* slots, const float* grad,
           size_t n, uint64_t step);

/// A sparse update (TF's sparse apply ops, after _deduplicate_indexed_slices):
/// the `k` rows `rows` of a row-major variable of `row_size` floats per row
/// get the update apply() gives them with gradient rows `grads` ([k,
/// row_size]); no other row of `var` or of its slots changes. So momentum
/// and Adam are lazy (TF's SparseApplyMomentum, LazyAdamOptimizer: an
/// untouched row's slots neither decay nor move it), while Adam's bias
/// correction still counts the global step, as TF's does. The rows must be
/// distinct and in range (the caller deduplicates and checks them: a
/// repeated row would be updated twice).
void apply_rows(const optimizer_spec& spec, float* var, float* const* slots, size_t row_size,
                const int64_t* rows, const float* grads, size_t k, uint64_t step);

/// Index of the first element of `data` that is NaN or infinite, or n.
size_t first_non_finite(const float* data, size_t n);

} // namespace af::train
