#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>

#include "kernels/kernels.hpp"
#include "core/tensor.hpp"

using af::dtype;
using af::tensor;

TEST_CASE("a tensor holds dtype, shape and one contiguous buffer", "[tensor]") {
  auto t = tensor::filled(dtype::float32, {2, 3}, 1.5);
  CHECK(t.num_elements() == 6);
  CHECK(t.nbytes() == 24);
  CHECK(t.summary() == "float32[2,3]");
  CHECK(reinterpret_cast<uintptr_t>(t.bytes()) % 64 == 0);
  CHECK(t.values<float>() == std::vector<float>(6, 1.5f));
  auto s = tensor::scalar(4);
  CHECK(s.shape().empty());
  CHECK(s.num_elements() == 1);
  CHECK(tensor{}.empty());
  CHECK_THROWS_AS((tensor{dtype::float32, {2, -1}}), std::invalid_argument);
  for (auto d : {dtype::float64, dtype::int32, dtype::int64})
    CHECK(tensor::filled(d, {3}, 7).values<double>() == std::vector<double>{7, 7, 7});
}

TEST_CASE("copying a tensor shares its buffer and writing clones it first", "[tensor]") {
  auto a = tensor::filled(dtype::float32, {4}, 1);
  auto b = a;
  CHECK(a.shares_buffer_with(b));
  b.mutable_data<float>()[0] = 9;
  CHECK_FALSE(a.shares_buffer_with(b));
  CHECK(a.values<float>()[0] == 1);
  CHECK(b.values<float>()[0] == 9);
  // a tensor that is not shared is written in place
  auto* before = a.bytes();
  a.mutable_data<float>()[1] = 3;
  CHECK(a.bytes() == before);
}

TEST_CASE("tensors print like NumPy arrays", "[tensor]") {
  CHECK(tensor::filled(dtype::float32, {2, 2}, 7).to_string() == "[[7. 7.]\n [7. 7.]]");
  CHECK(tensor::scalar(1).to_string() == "1.0"); // str(np.float32(1))
  CHECK(tensor::from_values<int32_t>({3}, {1, 2, 3}).to_string() == "[1 2 3]");
  CHECK(tensor::filled(dtype::float32, {100}, 0).to_string(4).find("...") != std::string::npos);
}

TEST_CASE("the CPU backend broadcasts like NumPy and updates in place", "[tensor][kernels]") {
  auto cpu = af::kernels::make_cpu_backend();
  auto a = tensor::from_values<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  auto row = tensor::from_values<float>({3}, {10, 20, 30});
  auto col = tensor::from_values<float>({2, 1}, {100, 200});
  tensor out;
  REQUIRE(cpu->binary(af::kernels::binary_op::add, a, row, out).ok());
  CHECK(out.values<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
  REQUIRE(cpu->binary(af::kernels::binary_op::mul, a, col, out).ok());
  CHECK(out.values<float>() == std::vector<float>{100, 200, 300, 800, 1000, 1200});
  REQUIRE(cpu->binary(af::kernels::binary_op::sub, tensor::scalar(1), a, out).ok());
  CHECK(out.values<float>() == std::vector<float>{0, -1, -2, -3, -4, -5});
  auto bad = cpu->binary(af::kernels::binary_op::add, a, tensor::filled(dtype::float32, {4}, 1), out);
  CHECK_FALSE(bad.ok());
  CHECK(bad.error.find("[2,3]") != std::string::npos);
  auto mixed = cpu->binary(af::kernels::binary_op::add, a, tensor::filled(dtype::float64, {2, 3}, 1), out);
  CHECK(mixed.error.find("float64") != std::string::npos);
  // in place: unshared tensors keep their buffer, shared ones leave readers alone
  auto* before = a.bytes();
  REQUIRE(cpu->binary_inplace(af::kernels::binary_op::add, a, tensor::scalar(1)).ok());
  CHECK(a.bytes() == before);
  auto snapshot = a;
  REQUIRE(cpu->binary_inplace(af::kernels::binary_op::add, a, tensor::scalar(1)).ok());
  CHECK(snapshot.values<float>()[0] == 2);
  CHECK(a.values<float>()[0] == 3);
}

TEST_CASE("random initializers are deterministic for a seed", "[tensor][kernels]") {
  tensor a{dtype::float32, {1000}}, b{dtype::float32, {1000}}, c{dtype::float32, {1000}};
  REQUIRE(af::kernels::fill_uniform(a, -1, 1, 42).ok());
  REQUIRE(af::kernels::fill_uniform(b, -1, 1, 42).ok());
  REQUIRE(af::kernels::fill_uniform(c, -1, 1, 43).ok());
  CHECK(a == b);
  CHECK(a != c);
  auto v = a.values<float>();
  CHECK(*std::min_element(v.begin(), v.end()) >= -1);
  CHECK(*std::max_element(v.begin(), v.end()) < 1);
  tensor n{dtype::float64, {20000}};
  REQUIRE(af::kernels::fill_normal(n, 3, 2, 7).ok());
  double mean = 0;
  for (auto x : n.values<double>())
    mean += x / 20000;
  CHECK(mean == Approx(3).margin(0.1));
  CHECK_FALSE(af::kernels::fill_normal(n, 0, -1, 7).ok());
  tensor i{dtype::int32, {3}};
  CHECK(af::kernels::fill_uniform(i, 0, 1, 1).error.find("int32") != std::string::npos);
}

TEST_CASE("asking for the CUDA backend without a GPU says why", "[kernels]") {
  std::string why;
  if (af::kernels::cuda_device_count(&why) == 0) {
    CHECK(af::kernels::make_cuda_backend(0, &why) == nullptr);
    CHECK_FALSE(why.empty());
  } else {
    CHECK(af::kernels::make_cuda_backend(1000, &why) == nullptr);
    CHECK(why.find("1000") != std::string::npos);
  }
}

TEST_CASE("a slice shares its tensor's bytes, and a write to either copies first", "[tensor]") {
  // Catches: a slice (the worker's parameters cut out of the flat answer
  // without a copy) written in place into the buffer it shares: the flat
  // tensor, or another slice of it, changed behind its holder's back.
  auto flat = tensor::from_values<float>({5}, {1, 2, 3, 4, 5});
  auto w = flat.slice(0, {2, 2});
  auto b = flat.slice(4, {1});
  REQUIRE(w.shape() == af::shape_type{2, 2});
  CHECK(w.data<float>() == flat.data<float>()); // no copy
  CHECK(b.data<float>() == flat.data<float>() + 4);
  CHECK(b.at(0) == 5);
  CHECK(flat.slice(4, {2}).empty()); // past the end
  w.mutable_data<float>()[0] = 10;
  CHECK(w.at(0) == 10);
  CHECK(flat.at(0) == 1); // the write copied first
  flat.mutable_data<float>()[4] = 50;
  CHECK(b.at(0) == 5);
  CHECK(flat.at(4) == 50);
  // alone at last, a slice writes in place
  tensor last;
  {
    auto whole = tensor::from_values<float>({3}, {7, 8, 9});
    last = whole.slice(1, {2});
  }
  const float* before = last.data<float>();
  last.mutable_data<float>()[0] = 80;
  CHECK(last.data<float>() == before);
  CHECK(last.at(0) == 80);
}

namespace {

/// The VmFlags of the mapping of /proc/self/smaps that holds `p`, or "".
std::string vm_flags_of(const void* p) {
  std::ifstream in{"/proc/self/smaps"};
  auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find('-'))
      inside = at >= lo && at < hi;
    else if (inside && line.rfind("VmFlags:", 0) == 0)
      return line;
  }
  return {};
}

} // namespace

// The bug: a big embedding shard on 4 KiB pages, a TLB miss per random row,
// and the 1 M job's 4 MB tensors streamed at 4 KiB pages' speed (core/tensor.cpp
// advise_huge_pages). Fails without the madvise (no "hg"), and with the
// threshold at 32 MiB as it was (the 4 MB tensor's "hg").
TEST_CASE("a buffer of 2 MiB or more is 2 MiB-aligned and advised transparent huge pages, a "
          "smaller one is not",
          "[tensor]") {
  if (!std::ifstream{"/sys/kernel/mm/transparent_hugepage/enabled"}) {
    WARN("this kernel has no transparent huge pages: madvise(MADV_HUGEPAGE) cannot be seen");
    return;
  }
  tensor big{dtype::float32, {int64_t{40} << 20 >> 2}}; // 40 MiB
  auto flags = vm_flags_of(big.bytes() + (big.nbytes() / 2));
  REQUIRE_FALSE(flags.empty());
  CHECK(flags.find(" hg") != std::string::npos);
  tensor w{dtype::float32, {1'000'000}}; // the 1 M job's weights
  CHECK(reinterpret_cast<uintptr_t>(w.bytes()) % (uintptr_t{2} << 20) == 0);
  CHECK(vm_flags_of(w.bytes()).find(" hg") != std::string::npos);
  CHECK(vm_flags_of(w.bytes() + (2 << 20)).find(" hg") != std::string::npos);
  tensor below{dtype::float32, {(int64_t{1} << 20) / 4}}; // 1 MiB
  CHECK(vm_flags_of(below.bytes()).find(" hg") == std::string::npos);
  tensor small{dtype::float32, {1024}};
  CHECK(vm_flags_of(small.bytes()).find(" hg") == std::string::npos);
}
