#pragma once
/// The executor actor: one per device of a node; runs ops on that device.
///
/// Protocol:
///   (compute, compute_request) -> (compute_result)
///        Operands are tensors or variables. The executor reads variable
///        operands itself, so a variable on the same node is used without a
///        copy and a remote one travels once, node to node, not through the
///        client. Errors: shape_mismatch / dtype_mismatch naming the op and
///        both shapes, uninitialized naming the variable, invalid_argument for
///        an op the executor does not know.

#include <cstdint>
#include <string>
#include <vector>

#include "caf/meta/type_name.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"

#include "messages/op_attrs.hpp"
#include "messages/variable.hpp"

namespace af {

/// A tensor, or a variable to read (when `var` is set).
struct operand {
  tensor value;
  variable_actor var;
  std::string var_name; ///< for errors
};

// A null actor handle does not survive CAF 0.17's deserializer (the whole
// message arrives empty), so the handle travels only when there is one.
caf::error inspect(caf::serializer& f, operand& x);
caf::error inspect(caf::deserializer& f, operand& x);

template <class Inspector>
typename std::enable_if<!std::is_base_of<caf::serializer, Inspector>::value
                          && !std::is_base_of<caf::deserializer, Inspector>::value,
                        typename Inspector::result_type>::type
inspect(Inspector& f, operand& x) {
  return f(caf::meta::type_name("operand"), x.value, x.var, x.var_name);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, op_attrs& x) {
  return f(caf::meta::type_name("op_attrs"), x.transpose_a, x.transpose_b, x.all_axes, x.axis,
           x.keep_dims);
}

struct compute_request {
  std::string op;      ///< a kernels::run_op name: "add", "matmul", "softmax_xent", ...
  std::string name;    ///< the op's name in the graph, for errors and traces
  std::vector<operand> inputs;
  op_attrs attrs;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, compute_request& x) {
  return f(caf::meta::type_name("compute_request"), x.op, x.name, x.inputs, x.attrs);
}

struct compute_result {
  tensor value;
  std::string device;  ///< the executor's full device name
  int64_t start_ns = 0; ///< steady clock of the executor's node
  int64_t end_ns = 0;
  std::string note;    ///< e.g. that a GPU executor ran the op on its CPU
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, compute_result& x) {
  return f(caf::meta::type_name("compute_result"), x.value, x.device, x.start_ns, x.end_ns, x.note);
}

using executor_actor = caf::typed_actor<
  caf::replies_to<compute_atom, compute_request>::with<compute_result>>;

} // namespace af
