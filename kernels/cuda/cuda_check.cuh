#pragma once
// What every CUDA source of the backend shares to report failures: the
// status-returning checks of CUDA and cuBLAS calls, and failure_log for the
// paths that cannot return a status. CUDA types stay in kernels/cuda.
#include "kernels/kernels.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

namespace af::kernels::cuda_detail {

#define AF_CUDA_CHECK(expr)                                                    \
  do {                                                                         \
    cudaError_t af_err_ = (expr);                                              \
    if (af_err_ != cudaSuccess)                                                \
      return status::failure(std::string{#expr} + " failed: "                 \
                             + cudaGetErrorString(af_err_));                   \
  } while (false)

#define AF_CUBLAS_CHECK(expr)                                                  \
  do {                                                                         \
    cublasStatus_t af_st_ = (expr);                                            \
    if (af_st_ != CUBLAS_STATUS_SUCCESS)                                       \
      return status::failure(std::string{#expr} + " failed: cuBLAS status "   \
                             + std::to_string(static_cast<int>(af_st_)) + " (" \
                             + cublasGetStatusString(af_st_) + ")");           \
  } while (false)

/// Checks a CUDA or cuBLAS call on a path that cannot return a status; true
/// if it succeeded. See failure_log.
#define AF_CHECK_LOG(log, expr) ((log).ok((expr), #expr))

#define AF_TRY(expr)                                                           \
  do {                                                                         \
    if (auto af_s_ = (expr); !af_s_.ok())                                      \
      return af_s_;                                                            \
  } while (false)

/// Where the failures of a path that cannot return a status go (destructors,
/// device_copy::download, the benchmark baselines): the first failure is
/// written to stderr once, when the path ends, with how many more followed it
/// (after one failure the rest are mostly its echo). Never throws.
class failure_log {
public:
  failure_log(const char* where, int ordinal) noexcept : where_(where), ordinal_(ordinal) {}
  failure_log(const failure_log&) = delete;
  failure_log& operator=(const failure_log&) = delete;

  ~failure_log() {
    if (failures_ == 0)
      return;
    if (failures_ == 1)
      std::fprintf(stderr, "actorflow: GPU %d: %s: %s failed: %s\n", ordinal_, where_, call_, reason_);
    else
      std::fprintf(stderr, "actorflow: GPU %d: %s: %s failed: %s (and %d more CUDA failures)\n",
                   ordinal_, where_, call_, reason_, failures_ - 1);
  }

  bool ok(cudaError_t err, const char* call) noexcept {
    if (err == cudaSuccess)
      return true;
    // At process exit the runtime may unload before the last buffers are
    // returned; it frees them itself, so that is no failure worth a line.
    if (err != cudaErrorCudartUnloading)
      note(call, cudaGetErrorString(err));
    return false;
  }

  bool ok(cublasStatus_t st, const char* call) noexcept {
    if (st == CUBLAS_STATUS_SUCCESS)
      return true;
    note(call, cublasGetStatusString(st));
    return false;
  }

private:
  void note(const char* call, const char* reason) noexcept {
    if (failures_++ == 0) {
      call_ = call;
      reason_ = reason;
    }
  }

  const char* where_;
  int ordinal_;
  int failures_ = 0;
  const char* call_ = "";
  const char* reason_ = "";
};

/// `first`, or `then` if `first` succeeded; both if both failed.
inline status first_failure(status first, status then) {
  if (first.ok())
    return then;
  if (!then.ok())
    first.error += " (and then " + then.error + ")";
  return first;
}

} // namespace af::kernels::cuda_detail
