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

using op_inputs = std::vector<tensor>;
using op_kernel = status (*)(backend&, const op_attrs&, const op_inputs&, tensor&);

/// One graph op: its name, how many inputs it takes and the kernel it runs.
struct op_entry {
  std::string_view name;
  int arity;
  op_kernel run;
};

template <binary_op Op>
status binary_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  return b.binary(Op, in[0], in[1], out);
}

template <unary_op Op>
status unary_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  return b.unary(Op, in[0], out);
}

template <reduce_op Op>
status reduce_kernel(backend& b, const op_attrs& attrs, const op_inputs& in, tensor& out) {
  return b.reduce(Op, attrs, in[0], out);
}

template <bool Log>
status softmax_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  return b.softmax(in[0], Log, out);
}

template <bool Log>
status softmax_grad_kernel(backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
  return b.softmax_grad(in[0], in[1], Log, out);
}

// The table is the only list of op names: known_op and run_op both read it,
// so a name is either run by its own kernel or rejected, never sent to
// another op's kernel.
const op_entry op_table[] = {
  {"add", 2, binary_kernel<binary_op::add>},
  {"sub", 2, binary_kernel<binary_op::sub>},
  {"mul", 2, binary_kernel<binary_op::mul>},
  {"div", 2, binary_kernel<binary_op::div>},
  {"relu_grad", 2, binary_kernel<binary_op::relu_grad>},       // (dy, x)
  {"sigmoid_grad", 2, binary_kernel<binary_op::sigmoid_grad>}, // (dy, y)
  {"tanh_grad", 2, binary_kernel<binary_op::tanh_grad>},       // (dy, y)
  {"neg", 1, unary_kernel<unary_op::neg>},
  {"exp", 1, unary_kernel<unary_op::exp>},
  {"log", 1, unary_kernel<unary_op::log>},
  {"relu", 1, unary_kernel<unary_op::relu>},
  {"sigmoid", 1, unary_kernel<unary_op::sigmoid>},
  {"tanh", 1, unary_kernel<unary_op::tanh>},
  {"square", 1, unary_kernel<unary_op::square>},
  {"sqrt", 1, unary_kernel<unary_op::sqrt>},
  {"sum", 1, reduce_kernel<reduce_op::sum>},
  {"mean", 1, reduce_kernel<reduce_op::mean>},
  {"max", 1, reduce_kernel<reduce_op::max>},
  {"matmul", 2,
   [](backend& b, const op_attrs& attrs, const op_inputs& in, tensor& out) {
     return b.matmul(in[0], in[1], attrs.transpose_a, attrs.transpose_b, out);
   }},
  {"sum_to", 2,
   [](backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
     return b.sum_to(in[0], in[1], out);
   }},
  {"softmax", 1, softmax_kernel<false>},
  {"log_softmax", 1, softmax_kernel<true>},
  {"softmax_grad", 2, softmax_grad_kernel<false>},    // (dy, y)
  {"log_softmax_grad", 2, softmax_grad_kernel<true>}, // (dy, y)
  {"softmax_xent", 2,
   [](backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
     return b.softmax_xent(in[0], in[1], out);
   }},
  {"softmax_xent_grad", 3, // (dy, logits, labels)
   [](backend& b, const op_attrs&, const op_inputs& in, tensor& out) {
     return b.softmax_xent_grad(in[0], in[1], in[2], out);
   }},
  {"sum_grad", 2, // (dy, x)
   [](backend& b, const op_attrs& attrs, const op_inputs& in, tensor& out) {
     return b.reduce_grad(reduce_op::sum, attrs, in[0], in[1], tensor{}, out);
   }},
  {"mean_grad", 2, // (dy, x)
   [](backend& b, const op_attrs& attrs, const op_inputs& in, tensor& out) {
     return b.reduce_grad(reduce_op::mean, attrs, in[0], in[1], tensor{}, out);
   }},
  {"max_grad", 3, // (dy, x, y)
   [](backend& b, const op_attrs& attrs, const op_inputs& in, tensor& out) {
     return b.reduce_grad(reduce_op::max, attrs, in[0], in[1], in[2], out);
   }},
  {"correct_count", 2, // (logits [batch, classes], labels [batch]): how many argmax == label
   [](backend&, const op_attrs&, const op_inputs& in, tensor& out) {
     const tensor& logits = in[0];
     const tensor& labels = in[1];
     if (logits.type() != dtype::float32 || logits.shape().size() != 2)
       return status::shape("correct_count takes float32 logits [batch, classes], got "
                            + logits.summary());
     if ((labels.type() != dtype::int32 && labels.type() != dtype::int64)
         || labels.shape() != shape_type{logits.shape()[0]})
       return status::shape("correct_count: labels " + labels.summary()
                            + " must be int32 or int64 [batch] matching logits " + logits.summary());
     auto rows = static_cast<size_t>(logits.shape()[0]);
     auto cols = static_cast<size_t>(logits.shape()[1]);
     const float* x = logits.data<float>();
     double hits = 0;
     for (size_t r = 0; r < rows; ++r) {
       size_t best = 0;
       for (size_t c = 1; c < cols; ++c)
         if (x[r * cols + c] > x[r * cols + best])
           best = c;
       hits += static_cast<int64_t>(best) == integer_at(labels, r) ? 1 : 0;
     }
     out = tensor::filled(dtype::float32, {}, hits);
     return status::success();
   }},
  {"ones_like", 1, // the seed of gradients: the loss's dtype and shape
   [](backend&, const op_attrs&, const op_inputs& in, tensor& out) {
     out = tensor::filled(in[0].type(), in[0].shape(), 1);
     return status::success();
   }},
};

const op_entry* find_op(std::string_view name) {
  for (const auto& e : op_table)
    if (e.name == name)
      return &e;
  return nullptr;
}

} // namespace

bool known_op(const std::string& op) {
  return find_op(op) != nullptr;
}

std::vector<std::pair<std::string, int>> op_list() {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& e : op_table)
    out.emplace_back(std::string{e.name}, e.arity);
  return out;
}

status run_op(backend& b, const std::string& op, const op_attrs& attrs,
              const std::vector<tensor>& in, tensor& out) {
  const auto* entry = find_op(op);
  if (entry == nullptr)
    return status::failure("unknown op '" + op + "'");
  if (static_cast<int>(in.size()) != entry->arity)
    return status::failure(op + " takes " + std::to_string(entry->arity) + " input(s), got "
                           + std::to_string(in.size()));
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].empty())
      return status::failure(op + ": input " + std::to_string(i) + " has no value");
  return entry->run(b, attrs, in, out);
}

} // namespace af::kernels
