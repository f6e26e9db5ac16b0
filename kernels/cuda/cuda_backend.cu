// CUDA backend: elementwise kernels on one GPU, one stream per backend.
// CUDA types stay in this file; kernels.hpp is the only interface.
#include "kernels/kernels.hpp"

#include <cuda_runtime.h>

#include <string>

namespace af::kernels {

namespace {

#define AF_CUDA_CHECK(expr)                                                    \
  do {                                                                         \
    cudaError_t af_err_ = (expr);                                              \
    if (af_err_ != cudaSuccess)                                                \
      return status::failure(std::string{#expr} + " failed: "                 \
                             + cudaGetErrorString(af_err_));                   \
  } while (false)

// CPU reference: cpu_kernels.cpp's run_binary; this is its GPU twin.
__global__ void binary_kernel(int op, const float* a, const float* b, float* out,
                              size_t n, int a_scalar, int b_scalar) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (; i < n; i += stride) {
    float x = a[a_scalar ? 0 : i];
    float y = b[b_scalar ? 0 : i];
    float r = 0;
    switch (op) {
      case 0: r = x + y; break;
      case 1: r = x - y; break;
      case 2: r = x * y; break;
      default: r = x / y; break;
    }
    out[i] = r;
  }
}

class cuda_backend : public backend {
public:
  explicit cuda_backend(int ordinal) : ordinal_(ordinal) {
    // nop
  }

  ~cuda_backend() override {
    if (stream_ != nullptr) {
      cudaSetDevice(ordinal_);
      cudaStreamDestroy(stream_);
    }
  }

  status init() {
    AF_CUDA_CHECK(cudaSetDevice(ordinal_));
    AF_CUDA_CHECK(cudaStreamCreate(&stream_));
    return status::success();
  }

  std::string name() const override {
    return "cuda:" + std::to_string(ordinal_);
  }

  status binary(binary_op op, const tensor& a, const tensor& b, tensor& out) override {
    if (a.type() != dtype::float32 || b.type() != dtype::float32)
      return status::failure("the CUDA elementwise kernels take float32 only");
    bool a_scalar = a.num_elements() == 1 && b.num_elements() != 1;
    bool b_scalar = b.num_elements() == 1;
    if (a.shape() != b.shape() && !a_scalar && !b_scalar)
      return status::failure("the CUDA elementwise kernels broadcast scalars only: "
                             + shape_string(a.shape()) + " vs " + shape_string(b.shape()));
    tensor result{dtype::float32, a_scalar ? b.shape() : a.shape()};
    size_t n = result.num_elements();
    if (n == 0) {
      out = std::move(result);
      return status::success();
    }
    float *da = nullptr, *db = nullptr, *dout = nullptr;
    AF_CUDA_CHECK(cudaSetDevice(ordinal_));
    AF_CUDA_CHECK(cudaMallocAsync(&da, a.nbytes(), stream_));
    AF_CUDA_CHECK(cudaMallocAsync(&db, b.nbytes(), stream_));
    AF_CUDA_CHECK(cudaMallocAsync(&dout, result.nbytes(), stream_));
    AF_CUDA_CHECK(cudaMemcpyAsync(da, a.bytes(), a.nbytes(), cudaMemcpyHostToDevice, stream_));
    AF_CUDA_CHECK(cudaMemcpyAsync(db, b.bytes(), b.nbytes(), cudaMemcpyHostToDevice, stream_));
    int threads = 256;
    int blocks = static_cast<int>(std::min<size_t>((n + threads - 1) / threads, 65535));
    binary_kernel<<<blocks, threads, 0, stream_>>>(static_cast<int>(op), da, db, dout, n,
                                                   a_scalar, b_scalar);
    AF_CUDA_CHECK(cudaGetLastError());
    AF_CUDA_CHECK(cudaMemcpyAsync(result.mutable_bytes(), dout, result.nbytes(),
                                  cudaMemcpyDeviceToHost, stream_));
    AF_CUDA_CHECK(cudaFreeAsync(da, stream_));
    AF_CUDA_CHECK(cudaFreeAsync(db, stream_));
    AF_CUDA_CHECK(cudaFreeAsync(dout, stream_));
    AF_CUDA_CHECK(cudaStreamSynchronize(stream_));
    out = std::move(result);
    return status::success();
  }

  status binary_inplace(binary_op op, tensor& a, const tensor& b) override {
    tensor out;
    auto st = binary(op, a, b, out);
    if (st.ok())
      a = std::move(out);
    return st;
  }

private:
  int ordinal_;
  cudaStream_t stream_ = nullptr;
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
