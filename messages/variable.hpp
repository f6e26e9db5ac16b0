#pragma once
/// The variable actor: one per variable, living on the node of its device.
///
/// Protocol (every reply may instead be an error of messages/error.hpp):
///   (read)                         -> (tensor value, uint64 version)
///        uninitialized if no value was ever set; the error names the variable.
///   (assign,     tensor, bool want_value) -> (tensor value_or_empty, uint64 version)
///   (assign_add, tensor, bool want_value) -> (tensor value_or_empty, uint64 version)
///   (assign_sub, tensor, bool want_value) -> (tensor value_or_empty, uint64 version)
///        the operand must have the variable's dtype and shape (or be a scalar,
///        which is broadcast); `want_value` asks for the value after the update,
///        as TensorFlow's assign ops return it. assign_add/sub of an
///        uninitialized variable is an error; assign initializes it.
///   (init, initializer, bool only_if_uninitialized) -> (uint64 version)
///   (info)                         -> (variable_info)
///   (wait_init)                    -> (uint64 version)
///        answered once the variable has a value (at once if it has one); the
///        caller bounds the wait with its request timeout.
/// Every successful update bumps the version by one.

#include <cstdint>
#include <string>

#include "caf/meta/type_name.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"

#include "messages/atoms.hpp"
#include "messages/serialization.hpp"
#include "messages/tensor.hpp"

namespace af {

/// How a variable gets its first value (TF's initializers).
struct initializer {
  std::string kind = "zeros"; ///< constant, zeros, ones, uniform, normal, tensor
  double value = 0;           ///< constant
  double a = 0;               ///< uniform: low;  normal: mean
  double b = 1;               ///< uniform: high; normal: stddev
  uint64_t seed = 0;          ///< uniform, normal
  tensor from;                ///< tensor

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

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, initializer& x) {
  return f(caf::meta::type_name("initializer"), x.kind, x.value, x.a, x.b, x.seed, x.from);
}

/// What a variable is: its name, dtype, shape and the full device it lives on.
struct variable_spec {
  std::string name;
  dtype type = dtype::float32;
  shape_type shape;
  std::string device; ///< canonical, e.g. /job:ps/replica:0/task:0/device:CPU:0
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, variable_spec& x) {
  return f(caf::meta::type_name("variable_spec"), x.name, x.type, x.shape, x.device);
}

struct variable_info {
  variable_spec spec;
  bool initialized = false;
  uint64_t version = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, variable_info& x) {
  return f(caf::meta::type_name("variable_info"), x.spec, x.initialized, x.version);
}

using variable_actor = caf::typed_actor<
  caf::replies_to<read_atom>::with<tensor, uint64_t>,
  caf::replies_to<assign_atom, tensor, bool>::with<tensor, uint64_t>,
  caf::replies_to<assign_add_atom, tensor, bool>::with<tensor, uint64_t>,
  caf::replies_to<assign_sub_atom, tensor, bool>::with<tensor, uint64_t>,
  caf::replies_to<init_atom, initializer, bool>::with<uint64_t>,
  caf::replies_to<info_atom>::with<variable_info>,
  caf::replies_to<wait_init_atom>::with<uint64_t>>;

} // namespace af
