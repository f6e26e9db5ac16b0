// A worker's sparse step (dist/sparse_step.hpp) against a table cut over two
// ps of an embedded cluster, over their data planes: the step reads only
// the batch's rows, and each shard gets only its rows' gradients.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "caf/all.hpp"

#include "dist/embedded_cluster.hpp"
#include "dist/sparse_step.hpp"
#include "messages/error.hpp"

using namespace af;
using namespace std::chrono_literals;

namespace {

constexpr int64_t table_rows = 10;
constexpr int64_t width = 2;

/// The whole table's starting value of (id, j).
float start(int64_t id, int64_t j) {
  return 0.1f * static_cast<float>(id * width + j + 1);
}

/// Shard `k` of 2 under mod: ids k, k + 2, ...; row r is id 2r + k.
tensor shard_value(int64_t k) {
  tensor t{dtype::float32, {table_rows / 2, width}};
  for (int64_t r = 0; r < table_rows / 2; ++r)
    for (int64_t j = 0; j < width; ++j)
      t.mutable_data<float>()[r * width + j] = start(2 * r + k, j);
  return t;
}

/// pred_e = sum(row of e) + bias; loss = mean of (pred - label)^2 / 2.
class sum_model : public train::sparse_model {
public:
  std::vector<train::table_spec> tables() const override {
    return {{"emb", table_rows, width, initializer::zeros()}};
  }
  std::vector<train::parameter> dense_parameters() const override {
    return {{"bias", {1}, initializer::zeros()}};
  }
  outcome<train::sparse_step_result> step(const std::vector<tensor>& rows,
                                          const std::vector<std::vector<int32_t>>& index,
                                          const std::vector<tensor>& dense,
                                          const std::vector<float>& labels, bool) override {
    train::sparse_step_result out;
    const auto n = labels.size();
    const float bias = dense[0].data<float>()[0];
    out.row_grads.push_back(tensor::filled(dtype::float32, rows[0].shape(), 0));
    float* g = out.row_grads[0].mutable_data<float>();
    float db = 0;
    for (size_t e = 0; e < n; ++e) {
      const float* row = rows[0].data<float>() + index[0][e] * width;
      float pred = bias;
      for (int64_t j = 0; j < width; ++j)
        pred += row[j];
      float d = (pred - labels[e]) / static_cast<float>(n);
      out.loss += 0.5 * (pred - labels[e]) * (pred - labels[e]) / static_cast<double>(n);
      out.predictions.push_back(pred);
      for (int64_t j = 0; j < width; ++j)
        g[index[0][e] * width + j] += d;
      db += d;
    }
    out.dense_grads.push_back(tensor::filled(dtype::float32, {1}, db));
    return out;
  }
};

/// A link whose one answer is in once `in()` says so; finish() notes its
/// index in `order` and runs `then`.
struct scripted_link final : sparse_ps_link {
  scripted_link(size_t index, std::vector<size_t>& order, std::function<bool()> in,
                std::function<void()> then = {})
    : index(index), order(order), in(std::move(in)), then(std::move(then)) {}
  caf::error start_gather_rows(const std::string&, const tensor&) override { return {}; }
  caf::error start_read(const std::string&) override { return {}; }
  caf::error start_push(uint64_t, const sparse_push_values&) override { return {}; }
  bool await_answer(std::chrono::steady_clock::time_point) override {
    // (A bound: a helper that looked for ever would fail the order check.)
    return ++looks > 1000 || in();
  }
  caf::expected<answer> finish() override {
    order.push_back(index);
    if (then)
      then();
    return answer{};
  }
  size_t index;
  std::vector<size_t>& order;
  std::function<bool()> in;
  std::function<void()> then;
  int looks = 0;
};

} // namespace

// Bug caught: the chief read its pushes' answers in the ps' order. Its push
// to ps 0 waited in a sync round for worker 1, which waited for the chief
// to restore ps 1; ps 1 had died, its connection's end was in, and the
// chief read it only after ps 0's round was abandoned at step_timeout_ms:
// the job failed (a flake of the sparse SIGKILL test). Here ps 0's answer
// comes only once ps 1's has been finished (its recovery).
TEST_CASE("a step's push answers are finished as they come: a dead ps before a round that waits "
          "for its recovery",
          "[sparse_step]") {
  std::vector<size_t> order;
  bool recovered = false;
  scripted_link round{0, order, [&] { return recovered; }};
  scripted_link dead{1, order, [] { return true; }, [&] { recovered = true; }};
  scripted_link untouched{2, order, [] { return true; }};
  std::vector<sparse_ps_link*> links{&round, &dead, &untouched};
  finish_as_answered(links, {1, 1, 0}, [&](size_t p) { REQUIRE(links[p]->finish()); });
  CHECK(order == std::vector<size_t>{1, 0});
  CHECK(untouched.looks == 0); // not asked for: neither looked at nor finished

  // Answers in together go in the ps' order; a lone one without a look.
  order.clear();
  recovered = true;
  finish_as_answered(links, {1, 1, 1}, [&](size_t p) { REQUIRE(links[p]->finish()); });
  CHECK(order == std::vector<size_t>{0, 1, 2});
  order.clear();
  round.looks = 0;
  finish_as_answered(links, {1, 0, 0}, [&](size_t p) { REQUIRE(links[p]->finish()); });
  CHECK(order == std::vector<size_t>{0});
  CHECK(round.looks == 0);
}

TEST_CASE("a sparse step gathers the batch's rows from each shard and pushes each shard its "
          "rows' gradients",
          "[sparse_push][sparse_step]") {
  auto cluster = embedded_cluster::start({{"ps", 2}, {"worker", 1}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  for (int k = 0; k < 2; ++k) {
    auto scope = s->device("/job:ps/task:" + std::to_string(k));
    REQUIRE(s->variable("emb/part_" + std::to_string(k), {table_rows / 2, width},
                        initializer::from_tensor(shard_value(k))));
  }
  {
    auto scope = s->device("/job:ps/task:0");
    REQUIRE(s->variable("bias", {1}, initializer::constant(0.5)));
  }
  REQUIRE_FALSE(s->initialize());
  std::vector<std::unique_ptr<sparse_ps_link>> owned;
  std::vector<sparse_ps_link*> links;
  caf::scoped_actor self{s->system()};
  for (int k = 0; k < 2; ++k) {
    aggregator_spec spec;
    spec.name = "train/ps" + std::to_string(k);
    spec.mode = "async";
    spec.variables = k == 0 ? std::vector<std::string>{"bias", "emb/part_0"}
                            : std::vector<std::string>{"emb/part_1"};
    spec.sparse = {"emb/part_" + std::to_string(k)};
    spec.optimizer.kind = "sgd";
    spec.optimizer.lr = 0.5;
    auto agg = s->aggregator("ps", k, spec);
    REQUIRE(agg);
    std::string token;
    uint64_t last_seq = 0;
    self
      ->request(*agg, 10s, join_atom::value, uint32_t{0}, std::string{"/job:worker/task:0"},
                std::string{"127.0.0.1:1"}, uint32_t{4}, caf::actor{})
      .receive([&](uint64_t, std::string& t, uint64_t seq) { token = t; last_seq = seq; },
               [&](caf::error& e) { FAIL(describe(e)); });
    auto info = s->ping("ps", k);
    REQUIRE(info);
    auto ch = data_channel::connect("127.0.0.1", info->data_port, "ps " + std::to_string(k), 5s);
    REQUIRE(ch);
    owned.push_back(std::make_unique<data_plane_ps_link>(std::move(*ch), spec.name, 0, token,
                                                         last_seq, 10s));
    links.push_back(owned.back().get());
  }
  sparse_layout layout;
  sparse_layout::table emb;
  REQUIRE(kernels::shard_router::make(kernels::partition_strategy::mod, {5, 5}, emb.router).ok());
  emb.shard_vars = {"emb/part_0", "emb/part_1"};
  emb.shard_ps = {0, 1};
  layout.tables.push_back(emb);
  layout.dense_vars = {"bias"};
  layout.dense_ps = {0};
  layout.ps_order = {{{false, 0, 0}, {true, 0, 0}}, {{true, 0, 1}}};
  sum_model model;
  // ids 3 (shard 1, row 1), 4 (shard 0, row 2), 3 again, 7 (shard 1, row 3).
  train::sparse_batch batch;
  batch.ids = {{3, 4, 3, 7}};
  batch.labels = {1, 0, 1, 0};
  auto r = run_sparse_step(model, layout, links, batch, 0);
  REQUIRE(r);
  CHECK(r->global_steps == std::vector<uint64_t>{1, 1});
  CHECK(r->dropped_late == std::vector<bool>{false, false});
  // What the step should have done, from the whole table.
  std::vector<float> want(table_rows * width);
  for (int64_t id = 0; id < table_rows; ++id)
    for (int64_t j = 0; j < width; ++j)
      want[id * width + j] = start(id, j);
  float db = 0;
  for (size_t e = 0; e < batch.labels.size(); ++e) {
    auto id = batch.ids[0][e];
    float d = (0.5f + start(id, 0) + start(id, 1) - batch.labels[e]) / 4.0f;
    db += d;
    for (int64_t j = 0; j < width; ++j)
      want[id * width + j] -= 0.5f * d;
  }
  // Every row of the table, read back by id from its shard (untouched ones too).
  for (int64_t id = 0; id < table_rows; ++id) {
    auto k = id % 2;
    auto got = links[k]->gather_rows("emb/part_" + std::to_string(k),
                                      tensor::filled(dtype::int64, {1}, id / 2));
    REQUIRE(got);
    for (int64_t j = 0; j < width; ++j)
      CHECK(got->data<float>()[j] == Approx(want[id * width + j]).epsilon(1e-6));
  }
  auto bias = links[0]->read("bias");
  REQUIRE(bias);
  CHECK(bias->data<float>()[0] == Approx(0.5f - 0.5f * db));
  CHECK(r->result.predictions.size() == 4);
  // An id outside the table: refused naming it, before any request.
  batch.ids = {{1, 12}};
  batch.labels = {0, 0};
  auto bad = run_sparse_step(model, layout, links, batch, 1);
  REQUIRE_FALSE(bad);
  CHECK(is(bad.error(), af_error::invalid_argument));
  CHECK_THAT(describe(bad.error()), Catch::Contains("table 'emb': ids[1] = 12"));
}

TEST_CASE("requests pipelined on one data channel are answered in order, and a refused one "
          "in between leaves the later answers right",
          "[sparse_step][data_plane]") {
  // Catches: answers matched to the wrong request when several are out on
  // one connection (the sparse step sends every ps all its requests before
  // it reads any answer), an error answer whose text is left in the stream
  // (the next answer would be read from the middle of it) and a channel left
  // waiting for an answer to a request that never went out. (Every request
  // here waits the channel's timeout: the reply wait given back afterwards
  // is tests/test_data_plane_deadlines.cpp's.)
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  {
    auto scope = s->device("/job:ps/task:0");
    REQUIRE(s->variable("emb/part_0", {table_rows / 2, width},
                        initializer::from_tensor(shard_value(0))));
    REQUIRE(s->variable("bias", {1}, initializer::constant(0.5)));
  }
  REQUIRE_FALSE(s->initialize());
  auto info = s->ping("ps", 0);
  REQUIRE(info);
  auto ch = data_channel::connect("127.0.0.1", info->data_port, "ps 0", 5s);
  REQUIRE(ch);
  auto& c = **ch;
  auto ids = [](std::vector<int64_t> v) {
    tensor t{dtype::int64, {static_cast<int64_t>(v.size())}};
    std::memcpy(t.mutable_data<int64_t>(), v.data(), v.size() * sizeof(int64_t));
    return t;
  };
  for (int round = 0; round < 50; ++round) {
    REQUIRE_FALSE(c.send_gather_rows("emb/part_0", ids({4, 0})));
    REQUIRE_FALSE(c.send_read("bias"));
    REQUIRE_FALSE(c.send_gather_rows("emb/part_0", ids({1, 99}))); // row 99: refused
    REQUIRE_FALSE(c.send_gather_rows("no_such_table", ids({0})));  // refused
    REQUIRE_FALSE(c.send_gather_rows("emb/part_0", ids({2})));
    CHECK(c.in_flight() == 5);
    auto a = c.next_reply();
    REQUIRE(a);
    REQUIRE(a->value.num_elements() == 2 * width);
    for (int64_t j = 0; j < width; ++j) {
      CHECK(a->value.data<float>()[j] == start(8, j)); // row 4 of shard 0: id 8
      CHECK(a->value.data<float>()[width + j] == start(0, j));
    }
    auto b = c.next_reply();
    REQUIRE(b);
    REQUIRE(b->value.num_elements() == 1);
    CHECK(b->value.data<float>()[0] == 0.5f);
    auto bad = c.next_reply();
    REQUIRE_FALSE(bad);
    CHECK(is(bad.error(), af_error::invalid_argument));
    CHECK_THAT(describe(bad.error()), Catch::Contains("99"));
    auto missing = c.next_reply();
    REQUIRE_FALSE(missing);
    CHECK(is(missing.error(), af_error::not_found));
    auto last = c.next_reply();
    REQUIRE(last);
    REQUIRE(last->value.num_elements() == width);
    CHECK(last->value.data<float>()[0] == start(4, 0));
    CHECK(c.in_flight() == 0);
    CHECK_FALSE(c.broken());
  }
  // No request out: an answer asked for is an error, not a wait.
  auto none = c.next_reply();
  REQUIRE_FALSE(none);
  CHECK(is(none.error(), af_error::internal));
  // The channel's blocking calls go on as before on the same connection.
  auto v = c.gather_rows("emb/part_0", ids({3}));
  REQUIRE(v);
  CHECK(v->first.data<float>()[0] == start(6, 0));
}
