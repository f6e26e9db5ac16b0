// Exits 77 (ctest's "skipped") when there is no usable GPU, 0 otherwise.
#include <cstdio>

#include "kernels/kernels.hpp"

int main() {
  std::string why;
  if (af::kernels::cuda_device_count(&why) == 0) {
    std::printf("skipping the [gpu] tests: %s\n", why.c_str());
    return 77;
  }
  return 0;
}
