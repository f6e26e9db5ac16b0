#include "train/elementwise.hpp"

#include "core/simd_clones.hpp"

namespace af::train {

AF_SIMD_CLONES void add_into(const float* a, const float* b, float* out, size_t n) {
  for (size_t k = 0; k < n; ++k)
    out[k] = a[k] + b[k];
}

AF_SIMD_CLONES void add_scaled_into(const float* a, const float* b, float scale, float* out,
                                    size_t n) {
  for (size_t k = 0; k < n; ++k)
    out[k] = (a[k] + b[k]) * scale;
}

AF_SIMD_CLONES void scaled_into(const float* a, float scale, float* out, size_t n) {
  for (size_t k = 0; k < n; ++k)
    out[k] = a[k] * scale;
}

} // namespace af::train
