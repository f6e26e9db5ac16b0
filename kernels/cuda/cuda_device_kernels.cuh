#pragma once
// The device kernels of the CUDA backend: each the GPU twin of a loop in
// kernels/cpu/cpu_kernels.cpp, launched by cuda_backend.cu. The op numbers
// are the enums of kernels.hpp (binary_op, unary_op, reduce_op) as ints.
#include "core/int_arith.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace af::kernels::cuda_detail {

constexpr int threads_per_block = 256;

inline int blocks_for(size_t n) {
  return static_cast<int>(std::min<size_t>((n + threads_per_block - 1) / threads_per_block, 65535));
}

#define GRID_LOOP(i, n)                                                        \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<size_t>(gridDim.x) * blockDim.x)

constexpr int max_rank = 8;

/// Broadcast strides of an input seen through the output's shape.
struct strides8 {
  int rank;
  long long out_dims[max_rank];
  long long a[max_rank];
  long long b[max_rank];
};

template <class T>
__device__ T apply_binary(int op, T x, T y) {
  switch (op) {
    case 0: return af::int_arith::wrap_add(x, y); // the CPU's integer semantics too
    case 1: return af::int_arith::wrap_sub(x, y);
    case 2: return af::int_arith::wrap_mul(x, y);
    case 3: return af::int_arith::total_div(x, y);
    case 4: return y > T(0) ? x : T(0);        // relu_grad (dy, x)
    case 5: // sigmoid_grad (dy, y)
      return af::int_arith::wrap_mul(af::int_arith::wrap_mul(x, y), af::int_arith::wrap_sub(T(1), y));
    default: // tanh_grad (dy, y)
      return af::int_arith::wrap_mul(x, af::int_arith::wrap_sub(T(1), af::int_arith::wrap_mul(y, y)));
  }
}

template <class T>
__global__ void binary_kernel(int op, const T* a, const T* b, T* out, size_t n, strides8 s) {
  GRID_LOOP(i, n) {
    size_t rest = i, ia = 0, ib = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      size_t idx = rest % s.out_dims[d];
      rest /= s.out_dims[d];
      ia += idx * s.a[d];
      ib += idx * s.b[d];
    }
    out[i] = apply_binary(op, a[ia], b[ib]);
  }
}

template <class T>
__global__ void unary_kernel(int op, const T* x, T* out, size_t n) {
  GRID_LOOP(i, n) {
    T v = x[i];
    T r;
    switch (op) {
      case 0: r = af::int_arith::wrap_neg(v); break;
      case 1: r = exp(v); break;
      case 2: r = log(v); break;
      case 3: r = v > T(0) ? v : T(0); break;
      case 4: r = T(1) / (T(1) + exp(-v)); break;
      case 5: r = tanh(v); break;
      case 6: r = v * v; break;
      case 7: r = sqrt(v); break;
      default: r = v > T(0) ? v + log1p(exp(-v)) : log1p(exp(v)); break; // softplus
    }
    out[i] = r;
  }
}

template <class T>
__global__ void reduce_kernel(int op, const T* x, T* out, size_t outer, size_t len, size_t inner) {
  GRID_LOOP(i, outer * inner) {
    size_t a = i / inner, c = i % inner;
    double acc = op == 2 ? -1.0 / 0.0 : 0.0;
    for (size_t r = 0; r < len; ++r) {
      double v = x[(a * len + r) * inner + c];
      acc = op == 2 ? (v > acc ? v : acc) : acc + v;
    }
    if (op == 1)
      acc = len == 0 ? 0.0 / 0.0 : acc / static_cast<double>(len);
    out[i] = static_cast<T>(acc);
  }
}

template <class T>
__global__ void reduce_grad_kernel(int op, const T* dy, const T* x, const T* y, T* out,
                                   size_t outer, size_t len, size_t inner) {
  GRID_LOOP(i, outer * len * inner) {
    size_t c = i % inner, a = i / (len * inner);
    T g = dy[a * inner + c];
    if (op == 2)
      out[i] = x[i] == y[a * inner + c] ? g : T(0);
    else
      out[i] = op == 1 ? g / static_cast<T>(len) : g;
  }
}

template <class T>
__global__ void sum_to_kernel(const T* dy, T* out, size_t n, strides8 s) {
  GRID_LOOP(i, n) {
    size_t rest = i, target = 0;
    for (int d = s.rank - 1; d >= 0; --d) {
      size_t idx = rest % s.out_dims[d];
      rest /= s.out_dims[d];
      target += idx * s.a[d];
    }
    atomicAdd(out + target, dy[i]);
  }
}

/// The max of a row and the sum of exp(x - max) over it: softmax's normaliser.
template <class T>
__device__ void row_normaliser(const T* in, size_t classes, T& mx, double& sum) {
  mx = in[0];
  for (size_t c = 1; c < classes; ++c)
    mx = in[c] > mx ? in[c] : mx;
  sum = 0;
  for (size_t c = 0; c < classes; ++c)
    sum += exp(static_cast<double>(in[c] - mx));
}

template <class T>
__global__ void softmax_kernel(const T* logits, T* out, size_t rows, size_t classes, int log) {
  GRID_LOOP(r, rows) {
    const T* in = logits + r * classes;
    T* o = out + r * classes;
    T mx;
    double sum;
    row_normaliser(in, classes, mx, sum);
    for (size_t c = 0; c < classes; ++c)
      o[c] = log ? static_cast<T>(in[c] - mx - ::log(sum))
                 : static_cast<T>(exp(static_cast<double>(in[c] - mx)) / sum);
  }
}

template <class T>
__global__ void softmax_grad_kernel(const T* dy, const T* y, T* out, size_t rows, size_t classes,
                                    int log) {
  GRID_LOOP(r, rows) {
    const T* g = dy + r * classes;
    const T* yy = y + r * classes;
    T* o = out + r * classes;
    double acc = 0;
    for (size_t c = 0; c < classes; ++c)
      acc += log ? g[c] : g[c] * yy[c];
    for (size_t c = 0; c < classes; ++c)
      o[c] = log ? static_cast<T>(g[c] - exp(static_cast<double>(yy[c])) * acc)
                 : static_cast<T>(yy[c] * (g[c] - acc));
  }
}

/// Labels arrive as int64 (converted on the host).
template <class T>
__global__ void xent_kernel(const T* logits, const long long* labels, const T* dy, T* loss,
                            T* grad, size_t rows, size_t classes) {
  GRID_LOOP(r, rows) {
    const T* in = logits + r * classes;
    T mx;
    double sum;
    row_normaliser(in, classes, mx, sum);
    auto label = static_cast<size_t>(labels[r]);
    if (loss != nullptr)
      loss[r] = static_cast<T>(::log(sum) - static_cast<double>(in[label] - mx));
    if (grad != nullptr)
      for (size_t c = 0; c < classes; ++c)
        grad[r * classes + c] = static_cast<T>(
          dy[r] * (exp(static_cast<double>(in[c] - mx)) / sum - (c == label ? 1.0 : 0.0)));
  }
}

template <class T>
__global__ void optimizer_kernel(int kind, T* w, T* m, T* v, const T* g, size_t n, double lr,
                                 double b1, double b2, double eps) {
  GRID_LOOP(i, n) {
    if (kind == 0) {
      w[i] -= static_cast<T>(lr) * g[i];
    } else if (kind == 1) {
      m[i] = static_cast<T>(b1) * m[i] + g[i];
      w[i] -= static_cast<T>(lr) * m[i];
    } else { // adam, lr already bias-corrected
      m[i] = static_cast<T>(b1 * m[i] + (1 - b1) * g[i]);
      v[i] = static_cast<T>(b2 * v[i] + (1 - b2) * g[i] * g[i]);
      w[i] -= static_cast<T>(lr * m[i] / (sqrt(static_cast<double>(v[i])) + eps));
    }
  }
}

/// out[i, k] = params[ids[i], k] (gather along axis 0); the ids were checked
/// against params' rows on the host, so none reads out of bounds.
template <class T>
__global__ void gather_kernel(const T* params, const long long* ids, T* out, size_t n_ids,
                              size_t row) {
  GRID_LOOP(i, n_ids * row) {
    out[i] = params[static_cast<size_t>(ids[i / row]) * row + i % row];
  }
}

} // namespace af::kernels::cuda_detail
