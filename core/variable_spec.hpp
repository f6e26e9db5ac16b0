#pragma once
/// What a variable is and how it gets its first value: plain data, no CAF, so
/// the graph library (graph/) can describe variables. Their CAF inspectors are
/// in messages/variable.hpp.

#include <cstdint>
#include <string>

#include "core/tensor.hpp"

namespace af {

/// How a variable gets its first value (TF's initializers).
struct initializer {
  std::string kind = "zeros"; ///< constant, zeros, ones, uniform, normal, tensor
  double value = 0;           ///< constant
  double a = 0;               ///< uniform: low;  normal: mean
  double b = 1;               ///< uniform: high; normal: stddev
  uint64_t seed = 0;          ///< uniform, normal
  tensor from;                ///< tensor
  /// uniform, normal: the value is drawn per element of a table, from
  /// (seed, global row, column) alone (kernels/table_init.hpp), so each
  /// shard of a partitioned table holds the unpartitioned table's rows.
  /// false (every other variable): one stream of `seed`, element after
  /// element, as before.
  bool table = false;
  int64_t row_start = 0;      ///< table: the global row of local row 0
  int64_t row_stride = 1;     ///< table: local row r is global row row_start + r * row_stride

  static initializer constant(double v) { initializer i; i.kind = "constant"; i.value = v; return i; }
  static initializer zeros() { return constant(0); }
  static initializer ones() { return constant(1); }
  static initializer uniform(double low, double high, uint64_t seed) {
    initializer i; i.kind = "uniform"; i.a = low; i.b = high; i.seed = seed; return i;
  }
  static initializer normal(double mean, double stddev, uint64_t seed) {
    initializer i; i.kind = "normal"; i.a = mean; i.b = stddev; i.seed = seed; return i;
  }
  static initializer from_tensor(tensor t) { initializer i; i.kind = "tensor"; i.from = std::move(t); return i; }
};

/// What a variable is: its name, dtype, shape and the full device it lives on.
struct variable_spec {
  std::string name;
  dtype type = dtype::float32;
  shape_type shape;
  std::string device; ///< canonical, e.g. /job:ps/replica:0/task:0/device:CPU:0
};

} // namespace af

namespace af {

/// The operations on a variable's value: one enum for the variable actor's
/// protocol, the data plane's frame kinds (wire::kind has the same values)
/// and the executor's update ops.
enum class var_op : uint8_t { read = 1, assign = 2, assign_add = 3, assign_sub = 4 };

/// "read", "assign", "assign_add", "assign_sub".
const char* to_string(var_op op);

/// The var_op of a graph op name ("assign_add"), if it is one.
bool parse_var_op(const std::string& name, var_op& out);

/// True if `code` (a byte from a peer) is a var_op.
constexpr bool valid_var_op(uint8_t code) {
  return code >= 1 && code <= 4;
}

/// A fresh id for one update (never 0): the variable applies an update once
/// per id, so a retry sent with the same id after a lost reply is not
/// counted twice (actors/variable.hpp). Distinct within a process (a
/// bijection of a counter) and random across processes (a 64-bit seed from
/// std::random_device mixed in): two clients collide with a chance of about
/// n^2 / 2^65 for n ids in a variable's table. Thread-safe.
uint64_t new_request_id();

} // namespace af
