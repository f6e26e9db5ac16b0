// The scatter updates of a variable (issue 25: tf.scatter_add / _sub /
// _update) where the variable lives: on its cell, without an actor system,
// then through a session on an embedded cluster, where the update travels
// from the worker's executor to the ps's variable actor. Each case names the
// bug it catches.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "actors/variable.hpp"
#include "kernels/sparse.hpp"
#include "scenarios.hpp"

using namespace af;
using namespace af::testing;
using kernels::scatter_op;

namespace {

const char* ps0 = "/job:ps/replica:0/task:0/device:CPU:0";

/// A [4, 2] float32 cell holding 0, 1, ..., 7.
std::unique_ptr<variable_cell> table_cell() {
  auto cell = std::make_unique<variable_cell>(variable_spec{"emb", dtype::float32, {4, 2}, ps0});
  std::vector<float> v{0, 1, 2, 3, 4, 5, 6, 7};
  REQUIRE(cell->apply(var_op::assign, tensor::from_values<float>({4, 2}, v), false));
  return cell;
}

std::vector<float> values(variable_cell& cell) {
  return value_of(cell.apply(var_op::read, tensor{}, true)).value.values<float>();
}

} // namespace

TEST_CASE("a variable's scatter_add sums duplicate ids and bumps the version once (catches "
          "duplicates overwritten)", "[variable][sparse]") {
  auto owned = table_cell();
  auto& cell = *owned;
  auto ids = tensor::from_values<int32_t>({3}, {3, 1, 3});
  auto ups = tensor::from_values<float>({3, 2}, {1, 1, 10, 10, 100, 100});
  auto r = value_of(cell.apply_scatter(scatter_op::add, ids, ups, true));
  CHECK(r.version == 2u); // the assign, then this one update
  CHECK(r.value.values<float>() == std::vector<float>{0, 1, 12, 13, 4, 5, 107, 108});
  value_of(cell.apply_scatter(scatter_op::sub, ids, ups, false));
  CHECK(values(cell) == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7});
  value_of(cell.apply_scatter(scatter_op::update, ids, ups, false));
  CHECK(values(cell) == std::vector<float>{0, 1, 10, 10, 4, 5, 100, 100}); // the last of id 3
}

TEST_CASE("a variable refuses a scatter with an id out of range, naming the id and the "
          "variable, and is unchanged (catches a partial write)", "[variable][sparse]") {
  auto owned = table_cell();
  auto& cell = *owned;
  auto before = values(cell);
  auto snapshot = value_of(cell.apply(var_op::read, tensor{}, true)).value; // a reader's
  auto ids = tensor::from_values<int64_t>({3}, {0, 2, -1});
  auto r = cell.apply_scatter(scatter_op::add, ids, tensor::filled(dtype::float32, {3, 2}, 9), true);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::invalid_argument));
  CHECK(describe(r.error()).find("scatter_add to variable 'emb'") != std::string::npos);
  CHECK(describe(r.error()).find("indices[2] = -1 is not in [0, 4)") != std::string::npos);
  CHECK(values(cell) == before);
  CHECK(cell.info().version == 1u);
  // A good scatter then writes a fresh buffer: the reader's snapshot keeps its values.
  value_of(cell.apply_scatter(scatter_op::update, tensor::from_values<int32_t>({1}, {0}),
                              tensor::filled(dtype::float32, {}, 9), false));
  CHECK(snapshot.values<float>() == before);
  CHECK(values(cell)[0] == 9);
  // Uninitialized and retried updates behave as assign_add's do.
  variable_cell fresh{variable_spec{"e2", dtype::float32, {2, 1}, ps0}};
  auto un = fresh.apply_scatter(scatter_op::add, tensor::from_values<int32_t>({1}, {0}),
                                tensor::filled(dtype::float32, {1, 1}, 1), false);
  REQUIRE_FALSE(un);
  CHECK(is(un.error(), af_error::uninitialized));
}

TEST_CASE("a retried scatter_add with the same request id is applied once (catches a retry "
          "counted twice)", "[variable][sparse][exactly-once]") {
  auto owned = table_cell();
  auto& cell = *owned;
  auto ids = tensor::from_values<int32_t>({1}, {0});
  auto ups = tensor::filled(dtype::float32, {1, 2}, 1);
  auto id = new_request_id();
  auto first = value_of(cell.apply_scatter(scatter_op::add, ids, ups, true, id));
  auto retry = value_of(cell.apply_scatter(scatter_op::add, ids, ups, true, id));
  CHECK(retry.replayed);
  CHECK(retry.version == first.version);
  CHECK(values(cell)[0] == 1);
}

TEST_CASE("scatter_add through a session updates the ps's variable, and a bad id comes back naming "
          "it and the variable, which is unchanged (catches a scatter the executor or the "
          "variable actor drops)", "[variable][sparse][embedded]") {
  embedded_under_test c{{{"ps", 1}, {"worker", 1}}};
  auto s = c.connect("worker", 0);
  auto d = value_of(s.device("/job:ps/task:0"));
  std::vector<float> start{0, 1, 2, 3, 4, 5};
  auto emb = value_of(s.variable("emb", {3, 2},
                                 initializer::from_tensor(tensor::from_values<float>({3, 2}, start))));
  d.reset(); // the ops below run on the worker
  require_ok(s.initialize({emb}));
  // Updates computed on the worker (a mul), so they travel to the ps as a step's value.
  auto ids = s.constant(tensor::from_values<int64_t>({3}, {2, 0, 2}));
  auto ups = s.mul(s.constant(tensor::filled(dtype::float32, {3, 2}, 1)), s.constant(tensor::scalar(2)));
  auto r = value_of(s.run(s.scatter_add(emb, ids, ups)));
  CHECK(r.values<float>() == std::vector<float>{2, 3, 2, 3, 8, 9});
  auto bad = s.run(s.scatter_update(emb, s.constant(tensor::from_values<int32_t>({2}, {1, 7})),
                                    s.constant(tensor::filled(dtype::float32, {2, 2}, 0))));
  REQUIRE_FALSE(bad);
  INFO(describe(bad.error()));
  CHECK(describe(bad.error()).find("variable 'emb'") != std::string::npos);
  CHECK(describe(bad.error()).find("indices[1] = 7 is not in [0, 3)") != std::string::npos);
  CHECK(value_of(s.run(emb)).values<float>() == std::vector<float>{2, 3, 2, 3, 8, 9});
}
