#pragma once
/// Attributes of a graph op (plain data, no CAF): what an op needs besides its
/// inputs. Defaults are what an op without attributes gets.

#include <cstdint>

namespace af {

struct op_attrs {
  bool transpose_a = false; ///< matmul
  bool transpose_b = false; ///< matmul
  bool all_axes = true;     ///< reductions: reduce everything (else `axis`)
  int32_t axis = 0;         ///< reductions; negative counts from the end
  bool keep_dims = false;   ///< reductions
};

} // namespace af
