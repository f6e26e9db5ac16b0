#pragma once
/// bfloat16 on the data plane's wire ([train] wire_dtype = "bf16";
/// docs/training.md "bf16 on the wire"): the top 16 bits of a float32 (sign,
/// the same 8 exponent bits, 7 mantissa bits), so that widening is a shift
/// and the range is float32's. Only the wire carries it: no tensor of the
/// runtime is bf16 (core/tensor.hpp's dtype has none); a frame says it with
/// wire::bf16_dtype (core/wire_format.hpp).

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace af::bf16 {

/// `x` rounded to the nearest bf16, ties to even (as TF's and PyTorch's
/// float-to-bfloat16 casts): an infinity stays that infinity, a NaN stays a
/// NaN (quiet, its sign kept), and a finite value just under float32's
/// largest may round up to infinity, as rounding does.
inline uint16_t from_float(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: truncating could make it an infinity
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + bias) >> 16);
}

/// The float32 that bf16 `b` is (exact).
inline float to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

/// `x` rounded to bf16 and widened again: what the other end reads.
inline float round(float x) {
  return to_float(from_float(x));
}

/// `n` floats of `src` rounded into `dst`.
void narrow(const float* src, uint16_t* dst, size_t n);

/// `n` bf16 of `src` widened into `dst`.
void widen(const uint16_t* src, float* dst, size_t n);

/// Error feedback over `n` elements: each `g[i] + residual[i]` is rounded to
/// bf16, `sent[i]` becomes that rounded value (what goes on the wire, exact
/// in bf16; `sent` may be `g`) and `residual[i]` what the rounding left out,
/// which the next call adds back. So the sum of what was sent over N calls differs from the sum
/// of the true values by the last residual alone: one bf16 rounding, not N.
/// A finite value that would round past bf16's largest finite one is sent
/// as that largest (its excess kept in the residual): the worker checked
/// its float32 gradient, and the ps must not see an infinity it never had.
/// NaN and infinity in `g` are the caller's to have refused first.
void round_with_feedback(const float* g, float* sent, float* residual, size_t n);

} // namespace af::bf16
