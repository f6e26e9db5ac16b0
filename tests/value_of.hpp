#pragma once
// The value of a caf::expected in a test, or the test fails with its error.

#include <catch2/catch.hpp>

#include <utility>

#include "caf/expected.hpp"

#include "messages/error.hpp"

namespace af::testing {

/// The value of `x`, or the test fails with its error's sentence.
template <class T>
T value_of(caf::expected<T> x) {
  if (!x)
    FAIL(describe(x.error()));
  return std::move(*x);
}

} // namespace af::testing
