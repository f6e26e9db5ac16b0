#pragma once
/// Pure compute, no CAF and no CUDA types. One `backend` interface; the CPU
/// backend is always built and is the reference, the CUDA backend exists when
/// nvcc was found and a GPU is present. Failures come back as a sentence in
/// `status`, never as a crash.

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "messages/tensor.hpp"

namespace af::kernels {

struct status {
  std::string error; ///< empty on success
  bool ok() const { return error.empty(); }
  static status success() { return {}; }
  static status failure(std::string why) { return {std::move(why)}; }
};

enum class binary_op { add, sub, mul, div };

std::optional<binary_op> parse_binary_op(std::string_view name);
const char* to_string(binary_op op);

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
};

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

/// Fills `t` (float32 or float64) from U[low, high) or N(mean, stddev),
/// deterministically for a seed.
status fill_uniform(tensor& t, double low, double high, uint64_t seed);
status fill_normal(tensor& t, double mean, double stddev, uint64_t seed);

} // namespace af::kernels
