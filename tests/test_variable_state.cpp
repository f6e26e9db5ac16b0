// The variable's bookkeeping, driven without an actor system.
#include <catch2/catch.hpp>

#include "actors/variable.hpp"
#include "messages/error.hpp"

using namespace af;

namespace {

variable_state make(shape_type shape, dtype type = dtype::float32) {
  variable_state st;
  st.spec = variable_spec{"v", type, std::move(shape), "/job:ps/replica:0/task:0/device:CPU:0"};
  return st;
}

} // namespace

TEST_CASE("reading an uninitialized variable is an error that names it", "[variable]") {
  auto st = make({2});
  auto r = st.read();
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::uninitialized));
  CHECK(describe(r.error()).find("variable 'v' on /job:ps/replica:0/task:0/device:CPU:0") != std::string::npos);
  auto add = st.update("add", tensor::scalar(1));
  REQUIRE_FALSE(add);
  CHECK(is(add.error(), af_error::uninitialized));
}

TEST_CASE("initializers set the value and bump the version", "[variable]") {
  auto st = make({2, 2});
  REQUIRE(st.initialize(initializer::constant(2), false) == 1u);
  CHECK(st.read()->values<float>() == std::vector<float>(4, 2));
  // only_if_uninitialized leaves a set value alone
  CHECK(st.initialize(initializer::ones(), true) == 1u);
  CHECK(st.read()->values<float>() == std::vector<float>(4, 2));
  CHECK(st.initialize(initializer::ones(), false) == 2u);
  CHECK(st.read()->values<float>() == std::vector<float>(4, 1));
  auto u1 = make({100}), u2 = make({100});
  REQUIRE(u1.initialize(initializer::uniform(0, 1, 5), false));
  REQUIRE(u2.initialize(initializer::uniform(0, 1, 5), false));
  CHECK(*u1.read() == *u2.read());
  REQUIRE(u1.initialize(initializer::normal(0, 1, 5), false));
  CHECK(*u1.read() != *u2.read());
  auto from = make({3});
  REQUIRE(from.initialize(initializer::from_tensor(tensor::from_values<float>({3}, {1, 2, 3})), false));
  CHECK(from.read()->values<float>() == std::vector<float>{1, 2, 3});
  auto wrong = from.initialize(initializer::from_tensor(tensor::filled(dtype::float32, {4}, 0)), false);
  REQUIRE_FALSE(wrong);
  CHECK(is(wrong.error(), af_error::shape_mismatch));
  auto kind = from.initialize(initializer{"glorot", 0, 0, 1, 0, {}}, false);
  REQUIRE_FALSE(kind);
  CHECK(describe(kind.error()).find("unknown kind 'glorot'") != std::string::npos);
}

TEST_CASE("assign, assign_add and assign_sub check dtype and shape and keep readers' snapshots",
          "[variable]") {
  auto st = make({2, 2});
  auto four = tensor::filled(dtype::float32, {2, 2}, 4);
  REQUIRE(st.update(nullptr, four) == 1u);
  CHECK(st.value.shares_buffer_with(four)); // assign keeps the sender's buffer
  auto snapshot = *st.read();
  REQUIRE(st.update("add", tensor::scalar(1)) == 2u);   // a scalar broadcasts
  REQUIRE(st.update("sub", tensor::filled(dtype::float32, {2, 2}, 0.5)) == 3u);
  CHECK(st.read()->values<float>() == std::vector<float>(4, 4.5));
  CHECK(snapshot.values<float>() == std::vector<float>(4, 4));
  CHECK(four.values<float>() == std::vector<float>(4, 4));
  auto shape = st.update(nullptr, tensor::filled(dtype::float32, {3}, 1));
  REQUIRE_FALSE(shape);
  CHECK(describe(shape.error()) == "shape_mismatch: assign to 'v': value has shape [3], variable has [2,2]");
  auto type = st.update("add", tensor::filled(dtype::float64, {2, 2}, 1));
  REQUIRE_FALSE(type);
  CHECK(is(type.error(), af_error::dtype_mismatch));
  CHECK(st.version == 3u); // failed updates change nothing
  CHECK(st.read()->values<float>() == std::vector<float>(4, 4.5));
}
