#pragma once
/// The optimizers' update written into buffers of its own, reading the old
/// value and slots from one place and writing the new ones to another, in
/// one pass. apply() (train/optimizer.hpp) is this one in place. A pipelined
/// round (dist/pipelined_round.hpp) updates into copies of its own, so
/// that an aborted round leaves the variables as they were: with apply()
/// it copied each block in first, a pass over memory the store-and-forward
/// update, in place, does not make.

#include <cstddef>

#include "train/optimizer.hpp"

namespace af::train {

/// apply(c, var, slots, grad, n) with var and slots first holding `old_var`
/// and `old_slots`: the same operations, so the same bits. `old_*` may be
/// the buffers written (in place), or buffers no written one overlaps.
void apply_into(const step_constants& c, const float* old_var, const float* const* old_slots,
                float* var, float* const* slots, const float* grad, size_t n);

} // namespace af::train
