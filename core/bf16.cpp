#include "core/bf16.hpp"

#include <cstring>

namespace af::bf16 {

void narrow(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = from_float(src[i]);
}

void widen(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = to_float(src[i]);
}

void round_with_feedback(const float* g, float* sent, float* residual, size_t n) {
  // Branch-free (selects only), so that the compiler vectorizes it: this
  // runs over every gradient element of every step.
  for (size_t i = 0; i < n; ++i) {
    float v = g[i] + residual[i];
    uint32_t u;
    std::memcpy(&u, &v, sizeof(u));
    uint32_t q = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; // from_float, NaN aside
    // Past bf16's largest finite value (or g + residual overflowed): the
    // largest is sent, so that one step's rounding does not become an
    // infinity the ps refuses, nor a residual that poisons every next one.
    uint32_t past = 0u - static_cast<uint32_t>((q & 0x7f800000u) == 0x7f800000u); // all ones
    q = (q & ~past) | (((u & 0x80000000u) | 0x7f7f0000u) & past);
    float qf;
    std::memcpy(&qf, &q, sizeof(qf));
    // Exact: q is v's top bits, rounded (Sterbenz), or the largest bf16.
    // An overflowed v leaves no residual (masked to +0).
    float rf = v - qf;
    uint32_t r;
    std::memcpy(&r, &rf, sizeof(r));
    r &= 0u - static_cast<uint32_t>((u & 0x7f800000u) != 0x7f800000u);
    std::memcpy(&residual[i], &r, sizeof(r));
    sent[i] = qf;
  }
}

} // namespace af::bf16
