// A step's values stay on a device between ops and come to the host only when
// read there: checked with a backend whose "device" is host memory that
// counts every upload and download.
#include <catch2/catch.hpp>

#include <atomic>

#include "actors/edge_token.hpp"
#include "actors/executor.hpp"
#include "scenarios.hpp"

using namespace af;
using namespace af::testing;

namespace {

struct counters {
  std::atomic<int> uploads{0};
  std::atomic<int> downloads{0};
};

/// "Device memory": a tensor the fake backend keeps; downloads are counted.
class fake_copy : public device_copy {
public:
  fake_copy(tensor value, const void* owner, counters& c) : value_(std::move(value)), owner_(owner), c_(c) {}
  const void* owner() const noexcept override { return owner_; }
  void* device_pointer() const noexcept override { return const_cast<tensor*>(&value_); }
  void download(void* host, size_t bytes) const override {
    ++c_.downloads;
    std::memcpy(host, value_.bytes(), bytes);
  }

private:
  tensor value_;
  const void* owner_;
  counters& c_;
};

/// Computes on the CPU but keeps results in fake device memory, as the CUDA
/// backend keeps them in GPU memory.
class fake_device_backend : public kernels::backend {
public:
  explicit fake_device_backend(counters& c) : c_(c) {}
  std::string name() const override { return "fake-device"; }

  kernels::status binary(kernels::binary_op op, const tensor& a, const tensor& b, tensor& out) override {
    tensor r;
    auto st = cpu_->binary(op, fetch(a), fetch(b), r);
    return finish(st, std::move(r), out);
  }
  kernels::status binary_inplace(kernels::binary_op op, tensor& a, const tensor& b) override {
    return cpu_->binary_inplace(op, a, b);
  }
  kernels::status unary(kernels::unary_op op, const tensor& x, tensor& out) override {
    tensor r;
    auto st = cpu_->unary(op, fetch(x), r);
    return finish(st, std::move(r), out);
  }

private:
  /// The input as the device sees it: ours directly, others "uploaded".
  tensor fetch(const tensor& t) {
    if (auto* d = t.device(); d != nullptr && d->owner() == this)
      return *static_cast<const tensor*>(d->device_pointer());
    ++c_.uploads;
    return tensor::from_values<float>(t.shape(), t.values<float>());
  }
  kernels::status finish(kernels::status st, tensor r, tensor& out) {
    if (st.ok())
      out = tensor::on_device(r.type(), r.shape(), std::make_shared<fake_copy>(r, this, c_));
    return st;
  }
  counters& c_;
  std::unique_ptr<kernels::backend> cpu_ = kernels::make_cpu_backend();
};

} // namespace

TEST_CASE("a tensor on a device is downloaded once, on first host access, and shared by copies",
          "[device]") {
  counters c;
  int owner = 0;
  auto t = tensor::on_device(dtype::float32, {3},
                             std::make_shared<fake_copy>(tensor::filled(dtype::float32, {3}, 4), &owner, c));
  CHECK_FALSE(t.on_host());
  CHECK(c.downloads == 0);
  auto copy = t;
  CHECK(copy.values<float>() == std::vector<float>{4, 4, 4});
  CHECK(t.at(2) == 4);
  CHECK(c.downloads == 1);
  CHECK(t.on_host());
  // writing makes a host tensor of its own; the device copy no longer applies
  copy.mutable_data<float>()[0] = 9;
  CHECK(copy.device() == nullptr);
  CHECK(t.device() != nullptr);
  CHECK(t.at(0) == 4);
}

TEST_CASE("an executor keeps a step's values on its device and downloads only what is fetched",
          "[device]") {
  counters c;
  system_config cfg{node_options{}};
  caf::actor_system sys{cfg};
  auto backend = std::make_shared<fake_device_backend>(c);
  auto exec = sys.spawn(executor_impl, std::string{"/job:x/replica:0/task:0/device:GPU:0"},
                        std::shared_ptr<kernels::backend>{backend}, kernels::make_cpu_backend());
  // (a + b) * (a + b), negated; only the last value is fetched
  auto constant = [](float v) {
    op_input in;
    in.kind = op_input::constant;
    in.value = tensor::filled(dtype::float32, {4}, v);
    return in;
  };
  auto local = [](int32_t id) {
    op_input in;
    in.kind = op_input::local;
    in.op = id;
    return in;
  };
  partition part;
  part.graph = 7;
  part.edge_token = make_edge_token();
  part.ops = {partition_op{1, "add", "sum", {}, {constant(1), constant(2)}, {}, false, true, {}, {}, {}},
              partition_op{2, "mul", "square", {}, {local(1), local(1)}, {}, false, true, {}, {}, {}},
              partition_op{3, "neg", "out", {}, {local(2)}, {}, true, true, {}, {}, {}}};
  caf::scoped_actor self{sys, true};
  self->request(exec, std::chrono::seconds(10), register_atom::value, part)
    .receive([](caf::ok_atom) {}, [](caf::error& e) { FAIL(describe(e)); });
  step_result result;
  self->request(exec, std::chrono::seconds(10), run_step_atom::value, uint64_t{7}, uint64_t{1},
                std::vector<feed>{})
    .receive([&](step_result& r) { result = std::move(r); }, [](caf::error& e) { FAIL(describe(e)); });
  REQUIRE(result.fetched.size() == 1);
  CHECK(c.uploads == 2);   // the two constants
  CHECK(c.downloads == 0); // nothing came back to the host yet
  CHECK_FALSE(result.fetched[0].value.on_host());
  CHECK(result.fetched[0].value.values<float>() == std::vector<float>(4, -9));
  CHECK(c.downloads == 1); // the fetched value, once the client read it
  self->send_exit(exec, caf::exit_reason::user_shutdown);
}
