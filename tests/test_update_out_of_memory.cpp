// A spread update (a sync round's) when an allocation fails on its way: the
// variable keeps its value, as update_each's error says. operator new is
// replaced for this binary: it passes through, except on a thread that armed
// `fail_countdown`, where the allocation after that many others throws.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "actors/variable.hpp"
#include "core/parallel_ranges.hpp"
#include "messages/error.hpp"
#include "train/optimizer.hpp"

namespace {
thread_local long fail_countdown = -1; // -1: never fails
} // namespace

void* operator new(std::size_t n) {
  if (fail_countdown >= 0 && fail_countdown-- == 0)
    throw std::bad_alloc{};
  if (void* p = std::malloc(n > 0 ? n : 1))
    return p;
  throw std::bad_alloc{};
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

using namespace af;

TEST_CASE("a spread update whose split cannot allocate keeps the variable's value (copy on "
          "write), then runs unsplit, and a later one splits",
          "[variable][parallel]") {
  // Catches: parallel_ranges throwing bad_alloc (making its pool, starting a
  // helper, its ranges) after apply_blocks put a fresh, unwritten buffer in
  // place of a value a reader holds: the update failed "out of memory" and
  // left the variable holding that buffer's garbage. Each allocation of the
  // update is made to fail in turn until it succeeds.
  ::setenv("ACTORFLOW_UPDATE_THREADS", "2", 0); // a helper even on one core, if read first here
  const size_t n = 2 * variable_cell::split_floats + 7;
  train::optimizer_spec opt;
  opt.kind = "sgd";
  opt.lr = 0.5;
  std::vector<float> start(n), grad(n), want(n);
  for (size_t i = 0; i < n; ++i) {
    start[i] = 1.0f + static_cast<float>(i % 97);
    grad[i] = 0.25f * static_cast<float>(i % 13);
  }
  variable_cell cell{variable_spec{"v", dtype::float32, {static_cast<int64_t>(n)},
                                   "/job:ps/replica:0/task:0/device:CPU:0"}};
  tensor t{dtype::float32, {static_cast<int64_t>(n)}};
  std::memcpy(t.mutable_data<float>(), start.data(), n * sizeof(float));
  REQUIRE(cell.apply(var_op::assign, t, false));
  auto fill = [&](size_t offset, size_t len, float* out) {
    std::memcpy(out, grad.data() + offset, len * sizeof(float));
  };
  want = start;
  train::apply(opt, want.data(), nullptr, grad.data(), n, 0);
  size_t failures = 0;
  for (long k = 0;; ++k) {
    REQUIRE(k < 1000);
    tensor held; // a reader's: the update goes to a fresh buffer
    REQUIRE_FALSE(cell.share_value(held, n));
    fail_countdown = k;
    auto err = cell.apply_gradient_by(opt, fill, n, 0, nullptr, true);
    fail_countdown = -1;
    auto now = cell.apply(var_op::read, tensor{}, true);
    REQUIRE(now);
    CAPTURE(k);
    if (err) {
      ++failures;
      CHECK(describe(err).find("out of memory") != std::string::npos);
      REQUIRE(std::memcmp(now->value.data<float>(), start.data(), n * sizeof(float)) == 0);
      continue;
    }
    CHECK(std::memcmp(now->value.data<float>(), want.data(), n * sizeof(float)) == 0);
    break;
  }
  CHECK(failures > 0); // the countdown did reach the update's allocations
  // Nothing failing now: the next update splits where there is a helper.
  const size_t splits_before = parallel_splits();
  REQUIRE_FALSE(cell.apply_gradient_by(opt, fill, n, 1, nullptr, true));
  train::apply(opt, want.data(), nullptr, grad.data(), n, 1);
  auto after = cell.apply(var_op::read, tensor{}, true);
  REQUIRE(after);
  CHECK(std::memcmp(after->value.data<float>(), want.data(), n * sizeof(float)) == 0);
  if (parallel_threads() > 1)
    CHECK(parallel_splits() == splits_before + 1);
}
