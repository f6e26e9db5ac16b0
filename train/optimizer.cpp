#include "train/optimizer.hpp"
#include "train/optimizer_into.hpp"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/prefetch.hpp"
#include "core/simd_clones.hpp"

namespace af::train {

std::string validate(const optimizer_spec& s) {
  if (s.kind != "sgd" && s.kind != "momentum" && s.kind != "adagrad" && s.kind != "adam")
    return fmt::format("optimizer '{}' is unknown: use sgd, momentum, adagrad or adam", s.kind);
  if (!(s.lr > 0) || !std::isfinite(s.lr))
    return fmt::format("learning rate {} must be a positive number", s.lr);
  if (s.kind == "momentum" && !(s.momentum >= 0 && s.momentum < 1))
    return fmt::format("momentum {} must be in [0, 1)", s.momentum);
  if (s.kind == "adagrad" && !(s.initial_accumulator > 0))
    return fmt::format("adagrad initial_accumulator {} must be positive", s.initial_accumulator);
  if (s.kind == "adam") {
    if (!(s.beta1 >= 0 && s.beta1 < 1) || !(s.beta2 >= 0 && s.beta2 < 1))
      return fmt::format("adam betas {} and {} must be in [0, 1)", s.beta1, s.beta2);
    if (!(s.epsilon > 0))
      return fmt::format("adam epsilon {} must be positive", s.epsilon);
  }
  const auto& k = s.schedule.kind;
  if (k != "constant" && k != "step" && k != "cosine")
    return fmt::format("learning-rate schedule '{}' is unknown: use constant, step or cosine", k);
  if (k == "step" && (s.schedule.decay_steps == 0 || !(s.schedule.decay_rate > 0)))
    return "schedule 'step' needs decay_steps > 0 and decay_rate > 0";
  if (k == "cosine" && !(s.schedule.min_lr >= 0 && s.schedule.min_lr <= s.lr))
    return fmt::format("cosine min_lr {} must be in [0, lr]", s.schedule.min_lr);
  return {};
}

double learning_rate(const optimizer_spec& s, uint64_t step) {
  const auto& k = s.schedule;
  if (k.kind == "step")
    return s.lr * std::pow(k.decay_rate, static_cast<double>(step / k.decay_steps));
  if (k.kind == "cosine" && k.total_steps > 0) {
    double t = std::min<double>(1.0, static_cast<double>(step) / static_cast<double>(k.total_steps));
    return k.min_lr + 0.5 * (s.lr - k.min_lr) * (1 + std::cos(M_PI * t));
  }
  return s.lr;
}

std::vector<std::string> slot_names(const std::string& kind) {
  if (kind == "momentum")
    return {"momentum"};
  if (kind == "adagrad")
    return {"accumulator"};
  if (kind == "adam")
    return {"m", "v"};
  return {};
}

float slot_initial_value(const optimizer_spec& s, size_t slot) {
  return s.kind == "adagrad" && slot == 0 ? static_cast<float>(s.initial_accumulator) : 0.0f;
}

step_constants constants_at(const optimizer_spec& s, uint64_t step) {
  using method = step_constants::method;
  step_constants c;
  c.kind = s.kind == "momentum" ? method::momentum
           : s.kind == "adagrad" ? method::adagrad
           : s.kind == "adam"    ? method::adam
                                 : method::sgd;
  c.lr = static_cast<float>(learning_rate(s, step));
  c.momentum = static_cast<float>(s.momentum);
  c.beta1 = static_cast<float>(s.beta1);
  c.beta2 = static_cast<float>(s.beta2);
  c.epsilon = static_cast<float>(s.epsilon);
  if (c.kind == method::adam) {
    // TF's AdamOptimizer: lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t)
    const double t = static_cast<double>(step + 1);
    c.adam_lr = static_cast<float>(c.lr * std::sqrt(1 - std::pow(s.beta2, t))
                                   / (1 - std::pow(s.beta1, t)));
  }
  return c;
}

void apply(const step_constants& c, float* var, float* const* slots, const float* grad, size_t n) {
  apply_into(c, var, slots, var, slots, grad, n); // in place: the old values are the new ones' buffers
}

// Built for AVX2 as well, without FMA (core/simd_clones.hpp): the same bits.
AF_SIMD_CLONES void apply_into(const step_constants& c, const float* old_var,
                               const float* const* old_slots, float* var, float* const* slots,
                               const float* grad, size_t n) {
  // The optimizers' formulas (apply() is this one in place): each
  // element's old value read, then its new one written.
  const float lr = c.lr;
  switch (c.kind) {
    case step_constants::method::momentum: {
      // TF's MomentumOptimizer: accum = momentum * accum + grad; var -= lr * accum
      const float* old_acc = old_slots[0];
      float* acc = slots[0];
      const float mu = c.momentum;
      for (size_t i = 0; i < n; ++i) {
        acc[i] = mu * old_acc[i] + grad[i];
        var[i] = old_var[i] - lr * acc[i];
      }
      break;
    }
    case step_constants::method::adagrad: {
      // TF's AdagradOptimizer (ApplyAdagrad): accum += grad^2; var -= lr * grad / sqrt(accum)
      const float* old_acc = old_slots[0];
      float* acc = slots[0];
      for (size_t i = 0; i < n; ++i) {
        acc[i] = old_acc[i] + grad[i] * grad[i];
        var[i] = old_var[i] - lr * grad[i] / std::sqrt(acc[i]);
      }
      break;
    }
    case step_constants::method::adam: {
      const float* old_m = old_slots[0];
      const float* old_v = old_slots[1];
      float* m = slots[0];
      float* v = slots[1];
      const float b1 = c.beta1, b2 = c.beta2, eps = c.epsilon, lr_t = c.adam_lr;
      for (size_t i = 0; i < n; ++i) {
        m[i] = b1 * old_m[i] + (1 - b1) * grad[i];
        v[i] = b2 * old_v[i] + (1 - b2) * grad[i] * grad[i];
        var[i] = old_var[i] - lr_t * m[i] / (std::sqrt(v[i]) + eps);
      }
      break;
    }
    case step_constants::method::sgd:
      for (size_t i = 0; i < n; ++i)
        var[i] = old_var[i] - lr * grad[i];
      break;
  }
}

void apply(const optimizer_spec& s, float* var, float* const* slots, const float* grad, size_t n,
           uint64_t step) {
  apply(constants_at(s, step), var, slots, grad, n);
}

void apply_rows(const optimizer_spec& s, float* var, float* const* slots, size_t row_size,
                const int64_t* rows, const float* grads, size_t k, uint64_t step) {
  // One formula: each touched row gets exactly the dense update of its
  // floats, with the constants of this step computed once.
  const auto c = constants_at(s, step);
  const size_t nslots = slot_names(s.kind).size();
  for (size_t j = 0; j < k; ++j) {
    if (j + rows_ahead < k) { // the rows are misses of a big table: overlap them
      const size_t ahead = static_cast<size_t>(rows[j + rows_ahead]) * row_size;
      prefetch_row(var + ahead, row_size * sizeof(float), true);
      for (size_t q = 0; q < nslots && q < 2; ++q)
        prefetch_row(slots[q] + ahead, row_size * sizeof(float), true);
    }
    const size_t offset = static_cast<size_t>(rows[j]) * row_size;
    float* row_slots[2] = {nslots > 0 ? slots[0] + offset : nullptr,
                           nslots > 1 ? slots[1] + offset : nullptr};
    apply(c, var + offset, row_slots, grads + j * row_size, row_size);
  }
}

// The check reads every float of every push twice a step (the worker's own
// gradient, then the ps's copy): 18 % of a worker's and 24 % of the ps's CPU
// in the 1 M sync job. Built for AVX2 as well (core/simd_clones.hpp): 1.7x
// the SSE2 loop's speed on the 2-vCPU Xeon (docs/performance.md, "The
// non-finite check in AVX2"). Integer operations: every version agrees.
AF_SIMD_CLONES size_t first_non_finite(const float* data, size_t n) {
  // A float is non-finite iff its exponent bits are all ones; adding one to
  // that exponent carries into the sign bit then, and only then. Integer
  // and/add/or vectorize (a float sum would not: its order is fixed), so the
  // check of a 4 MB gradient costs a memory pass, not 1 M dependent adds.
  uint32_t carry = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + i, sizeof(bits));
    carry |= (bits & 0x7f800000u) + 0x00800000u;
  }
  if ((carry & 0x80000000u) == 0)
    return n;
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(data[i]))
      return i;
  return n;
}

} // namespace af::train
