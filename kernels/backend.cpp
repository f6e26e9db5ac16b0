// The backend's defaults ("not on this backend") and the geometry helpers
// that the CPU and CUDA backends share.
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

status backend::gather(const tensor&, const tensor&, tensor&) {
  return unsupported("gather");
}

status backend::unsorted_segment_sum(const tensor&, const tensor&, int64_t, tensor&) {
  return unsupported("unsorted_segment_sum");
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

} // namespace af::kernels
