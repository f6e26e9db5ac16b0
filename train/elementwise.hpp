#pragma once
/// The loops of a sync round's mean (dist/aggregation_round.hpp mean_into),
/// built for AVX2 as well (core/simd_clones.hpp): the same bits as the
/// loops written inline, one float at a time.
#include <cstddef>

namespace af::train {

/// out[k] = a[k] + b[k] for k < n (out may be a).
void add_into(const float* a, const float* b, float* out, size_t n);

/// out[k] = (a[k] + b[k]) * scale for k < n (out may be a).
void add_scaled_into(const float* a, const float* b, float scale, float* out, size_t n);

/// out[k] = a[k] * scale for k < n.
void scaled_into(const float* a, float scale, float* out, size_t n);

} // namespace af::train
