#pragma once
// What the dense-push tests share (test_dense_plane_push.cpp,
// test_dense_plane_edges.cpp): a gradient that differs per worker and round,
// and a byte-for-byte comparison of two tensors.

#include <cstdint>
#include <cstring>

#include "core/tensor.hpp"

namespace af::test {

/// Worker `w`'s gradient of round `k`, `floats` long: different per worker and round.
inline tensor dense_gradient(int64_t floats, uint32_t w, int k) {
  auto g = tensor::filled(dtype::float32, {floats}, 0.0f);
  float* p = g.mutable_data<float>();
  for (int64_t i = 0; i < floats; ++i)
    p[i] = static_cast<float>((i * (k + 3) + 11 * w + 5 * i) % 103) * 0.0125f - 0.6f;
  return g;
}

/// True if both hold the same bytes.
inline bool same_bytes(const tensor& a, const tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

} // namespace af::test
