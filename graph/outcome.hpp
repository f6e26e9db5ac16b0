#pragma once
/// A value or an error, with no CAF: what the graph library returns. The
/// runtime turns a graph_error into a caf::error with the same code and text.

#include <string>
#include <utility>
#include <variant>

#include "core/error_code.hpp"

namespace af {

struct graph_error {
  af_error code = af_error::invalid_argument;
  std::string what; ///< one sentence naming the thing and what to do
};

template <class T>
class outcome {
public:
  outcome(T value) : v_(std::move(value)) {} // NOLINT: implicit, like expected
  outcome(graph_error err) : v_(std::move(err)) {} // NOLINT

  explicit operator bool() const { return v_.index() == 0; }
  T& operator*() { return std::get<0>(v_); }
  const T& operator*() const { return std::get<0>(v_); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  const graph_error& error() const { return std::get<1>(v_); }

private:
  std::variant<T, graph_error> v_;
};

/// An error or nothing (for steps that return no value).
using graph_status = outcome<std::monostate>;

inline graph_status ok() {
  return std::monostate{};
}

} // namespace af
