// CUDA kernels against the CPU reference: |gpu - cpu| <= atol + rtol * |cpu|.
// Hidden ([.]): run with `actorflow-tests "[gpu]"` on a machine with a GPU;
// ctest's gpu_kernels entry does that and reports "skipped" without one.
#include <catch2/catch.hpp>

#include <cmath>

#include "kernels/kernels.hpp"

using namespace af;
using namespace af::kernels;

namespace {

tensor random(shape_type shape, uint64_t seed, double lo, double hi, dtype type = dtype::float32) {
  tensor t{type, std::move(shape)};
  REQUIRE(fill_uniform(t, lo, hi, seed).ok());
  return t;
}

void require_close(const tensor& got, const tensor& want, double atol, double rtol) {
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.type() == want.type());
  size_t bad = 0;
  for (size_t i = 0; i < want.num_elements(); ++i)
    if (!(std::abs(got.at(i) - want.at(i)) <= atol + rtol * std::abs(want.at(i))))
      ++bad;
  CHECK(bad == 0);
}

std::unique_ptr<backend> gpu_backend() {
  std::string why;
  auto gpu = make_cuda_backend(0, &why);
  if (!gpu)
    FAIL("no CUDA backend: " << why);
  return gpu;
}

} // namespace

TEST_CASE("every CUDA op matches the CPU backend", "[.][gpu]") {
  auto gpu = gpu_backend();
  auto cpu = make_cpu_backend();
  for (auto type : {dtype::float32, dtype::float64}) {
    double atol = type == dtype::float32 ? 1e-5 : 1e-12, rtol = type == dtype::float32 ? 1e-4 : 1e-10;
    auto x = random({64, 33}, 1, -2, 2, type), pos = random({64, 33}, 2, 0.1, 3, type);
    auto row = random({33}, 3, 0.5, 2, type), col = random({64, 1}, 4, 0.5, 2, type);
    auto a = random({130, 70}, 5, -1, 1, type), b = random({70, 90}, 6, -1, 1, type);
    // Every class of 33 shows up, in no order: a kernel that reads one row's
    // label for all, or indexes labels with the wrong stride, differs.
    std::vector<int32_t> label_values(64);
    for (int32_t i = 0; i < 64; ++i)
      label_values[i] = (i * 7 + 3) % 33;
    auto labels = tensor::from_values<int32_t>({64}, label_values);
    op_attrs all, axis0, last_keep, ta, tb;
    axis0.all_axes = false;
    last_keep.all_axes = false;
    last_keep.axis = -1;
    last_keep.keep_dims = true;
    ta.transpose_a = true;
    tb.transpose_b = true;
    struct op_case {
      std::string op;
      std::vector<tensor> in;
      op_attrs attrs;
    };
    auto max_all = tensor{};
    REQUIRE(cpu->reduce(reduce_op::max, all, x, max_all).ok());
    std::vector<op_case> cases = {
      {"add", {x, row}, {}}, {"sub", {x, col}, {}}, {"mul", {x, tensor::filled(type, {}, 3)}, {}},
      {"div", {x, pos}, {}}, {"relu_grad", {pos, x}, {}}, {"sigmoid_grad", {x, pos}, {}},
      {"tanh_grad", {x, pos}, {}}, {"neg", {x}, {}}, {"exp", {x}, {}}, {"log", {pos}, {}},
      {"relu", {x}, {}}, {"sigmoid", {x}, {}}, {"tanh", {x}, {}}, {"square", {x}, {}},
      {"sqrt", {pos}, {}}, {"matmul", {a, b}, {}}, {"matmul", {tensor{}, b}, ta},
      {"softplus", {x}, {}},
      {"sum", {x}, all}, {"mean", {x}, axis0}, {"max", {x}, last_keep},
      {"sum_grad", {tensor::filled(type, {33}, 1.5), x}, axis0},
      {"max_grad", {tensor::filled(type, {}, 2), x, max_all}, all},
      {"sum_to", {x, row}, {}}, {"sum_to", {x, col}, {}},
      {"softmax", {x}, {}}, {"log_softmax", {x}, {}}, {"softmax_grad", {x, pos}, {}},
      {"log_softmax_grad", {x, pos}, {}}, {"softmax_xent", {x, labels}, {}},
      {"softmax_xent_grad", {random({64}, 7, 0, 1, type), x, labels}, {}},
    };
    cases[16].in[0] = random({70, 130}, 8, -1, 1, type); // a^T for the transposed matmul
    for (auto& c : cases) {
      INFO(c.op << " " << dtype_name(type));
      tensor want, got;
      auto cs = run_op(*cpu, c.op, c.attrs, c.in, want);
      REQUIRE(cs.ok());
      auto gs = run_op(*gpu, c.op, c.attrs, c.in, got);
      if (!gs.ok())
        FAIL(gs.error);
      require_close(got, want, atol * 10, rtol * 10);
    }
  }
}

TEST_CASE("CUDA optimizer updates match the CPU backend", "[.][gpu]") {
  auto gpu = gpu_backend();
  auto cpu = make_cpu_backend();
  auto w0 = random({1000}, 1, -1, 1), g = random({1000}, 2, -1, 1);
  auto wc = tensor::from_values<float>({1000}, w0.values<float>()), wg = wc;
  wg.mutable_bytes(); // its own buffer
  REQUIRE(cpu->apply_sgd(wc, g, 0.1).ok());
  REQUIRE(gpu->apply_sgd(wg, g, 0.1).ok());
  require_close(wg, wc, 1e-6, 1e-5);
  auto ac = tensor::filled(dtype::float32, {1000}, 0), ag = ac;
  ag.mutable_bytes();
  REQUIRE(cpu->apply_momentum(wc, ac, g, 0.1, 0.9).ok());
  REQUIRE(gpu->apply_momentum(wg, ag, g, 0.1, 0.9).ok());
  require_close(wg, wc, 1e-6, 1e-5);
  require_close(ag, ac, 1e-6, 1e-5);
  auto mc = tensor::filled(dtype::float32, {1000}, 0), vc = mc, mg = mc, vg = mc;
  for (auto* t : {&vc, &mg, &vg})
    t->mutable_bytes();
  for (int64_t step = 1; step <= 3; ++step) {
    REQUIRE(cpu->apply_adam(wc, mc, vc, g, 0.01, 0.9, 0.999, 1e-8, step).ok());
    REQUIRE(gpu->apply_adam(wg, mg, vg, g, 0.01, 0.9, 0.999, 1e-8, step).ok());
  }
  require_close(wg, wc, 1e-6, 1e-4);
}
