// CUDA backend: every op of kernels.hpp on one GPU, with one stream, one
// cuBLAS handle and a caching device-memory pool per device. CUDA types stay
// in kernels/cuda; kernels.hpp is the only interface. The CPU backend
// (kernels/cpu/cpu_kernels.cpp) is the reference: tests/test_gpu.cpp compares
// every op against it. Inputs are staged host -> device and results device ->
// host per op; keeping a step's tensors on the device is future work.
// Beside it: cuda_check.cuh (failure reporting), cuda_device_kernels.cuh (the
// __global__ kernels), cuda_memory.cuh (the buffer pool), cuda_bench.cu (the
// benchmark baselines).
#include "kernels/kernels.hpp"
#include "kernels/sparse.hpp"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_device_kernels.cuh"
#include "kernels/cuda/cuda_memory.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

namespace af::kernels {

namespace {

using namespace cuda_detail;

// -- the backend ------------------------------------------------------------------

class cuda_backend : public backend {
public:
  explicit cuda_backend(int ordinal)
    : ordinal_(ordinal), pool_(std::make_shared<device_pool>(ordinal)) {
    // nop
  }

  ~cuda_backend() override {
    if (stream_ == nullptr && blas_ == nullptr)
      return; // init() failed before making anything
    failure_log log{"closing the CUDA backend", ordinal_};
    AF_CHECK_LOG(log, cudaSetDevice(ordinal_));
    if (stream_ != nullptr)
      AF_CHECK_LOG(log, cudaStreamSynchronize(stream_));
    if (blas_ != nullptr)
      AF_CHECK_LOG(log, cublasDestroy(blas_));
    if (stream_ != nullptr)
      AF_CHECK_LOG(log, cudaStreamDestroy(stream_));
  }

  /// Sets the device, stream and cuBLAS handle up; a failure names the call
  /// (make_cuda_backend passes it on as `why`).
  status init() {
    AF_CUDA_CHECK(cudaSetDevice(ordinal_));
    cudaStream_t stream = nullptr; // members are set only once made
    AF_CUDA_CHECK(cudaStreamCreate(&stream));
    stream_ = stream;
    cublasHandle_t blas = nullptr;
    AF_CUBLAS_CHECK(cublasCreate(&blas));
    blas_ = blas;
    AF_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    return status::success();
  }

  std::string name() const override {
    return "cuda:" + std::to_string(ordinal_);
  }

  status binary(binary_op op, const tensor& a, const tensor& b, tensor& out) override {
    AF_TRY(need_float(a, to_string(op)));
    if (a.type() != b.type())
      return status::dtype(std::string{to_string(op)} + ": dtypes differ");
    auto shape = broadcast_shapes(a.shape(), b.shape());
    if (!shape || shape->size() > max_rank)
      return status::shape(std::string{to_string(op)} + ": shapes " + shape_string(a.shape())
                             + " and " + shape_string(b.shape()) + " do not broadcast");
    strides8 s{};
    s.rank = static_cast<int>(shape->size());
    fill_strides(a.shape(), *shape, s.a);
    fill_strides(b.shape(), *shape, s.b);
    for (int d = 0; d < s.rank; ++d)
      s.out_dims[d] = (*shape)[d];
    tensor result{a.type(), *shape};
    return launch(result, {&a, &b}, [&](auto zero, const std::vector<void*>& in, void* o) {
      using T = decltype(zero);
      binary_kernel<T><<<blocks_for(result.num_elements()), threads_per_block, 0, stream_>>>(
        static_cast<int>(op), static_cast<const T*>(in[0]), static_cast<const T*>(in[1]),
        static_cast<T*>(o), result.num_elements(), s);
    }, out);
  }

  status binary_inplace(binary_op op, tensor& a, const tensor& b) override {
    tensor out;
    AF_TRY(binary(op, a, b, out));
    if (out.shape() != a.shape())
      return status::shape("cannot update " + shape_string(a.shape()) + " in place with "
                             + shape_string(b.shape()));
    a = std::move(out);
    return status::success();
  }

  status unary(unary_op op, const tensor& x, tensor& out) override {
    AF_TRY(need_float(x, to_string(op)));
    tensor result{x.type(), x.shape()};
    return launch(result, {&x}, [&](auto zero, const std::vector<void*>& in, void* o) {
      using T = decltype(zero);
      unary_kernel<T><<<blocks_for(x.num_elements()), threads_per_block, 0, stream_>>>(
        static_cast<int>(op), static_cast<const T*>(in[0]), static_cast<T*>(o), x.num_elements());
    }, out);
  }

  status matmul(const tensor& a, const tensor& b, bool ta, bool tb, tensor& out) override {
    AF_TRY(need_float(a, "matmul"));
    if (a.type() != b.type() || a.shape().size() != 2 || b.shape().size() != 2)
      return status::failure("matmul takes two 2-D tensors of one dtype");
    int m = static_cast<int>(a.shape()[ta ? 1 : 0]), k = static_cast<int>(a.shape()[ta ? 0 : 1]);
    int k2 = static_cast<int>(b.shape()[tb ? 1 : 0]), n = static_cast<int>(b.shape()[tb ? 0 : 1]);
    if (k != k2)
      return status::shape("matmul: inner dimensions differ: " + shape_string(a.shape()) + " x "
                             + shape_string(b.shape()));
    tensor result{a.type(), {m, n}};
    int lda = static_cast<int>(a.shape()[1]), ldb = static_cast<int>(b.shape()[1]);
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
    auto opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    status blas = status::success();
    auto st = launch(result, {&a, &b}, [&](auto zero, const std::vector<void*>& in, void* o) {
      using T = decltype(zero);
      T one = 1, nil = 0;
      cublasStatus_t rc;
      if constexpr (std::is_same<T, float>::value)
        rc = cublasSgemm(blas_, opb, opa, n, m, k, &one, static_cast<const T*>(in[1]), ldb,
                         static_cast<const T*>(in[0]), lda, &nil, static_cast<T*>(o), n);
      else
        rc = cublasDgemm(blas_, opb, opa, n, m, k, &one, static_cast<const T*>(in[1]), ldb,
                         static_cast<const T*>(in[0]), lda, &nil, static_cast<T*>(o), n);
      if (rc != CUBLAS_STATUS_SUCCESS)
        blas = status::failure("cuBLAS gemm failed with status " + std::to_string(static_cast<int>(rc)));
    }, out);
    return blas.ok() ? st : blas;
  }

  status reduce(reduce_op op, const op_attrs& attrs, const tensor& x, tensor& out) override {
    AF_TRY(need_float(x, "reduce"));
    shape_type shape;
    AF_TRY(reduced_shape(x.shape(), attrs, shape));
    auto [outer, len, inner] = reduction_of(x.shape(), attrs);
    tensor result{x.type(), shape};
    return launch(result, {&x}, [&, outer = outer, len = len, inner = inner](
                                  auto zero, const std::vector<void*>& in, void* o) {
      using T = decltype(zero);
      reduce_kernel<T><<<blocks_for(outer * inner), threads_per_block, 0, stream_>>>(
        static_cast<int>(op), static_cast<const T*>(in[0]), static_cast<T*>(o), outer, len, inner);
    }, out);
  }

  status reduce_grad(reduce_op op, const op_attrs& attrs, const tensor& dy, const tensor& x,
                     const tensor& y, tensor& out) override {
    AF_TRY(need_float(x, "reduce gradient"));
    auto [outer, len, inner] = reduction_of(x.shape(), attrs);
    tensor result{x.type(), x.shape()};
    const tensor& yy = op == reduce_op::max ? y : dy; // y is unused otherwise
    return launch(result, {&dy, &x, &yy}, [&, outer = outer, len = len, inner = inner](
                                            auto zero, const std::vector<void*>& in, void* o) {
      using T = decltype(zero);
      reduce_grad_kernel<T><<<blocks_for(x.num_elements()), threads_per_block, 0, stream_>>>(
        static_cast<int>(op), static_cast<const T*>(in[0]), static_cast<const T*>(in[1]),
        static_cast<const T*>(in[2]), static_cast<T*>(o), outer, len, inner);
    }, out);
  }

  status sum_to(const tensor& dy, const tensor& like, tensor& out) override {
    if (dy.shape() == like.shape()) {
      out = dy;
      return status::success();
    }
    AF_TRY(need_float(dy, "sum_to"));
    auto b = broadcast_shapes(like.shape(), dy.shape());
    if (!b || *b != dy.shape() || dy.shape().size() > max_rank)
      return status::shape("sum_to: " + shape_string(dy.shape()) + " is not a broadcast of "
                             + shape_string(like.shape()));
    strides8 s{};
    s.rank = static_cast<int>(dy.shape().size());
    fill_strides(like.shape(), dy.shape(), s.a);
    for (int d = 0; d < s.rank; ++d)
      s.out_dims[d] = dy.shape()[d];
    tensor result = tensor::filled(dy.type(), like.shape(), 0);
    return launch(result, {&dy}, [&](auto zero, const std::vector<void*>& in, void* o) {
      using T = decltype(zero);
      sum_to_kernel<T><<<blocks_for(dy.num_elements()), threads_per_block, 0, stream_>>>(
        static_cast<const T*>(in[0]), static_cast<T*>(o), dy.num_elements(), s);
    }, out, /*upload_output=*/true);
  }

  status softmax(const tensor& logits, bool log, tensor& out) override {
    AF_TRY(need_float(logits, "softmax"));
    if (logits.shape().empty())
      return status::shape("softmax needs at least one dimension");
    size_t classes = static_cast<size_t>(logits.shape().back());
    size_t rows = classes == 0 ? 0 : logits.num_elements() / classes;
    tensor result{logits.type(), logits.shape()};
    return launch(result, {&logits}, [&](auto zero, const std::vector<void*>& in, void* o) {
      using T = decltype(zero);
      softmax_kernel<T><<<blocks_for(rows), threads_per_block, 0, stream_>>>(
        static_cast<const T*>(in[0]), static_cast<T*>(o), rows, classes, log ? 1 : 0);
    }, out);
  }

  status softmax_grad(const tensor& dy, const tensor& y, bool log, tensor& out) override {
    AF_TRY(need_float(y, "softmax gradient"));
    if (dy.shape() != y.shape() || y.shape().empty())
      return status::shape("softmax gradient: dy and y must match");
    size_t classes = static_cast<size_t>(y.shape().back());
    size_t rows = classes == 0 ? 0 : y.num_elements() / classes;
    tensor result{y.type(), y.shape()};
    return launch(result, {&dy, &y}, [&](auto zero, const std::vector<void*>& in, void* o) {
      using T = decltype(zero);
      softmax_grad_kernel<T><<<blocks_for(rows), threads_per_block, 0, stream_>>>(
        static_cast<const T*>(in[0]), static_cast<const T*>(in[1]), static_cast<T*>(o), rows,
        classes, log ? 1 : 0);
    }, out);
  }

  status softmax_xent(const tensor& logits, const tensor& labels, tensor& loss) override {
    return xent(logits, labels, nullptr, &loss, nullptr);
  }

  status softmax_xent_grad(const tensor& dy, const tensor& logits, const tensor& labels,
                           tensor& out) override {
    return xent(logits, labels, &dy, nullptr, &out);
  }

  /// Float params only (an integer table runs on the CPU, as an op a backend
  /// lacks does); the ids are checked on the host before the launch.
  status gather(const tensor& params, const tensor& indices, tensor& out) override {
    if (params.type() != dtype::float32 && params.type() != dtype::float64)
      return unsupported("gather of an integer table"); // the executor runs it on the CPU
    shape_type shape;
    AF_TRY(check_gather(params, indices, shape));
    size_t n_ids = indices.num_elements();
    size_t row = params.shape()[0] == 0 ? 0 : params.num_elements() / params.shape()[0];
    tensor ids64{dtype::int64, indices.shape()};
    for (size_t i = 0; i < n_ids; ++i)
      ids64.mutable_data<int64_t>()[i] = integer_at(indices, i);
    tensor result{params.type(), shape};
    return launch(result, {&params, &ids64}, [&](auto zero, const std::vector<void*>& in, void* o) {
      using T = decltype(zero);
      gather_kernel<T><<<blocks_for(n_ids * row), threads_per_block, 0, stream_>>>(
        static_cast<const T*>(in[0]), static_cast<const long long*>(in[1]), static_cast<T*>(o),
        n_ids, row);
    }, out);
  }

  status apply_sgd(tensor& var, const tensor& grad, double lr) override {
    return optimize(0, var, nullptr, nullptr, grad, lr, 0, 0, 0);
  }

  status apply_momentum(tensor& var, tensor& accum, const tensor& grad, double lr,
                        double momentum) override {
    return optimize(1, var, &accum, nullptr, grad, lr, momentum, 0, 0);
  }

  status apply_adam(tensor& var, tensor& m, tensor& v, const tensor& grad, double lr, double beta1,
                    double beta2, double epsilon, int64_t t) override {
    if (t < 1)
      return status::failure("adam: the step count starts at 1, got " + std::to_string(t));
    double lr_t = lr * std::sqrt(1 - std::pow(beta2, t)) / (1 - std::pow(beta1, t));
    return optimize(2, var, &m, &v, grad, lr_t, beta1, beta2, epsilon);
  }

private:
  static status need_float(const tensor& x, const std::string& what) {
    if (x.type() != dtype::float32 && x.type() != dtype::float64)
      return status::dtype(what + " takes float32 or float64, got " + dtype_name(x.type()));
    return status::success();
  }

  static void fill_strides(const shape_type& in, const shape_type& out, long long* strides) {
    auto v = broadcast_strides(in, out);
    for (size_t d = 0; d < v.size(); ++d)
      strides[d] = static_cast<long long>(v[d]);
  }

  status alloc(size_t bytes, void** p) {
    return pool_->take(bytes, p);
  }

  void release(void* p, size_t bytes) {
    pool_->give(p, bytes);
  }

  /// Runs `kernel(zero_of_T, device inputs, device output)`. Inputs this GPU
  /// made are used where they are; others are uploaded. The output stays on
  /// the device: `out` is a device tensor whose host copy is made only if
  /// someone reads it on the host.
  template <class F>
  status launch(tensor& result, std::vector<const tensor*> inputs, F kernel, tensor& out,
                bool upload_output = false) {
    std::lock_guard<std::mutex> guard{mtx_};
    AF_CUDA_CHECK(cudaSetDevice(ordinal_));
    std::vector<void*> dev(inputs.size(), nullptr);
    std::vector<bool> borrowed(inputs.size(), false);
    void* dout = nullptr;
    // Waits for the stream, then gives the staged buffers back to the pool,
    // and the output too unless it is kept (it is not if the wait failed).
    auto cleanup = [&](bool keep_output) {
      auto rc = cudaStreamSynchronize(stream_);
      for (size_t i = 0; i < dev.size(); ++i)
        if (dev[i] != nullptr && !borrowed[i])
          release(dev[i], inputs[i]->nbytes());
      if (dout != nullptr && (!keep_output || rc != cudaSuccess))
        release(dout, result.nbytes());
      if (rc != cudaSuccess)
        return status::failure(std::string{"cudaStreamSynchronize(stream_) failed: "}
                               + cudaGetErrorString(rc));
      return status::success();
    };
    auto upload_failed = [](const std::string& what, cudaError_t rc) {
      return status::failure("upload failed: cudaMemcpyAsync(" + what + ", host to device) failed: "
                             + cudaGetErrorString(rc));
    };
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (auto* d = inputs[i]->device(); d != nullptr && d->owner() == this) {
        dev[i] = d->device_pointer(); // already here: no upload
        borrowed[i] = true;
        continue;
      }
      if (auto st = alloc(inputs[i]->nbytes(), &dev[i]); !st.ok())
        return first_failure(st, cleanup(false));
      if (inputs[i]->nbytes() > 0) {
        auto rc = cudaMemcpyAsync(dev[i], inputs[i]->bytes(), inputs[i]->nbytes(),
                                  cudaMemcpyHostToDevice, stream_);
        if (rc != cudaSuccess)
          return first_failure(upload_failed("input " + std::to_string(i), rc), cleanup(false));
      }
    }
    if (auto st = alloc(result.nbytes(), &dout); !st.ok())
      return first_failure(st, cleanup(false));
    if (upload_output && result.nbytes() > 0) {
      auto rc = cudaMemcpyAsync(dout, result.bytes(), result.nbytes(), cudaMemcpyHostToDevice, stream_);
      if (rc != cudaSuccess)
        return first_failure(upload_failed("output", rc), cleanup(false));
    }
    if (result.num_elements() > 0) {
      // A call that failed earlier on this thread (and was reported there)
      // leaves its error behind for cudaGetLastError: clear it, so that it is
      // not blamed on this kernel. A sticky error fails the launch again.
      (void)cudaGetLastError();
      if (result.type() == dtype::float32)
        kernel(float{}, dev, dout);
      else
        kernel(double{}, dev, dout);
      const char* call = "cudaGetLastError() after the launch";
      auto rc = cudaGetLastError();
      if (rc == cudaSuccess) {
        call = "cudaStreamSynchronize(stream_)";
        rc = cudaStreamSynchronize(stream_);
      }
      if (rc != cudaSuccess)
        return first_failure(status::failure(std::string{"kernel failed: "} + call + " failed: "
                                             + cudaGetErrorString(rc)),
                             cleanup(false));
    }
    AF_TRY(cleanup(true)); // on failure the output went back to the pool
    out = tensor::on_device(result.type(), result.shape(),
                            std::make_shared<cuda_copy>(dout, result.nbytes(), pool_, this));
    return status::success();
  }

  status xent(const tensor& logits, const tensor& labels, const tensor* dy, tensor* loss,
              tensor* grad) {
    AF_TRY(need_float(logits, "softmax_xent"));
    if (logits.shape().size() != 2 || labels.shape() != shape_type{logits.shape()[0]}
        || (labels.type() != dtype::int32 && labels.type() != dtype::int64))
      return status::shape("softmax_xent takes logits [batch, classes] and int labels [batch]");
    size_t rows = static_cast<size_t>(logits.shape()[0]);
    size_t classes = static_cast<size_t>(logits.shape()[1]);
    tensor labels64{dtype::int64, labels.shape()};
    for (size_t r = 0; r < rows; ++r) {
      auto l = integer_at(labels, r);
      if (l < 0 || static_cast<size_t>(l) >= classes)
        return status::failure("softmax_xent: label " + std::to_string(l) + " of example "
                               + std::to_string(r) + " is out of range [0, " + std::to_string(classes) + ")");
      labels64.mutable_data<int64_t>()[r] = l;
    }
    tensor ones = dy ? *dy : tensor::filled(logits.type(), {static_cast<int64_t>(rows)}, 1);
    tensor result = grad ? tensor{logits.type(), logits.shape()}
                         : tensor{logits.type(), {static_cast<int64_t>(rows)}};
    bool want_grad = grad != nullptr;
    return launch(result, {&logits, &labels64, &ones}, [&](auto zero, const std::vector<void*>& in, void* o) {
      using T = decltype(zero);
      xent_kernel<T><<<blocks_for(rows), threads_per_block, 0, stream_>>>(
        static_cast<const T*>(in[0]), static_cast<const long long*>(in[1]),
        static_cast<const T*>(in[2]), want_grad ? nullptr : static_cast<T*>(o),
        want_grad ? static_cast<T*>(o) : nullptr, rows, classes);
    }, want_grad ? *grad : *loss);
  }

  status optimize(int kind, tensor& var, tensor* m, tensor* v, const tensor& grad, double lr,
                  double b1, double b2, double eps) {
    AF_TRY(need_float(var, "optimizer"));
    if (grad.shape() != var.shape() || grad.type() != var.type() || (m && m->shape() != var.shape())
        || (v && v->shape() != var.shape()))
      return status::failure("optimizer: " + var.summary() + ", its slots and " + grad.summary()
                             + " must match");
    std::lock_guard<std::mutex> guard{mtx_};
    AF_CUDA_CHECK(cudaSetDevice(ordinal_));
    size_t bytes = var.nbytes();
    void *dw = nullptr, *dm = nullptr, *dv = nullptr, *dg = nullptr;
    auto cleanup = [&] {
      auto rc = cudaStreamSynchronize(stream_);
      for (void* p : {dw, dm, dv, dg})
        if (p != nullptr)
          release(p, bytes);
      if (rc != cudaSuccess)
        return status::failure(std::string{"cudaStreamSynchronize(stream_) failed: "}
                               + cudaGetErrorString(rc));
      return status::success();
    };
    for (void** p : {&dw, &dm, &dv, &dg})
      if (auto st = alloc(bytes, p); !st.ok())
        return first_failure(st, cleanup());
    // The first failure stops the update; later steps are skipped.
    status failed = status::success();
    auto copy = [&](const char* what, void* dst, const void* src, cudaMemcpyKind dir) {
      if (!failed.ok())
        return;
      if (auto rc = cudaMemcpyAsync(dst, src, bytes, dir, stream_); rc != cudaSuccess)
        failed = status::failure(std::string{"optimizer update failed: cudaMemcpyAsync("} + what
                                 + ") failed: " + cudaGetErrorString(rc));
    };
    copy("variable to device", dw, var.bytes(), cudaMemcpyHostToDevice);
    copy("gradient to device", dg, grad.bytes(), cudaMemcpyHostToDevice);
    if (m)
      copy("first slot to device", dm, m->bytes(), cudaMemcpyHostToDevice);
    if (v)
      copy("second slot to device", dv, v->bytes(), cudaMemcpyHostToDevice);
    size_t n = var.num_elements();
    if (failed.ok() && n > 0) { // an empty grid is no launch but an error
      (void)cudaGetLastError(); // not blamed on this kernel; see launch()
      if (var.type() == dtype::float32)
        optimizer_kernel<float><<<blocks_for(n), threads_per_block, 0, stream_>>>(
          kind, static_cast<float*>(dw), static_cast<float*>(dm), static_cast<float*>(dv),
          static_cast<const float*>(dg), n, lr, b1, b2, eps);
      else
        optimizer_kernel<double><<<blocks_for(n), threads_per_block, 0, stream_>>>(
          kind, static_cast<double*>(dw), static_cast<double*>(dm), static_cast<double*>(dv),
          static_cast<const double*>(dg), n, lr, b1, b2, eps);
      if (auto rc = cudaGetLastError(); rc != cudaSuccess)
        failed = status::failure(std::string{"optimizer update failed: kernel launch failed: "}
                                 + cudaGetErrorString(rc));
    }
    copy("variable to host", var.mutable_bytes(), dw, cudaMemcpyDeviceToHost);
    if (m)
      copy("first slot to host", m->mutable_bytes(), dm, cudaMemcpyDeviceToHost);
    if (v)
      copy("second slot to host", v->mutable_bytes(), dv, cudaMemcpyDeviceToHost);
    if (failed.ok()) {
      if (auto rc = cudaStreamSynchronize(stream_); rc != cudaSuccess)
        failed = status::failure(std::string{"optimizer update failed: cudaStreamSynchronize(stream_) failed: "}
                                 + cudaGetErrorString(rc));
    }
    return first_failure(failed, cleanup());
  }

  int ordinal_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::mutex mtx_; ///< one stream: calls from several executors' threads take turns
  std::shared_ptr<device_pool> pool_;
};

} // namespace

bool cuda_compiled() {
  return true;
}

int cuda_device_count(std::string* why) {
  int count = 0;
  auto err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why)
      *why = std::string{"no usable GPU: "} + cudaGetErrorString(err);
    return 0;
  }
  if (count == 0 && why)
    *why = "no GPU found by the CUDA runtime";
  return count;
}

std::unique_ptr<backend> make_cuda_backend(int ordinal, std::string* why) {
  int count = cuda_device_count(why);
  if (ordinal < 0 || ordinal >= count) {
    if (why && count > 0)
      *why = "GPU " + std::to_string(ordinal) + " does not exist (this machine has "
             + std::to_string(count) + ")";
    return nullptr;
  }
  auto b = std::make_unique<cuda_backend>(ordinal);
  if (auto st = b->init(); !st.ok()) {
    if (why)
      *why = st.error;
    return nullptr;
  }
  return b;
}

} // namespace af::kernels
