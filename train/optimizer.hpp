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

/// TF's GradientDescentOptimizer, MomentumOptimizer and AdamOptimizer.
struct optimizer_spec {
  std::string kind = "sgd"; ///< sgd, momentum, adam
  double lr = 0.1;
  double momentum = 0.9;    ///< momentum
  double beta1 = 0.9;       ///< adam
  double beta2 = 0.999;     ///< adam
  double epsilon = 1e-8;    ///< adam
  schedule_spec schedule;
};

/// Empty if `spec` is usable, else a sentence naming the bad field.
std::string validate(const optimizer_spec& spec);

/// The learning rate at global step `step` (0-based: the step being applied).
double learning_rate(const optimizer_spec& spec, uint64_t step);

/// The slots `kind` keeps beside a variable: {} (sgd), {"momentum"}, {"m", "v"}.
std::vector<std::string> slot_names(const std::string& kind);

/// One update of `n` floats of `var` with `grad`, at global step `step`
/// (0-based; Adam's bias correction uses step + 1). `slots` has one buffer of
/// n floats per slot_names(kind), in that order, zero at the start.
void apply(const optimizer_spec& spec, float* var, float* const* slots, const float* grad,
           size_t n, uint64_t step);

/// Index of the first element of `data` that is NaN or infinite, or n.
size_t first_non_finite(const float* data, size_t n);

} // namespace af::train
