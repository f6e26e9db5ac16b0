#pragma once
// Pieces of the tests that serve variables on an in-process data plane and
// count what it was asked (test_gather_many*.cpp).

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "actors/variable.hpp"
#include "net/data_plane.hpp"

namespace af::testing {

/// A variable `name` on ps 0 whose value is `value`.
inline std::shared_ptr<variable_cell> cell_of(const std::string& name, tensor value) {
  auto cell = std::make_shared<variable_cell>(
    variable_spec{name, value.type(), value.shape(), "/job:ps/replica:0/task:0/device:CPU:0"});
  REQUIRE(cell->initialize(initializer::from_tensor(value), false, ""));
  return cell;
}

/// int64 [n] of `v`.
inline tensor int64s(const std::vector<int64_t>& v) {
  tensor t{dtype::int64, {static_cast<int64_t>(v.size())}};
  std::memcpy(t.mutable_data<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

/// Request frames the server took so far, on every transport.
inline uint64_t requests_of(const data_plane_server& srv) {
  uint64_t n = 0;
  for (const auto& t : srv.counters().transports)
    n += t.requests.load();
  return n;
}

/// Variable ops (reads, gathers, ...) it served so far, on every transport.
inline uint64_t variable_ops_of(const data_plane_server& srv) {
  uint64_t n = 0;
  for (const auto& t : srv.counters().transports)
    n += t.variable_ops.load();
  return n;
}

} // namespace af::testing
