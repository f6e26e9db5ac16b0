// A partitioned embedding table on an embedded cluster of 3 ps and a worker
// (graph/embedding.hpp, docs/sparse.md "Partitioned tables"): each shard
// lives on its ps, each shard's gather runs there, and the lookup and its
// gradient equal the unpartitioned table's. Each case says which bug it catches.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/session.hpp"
#include "actors/trace.hpp"
#include "dist/embedded_cluster.hpp"
#include "graph/embedding.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

/// A [rows, cols] float32 table with value r * 10 + c at (r, c).
tensor id_table(int64_t rows, int64_t cols) {
  std::vector<float> v;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      v.push_back(static_cast<float>(r * 10 + c));
  return tensor::from_values<float>({rows, cols}, v);
}

} // namespace

TEST_CASE("a table over 3 ps, each shard on its ps, each shard's gather runs there, and a "
          "lookup returns the right rows and the gradient each shard's own (catches shards "
          "pulled whole to the worker, or rows from the wrong shard)", "[partitioned][cluster]") {
  auto ec = embedded_cluster::start({{"ps", 3}, {"worker", 1}});
  REQUIRE(ec);
  auto s = (*ec)->session_for("worker", 0);
  REQUIRE(s);
  // 10 rows of 4 over 3 ps by mod: shard k holds ids k, k + 3, ... (4, 3, 3 rows).
  const int64_t rows = 10, cols = 4;
  auto full = id_table(rows, cols);
  auto sizes = kernels::balanced_shard_rows(rows, 3);
  std::vector<output> shards;
  for (size_t k = 0; k < 3; ++k) {
    std::vector<float> v;
    for (int64_t r = 0; r < sizes[k]; ++r)
      for (int64_t c = 0; c < cols; ++c)
        v.push_back(full.data<float>()[(r * 3 + static_cast<int64_t>(k)) * cols + c]);
    auto scope = s->device("/job:ps/task:" + std::to_string(k));
    REQUIRE(scope);
    auto var = s->variable(shard_name("emb", k), {sizes[k], cols},
                           initializer::from_tensor(tensor::from_values<float>({sizes[k], cols}, v)));
    REQUIRE(var);
    shards.push_back(*var);
  }
  auto table = embedding_table_of(s->graph_def(), "emb", kernels::partition_strategy::mod, shards);
  REQUIRE(table);
  REQUIRE(!s->initialize());
  std::vector<int64_t> ids = {9, 0, 4, 4, 7, 9, 2};
  auto in = s->constant(tensor::from_values<int64_t>({7}, ids));
  auto y = embedding_lookup(s->builder(), *table, in);
  REQUIRE(y);
  run_trace trace;
  auto got = s->run(*y, &trace);
  REQUIRE(got);
  const tensor& rows_back = *got;
  REQUIRE(rows_back.shape() == shape_type{7, cols});
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < cols; ++c)
      CHECK(rows_back.data<float>()[i * cols + c] == static_cast<float>(ids[i] * 10 + c));
  for (size_t k = 0; k < 3; ++k) {
    INFO("shard " << k);
    auto where = "/job:ps/replica:0/task:" + std::to_string(k) + "/";
    CHECK(s->device_of(shards[k]).find(where) == 0);
    const auto* gather = trace.find("emb/lookup/gather_" + std::to_string(k));
    REQUIRE(gather != nullptr);
    CHECK(gather->device.find(where) == 0);
  }
  const auto* route = trace.find("emb/route");
  REQUIRE(route != nullptr);
  CHECK(route->device.find("/job:worker/replica:0/task:0/") == 0);
  // Backward: loss = sum(lookup * 1) gives each row the count of its ids.
  auto loss = s->reduce_sum(*y);
  auto grads = s->gradients(loss, shards);
  REQUIRE(grads);
  auto g = s->run(*grads);
  REQUIRE(g);
  for (size_t k = 0; k < 3; ++k)
    for (int64_t r = 0; r < sizes[k]; ++r) {
      auto id = r * 3 + static_cast<int64_t>(k);
      float count = 0;
      for (auto i : ids)
        count += i == id ? 1.0f : 0.0f;
      INFO("shard " << k << " row " << r << " (id " << id << ")");
      CHECK((*g)[k].data<float>()[r * cols] == count);
    }
  // An id past the table fails the step, naming it and the table; the ps live on.
  auto bad = embedding_lookup(s->builder(), *table, s->constant(tensor::from_values<int64_t>({1}, {10})));
  REQUIRE(bad);
  auto refused = s->run(*bad);
  REQUIRE_FALSE(refused);
  INFO(describe(refused.error()));
  CHECK(describe(refused.error()).find("'emb/route") != std::string::npos); // emb/route_1: the second lookup's
  CHECK(describe(refused.error()).find("= 10 is not a row of the table") != std::string::npos);
  CHECK(s->run(*y));
}

TEST_CASE("unsorted_segment_sum with num_segments 2^63 - 1 on a worker is refused naming it, and "
          "the worker answers the next run (issue 25 F1, the node stopped)",
          "[sparse][cluster]") {
  auto ec = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(ec);
  auto s = (*ec)->session_for("worker", 0);
  REQUIRE(s);
  auto data = s->constant(tensor::from_values<float>({1, 2}, {1, 2}));
  auto ids = s->constant(tensor::from_values<int64_t>({1}, {0}));
  auto huge = s->op("unsorted_segment_sum",
                    {data, ids, s->constant(tensor::from_values<int64_t>({}, {INT64_MAX}))});
  auto refused = s->run(huge);
  REQUIRE_FALSE(refused);
  auto text = describe(refused.error());
  INFO(text);
  CHECK(text.find("num_segments = 9223372036854775807 is not in [0, 2^31 - 1)")
        != std::string::npos);
  auto fine = s->op("unsorted_segment_sum",
                    {data, ids, s->constant(tensor::from_values<int64_t>({}, {2}))});
  auto got = s->run(fine);
  REQUIRE(got);
  CHECK(got->shape() == shape_type{2, 2});
  CHECK(got->data<float>()[1] == 2.0f);
}

} // namespace af
