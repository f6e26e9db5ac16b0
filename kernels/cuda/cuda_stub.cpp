// CPU-only build: the CUDA backend was compiled out.
#include "kernels/kernels.hpp"

namespace af::kernels {

bool cuda_compiled() {
  return false;
}

int cuda_device_count(std::string* why) {
  if (why)
    *why = "this actorflow was built without CUDA (nvcc was not found at configure time)";
  return 0;
}

std::unique_ptr<backend> make_cuda_backend(int, std::string* why) {
  cuda_device_count(why);
  return nullptr;
}

double cuda_sgemm_gflops(int, int) {
  return 0;
}

double cuda_copy_gbps(size_t, int) {
  return 0;
}

} // namespace af::kernels
