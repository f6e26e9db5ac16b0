// The GPU benchmark baselines of kernels.hpp (cuda_sgemm_gflops,
// cuda_copy_gbps): cuBLAS and the copy engine on device-resident buffers,
// what bench/ compares the backend against.
#include "kernels/cuda/cuda_check.cuh"

#include <algorithm>
#include <vector>

namespace af::kernels {

using namespace cuda_detail;

namespace {

double median_of(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs.empty() ? 0 : xs[xs.size() / 2];
}

/// Milliseconds of `f` (`what`, returning a CUDA or cuBLAS status) on
/// `stream`, timed with CUDA events, into `ms`; false if a call failed.
template <class F>
bool time_ms(failure_log& log, cudaStream_t stream, const char* what, F f, float& ms) {
  cudaEvent_t start = nullptr, stop = nullptr;
  ms = 0;
  bool ok = AF_CHECK_LOG(log, cudaEventCreate(&start)) && AF_CHECK_LOG(log, cudaEventCreate(&stop))
            && AF_CHECK_LOG(log, cudaEventRecord(start, stream)) && log.ok(f(), what)
            && AF_CHECK_LOG(log, cudaEventRecord(stop, stream))
            && AF_CHECK_LOG(log, cudaEventSynchronize(stop))
            && AF_CHECK_LOG(log, cudaEventElapsedTime(&ms, start, stop));
  if (start != nullptr)
    AF_CHECK_LOG(log, cudaEventDestroy(start));
  if (stop != nullptr)
    AF_CHECK_LOG(log, cudaEventDestroy(stop));
  return ok;
}

/// cudaMalloc that leaves `*p` nullptr when it fails.
template <class T>
bool device_alloc(failure_log& log, T** p, size_t bytes) {
  void* fresh = nullptr;
  bool ok = AF_CHECK_LOG(log, cudaMalloc(&fresh, bytes));
  *p = ok ? static_cast<T*>(fresh) : nullptr;
  return ok;
}

} // namespace

// The baselines return 0 on any failure, after writing it to stderr.

double cuda_sgemm_gflops(int n, int reps) {
  if (cuda_device_count() == 0)
    return 0;
  failure_log log{"cuda_sgemm_gflops", 0};
  if (!AF_CHECK_LOG(log, cudaSetDevice(0)))
    return 0;
  size_t bytes = static_cast<size_t>(n) * n * sizeof(float);
  float *a = nullptr, *b = nullptr, *c = nullptr;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  float one = 1, nil = 0;
  auto gemm = [&] {
    return cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b, n, a, n, &nil, c, n);
  };
  bool ok = device_alloc(log, &a, bytes) && device_alloc(log, &b, bytes)
            && device_alloc(log, &c, bytes) && AF_CHECK_LOG(log, cudaMemset(a, 0, bytes))
            && AF_CHECK_LOG(log, cudaMemset(b, 0, bytes))
            && AF_CHECK_LOG(log, cudaStreamCreate(&stream)) && AF_CHECK_LOG(log, cublasCreate(&blas))
            && AF_CHECK_LOG(log, cublasSetStream(blas, stream))
            && log.ok(gemm(), "cublasSgemm (warm-up)")
            && AF_CHECK_LOG(log, cudaStreamSynchronize(stream));
  std::vector<double> samples;
  for (int i = 0; ok && i < reps; ++i) {
    float ms = 0;
    ok = time_ms(log, stream, "cublasSgemm", gemm, ms);
    if (ok)
      samples.push_back(2.0 * n * n * n / 1e9 / (ms / 1e3));
  }
  if (blas != nullptr)
    AF_CHECK_LOG(log, cublasDestroy(blas));
  if (stream != nullptr)
    AF_CHECK_LOG(log, cudaStreamDestroy(stream));
  for (float* p : {a, b, c})
    if (p != nullptr)
      AF_CHECK_LOG(log, cudaFree(p));
  return ok ? median_of(samples) : 0;
}

double cuda_copy_gbps(size_t bytes, int reps) {
  if (cuda_device_count() == 0)
    return 0;
  failure_log log{"cuda_copy_gbps", 0};
  if (!AF_CHECK_LOG(log, cudaSetDevice(0)))
    return 0;
  void *src = nullptr, *dst = nullptr;
  cudaStream_t stream = nullptr;
  auto copy = [&] { return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream); };
  bool ok = device_alloc(log, &src, bytes) && device_alloc(log, &dst, bytes)
            && AF_CHECK_LOG(log, cudaStreamCreate(&stream))
            && log.ok(copy(), "cudaMemcpyAsync (warm-up)")
            && AF_CHECK_LOG(log, cudaStreamSynchronize(stream));
  std::vector<double> samples;
  for (int i = 0; ok && i < reps; ++i) {
    float ms = 0;
    ok = time_ms(log, stream, "cudaMemcpyAsync", copy, ms);
    if (ok)
      samples.push_back(bytes / 1e9 / (ms / 1e3));
  }
  if (stream != nullptr)
    AF_CHECK_LOG(log, cudaStreamDestroy(stream));
  for (void* p : {src, dst})
    if (p != nullptr)
      AF_CHECK_LOG(log, cudaFree(p));
  return ok ? median_of(samples) : 0;
}

} // namespace af::kernels
