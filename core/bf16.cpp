#include "core/bf16.hpp"

#include <cmath>

namespace af::bf16 {

void narrow(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = from_float(src[i]);
}

void widen(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = to_float(src[i]);
}

void round_with_feedback(float* g, float* residual, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float v = g[i] + residual[i];
    float q = round(v);
    if (!std::isfinite(q)) [[unlikely]] {
      // Past bf16's largest finite value (or g + residual overflowed): the
      // largest is sent, so that one step's rounding does not become an
      // infinity the ps refuses, nor a residual that poisons every next one.
      q = std::copysign(to_float(0x7f7f), v);
      residual[i] = std::isfinite(v) ? v - q : 0.0f;
    } else {
      residual[i] = v - q; // exact: q is v's top bits, rounded (Sterbenz)
    }
    g[i] = q;
  }
}

} // namespace af::bf16
