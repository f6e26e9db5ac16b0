#include "train/optimizer.hpp"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace af::train {

std::string validate(const optimizer_spec& s) {
  if (s.kind != "sgd" && s.kind != "momentum" && s.kind != "adam")
    return fmt::format("optimizer '{}' is unknown: use sgd, momentum or adam", s.kind);
  if (!(s.lr > 0) || !std::isfinite(s.lr))
    return fmt::format("learning rate {} must be a positive number", s.lr);
  if (s.kind == "momentum" && !(s.momentum >= 0 && s.momentum < 1))
    return fmt::format("momentum {} must be in [0, 1)", s.momentum);
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
  if (kind == "adam")
    return {"m", "v"};
  return {};
}

void apply(const optimizer_spec& s, float* var, float* const* slots, const float* grad, size_t n,
           uint64_t step) {
  const float lr = static_cast<float>(learning_rate(s, step));
  if (s.kind == "momentum") {
    // TF's MomentumOptimizer: accum = momentum * accum + grad; var -= lr * accum
    float* acc = slots[0];
    const float mu = static_cast<float>(s.momentum);
    for (size_t i = 0; i < n; ++i) {
      acc[i] = mu * acc[i] + grad[i];
      var[i] -= lr * acc[i];
    }
  } else if (s.kind == "adam") {
    // TF's AdamOptimizer: lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t)
    float* m = slots[0];
    float* v = slots[1];
    const double t = static_cast<double>(step + 1);
    const float b1 = static_cast<float>(s.beta1);
    const float b2 = static_cast<float>(s.beta2);
    const float eps = static_cast<float>(s.epsilon);
    const float lr_t = static_cast<float>(lr * std::sqrt(1 - std::pow(s.beta2, t))
                                          / (1 - std::pow(s.beta1, t)));
    for (size_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * grad[i];
      v[i] = b2 * v[i] + (1 - b2) * grad[i] * grad[i];
      var[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
  } else {
    for (size_t i = 0; i < n; ++i)
      var[i] -= lr * grad[i];
  }
}

size_t first_non_finite(const float* data, size_t n) {
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
