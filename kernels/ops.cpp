// The backend's defaults ("not on this backend") and the one table from op
// names to kernels, used by every executor.
#include "kernels/kernels.hpp"

namespace af::kernels {

status backend::unsupported(const char* what) const {
  return status::failure(std::string{what} + " is not implemented on the " + name() + " backend",
                         status::kind::unsupported);
}

status backend::unary(unary_op op, const tensor&, tensor&) {
  return unsupported(to_string(op));
}

status backend::matmul(const tensor&, const tensor&, bool, bool, tensor&) {
  return unsupported("matmul");
}

status backend::reduce(reduce_op, const op_attrs&, const tensor&, tensor&) {
  return unsupported("reduce");
}

status backend::reduce_grad(reduce_op, const op_attrs&, const tensor&, const tensor&, const tensor&,
                            tensor&) {
  return unsupported("reduce_grad");
}

status backend::sum_to(const tensor&, const tensor&, tensor&) {
  return unsupported("sum_to");
}

status backend::softmax(const tensor&, bool, tensor&) {
  return unsupported("softmax");
}

status backend::softmax_grad(const tensor&, const tensor&, bool, tensor&) {
  return unsupported("softmax_grad");
}

status backend::softmax_xent(const tensor&, const tensor&, tensor&) {
  return unsupported("softmax_xent");
}

status backend::softmax_xent_grad(const tensor&, const tensor&, const tensor&, tensor&) {
  return unsupported("softmax_xent_grad");
}

status backend::apply_sgd(tensor&, const tensor&, double) {
  return unsupported("apply_sgd");
}

status backend::apply_momentum(tensor&, tensor&, const tensor&, double, double) {
  return unsupported("apply_momentum");
}

status backend::apply_adam(tensor&, tensor&, tensor&, const tensor&, double, double, double, double,
                           int64_t) {
  return unsupported("apply_adam");
}

reduction_geometry reduction_of(const shape_type& shape, const op_attrs& attrs) {
  reduction_geometry g;
  if (attrs.all_axes) {
    g.len = static_cast<size_t>(num_elements(shape));
    return g;
  }
  auto rank = static_cast<int32_t>(shape.size());
  auto axis = static_cast<size_t>(attrs.axis < 0 ? attrs.axis + rank : attrs.axis);
  for (size_t d = 0; d < axis; ++d)
    g.outer *= static_cast<size_t>(shape[d]);
  for (size_t d = axis + 1; d < shape.size(); ++d)
    g.inner *= static_cast<size_t>(shape[d]);
  g.len = static_cast<size_t>(shape[axis]);
  return g;
}

std::vector<size_t> broadcast_strides(const shape_type& in, const shape_type& out) {
  std::vector<size_t> strides(out.size(), 0);
  size_t stride = 1;
  for (size_t k = 0; k < in.size(); ++k) {
    size_t din = in.size() - 1 - k;
    size_t dout = out.size() - 1 - k;
    strides[dout] = in[din] == 1 ? 0 : stride;
    stride *= static_cast<size_t>(in[din]);
  }
  return strides;
}

namespace {

/// How many inputs each op takes.
int arity(const std::string& op) {
  if (parse_binary_op(op) || op == "matmul" || op == "sum_to" || op == "softmax_grad"
      || op == "log_softmax_grad" || op == "softmax_xent" || op == "sum_grad" || op == "mean_grad")
    return 2;
  if (parse_unary_op(op) || parse_reduce_op(op) || op == "softmax" || op == "log_softmax"
      || op == "ones_like")
    return 1;
  if (op == "max_grad" || op == "softmax_xent_grad")
    return 3;
  return -1;
}

} // namespace

bool known_op(const std::string& op) {
  return arity(op) >= 0;
}

status run_op(backend& b, const std::string& op, const op_attrs& attrs,
              const std::vector<tensor>& in, tensor& out) {
  auto n = arity(op);
  if (n < 0)
    return status::failure("unknown op '" + op + "'");
  if (static_cast<int>(in.size()) != n)
    return status::failure(op + " takes " + std::to_string(n) + " input(s), got "
                           + std::to_string(in.size()));
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].empty())
      return status::failure(op + ": input " + std::to_string(i) + " has no value");
  if (op == "ones_like") { // the seed of gradients: the loss's dtype and shape
    out = tensor::filled(in[0].type(), in[0].shape(), 1);
    return status::success();
  }
  if (auto bop = parse_binary_op(op))
    return b.binary(*bop, in[0], in[1], out);
  if (auto uop = parse_unary_op(op))
    return b.unary(*uop, in[0], out);
  if (auto rop = parse_reduce_op(op))
    return b.reduce(*rop, attrs, in[0], out);
  if (op == "matmul")
    return b.matmul(in[0], in[1], attrs.transpose_a, attrs.transpose_b, out);
  if (op == "sum_to")
    return b.sum_to(in[0], in[1], out);
  if (op == "softmax" || op == "log_softmax")
    return b.softmax(in[0], op == "log_softmax", out);
  if (op == "softmax_grad" || op == "log_softmax_grad")
    return b.softmax_grad(in[0], in[1], op == "log_softmax_grad", out);
  if (op == "softmax_xent")
    return b.softmax_xent(in[0], in[1], out);
  if (op == "softmax_xent_grad")
    return b.softmax_xent_grad(in[0], in[1], in[2], out);
  if (op == "sum_grad" || op == "mean_grad")
    return b.reduce_grad(op == "sum_grad" ? reduce_op::sum : reduce_op::mean, attrs, in[0], in[1],
                         tensor{}, out);
  // max_grad: (dy, x, y)
  return b.reduce_grad(reduce_op::max, attrs, in[0], in[1], in[2], out);
}

} // namespace af::kernels
