#pragma once
/// NumPy's text for a tensor: what `print(sess.run(x))` shows in Python.
///
/// `format_numpy` follows numpy's arrayprint.py with its default options
/// (floatmode "maxprec", sign "-", legacy off) as numpy 2.x has them: each
/// float keeps the digits its shortest round-trip text needs, at most
/// `precision` after the point, and the column is aligned on the point;
/// scientific notation when a column would be unreadable otherwise; the
/// middle of every axis of a large tensor elided with "...". A 0-d tensor
/// prints as its scalar does (`str(np.array(10.0))` is "10.0"). Float32
/// values print as the float they are: 0.1f is "0.1", not "0.10000000149".
///
/// `tensor::to_string` uses it; this header has no CAF dependency.

#include <cstddef>
#include <string>

#include "core/tensor.hpp"

namespace af {

/// numpy.set_printoptions' knobs that matter for the dtypes a tensor has.
struct print_options {
  int precision = 8;       ///< most digits after the point (numpy's `precision`)
  size_t threshold = 1000; ///< more elements than this: elide (numpy's `threshold`)
  size_t edge_items = 3;   ///< items kept at each end of each axis when eliding
  size_t line_width = 75;  ///< rows wrap before this many characters
};

/// `str(np.array(t))`; "<no value>" for an empty tensor.
std::string format_numpy(const tensor& t, const print_options& o = {});

/// The shape as a Python tuple, then the dtype: "(2, 2) float32", "(3,) int64",
/// "() int32"; "<no value>" for an empty tensor.
std::string describe_shape(const tensor& t);

} // namespace af
