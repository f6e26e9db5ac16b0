// The partition planner (train/partition.hpp): how many pieces a parameter is
// cut into, where they go, and the slicing between logical tensors and pieces.
// Each case names the bug it is there to catch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "kernels/shard_routing.hpp"
#include "train/partition.hpp"

using namespace af;
using namespace af::train;

namespace {

parameter param(const std::string& name, shape_type shape) {
  return {name, std::move(shape), initializer::uniform(-1, 1, 7)};
}

/// A tensor of `shape` whose element i is i (distinct everywhere, so a row put
/// in the wrong place shows).
tensor counting(const shape_type& shape) {
  auto n = static_cast<size_t>(num_elements(shape));
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(i);
  return tensor::from_values(shape, v);
}

} // namespace

TEST_CASE("a [10000,64] float variable is cut into max_partitions near-equal row ranges, the "
          "first R % k one row longer, named part_<i>",
          "[partition]") {
  // Catches: rows lost or doubled at a boundary, the remainder given to the
  // last piece instead of the first ones (TF's rule), k not capped by the
  // rows or by min_slice_bytes, a whole variable renamed.
  std::vector<parameter> params{param("emb/w", {10000, 64}), param("emb/b", {64})};
  auto plan = plan_partitions(params, 3, 8, 262144);
  REQUIRE(plan);
  // 2,560,000 bytes / 262,144 = 9 slices of the minimum; capped at 8.
  REQUIRE(plan->pieces.size() == 9);
  int64_t next = 0;
  for (uint32_t i = 0; i < 8; ++i) {
    const auto& p = plan->pieces[i];
    CHECK(p.name == "emb/w/part_" + std::to_string(i));
    CHECK(p.param == 0);
    CHECK(p.parts == 8);
    CHECK(p.row_begin == next);
    CHECK(p.row_end - p.row_begin == 1250);
    CHECK(p.shape == shape_type{1250, 64});
    next = p.row_end;
  }
  CHECK(next == 10000);
  CHECK(plan->pieces[8].name == "emb/b");
  CHECK(plan->pieces[8].whole());

  CHECK(partitions_for({10, 64}, 10 * 64 * 4, 3, 1) == 3);
  auto uneven = plan_partitions({param("v", {10, 4})}, 2, 3, 1);
  REQUIRE(uneven);
  REQUIRE(uneven->pieces.size() == 3);
  CHECK(uneven->pieces[0].row_end - uneven->pieces[0].row_begin == 4);
  CHECK(uneven->pieces[1].row_end - uneven->pieces[1].row_begin == 3);
  CHECK(uneven->pieces[2].row_end - uneven->pieces[2].row_begin == 3);
  // Fewer rows than max_partitions: one row each; too small: whole.
  CHECK(partitions_for({2, 1000000}, 8000000, 8, 1) == 2);
  CHECK(partitions_for({10000, 64}, 2560000, 8, 4000000) == 1);
  CHECK(partitions_for({}, 4, 8, 1) == 1);
}

TEST_CASE("pieces are spread over 3 ps by size: the bytes per ps differ by at most one piece",
          "[partition]") {
  // Catches: round robin by count (TF's), which here would put the big
  // variable's pieces and the small ones unevenly; a tie sent to the higher ps.
  std::vector<parameter> params{param("small/a", {64}), param("emb/w", {10000, 64}),
                                param("small/b", {10, 10}), param("mid/w", {3000, 64})};
  auto plan = plan_partitions(params, 3, 8, 262144);
  REQUIRE(plan);
  auto bytes = plan->bytes_per_ps();
  REQUIRE(bytes.size() == 3);
  uint64_t largest = 0;
  for (const auto& p : plan->pieces)
    largest = std::max(largest, p.bytes);
  auto [lo, hi] = std::minmax_element(bytes.begin(), bytes.end());
  CHECK(*hi - *lo <= largest);
  uint64_t total = 0;
  for (auto b : bytes)
    total += b;
  CHECK(total == (10000 * 64 + 64 + 100 + 3000 * 64) * 4);
  // Every ps holds part of the big variable, and every piece is on some ps.
  std::set<uint32_t> big_on;
  for (const auto& p : plan->pieces)
    if (p.param == 1)
      big_on.insert(p.ps);
  CHECK(big_on.size() == 3);
  size_t listed = 0;
  for (uint32_t k = 0; k < 3; ++k)
    listed += plan->on_ps(k).size();
  CHECK(listed == plan->pieces.size());

  // Equal pieces: the first goes to ps 0, the ties after it in order.
  auto even = plan_partitions({param("v", {6, 1})}, 3, 3, 1);
  REQUIRE(even);
  CHECK(even->pieces[0].ps == 0);
  CHECK(even->pieces[1].ps == 1);
  CHECK(even->pieces[2].ps == 2);
}

TEST_CASE("max_partitions = 1 keeps today's placement: variable i on ps i % n_ps, whole, by its "
          "own name",
          "[partition]") {
  // Catches: the by-size placement applied to unpartitioned jobs, which would
  // move their variables to other ps tasks than their checkpoints and tests
  // expect.
  std::vector<parameter> params{param("hidden0/w", {64, 100}), param("hidden0/b", {100}),
                                param("logits/w", {100, 10}), param("logits/b", {10}),
                                param("extra/w", {1000000, 1})};
  auto plan = plan_partitions(params, 2, 1, 1);
  REQUIRE(plan);
  REQUIRE(plan->pieces.size() == params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK(plan->pieces[i].name == params[i].name);
    CHECK(plan->pieces[i].whole());
    CHECK(plan->pieces[i].ps == i % 2);
  }
  CHECK(!plan_partitions(params, 0, 1, 1));
  CHECK(!plan_partitions(params, 2, 0, 1));
}

TEST_CASE("splitting logical tensors into their pieces and assembling them again gives the same "
          "bytes, logical checkpoint variables round-trip through pieces",
          "[partition]") {
  // Catches: a row offset off by one, rows of one piece copied from another
  // parameter, slots not assembled with the values, a checkpoint of another
  // shape sliced instead of refused.
  std::vector<parameter> params{param("emb/w", {10000, 64}), param("bias", {7}),
                                param("scale", {})};
  auto plan = plan_partitions(params, 3, 8, 262144);
  REQUIRE(plan);
  std::vector<tensor> logical{counting({10000, 64}), counting({7}), tensor::scalar(3)};
  auto pieces = split_into_pieces(*plan, logical);
  REQUIRE(pieces);
  REQUIRE(pieces->size() == plan->pieces.size());
  CHECK(pieces->at(3).at(0) == plan->pieces[3].row_begin * 64.0);
  CHECK((*pieces)[plan->pieces.size() - 2].shares_buffer_with(logical[1])); // whole: no copy
  auto back = assemble_pieces(*plan, params.size(), *pieces);
  REQUIRE(back);
  for (size_t i = 0; i < logical.size(); ++i) {
    REQUIRE((*back)[i].shape() == logical[i].shape());
    CHECK((*back)[i].values<float>() == logical[i].values<float>());
  }

  // A checkpoint of the logical variables, cut for a plan of another shape
  // (2 ps, 3 partitions) and assembled again.
  checkpoint ck;
  for (size_t i = 0; i < params.size(); ++i) {
    saved_variable v;
    v.name = params[i].name;
    v.value = logical[i];
    v.slots["momentum"] = counting(logical[i].shape());
    ck.variables.push_back(v);
  }
  auto other = plan_partitions(params, 2, 3, 1);
  REQUIRE(other);
  std::vector<saved_variable> saved;
  for (const auto& p : other->pieces) {
    auto v = piece_of_checkpoint(p, params[p.param].name, ck, {"momentum"}, "/ckpt");
    REQUIRE(v);
    CHECK(v->name == p.name);
    saved.push_back(std::move(*v));
  }
  auto restored = logical_variables(params, other->pieces, saved);
  REQUIRE(restored);
  REQUIRE(restored->size() == params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK((*restored)[i].name == params[i].name);
    CHECK((*restored)[i].value.values<float>() == logical[i].values<float>());
    CHECK((*restored)[i].slots.at("momentum").values<float>()
          == ck.variables[i].slots.at("momentum").values<float>());
  }

  // Catches: a slot the checkpoint lacks made at 0 where its optimizer
  // starts elsewhere (adagrad's accumulator at initial_accumulator).
  auto fresh = piece_of_checkpoint(other->pieces[0], params[other->pieces[0].param].name, ck,
                                   {"accumulator", "momentum"}, "/ckpt", {0.25f, 0.0f});
  REQUIRE(fresh);
  CHECK(fresh->slots.at("accumulator")
        == tensor::filled(dtype::float32, other->pieces[0].shape, 0.25));
  CHECK(fresh->slots.at("momentum").values<float>()
        == saved[0].slots.at("momentum").values<float>());

  // A checkpoint of another model's shape is refused naming the variable.
  ck.variables[0].value = counting({100, 64});
  auto wrong = piece_of_checkpoint(other->pieces[0], "emb/w", ck, {}, "/ckpt");
  REQUIRE(!wrong);
  CHECK(wrong.error().what.find("'emb/w'") != std::string::npos);
  CHECK(wrong.error().what.find("[10000,64]") != std::string::npos);
  // A piece missing from the saved state is named.
  saved.erase(saved.begin());
  auto missing = logical_variables(params, other->pieces, saved);
  REQUIRE(!missing);
  CHECK(missing.error().what.find("emb/w/part_0") != std::string::npos);
}

TEST_CASE("a parameter's size-balanced pieces are the shards of a partitioned table, routed as "
          "contiguous (or div) runs of ids (catches pieces out of part order, or the ps of "
          "another piece)", "[partition][partitioned]") {
  // [10, 4] in 3 pieces over 2 ps: rows 4, 3, 3 (TF's sizes); by bytes the
  // first (largest) goes to ps 0, the next to ps 1, the last to ps 1 (4 > 3 rows).
  auto plan = plan_partitions({param("small", {3}), param("emb", {10, 4})}, 2, 3, 1);
  REQUIRE(plan);
  auto layout = table_layout_of(*plan, 1);
  CHECK(layout.shard_rows == std::vector<int64_t>{4, 3, 3});
  std::vector<uint32_t> want_ps;
  for (const auto& p : plan->pieces)
    if (p.param == 1)
      want_ps.push_back(p.ps);
  CHECK(layout.ps == want_ps);
  for (auto strategy : {kernels::partition_strategy::contiguous, kernels::partition_strategy::div}) {
    kernels::shard_router router;
    REQUIRE(kernels::shard_router::make(strategy, layout.shard_rows, router).ok());
    CHECK(router.place(3) == kernels::shard_place{0, 3});
    CHECK(router.place(4) == kernels::shard_place{1, 0});
    CHECK(router.place(9) == kernels::shard_place{2, 2});
  }
  CHECK(table_layout_of(*plan, 7).shard_rows.empty());
}
