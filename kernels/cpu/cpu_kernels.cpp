#include "kernels/kernels.hpp"
#include "kernels/sparse.hpp"
#include "core/int_arith.hpp"
#include "core/parallel_ranges.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <cblas.h>

namespace af::kernels {

namespace {

// Integers wrap and divide without a trap (core/int_arith.hpp); for
// floats these are the plain operators.
using int_arith::total_div;
using int_arith::wrap_add;
using int_arith::wrap_mul;
using int_arith::wrap_sub;

template <class T>
T apply(binary_op op, T x, T y) {
  switch (op) {
    case binary_op::add: return wrap_add(x, y);
    case binary_op::sub: return wrap_sub(x, y);
    case binary_op::mul: return wrap_mul(x, y);
    case binary_op::div: return total_div(x, y);
    case binary_op::relu_grad: return y > T{0} ? x : T{0};                              // (dy, x)
    case binary_op::sigmoid_grad: return wrap_mul(wrap_mul(x, y), wrap_sub(T{1}, y));   // (dy, y)
    case binary_op::tanh_grad: return wrap_mul(x, wrap_sub(T{1}, wrap_mul(y, y)));      // (dy, y)
  }
  return T{};
}

// The hot cases get their own loops so that the compiler vectorizes them.
template <class T, class F>
void same_shape(const T* a, const T* b, T* out, size_t n, F f) {
  for (size_t i = 0; i < n; ++i)
    out[i] = f(a[i], b[i]);
}

template <class T>
void run_binary(binary_op op, const T* a, const T* b, T* out, size_t n) {
  switch (op) {
    case binary_op::add: same_shape(a, b, out, n, [](T x, T y) { return wrap_add(x, y); }); break;
    case binary_op::sub: same_shape(a, b, out, n, [](T x, T y) { return wrap_sub(x, y); }); break;
    case binary_op::mul: same_shape(a, b, out, n, [](T x, T y) { return wrap_mul(x, y); }); break;
    default: same_shape(a, b, out, n, [op](T x, T y) { return apply(op, x, y); }); break;
  }
}

template <class T>
void run_broadcast(binary_op op, const tensor& a, const tensor& b, T* out, const shape_type& shape) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  if (a.num_elements() == 1 || b.num_elements() == 1) {
    size_t n = static_cast<size_t>(num_elements(shape));
    if (b.num_elements() == 1) {
      T y = pb[0];
      for (size_t i = 0; i < n; ++i)
        out[i] = apply(op, pa[a.num_elements() == 1 ? 0 : i], y);
    } else {
      T x = pa[0];
      for (size_t i = 0; i < n; ++i)
        out[i] = apply(op, x, pb[i]);
    }
    return;
  }
  auto sa = broadcast_strides(a.shape(), shape);
  auto sb = broadcast_strides(b.shape(), shape);
  size_t rank = shape.size();
  std::vector<int64_t> idx(rank, 0);
  size_t n = static_cast<size_t>(num_elements(shape));
  size_t ia = 0, ib = 0;
  for (size_t i = 0; i < n; ++i) {
    out[i] = apply(op, pa[ia], pb[ib]);
    // odometer increment, keeping the input offsets in step
    for (size_t d = rank; d-- > 0;) {
      if (++idx[d] < shape[d]) {
        ia += sa[d];
        ib += sb[d];
        break;
      }
      ia -= sa[d] * static_cast<size_t>(shape[d] - 1);
      ib -= sb[d] * static_cast<size_t>(shape[d] - 1);
      idx[d] = 0;
    }
  }
}

template <class T>
void dispatch(binary_op op, const tensor& a, const tensor& b, T* out, const shape_type& shape) {
  if (a.shape() == b.shape())
    run_binary(op, a.data<T>(), b.data<T>(), out, a.num_elements());
  else
    run_broadcast(op, a, b, out, shape);
}

class cpu_backend : public backend {
public:
  std::string name() const override {
    return "cpu";
  }

  status binary(binary_op op, const tensor& a, const tensor& b, tensor& out) override {
    if (auto err = check(op, a, b); !err.ok())
      return err;
    auto shape = *broadcast_shapes(a.shape(), b.shape());
    tensor result{a.type(), shape};
    compute(op, a, b, result, shape);
    out = std::move(result);
    return status::success();
  }

  status binary_inplace(binary_op op, tensor& a, const tensor& b) override {
    if (auto err = check(op, a, b); !err.ok())
      return err;
    auto shape = *broadcast_shapes(a.shape(), b.shape());
    if (shape != a.shape())
      return status::shape("cannot update a tensor of shape " + shape_string(a.shape())
                             + " in place with one of shape " + shape_string(b.shape()));
    if (a.use_count() > 1) {
      // Someone (a reader's snapshot) still holds the buffer: never write under it.
      tensor result{a.type(), shape};
      compute(op, a, b, result, shape);
      a = std::move(result);
    } else {
      // Element i of the result depends on a[i] and b only, so aliasing is safe.
      compute(op, a, b, a, shape);
    }
    return status::success();
  }

  status unary(unary_op op, const tensor& x, tensor& out) override {
    if (auto st = need_float(x, to_string(op)); !st.ok())
      return st;
    tensor result{x.type(), x.shape()};
    with_float(x.type(), [&](auto zero) {
      using T = decltype(zero);
      const T* in = x.data<T>();
      T* o = result.mutable_data<T>();
      size_t n = x.num_elements();
      switch (op) {
        case unary_op::neg: for (size_t i = 0; i < n; ++i) o[i] = -in[i]; break;
        case unary_op::exp: for (size_t i = 0; i < n; ++i) o[i] = std::exp(in[i]); break;
        case unary_op::log: for (size_t i = 0; i < n; ++i) o[i] = std::log(in[i]); break;
        case unary_op::relu: for (size_t i = 0; i < n; ++i) o[i] = in[i] > T{0} ? in[i] : T{0}; break;
        case unary_op::sigmoid: for (size_t i = 0; i < n; ++i) o[i] = T{1} / (T{1} + std::exp(-in[i])); break;
        case unary_op::tanh: for (size_t i = 0; i < n; ++i) o[i] = std::tanh(in[i]); break;
        case unary_op::square: for (size_t i = 0; i < n; ++i) o[i] = in[i] * in[i]; break;
        case unary_op::sqrt: for (size_t i = 0; i < n; ++i) o[i] = std::sqrt(in[i]); break;
        case unary_op::softplus: // e^x never overflows: x + log(1 + e^-x) for positive x
          for (size_t i = 0; i < n; ++i)
            o[i] = in[i] > T{0} ? in[i] + std::log1p(std::exp(-in[i])) : std::log1p(std::exp(in[i]));
          break;
      }
    });
    out = std::move(result);
    return status::success();
  }

  /// Floats from which a kernel's pass is split across the cores
  /// (core/parallel_ranges.hpp), and (split_grain) the unit of its blocks.
  /// A 1 M-float linear model's worker spends its step's compute in two such
  /// passes (the forward dot, the gradient's column times a scalar); where
  /// its ps is still reading the other worker's push, one core is otherwise
  /// idle. In async too: there the workers' computes overlap each other and
  /// the ps, and a helper that finds no idle core takes no block.
  static constexpr size_t split_floats = elementwise_split_floats;
  static constexpr size_t split_grain = 4096;

  /// Floats of one partial sum of a long dot product: the sum is the same
  /// whatever the split, one core or several (the partials are added in
  /// order), so a result does not depend on how many cores the machine has
  /// (it may on the CPU's model: OpenBLAS picks its sdot kernel for it).
  static constexpr size_t dot_block = size_t{1} << 16;

  /// x . y over `k` floats: sdot for a short one, else partial sdots of
  /// dot_block floats each (on the cores, in parallel), added in order.
  static float dot(const float* x, const float* y, size_t k) {
    if (k < 2 * split_floats)
      return cblas_sdot(static_cast<int>(k), x, 1, y, 1);
    const size_t blocks = (k + dot_block - 1) / dot_block;
    std::vector<float> partial(blocks);
    parallel_ranges(blocks, 1, split_floats / dot_block, [&](size_t from, size_t to) {
      for (size_t b = from; b < to; ++b) {
        const size_t at = b * dot_block, len = std::min(dot_block, k - at);
        partial[b] = cblas_sdot(static_cast<int>(len), x + at, 1, y + at, 1);
      }
    });
    float sum = 0.0f;
    for (float v : partial)
      sum += v;
    return sum;
  }

  /// A product with a vector in it (a dot product, a matrix times a vector,
  /// an outer product): sgemm would pack its operands and scale its output
  /// first, which costs more than the product itself when one side is a
  /// vector (a 1 M-float linear model's step spent 40 % of its time there).
  /// Either operand's vector is contiguous whether or not it is transposed.
  static void vector_matmul(const tensor& a, const tensor& b, bool ta, bool tb, size_t m, size_t n,
                            size_t k, float* c) {
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    auto rows = [](const tensor& t) { return static_cast<int>(t.shape()[0]); };
    auto cols = [](const tensor& t) { return static_cast<int>(t.shape()[1]); };
    if (k == 1 && n == 1) { // a column times a scalar: one pass the compiler vectorizes
      const float b0 = pb[0];
      parallel_ranges(m, split_grain, split_floats, [&](size_t from, size_t to) {
        for (size_t i = from; i < to; ++i)
          c[i] = pa[i] * b0;
      });
    } else if (k == 1 && m == 1) { // a scalar times a row
      const float a0 = pa[0];
      for (size_t j = 0; j < n; ++j)
        c[j] = a0 * pb[j];
    } else if (k == 1) { // outer product: c[i][j] = a[i] * b[j]
      for (size_t i = 0; i < m; ++i) {
        const float ai = pa[i];
        float* ci = c + i * n;
        for (size_t j = 0; j < n; ++j)
          ci[j] = ai * pb[j];
      }
    } else if (m == 1 && n == 1) { // a dot product: both vectors are contiguous
      // sdot, not sgemv: where OpenBLAS cannot name the CPU (this VM's
      // "Intel(R) Xeon(R) Processor" falls back to its generic Prescott
      // kernels) sgemv of one row took 2.2x sdot's time (510 against 235 us
      // for 1 M floats: the 1 M linear model's forward pass). Only the single
      // dot: for several rows sgemv blocks them and threads over them.
      c[0] = dot(pa, pb, k);
    } else if (n == 1) { // c = op(a) * vector b
      cblas_sgemv(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, rows(a), cols(a), 1.0f, pa,
                  cols(a), pb, 1, 0.0f, c, 1);
    } else { // m == 1: c^T = op(b)^T * vector a
      cblas_sgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, rows(b), cols(b), 1.0f, pb,
                  cols(b), pa, 1, 0.0f, c, 1);
    }
  }

  status matmul(const tensor& a, const tensor& b, bool ta, bool tb, tensor& out) override {
    if (auto st = need_float(a, "matmul"); !st.ok())
      return st;
    if (a.type() != b.type())
      return status::dtype(std::string{"matmul: dtypes differ: "} + dtype_name(a.type()) + " vs "
                             + dtype_name(b.type()));
    if (a.shape().size() != 2 || b.shape().size() != 2)
      return status::shape("matmul takes 2-D tensors, got " + shape_string(a.shape()) + " and "
                             + shape_string(b.shape()));
    auto m = a.shape()[ta ? 1 : 0], k = a.shape()[ta ? 0 : 1];
    auto k2 = b.shape()[tb ? 1 : 0], n = b.shape()[tb ? 0 : 1];
    if (k != k2)
      return status::shape("matmul: inner dimensions differ: " + shape_string(a.shape())
                             + (ta ? "^T" : "") + " x " + shape_string(b.shape()) + (tb ? "^T" : ""));
    // BLAS takes int sizes: a larger one would be cut to a wrong (or
    // negative, a silent zero) product.
    for (auto d : {m, n, k})
      if (d > std::numeric_limits<int>::max())
        return status::shape("matmul: a dimension of " + shape_string(a.shape()) + " x "
                             + shape_string(b.shape()) + " is over 2^31 - 1, more than BLAS "
                             "takes: split the product");
    tensor result{a.type(), {m, n}};
    auto lda = static_cast<int>(a.shape()[1]), ldb = static_cast<int>(b.shape()[1]);
    auto tra = ta ? CblasTrans : CblasNoTrans, trb = tb ? CblasTrans : CblasNoTrans;
    if (m > 0 && n > 0) {
      if (k == 0)
        result = tensor::filled(a.type(), {m, n}, 0);
      else if (a.type() == dtype::float32 && (m == 1 || n == 1 || k == 1))
        vector_matmul(a, b, ta, tb, m, n, k, result.mutable_data<float>());
      else if (a.type() == dtype::float32)
        cblas_sgemm(CblasRowMajor, tra, trb, static_cast<int>(m), static_cast<int>(n),
                    static_cast<int>(k), 1.0f, a.data<float>(), lda, b.data<float>(), ldb, 0.0f,
                    result.mutable_data<float>(), static_cast<int>(n));
      else
        cblas_dgemm(CblasRowMajor, tra, trb, static_cast<int>(m), static_cast<int>(n),
                    static_cast<int>(k), 1.0, a.data<double>(), lda, b.data<double>(), ldb, 0.0,
                    result.mutable_data<double>(), static_cast<int>(n));
    }
    out = std::move(result);
    return status::success();
  }

  status reduce(reduce_op op, const op_attrs& attrs, const tensor& x, tensor& out) override {
    if (auto st = need_float(x, "reduce"); !st.ok())
      return st;
    shape_type shape;
    if (auto st = reduced_shape(x.shape(), attrs, shape); !st.ok())
      return st;
    if (op == reduce_op::max && x.num_elements() == 0)
      return status::failure("max of an empty tensor " + shape_string(x.shape()));
    // plain variables, not a structured binding: clang 14 (the fuzz build) cannot capture those
    auto geometry = reduction_of(x.shape(), attrs);
    size_t outer = geometry.outer, len = geometry.len, inner = geometry.inner;
    tensor result{x.type(), shape};
    with_float(x.type(), [&](auto zero) {
      using T = decltype(zero);
      const T* in = x.data<T>();
      T* o = result.mutable_data<T>();
      for (size_t a = 0; a < outer; ++a)
        for (size_t c = 0; c < inner; ++c) {
          double acc = op == reduce_op::max ? -std::numeric_limits<double>::infinity() : 0.0;
          for (size_t r = 0; r < len; ++r) {
            double v = in[(a * len + r) * inner + c];
            acc = op == reduce_op::max ? std::max(acc, v) : acc + v;
          }
          if (op == reduce_op::mean)
            acc = len == 0 ? std::numeric_limits<double>::quiet_NaN() : acc / static_cast<double>(len);
          o[a * inner + c] = static_cast<T>(acc);
        }
    });
    out = std::move(result);
    return status::success();
  }

  status reduce_grad(reduce_op op, const op_attrs& attrs, const tensor& dy, const tensor& x,
                     const tensor& y, tensor& out) override {
    if (auto st = need_float(x, "reduce gradient"); !st.ok())
      return st;
    shape_type shape;
    if (auto st = reduced_shape(x.shape(), attrs, shape); !st.ok())
      return st;
    if (static_cast<int64_t>(dy.num_elements()) != num_elements(shape) || dy.type() != x.type()
        || (op == reduce_op::max && y.num_elements() != dy.num_elements()))
      return status::shape("reduce gradient: dy " + dy.summary() + " does not match the reduction of "
                             + x.summary());
    // plain variables, not a structured binding: clang 14 (the fuzz build) cannot capture those
    auto geometry = reduction_of(x.shape(), attrs);
    size_t outer = geometry.outer, len = geometry.len, inner = geometry.inner;
    tensor result{x.type(), x.shape()};
    with_float(x.type(), [&](auto zero) {
      using T = decltype(zero);
      const T* g = dy.data<T>();
      const T* in = x.data<T>();
      T* o = result.mutable_data<T>();
      T scale = op == reduce_op::mean && len > 0 ? T{1} / static_cast<T>(len) : T{1};
      for (size_t a = 0; a < outer; ++a)
        for (size_t r = 0; r < len; ++r)
          for (size_t c = 0; c < inner; ++c) {
            size_t i = (a * len + r) * inner + c;
            T gv = g[a * inner + c];
            o[i] = op == reduce_op::max ? (in[i] == y.data<T>()[a * inner + c] ? gv : T{0}) : gv * scale;
          }
    });
    out = std::move(result);
    return status::success();
  }

  status sum_to(const tensor& dy, const tensor& like, tensor& out) override {
    if (dy.shape() == like.shape()) {
      out = dy; // nothing was broadcast: no copy
      return status::success();
    }
    auto b = broadcast_shapes(like.shape(), dy.shape());
    if (!b || *b != dy.shape())
      return status::shape("sum_to: " + shape_string(dy.shape()) + " is not a broadcast of "
                             + shape_string(like.shape()));
    if (auto st = need_float(dy, "sum_to"); !st.ok())
      return st;
    tensor result = tensor::filled(dy.type(), like.shape(), 0);
    auto strides = broadcast_strides(like.shape(), dy.shape());
    with_float(dy.type(), [&](auto zero) {
      using T = decltype(zero);
      const T* g = dy.data<T>();
      T* o = result.mutable_data<T>();
      size_t rank = dy.shape().size();
      std::vector<int64_t> idx(rank, 0);
      size_t target = 0;
      for (size_t i = 0; i < dy.num_elements(); ++i) {
        o[target] += g[i];
        for (size_t d = rank; d-- > 0;) {
          if (++idx[d] < dy.shape()[d]) {
            target += strides[d];
            break;
          }
          target -= strides[d] * static_cast<size_t>(dy.shape()[d] - 1);
          idx[d] = 0;
        }
      }
    });
    out = std::move(result);
    return status::success();
  }

  status softmax(const tensor& logits, bool log, tensor& out) override {
    if (auto st = need_float(logits, "softmax"); !st.ok())
      return st;
    if (logits.shape().empty())
      return status::shape("softmax needs at least one dimension, got a scalar");
    size_t classes = static_cast<size_t>(logits.shape().back());
    size_t rows = classes == 0 ? 0 : logits.num_elements() / classes;
    tensor result{logits.type(), logits.shape()};
    with_float(logits.type(), [&](auto zero) {
      using T = decltype(zero);
      for (size_t r = 0; r < rows; ++r) {
        const T* in = logits.data<T>() + r * classes;
        T* o = result.mutable_data<T>() + r * classes;
        T mx = *std::max_element(in, in + classes);
        double sum = 0;
        for (size_t c = 0; c < classes; ++c)
          sum += std::exp(static_cast<double>(in[c] - mx));
        for (size_t c = 0; c < classes; ++c)
          o[c] = log ? static_cast<T>(in[c] - mx - std::log(sum))
                     : static_cast<T>(std::exp(static_cast<double>(in[c] - mx)) / sum);
      }
    });
    out = std::move(result);
    return status::success();
  }

  status softmax_grad(const tensor& dy, const tensor& y, bool log, tensor& out) override {
    if (dy.shape() != y.shape() || dy.type() != y.type() || y.shape().empty())
      return status::shape("softmax gradient: dy " + dy.summary() + " and y " + y.summary()
                             + " must match");
    if (auto st = need_float(y, "softmax gradient"); !st.ok())
      return st;
    size_t classes = static_cast<size_t>(y.shape().back());
    size_t rows = classes == 0 ? 0 : y.num_elements() / classes;
    tensor result{y.type(), y.shape()};
    with_float(y.type(), [&](auto zero) {
      using T = decltype(zero);
      for (size_t r = 0; r < rows; ++r) {
        const T* g = dy.data<T>() + r * classes;
        const T* yy = y.data<T>() + r * classes;
        T* o = result.mutable_data<T>() + r * classes;
        double acc = 0;
        for (size_t c = 0; c < classes; ++c)
          acc += log ? g[c] : g[c] * yy[c];
        for (size_t c = 0; c < classes; ++c)
          o[c] = log ? static_cast<T>(g[c] - std::exp(static_cast<double>(yy[c])) * acc)
                     : static_cast<T>(yy[c] * (g[c] - acc));
      }
    });
    out = std::move(result);
    return status::success();
  }

  status softmax_xent(const tensor& logits, const tensor& labels, tensor& loss) override {
    tensor probs;
    if (auto st = xent_check(logits, labels); !st.ok())
      return st;
    if (auto st = softmax(logits, true, probs); !st.ok())
      return st;
    size_t batch = static_cast<size_t>(logits.shape()[0]);
    size_t classes = static_cast<size_t>(logits.shape()[1]);
    tensor result{logits.type(), {static_cast<int64_t>(batch)}};
    with_float(logits.type(), [&](auto zero) {
      using T = decltype(zero);
      for (size_t r = 0; r < batch; ++r)
        result.mutable_data<T>()[r] = -probs.data<T>()[r * classes + label(labels, r)];
    });
    loss = std::move(result);
    return status::success();
  }

  // The sparse ops' loops are kernels/cpu/sparse_kernels.cpp's.
  status gather(const tensor& params, const tensor& indices, tensor& out) override {
    return host_gather(params, indices, out);
  }

  status unsorted_segment_sum(const tensor& data, const tensor& segment_ids, int64_t num_segments,
                              tensor& out) override {
    return host_unsorted_segment_sum(data, segment_ids, num_segments, out);
  }

  status softmax_xent_grad(const tensor& dy, const tensor& logits, const tensor& labels,
                           tensor& out) override {
    if (auto st = xent_check(logits, labels); !st.ok())
      return st;
    if (dy.shape() != shape_type{logits.shape()[0]} || dy.type() != logits.type())
      return status::shape("softmax_xent gradient: dy " + dy.summary() + " does not match logits "
                             + logits.summary());
    tensor probs;
    if (auto st = softmax(logits, false, probs); !st.ok())
      return st;
    size_t batch = static_cast<size_t>(logits.shape()[0]);
    size_t classes = static_cast<size_t>(logits.shape()[1]);
    with_float(logits.type(), [&](auto zero) {
      using T = decltype(zero);
      T* p = probs.mutable_data<T>();
      for (size_t r = 0; r < batch; ++r) {
        p[r * classes + label(labels, r)] -= T{1};
        for (size_t c = 0; c < classes; ++c)
          p[r * classes + c] *= dy.data<T>()[r];
      }
    });
    out = std::move(probs);
    return status::success();
  }

  status apply_sgd(tensor& var, const tensor& grad, double lr) override {
    if (auto st = same_float(var, grad, "sgd"); !st.ok())
      return st;
    with_float(var.type(), [&](auto zero) {
      using T = decltype(zero);
      T* w = var.mutable_data<T>();
      const T* g = grad.data<T>();
      for (size_t i = 0; i < var.num_elements(); ++i)
        w[i] -= static_cast<T>(lr) * g[i];
    });
    return status::success();
  }

  status apply_momentum(tensor& var, tensor& accum, const tensor& grad, double lr,
                        double momentum) override {
    if (auto st = same_float(var, grad, "momentum"); !st.ok())
      return st;
    if (auto st = same_float(var, accum, "momentum accumulator"); !st.ok())
      return st;
    with_float(var.type(), [&](auto zero) {
      using T = decltype(zero);
      T* w = var.mutable_data<T>();
      T* acc = accum.mutable_data<T>();
      const T* g = grad.data<T>();
      for (size_t i = 0; i < var.num_elements(); ++i) {
        acc[i] = static_cast<T>(momentum) * acc[i] + g[i];
        w[i] -= static_cast<T>(lr) * acc[i];
      }
    });
    return status::success();
  }

  status apply_adam(tensor& var, tensor& m, tensor& v, const tensor& grad, double lr, double beta1,
                    double beta2, double epsilon, int64_t t) override {
    if (auto st = same_float(var, grad, "adam"); !st.ok())
      return st;
    if (auto st = same_float(var, m, "adam m"); !st.ok())
      return st;
    if (auto st = same_float(var, v, "adam v"); !st.ok())
      return st;
    if (t < 1)
      return status::failure("adam: the step count starts at 1, got " + std::to_string(t));
    double lr_t = lr * std::sqrt(1 - std::pow(beta2, t)) / (1 - std::pow(beta1, t));
    with_float(var.type(), [&](auto zero) {
      using T = decltype(zero);
      T* w = var.mutable_data<T>();
      T* mm = m.mutable_data<T>();
      T* vv = v.mutable_data<T>();
      const T* g = grad.data<T>();
      for (size_t i = 0; i < var.num_elements(); ++i) {
        mm[i] = static_cast<T>(beta1 * mm[i] + (1 - beta1) * g[i]);
        vv[i] = static_cast<T>(beta2 * vv[i] + (1 - beta2) * g[i] * g[i]);
        w[i] -= static_cast<T>(lr_t * mm[i] / (std::sqrt(static_cast<double>(vv[i])) + epsilon));
      }
    });
    return status::success();
  }

private:
  template <class F>
  static void with_float(dtype t, F f) {
    if (t == dtype::float32)
      f(float{});
    else
      f(double{});
  }

  static status need_float(const tensor& x, const std::string& what) {
    if (x.empty())
      return status::failure(what + ": the input has no value");
    if (x.type() != dtype::float32 && x.type() != dtype::float64)
      return status::dtype(what + " takes float32 or float64, got " + dtype_name(x.type()));
    return status::success();
  }

  static status same_float(const tensor& a, const tensor& b, const std::string& what) {
    if (auto st = need_float(a, what); !st.ok())
      return st;
    if (a.type() != b.type() || a.shape() != b.shape())
      return status::shape(what + ": " + a.summary() + " and " + b.summary() + " must match");
    return status::success();
  }

  static status xent_check(const tensor& logits, const tensor& labels) {
    if (auto st = need_float(logits, "softmax_xent"); !st.ok())
      return st;
    if (logits.shape().size() != 2)
      return status::shape("softmax_xent takes logits [batch, classes], got "
                             + shape_string(logits.shape()));
    if (labels.type() != dtype::int32 && labels.type() != dtype::int64)
      return status::dtype(std::string{"softmax_xent takes int32 or int64 labels, got "}
                             + dtype_name(labels.type()));
    if (labels.shape() != shape_type{logits.shape()[0]})
      return status::shape("softmax_xent: labels " + shape_string(labels.shape())
                             + " do not match logits " + shape_string(logits.shape()));
    auto classes = logits.shape()[1];
    for (size_t r = 0; r < labels.num_elements(); ++r) {
      auto l = integer_at(labels, r);
      if (l < 0 || l >= classes)
        return status::failure("softmax_xent: label " + std::to_string(l) + " of example "
                               + std::to_string(r) + " is out of range [0, "
                               + std::to_string(classes) + ")");
    }
    return status::success();
  }

  static size_t label(const tensor& labels, size_t r) {
    return static_cast<size_t>(integer_at(labels, r));
  }

  static status check(binary_op op, const tensor& a, const tensor& b) {
    if (a.empty() || b.empty())
      return status::failure(std::string{to_string(op)} + ": an operand has no value");
    if (a.type() != b.type())
      return status::dtype(std::string{to_string(op)} + ": dtypes differ: "
                             + dtype_name(a.type()) + " vs " + dtype_name(b.type()));
    if (!broadcast_shapes(a.shape(), b.shape()))
      return status::shape(std::string{to_string(op)} + ": shapes " + shape_string(a.shape())
                             + " and " + shape_string(b.shape()) + " do not broadcast");
    bool grad_op = op == binary_op::relu_grad || op == binary_op::sigmoid_grad
                   || op == binary_op::tanh_grad;
    if (grad_op && a.shape() != b.shape())
      return status::shape(std::string{to_string(op)} + " needs equal shapes, got "
                             + shape_string(a.shape()) + " and " + shape_string(b.shape()));
    return status::success();
  }

  static void compute(binary_op op, const tensor& a, const tensor& b, tensor& out,
                      const shape_type& shape) {
    switch (a.type()) {
      case dtype::float32: dispatch(op, a, b, out.mutable_data<float>(), shape); break;
      case dtype::float64: dispatch(op, a, b, out.mutable_data<double>(), shape); break;
      case dtype::int32: dispatch(op, a, b, out.mutable_data<int32_t>(), shape); break;
      case dtype::int64: dispatch(op, a, b, out.mutable_data<int64_t>(), shape); break;
    }
  }
};

template <class Dist>
status fill_with(tensor& t, Dist dist, uint64_t seed) {
  std::mt19937_64 gen{seed};
  switch (t.type()) {
    case dtype::float32: {
      auto* p = t.mutable_data<float>();
      for (size_t i = 0; i < t.num_elements(); ++i)
        p[i] = static_cast<float>(dist(gen));
      return status::success();
    }
    case dtype::float64: {
      auto* p = t.mutable_data<double>();
      for (size_t i = 0; i < t.num_elements(); ++i)
        p[i] = dist(gen);
      return status::success();
    }
    default:
      return status::failure(std::string{"random initializers need a float dtype, not "}
                             + dtype_name(t.type()));
  }
}

} // namespace

std::optional<binary_op> parse_binary_op(std::string_view name) {
  for (auto op : {binary_op::add, binary_op::sub, binary_op::mul, binary_op::div,
                  binary_op::relu_grad, binary_op::sigmoid_grad, binary_op::tanh_grad})
    if (name == to_string(op))
      return op;
  return std::nullopt;
}

const char* to_string(binary_op op) {
  switch (op) {
    case binary_op::add: return "add";
    case binary_op::sub: return "sub";
    case binary_op::mul: return "mul";
    case binary_op::div: return "div";
    case binary_op::relu_grad: return "relu_grad";
    case binary_op::sigmoid_grad: return "sigmoid_grad";
    case binary_op::tanh_grad: return "tanh_grad";
  }
  return "?";
}

std::optional<unary_op> parse_unary_op(std::string_view name) {
  for (auto op : {unary_op::neg, unary_op::exp, unary_op::log, unary_op::relu, unary_op::sigmoid,
                  unary_op::tanh, unary_op::square, unary_op::sqrt, unary_op::softplus})
    if (name == to_string(op))
      return op;
  return std::nullopt;
}

const char* to_string(unary_op op) {
  switch (op) {
    case unary_op::neg: return "neg";
    case unary_op::exp: return "exp";
    case unary_op::log: return "log";
    case unary_op::relu: return "relu";
    case unary_op::sigmoid: return "sigmoid";
    case unary_op::tanh: return "tanh";
    case unary_op::square: return "square";
    case unary_op::sqrt: return "sqrt";
    case unary_op::softplus: return "softplus";
  }
  return "?";
}

std::optional<reduce_op> parse_reduce_op(std::string_view name) {
  if (name == "sum") return reduce_op::sum;
  if (name == "mean") return reduce_op::mean;
  if (name == "max") return reduce_op::max;
  return std::nullopt;
}

status reduced_shape(const shape_type& shape, const op_attrs& attrs, shape_type& out) {
  if (attrs.all_axes) {
    out = attrs.keep_dims ? shape_type(shape.size(), 1) : shape_type{};
    return status::success();
  }
  auto rank = static_cast<int32_t>(shape.size());
  if (attrs.axis < -rank || attrs.axis >= rank)
    return status::shape("axis " + std::to_string(attrs.axis) + " is out of range for shape "
                           + shape_string(shape));
  auto axis = static_cast<size_t>(attrs.axis < 0 ? attrs.axis + rank : attrs.axis);
  out = shape;
  if (attrs.keep_dims)
    out[axis] = 1;
  else
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(axis));
  return status::success();
}

std::optional<shape_type> broadcast_shapes(const shape_type& a, const shape_type& b) {
  size_t rank = std::max(a.size(), b.size());
  shape_type out(rank, 1);
  for (size_t k = 0; k < rank; ++k) {
    int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1;
    int64_t db = k < b.size() ? b[b.size() - 1 - k] : 1;
    if (da != db && da != 1 && db != 1)
      return std::nullopt;
    out[rank - 1 - k] = da == 1 ? db : da;
  }
  return out;
}

std::unique_ptr<backend> make_cpu_backend() {
  return std::make_unique<cpu_backend>();
}

status fill_uniform(tensor& t, double low, double high, uint64_t seed) {
  if (!(low < high))
    return status::failure("uniform initializer needs low < high, got [" + std::to_string(low)
                           + ", " + std::to_string(high) + ")");
  return fill_with(t, std::uniform_real_distribution<double>{low, high}, seed);
}

status fill_normal(tensor& t, double mean, double stddev, uint64_t seed) {
  if (!(stddev > 0))
    return status::failure("normal initializer needs stddev > 0, got " + std::to_string(stddev));
  return fill_with(t, std::normal_distribution<double>{mean, stddev}, seed);
}

} // namespace af::kernels
