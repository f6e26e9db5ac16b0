// CUDA kernels against the CPU reference: |gpu - cpu| <= atol + rtol * |cpu|.
// Hidden ([.]): run with `actorflow-tests "[gpu]"` on a machine with a GPU;
// ctest's gpu_kernels entry does that and reports "skipped" without one.
#include <catch2/catch.hpp>

#include <cmath>

#include "kernels/kernels.hpp"

using namespace af;

TEST_CASE("CUDA elementwise kernels match the CPU backend", "[.][gpu]") {
  std::string why;
  auto gpu = kernels::make_cuda_backend(0, &why);
  if (!gpu)
    FAIL("no CUDA backend: " << why);
  auto cpu = kernels::make_cpu_backend();
  const double atol = 1e-6, rtol = 1e-5;
  for (int64_t n : {1, 7, 1000, 1 << 20}) {
    tensor a{dtype::float32, {n}}, b{dtype::float32, {n}};
    REQUIRE(kernels::fill_uniform(a, -2, 2, 1).ok());
    REQUIRE(kernels::fill_uniform(b, 0.5, 3, 2).ok());
    for (auto op : {kernels::binary_op::add, kernels::binary_op::sub, kernels::binary_op::mul,
                    kernels::binary_op::div}) {
      for (bool scalar_rhs : {false, true}) {
        INFO("n=" << n << " op=" << kernels::to_string(op) << " scalar_rhs=" << scalar_rhs);
        auto rhs = scalar_rhs ? tensor::scalar(1.5f) : b;
        tensor want, got;
        REQUIRE(cpu->binary(op, a, rhs, want).ok());
        auto st = gpu->binary(op, a, rhs, got);
        REQUIRE(st.ok());
        REQUIRE(got.shape() == want.shape());
        size_t bad = 0;
        for (size_t i = 0; i < want.num_elements(); ++i)
          if (std::abs(got.at(i) - want.at(i)) > atol + rtol * std::abs(want.at(i)))
            ++bad;
        CHECK(bad == 0);
      }
    }
  }
}
