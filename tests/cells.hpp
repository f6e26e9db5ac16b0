#pragma once
// Variable cells for tests that serve a data plane in-process.

#include <memory>
#include <string>

#include "actors/variable.hpp"

namespace af::testing {

/// A float32 variable `name` of `shape` on ps 0, every element `value`;
/// null if it cannot be initialized.
inline std::shared_ptr<variable_cell> float_cell(const std::string& name, shape_type shape,
                                                 float value) {
  auto cell = std::make_shared<variable_cell>(
    variable_spec{name, dtype::float32, std::move(shape), "/job:ps/replica:0/task:0/device:CPU:0"});
  if (!cell->initialize(initializer::constant(value), false, ""))
    return nullptr;
  return cell;
}

} // namespace af::testing
