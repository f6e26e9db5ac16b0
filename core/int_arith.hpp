#pragma once
/// Integer arithmetic that is total: every input has a defined result, never
/// a trap (SIGFPE) and never undefined behaviour (issue 22: INT32_MIN / -1
/// from any session killed the node that ran it). The CPU and CUDA kernels
/// share these, so both backends give the same integers.
///
/// The semantics (docs/graph.md, "Integer ops"), NumPy's where it has one:
/// - add, sub, mul, neg wrap as two's complement (computed in the unsigned
///   type, where overflow is defined): INT32_MAX + 1 == INT32_MIN.
/// - x / 0 == 0 (as it always was here), and MIN / -1 == MIN (the wrapped
///   quotient, as NumPy gives). Otherwise division truncates toward zero, as
///   C++ does.
/// - A float converted to an integer type truncates toward zero, NaN becomes
///   0 and a value out of the type's range (infinities too) saturates at its
///   limit (what a plain cast would leave undefined).

#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__CUDACC__)
#define AF_INT_HD __host__ __device__
#else
#define AF_INT_HD
#endif

namespace af::int_arith {

template <class T>
using unsigned_of = typename std::make_unsigned<T>::type;

template <class T>
AF_INT_HD inline T wrap_add(T x, T y) {
  if constexpr (std::is_integral<T>::value)
    return static_cast<T>(static_cast<unsigned_of<T>>(x) + static_cast<unsigned_of<T>>(y));
  else
    return x + y;
}

template <class T>
AF_INT_HD inline T wrap_sub(T x, T y) {
  if constexpr (std::is_integral<T>::value)
    return static_cast<T>(static_cast<unsigned_of<T>>(x) - static_cast<unsigned_of<T>>(y));
  else
    return x - y;
}

template <class T>
AF_INT_HD inline T wrap_mul(T x, T y) {
  if constexpr (std::is_integral<T>::value)
    return static_cast<T>(static_cast<unsigned_of<T>>(x) * static_cast<unsigned_of<T>>(y));
  else
    return x * y;
}

template <class T>
AF_INT_HD inline T wrap_neg(T x) {
  if constexpr (std::is_integral<T>::value)
    return static_cast<T>(unsigned_of<T>{0} - static_cast<unsigned_of<T>>(x));
  else
    return -x;
}

/// x / y: 0 for y == 0 and MIN for MIN / -1 with integers; IEEE for floats.
template <class T>
AF_INT_HD inline T total_div(T x, T y) {
  if constexpr (std::is_integral<T>::value) {
    if (y == T{0})
      return T{0};
    if (y == T{-1})
      return wrap_neg(x); // MIN / -1 would trap (x86 idiv raises #DE)
    return x / y;
  } else {
    return x / y;
  }
}

/// `v` as integer type T: truncated toward zero, NaN as 0, saturated at T's
/// limits outside its range.
template <class T>
AF_INT_HD inline T saturate_cast(double v) {
  static_assert(std::is_integral<T>::value, "saturate_cast makes integers");
  if (v != v)
    return T{0};
  constexpr T min = std::numeric_limits<T>::min();
  constexpr T max = std::numeric_limits<T>::max();
  // -MIN is 2^(bits-1), exact as a double; MAX itself may not be.
  constexpr double low = static_cast<double>(min);
  if (v <= low)
    return min;
  if (v >= -low)
    return max;
  return static_cast<T>(v);
}

} // namespace af::int_arith
