#pragma once
// Device memory of the CUDA backend: a caching pool of buffers per GPU, and
// the device copy of a tensor (core/tensor.hpp's device_copy) that returns
// its buffer to the pool.
#include "kernels/cuda/cuda_check.cuh"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace af::kernels::cuda_detail {

/// A caching pool of device buffers, so that steps do not cudaMalloc each
/// time. Shared by the backend and the device tensors it made, so a tensor
/// that outlives its backend still returns its buffer safely.
class device_pool {
public:
  explicit device_pool(int ordinal) : ordinal_(ordinal) {}

  ~device_pool() {
    bool any = std::any_of(free_.begin(), free_.end(),
                           [](const auto& entry) { return !entry.second.empty(); });
    if (!any)
      return;
    failure_log log{"releasing the device memory pool", ordinal_};
    AF_CHECK_LOG(log, cudaSetDevice(ordinal_));
    for (auto& [bytes, list] : free_) {
      for (void* p : list)
        AF_CHECK_LOG(log, cudaFree(p));
      list.clear(); // freed or not, no pointer stays behind to be freed twice
    }
    free_.clear();
  }

  /// A buffer of at least `bytes` in `*p`, from the pool or new; on failure
  /// `*p` is nullptr, so that nothing ever gives a bad pointer back.
  status take(size_t bytes, void** p) {
    *p = nullptr;
    bytes = std::max<size_t>(bytes, 1);
    {
      std::lock_guard<std::mutex> guard{mtx_};
      auto& list = free_[bytes];
      if (!list.empty()) {
        *p = list.back();
        list.pop_back();
        return status::success();
      }
    }
    AF_CUDA_CHECK(cudaSetDevice(ordinal_));
    void* fresh = nullptr;
    if (auto err = cudaMalloc(&fresh, bytes); err != cudaSuccess)
      return status::failure("cudaMalloc(" + std::to_string(bytes) + " bytes) on GPU "
                             + std::to_string(ordinal_) + " failed: " + cudaGetErrorString(err));
    *p = fresh;
    return status::success();
  }

  void give(void* p, size_t bytes) {
    std::lock_guard<std::mutex> guard{mtx_};
    free_[std::max<size_t>(bytes, 1)].push_back(p);
  }

  int ordinal() const { return ordinal_; }

private:
  int ordinal_;
  std::mutex mtx_;
  std::map<size_t, std::vector<void*>> free_;
};

/// A tensor's bytes in this GPU's memory; see core/tensor.hpp.
class cuda_copy : public device_copy {
public:
  cuda_copy(void* ptr, size_t bytes, std::shared_ptr<device_pool> pool, const void* owner)
    : ptr_(ptr), bytes_(bytes), pool_(std::move(pool)), owner_(owner) {}

  ~cuda_copy() override {
    pool_->give(ptr_, bytes_);
  }

  const void* owner() const noexcept override {
    return owner_;
  }

  void* device_pointer() const noexcept override {
    return ptr_;
  }

  void download(void* host, size_t bytes) const override {
    // device_copy::download has no way to say that it failed: a failure is
    // written to stderr.
    failure_log log{"downloading a tensor", pool_->ordinal()};
    AF_CHECK_LOG(log, cudaSetDevice(pool_->ordinal()));
    // The producing stream was synchronized when the op finished.
    AF_CHECK_LOG(log, cudaMemcpy(host, ptr_, std::min(bytes, bytes_), cudaMemcpyDeviceToHost));
  }

private:
  void* ptr_;
  size_t bytes_;
  std::shared_ptr<device_pool> pool_;
  const void* owner_;
};

} // namespace af::kernels::cuda_detail
