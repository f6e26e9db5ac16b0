#pragma once
/// Pure compute, no CAF and no CUDA types. One `backend` interface; the CPU
/// backend is always built and is the reference, the CUDA backend exists when
/// nvcc was found and a GPU is present. Failures come back as a sentence in
/// `status`, never as a crash.

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/op_attrs.hpp"
#include "core/prefetch.hpp"
#include "core/tensor.hpp"

namespace af::kernels {

struct status {
  /// What kind of failure: callers map it to an error code (shape_mismatch,
  /// ...) and fall back to another backend on `unsupported`.
  enum class kind { none, invalid, shape, dtype, unsupported };

  std::string error; ///< empty on success
  kind what = kind::none;

  bool ok() const { return error.empty(); }
  static status success() { return {}; }
  static status failure(std::string why, kind k = kind::invalid) { return {std::move(why), k}; }
  static status shape(std::string why) { return failure(std::move(why), kind::shape); }
  static status dtype(std::string why) { return failure(std::move(why), kind::dtype); }
};

/// Elementwise ops of two tensors. The *_grad ones take (dy, x) for relu and
/// (dy, y) for sigmoid/tanh, y being the forward output, and need equal shapes.
enum class binary_op { add, sub, mul, div, relu_grad, sigmoid_grad, tanh_grad };

/// softplus is log(1 + e^x), computed without overflow.
enum class unary_op { neg, exp, log, relu, sigmoid, tanh, square, sqrt, softplus };

enum class reduce_op { sum, mean, max };

std::optional<binary_op> parse_binary_op(std::string_view name);
const char* to_string(binary_op op);
std::optional<unary_op> parse_unary_op(std::string_view name);
const char* to_string(unary_op op);
std::optional<reduce_op> parse_reduce_op(std::string_view name);

/// Element `i` of an int32 or int64 tensor, exactly: tensor::at goes through
/// a double, and an int64 near 2^63 does not come back from one (the cast
/// would be undefined).
inline int64_t integer_at(const tensor& t, size_t i) {
  return t.type() == dtype::int32 ? t.data<int32_t>()[i] : t.data<int64_t>()[i];
}

/// Calls `f(i, id)` for every element of an int32 or int64 tensor, in order,
/// until it returns false; false if it did. The loop of integer_at without
/// its per-element look at the tensor's buffer (a ps checks and dedups
/// every id of every sparse push and gather).
template <class F>
bool each_id(const tensor& t, F&& f) {
  const size_t n = t.num_elements();
  if (t.type() == dtype::int32) {
    const int32_t* p = t.data<int32_t>();
    for (size_t i = 0; i < n; ++i)
      if (!f(i, static_cast<int64_t>(p[i])))
        return false;
    return true;
  }
  const int64_t* p = t.data<int64_t>();
  for (size_t i = 0; i < n; ++i)
    if (!f(i, p[i]))
      return false;
  return true;
}

/// Rows `ids` of `src` (rows of `row_bytes`, ids checked by the caller)
/// copied in the ids' order to `dst`, each row prefetched rows_ahead ids
/// before it is copied (core/prefetch.hpp): a gather from a big table.
template <class Id>
void copy_rows(const Id* ids, size_t n, const std::byte* src, std::byte* dst, size_t row_bytes) {
  for (size_t i = 0; i < n; ++i) {
    if (i + rows_ahead < n)
      prefetch_row(src + static_cast<size_t>(ids[i + rows_ahead]) * row_bytes, row_bytes);
    std::memcpy(dst + i * row_bytes, src + static_cast<size_t>(ids[i]) * row_bytes, row_bytes);
  }
}

/// copy_rows of an id tensor (int32 or int64).
inline void copy_rows(const tensor& ids, const std::byte* src, std::byte* dst, size_t row_bytes) {
  if (ids.type() == dtype::int32)
    copy_rows(ids.data<int32_t>(), ids.num_elements(), src, dst, row_bytes);
  else
    copy_rows(ids.data<int64_t>(), ids.num_elements(), src, dst, row_bytes);
}

/// The shape a reduction over `attrs` leaves of `shape`, or the reason it cannot.
status reduced_shape(const shape_type& shape, const op_attrs& attrs, shape_type& out);

/// A reduction seen as [outer, len, inner] around the reduced axis (len is
/// every element for all_axes). `attrs` must have passed reduced_shape.
struct reduction_geometry {
  size_t outer = 1, len = 1, inner = 1;
};
reduction_geometry reduction_of(const shape_type& shape, const op_attrs& attrs);

/// Strides of `in` seen through the broadcast shape `out` (0 along broadcast
/// dimensions), one per dimension of `out`.
std::vector<size_t> broadcast_strides(const shape_type& in, const shape_type& out);

/// NumPy broadcasting of two shapes; nullopt if they are incompatible.
std::optional<shape_type> broadcast_shapes(const shape_type& a, const shape_type& b);

class backend {
public:
  virtual ~backend() = default;

  /// "cpu" or "cuda:N".
  virtual std::string name() const = 0;

  /// out = a (op) b with NumPy broadcasting; a and b must share a dtype.
  virtual status binary(binary_op op, const tensor& a, const tensor& b, tensor& out) = 0;

  /// a = a (op) b in place, b broadcast to a's shape (variable updates).
  virtual status binary_inplace(binary_op op, tensor& a, const tensor& b) = 0;

  // Every op below defaults to "not on this backend": a backend implements
  // what it can, and the caller can fall back to the CPU for the rest.

  /// Elementwise function of a float tensor.
  virtual status unary(unary_op op, const tensor& x, tensor& out);

  /// op(a) x op(b) of 2-D float tensors (BLAS GEMM).
  virtual status matmul(const tensor& a, const tensor& b, bool transpose_a, bool transpose_b,
                        tensor& out);

  /// sum, mean or max over one axis or all (see op_attrs).
  virtual status reduce(reduce_op op, const op_attrs& attrs, const tensor& x, tensor& out);

  /// The gradient of a reduction: dy spread back over x's shape (for max: to
  /// the positions equal to y, the forward output).
  virtual status reduce_grad(reduce_op op, const op_attrs& attrs, const tensor& dy, const tensor& x,
                             const tensor& y, tensor& out);

  /// dy summed over the dimensions that broadcasting added to `like`'s shape.
  virtual status sum_to(const tensor& dy, const tensor& like, tensor& out);

  /// softmax (or log-softmax) over the last axis.
  virtual status softmax(const tensor& logits, bool log, tensor& out);

  /// Its gradient, from dy and the forward output y.
  virtual status softmax_grad(const tensor& dy, const tensor& y, bool log, tensor& out);

  /// Per-example cross-entropy of logits [batch, classes] with integer labels
  /// [batch] (TF's sparse_softmax_cross_entropy_with_logits).
  virtual status softmax_xent(const tensor& logits, const tensor& labels, tensor& loss);

  /// Its gradient w.r.t. the logits: dy[:, None] * (softmax(logits) - onehot(labels)).
  virtual status softmax_xent_grad(const tensor& dy, const tensor& logits, const tensor& labels,
                                   tensor& out);

  /// params[indices] along axis 0 (tf.gather): indices.shape + params.shape[1:].
  /// An id out of [0, rows) is refused naming it (kernels/sparse.hpp).
  virtual status gather(const tensor& params, const tensor& indices, tensor& out);

  /// tf.math.unsorted_segment_sum: rows of `data` summed into `num_segments`
  /// segments by `segment_ids` (negative ids dropped, ids >= num_segments
  /// refused naming them).
  virtual status unsorted_segment_sum(const tensor& data, const tensor& segment_ids,
                                      int64_t num_segments, tensor& out);

  /// var -= lr * grad
  virtual status apply_sgd(tensor& var, const tensor& grad, double lr);

  /// accum = momentum * accum + grad; var -= lr * accum (TF's MomentumOptimizer)
  virtual status apply_momentum(tensor& var, tensor& accum, const tensor& grad, double lr,
                                double momentum);

  /// TF's Adam update at step `t` (1-based) with moments m and v.
  virtual status apply_adam(tensor& var, tensor& m, tensor& v, const tensor& grad, double lr,
                            double beta1, double beta2, double epsilon, int64_t t);

protected:
  status unsupported(const char* what) const;
};

/// Runs graph op `op` (by name: add, matmul, sum, softmax_xent, relu_grad,
/// sum_to, ...) on `backend`, through the op registry (kernels/op_registry.hpp).
status run_op(backend& b, const std::string& op, const op_attrs& attrs,
              const std::vector<tensor>& inputs, tensor& out);

/// True if run_op knows `op`.
bool known_op(const std::string& op);

/// The reference backend (OpenBLAS for GEMM, loops elsewhere).
std::unique_ptr<backend> make_cpu_backend();

/// True if this binary was built with the CUDA backend.
bool cuda_compiled();

/// Number of usable GPUs (0 in a CPU-only build or without a driver/GPU);
/// `why` receives the reason when it is 0.
int cuda_device_count(std::string* why = nullptr);

/// The CUDA backend on GPU `ordinal`, or nullptr with `why` saying why
/// (compiled out, no GPU, bad ordinal).
std::unique_ptr<backend> make_cuda_backend(int ordinal, std::string* why);

/// Benchmark baselines on GPU 0 (0 without one): cublasSgemm on device-
/// resident n x n matrices in GFLOP/s, and a device-to-device copy of `bytes`
/// in GB/s; the median of `reps`.
double cuda_sgemm_gflops(int n, int reps);
double cuda_copy_gbps(size_t bytes, int reps);

/// Fills `t` (float32 or float64) from U[low, high) or N(mean, stddev),
/// deterministically for a seed.
status fill_uniform(tensor& t, double low, double high, uint64_t seed);
status fill_normal(tensor& t, double mean, double stddev, uint64_t seed);

} // namespace af::kernels
