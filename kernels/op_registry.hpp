#pragma once
/// The op registry: every graph op declared once (TF's REGISTER_OP), with its
/// name, inputs, attributes, shape rule, backend entry and one line of help.
/// What reads it: run_op / known_op (every executor and the one-process
/// evaluator), the graph builder (graph/op_builder.hpp), the gradient rules
/// (graph/gradients.cpp, keyed by the same name, checked against `gradient`
/// below), and the REPL's functions, help and completion. docs/ops.md says
/// how to add an op.
///
/// It lives in kernels/ because run_op is here and kernels/ is below graph/:
/// the gradient of an op builds graph nodes, so its rule is registered in
/// graph/ and only whether it has one is declared here; no lower layer ever
/// includes a higher one.

#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernels.hpp"

namespace af::kernels {

/// A dimension that is known only when the op runs (unique's length,
/// unsorted_segment_sum's num_segments, a value): TensorFlow's None.
constexpr int64_t unknown_dim = -1;

/// What an op's output is, as far as shapes go: its dtype and shape (a
/// dimension may be unknown_dim).
struct value_info {
  dtype type = dtype::float32;
  shape_type shape;
};

/// The backend entry: runs the op on a backend (CPU or CUDA through its
/// virtual functions; an op a backend lacks returns `unsupported` and the
/// executor falls back to the CPU). Inputs are checked for count and value.
using op_kernel = status (*)(backend&, const op_attrs&, const std::vector<tensor>&, tensor&);

/// The shape rule: the output's dtype and shape from the inputs', or why the
/// inputs do not fit (status::shape / status::dtype).
using op_shape_rule = status (*)(const op_attrs&, const std::vector<value_info>&, value_info&);

/// Which op_attrs fields an op reads (what the REPL takes as keywords).
enum class op_attr_kind : uint8_t {
  none,
  transposes, ///< transpose_a, transpose_b (matmul)
  reduction,  ///< all_axes / axis, keep_dims
};

/// Whether gradients() differentiates the op. `rule`: graph/gradients.cpp has
/// one under this op's name (a test checks both ways); `none`: it is not
/// differentiable (a gradient op itself, a count, a seed).
enum class op_gradient : uint8_t { rule, none };

/// The number of comma-separated names in `inputs`.
constexpr int count_inputs(std::string_view inputs) {
  int n = inputs.empty() ? 0 : 1;
  for (char c : inputs)
    n += c == ',' ? 1 : 0;
  return n;
}

/// One op.
struct op_def {
  std::string_view name;   ///< the graph op's name, as sent to executors
  std::string_view inputs; ///< input names, comma separated ("a, b"): their count is the arity
  op_attr_kind attrs;
  op_shape_rule shape;
  op_kernel run;
  op_gradient gradient;
  /// The builder method and REPL function when it is not `name`
  /// (reduce_sum for sum), else empty. Both names work in the REPL.
  std::string_view function;
  std::string_view help; ///< one line: what it computes
  /// Whether `inputs` may come several times over (dynamic_stitch's
  /// "INDICES, DATA" is N indices then N data tensors, N >= 1).
  bool variadic = false;
  /// How many inputs: counted from `inputs` once, when the table is made.
  int input_count = count_inputs(inputs);

  /// The number of inputs; of a variadic op, the fewest (one group).
  int arity() const { return input_count; }
  /// Whether the op takes `n` inputs: arity(), or for a variadic op any
  /// positive multiple of it.
  bool takes(size_t n) const {
    auto a = static_cast<size_t>(input_count);
    return variadic ? (n >= a && n % a == 0) : n == a;
  }
  /// The name users call: `function` if set, else `name`.
  std::string_view call_name() const { return function.empty() ? name : function; }
  /// "matmul(a, b, transpose_a=false, transpose_b=false)": the call with its inputs and keywords.
  std::string signature() const;
};

/// Every op, in a fixed order (forward ops first, then gradient ops).
const std::vector<op_def>& op_registry();

/// The op named `name` (its graph name or its `function`), or nullptr.
const op_def* find_op_def(std::string_view name);

/// The output of `op` on inputs like `in`, without running it (the shape rule).
status infer_op(const std::string& op, const op_attrs& attrs, const std::vector<value_info>& in,
                value_info& out);

} // namespace af::kernels
