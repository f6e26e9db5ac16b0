/// Helpers the host kernels share (kernels/cpu/*.cpp, op_registry.cpp): the
/// id dtypes, the elements of a row, and the one bound on a result whose
/// size a value in a small input sets (range's limit, dynamic_stitch's
/// ids, unsorted_segment_sum's num_segments).
#pragma once

#include "core/tensor.hpp"
#include "kernels/kernels.hpp"

#include <cstdint>
#include <string>

namespace af::kernels {

/// `t` is a dtype ids and counts come in: int32 or int64.
inline bool is_id_type(dtype t) {
  return t == dtype::int32 || t == dtype::int64;
}

/// The product of shape[from:], the elements of one row (one slice).
inline size_t row_elements(const shape_type& shape, size_t from) {
  size_t n = 1;
  for (size_t d = from; d < shape.size(); ++d)
    n *= static_cast<size_t>(shape[d]);
  return n;
}

/// Success when `count` rows of `row` elements of `type` is a result an op
/// may allocate: count in [0, 2^31 - 1), and count * row * dtype_size
/// neither overflows nor passes max_decoded_tensor_bytes() (the most a
/// tensor may be on the wire, so every result can be sent). Else an
/// invalid-argument status naming `op`, `what`, its value and the bound,
/// before anything is allocated: a small input must never size a huge one.
inline status check_result_rows(const char* op, const char* what, int64_t count, size_t row,
                                dtype type) {
  const std::string head = std::string{op} + ": " + what + " = " + std::to_string(count);
  if (count < 0 || count >= INT32_MAX)
    return status::failure(head + " is not in [0, 2^31 - 1)");
  uint64_t bytes = 0;
  const uint64_t limit = max_decoded_tensor_bytes();
  if (__builtin_mul_overflow(static_cast<uint64_t>(count), static_cast<uint64_t>(row), &bytes)
      || __builtin_mul_overflow(bytes, static_cast<uint64_t>(dtype_size(type)), &bytes)
      || bytes > limit)
    return status::failure(head + " makes a result of more than " + std::to_string(limit)
                           + " bytes (rows of " + std::to_string(row) + " " + dtype_name(type)
                           + "), the most a tensor may have (max_message_bytes)");
  return status::success();
}

} // namespace af::kernels
