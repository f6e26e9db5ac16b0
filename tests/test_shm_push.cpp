// A push read in place from the shared-memory ring (issue 24), end to end:
// the aggregator gets the ring's bytes, the piece-by-piece non-finite check
// still runs on them, and the round's answer is the same as a copied push's.
// The ring alone is in test_shm_in_place.cpp (actorflow-net-tests).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "caf/all.hpp"

#include "core/wire_format.hpp"
#include "dist/embedded_cluster.hpp"
#include "dist/training.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "members.hpp"

using namespace af;
using namespace std::chrono_literals;

TEST_CASE("on shared memory a push read in place with a non-finite float in a later piece is "
          "refused naming it, and finite pushes across the ring's end update every float",
          "[shm][members][plane]") {
  // Catches: the in-place read skipping the piece-by-piece check (the NaN
  // applied), and a payload that wraps around the ring's end read wrong.
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  constexpr int64_t n = 300000; // 1.2 MB: pieces of 64 K floats, the NaN in the fifth
  {
    auto scope = s->device("/job:ps/task:0");
    REQUIRE(s->variable("w", {n - 3}, initializer::constant(1)));
    REQUIRE(s->variable("b", {3}, initializer::constant(1)));
  }
  REQUIRE_FALSE(s->initialize());
  aggregator_spec spec;
  spec.name = "test/in_place";
  spec.mode = GENERATE(as<std::string>{}, "sync", "async");
  spec.variables = {"w", "b"};
  spec.workers = 1;
  spec.optimizer.lr = 1.0;
  auto agg = s->aggregator("ps", 0, spec);
  REQUIRE(agg);
  caf::scoped_actor self{s->system()};
  auto token = test::join_for_token(self, *agg, 0);
  auto info = s->ping("ps", 0);
  REQUIRE(info);
  auto chan = data_channel::connect("127.0.0.1", info->data_port, "ps", 5s);
  REQUIRE(chan);
  // A pull first: the connection moves to shared memory after an answer.
  REQUIRE((*chan)->aggregate(wire::kind::pull, spec.name, 0, 0, {}, 10s));
  REQUIRE_FALSE((*chan)->settle());
  if ((*chan)->transport() != "shared memory") {
    WARN("on " << (*chan)->transport() << " (ACTORFLOW_DATA_SHM=off?): nothing is read in place");
    return;
  }
  auto grad = tensor::filled(dtype::float32, {n}, 0.5f);
  grad.mutable_data<float>()[n - 1] = std::numeric_limits<float>::quiet_NaN();
  auto r = (*chan)->aggregate(wire::kind::push, spec.name, 0, 0, {grad}, 10s, token, 1);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::non_finite));
  CHECK_THAT(describe(r.error()), Catch::Contains("'b'") && Catch::Contains("element 2 "));
  // Finite pushes on the same connection: 4 MiB of ring, 1.2 MB a push, so
  // the fourth wraps around its end. Each takes 1/8 off every float.
  for (int k = 1; k <= 6; ++k) {
    INFO("push " << k);
    auto ok = (*chan)->aggregate(wire::kind::push, spec.name, 0, static_cast<uint64_t>(k - 1),
                                 {tensor::filled(dtype::float32, {n}, 0.125f)}, 10s, token,
                                 static_cast<uint64_t>(k + 1));
    REQUIRE(ok);
    REQUIRE(ok->second.num_elements() == static_cast<size_t>(n));
    const float* p = ok->second.data<float>();
    CHECK(std::count(p, p + n, 1.0f - 0.125f * static_cast<float>(k)) == n);
  }
  CHECK((*chan)->transport() == "shared memory");
}

TEST_CASE("sync answers read in place from shared memory's answer slots are the bits a TCP "
          "connection gets, while the worker holds the last ones",
          "[shm][members][plane]") {
  // Catches: answers never used in place (answers_in_place stays 0), and an
  // answer in a slot that differs from the one the ring or socket carries
  // (a slot written while held, a wrong slot named).
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  constexpr int64_t n = 300000;
  {
    auto scope = s->device("/job:ps/task:0");
    for (const char* v : {"w_shm", "w_tcp"})
      REQUIRE(s->variable(v, {n - 1}, initializer::constant(1)));
    for (const char* v : {"b_shm", "b_tcp"})
      REQUIRE(s->variable(v, {1}, initializer::constant(1)));
  }
  REQUIRE_FALSE(s->initialize());
  caf::scoped_actor self{s->system()};
  auto info = s->ping("ps", 0);
  REQUIRE(info);
  struct side {
    std::string name;
    std::unique_ptr<data_channel> chan;
    std::string token;
  };
  std::vector<side> sides;
  for (bool shm : {true, false}) {
    aggregator_spec spec;
    spec.name = shm ? "test/answers_shm" : "test/answers_tcp";
    spec.mode = "sync";
    spec.variables = {shm ? "w_shm" : "w_tcp", shm ? "b_shm" : "b_tcp"};
    spec.workers = 1;
    spec.optimizer.lr = 0.1;
    auto agg = s->aggregator("ps", 0, spec);
    REQUIRE(agg);
    auto token = test::join_for_token(self, *agg, 0);
    auto chan = data_channel::connect("127.0.0.1", info->data_port, "ps", 5s, {}, nullptr,
                                      nullptr, shm);
    REQUIRE(chan);
    REQUIRE((*chan)->aggregate(wire::kind::pull, spec.name, 0, 0, {}, 10s));
    REQUIRE_FALSE((*chan)->settle());
    sides.push_back({spec.name, std::move(*chan), token});
  }
  if (sides[0].chan->transport() != "shared memory") {
    WARN("on " << sides[0].chan->transport() << " (ACTORFLOW_DATA_SHM=off?): nothing in place");
    return;
  }
  REQUIRE(sides[1].chan->transport() == "tcp");
  std::vector<tensor> held; // a worker's parameters: the last answer, kept while the next comes
  for (int k = 1; k <= 6; ++k) {
    INFO("push " << k);
    auto grad = tensor::filled(dtype::float32, {n}, 0.0f);
    float* g = grad.mutable_data<float>();
    for (int64_t i = 0; i < n; ++i)
      g[i] = static_cast<float>((i * k) % 97) * 0.013f - 0.6f;
    std::vector<tensor> answers;
    for (auto& sd : sides) {
      auto r = sd.chan->aggregate(wire::kind::push, sd.name, 0, static_cast<uint64_t>(k - 1),
                                  {grad}, 10s, sd.token, static_cast<uint64_t>(k + 1));
      REQUIRE(r);
      REQUIRE(r->second.nbytes() == static_cast<size_t>(n) * sizeof(float));
      answers.push_back(std::move(r->second));
    }
    CHECK(std::memcmp(answers[0].bytes(), answers[1].bytes(), answers[0].nbytes()) == 0);
    if (!held.empty()) // the answer held meanwhile did not change
      CHECK(std::memcmp(held[0].bytes(), held[1].bytes(), held[0].nbytes()) == 0);
    held = std::move(answers);
  }
  CHECK(sides[0].chan->answers_in_place() == 6);
  CHECK(sides[1].chan->answers_in_place() == 0);
}

TEST_CASE("a push's answer written from the variables' own buffers is the flat answer's bits, on "
          "shared memory and on TCP, sync and async, and answers held do not change",
          "[shm][members][plane]") {
  // Catches: the data plane's answer from the variables' tensors (answer_parts,
  // no flat copy) written in another order, a piece missed or written twice,
  // into the slot or the socket, a header that does not describe it; and an
  // update that writes into a buffer an answer still shares. The CAF push is
  // the flat answer, made as before, of a twin aggregator given the same pushes.
  const std::string mode = GENERATE(as<std::string>{}, "sync", "async");
  auto cluster = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(cluster);
  auto s = (*cluster)->session_for("worker", 0);
  REQUIRE(s);
  constexpr int64_t n = 300000; // three variables: w, a small middle one, b
  const std::vector<std::string> sides_names = {"shm", "tcp", "caf"};
  {
    auto scope = s->device("/job:ps/task:0");
    for (const auto& side : sides_names) {
      REQUIRE(s->variable("w_" + side, {n - 5}, initializer::constant(1)));
      REQUIRE(s->variable("m_" + side, {3}, initializer::constant(-2)));
      REQUIRE(s->variable("b_" + side, {2}, initializer::constant(0.5)));
    }
  }
  REQUIRE_FALSE(s->initialize());
  caf::scoped_actor self{s->system()};
  auto info = s->ping("ps", 0);
  REQUIRE(info);
  struct side {
    std::string name;
    std::unique_ptr<data_channel> chan; // null: pushed over CAF (the flat answer)
    aggregator_actor agg;
    std::string token;
  };
  std::vector<side> sides;
  for (const auto& which : sides_names) {
    aggregator_spec spec;
    spec.name = "test/parts_" + which;
    spec.mode = mode;
    spec.variables = {"w_" + which, "m_" + which, "b_" + which};
    spec.workers = 1;
    spec.optimizer.kind = "momentum";
    spec.optimizer.lr = 0.05;
    spec.optimizer.momentum = 0.9;
    auto agg = s->aggregator("ps", 0, spec);
    REQUIRE(agg);
    auto token = test::join_for_token(self, *agg, 0);
    std::unique_ptr<data_channel> chan;
    if (which != "caf") {
      auto c = data_channel::connect("127.0.0.1", info->data_port, "ps", 5s, {}, nullptr, nullptr,
                                     which == "shm");
      REQUIRE(c);
      REQUIRE((*c)->aggregate(wire::kind::pull, spec.name, 0, 0, {}, 10s));
      REQUIRE_FALSE((*c)->settle());
      chan = std::move(*c);
    }
    sides.push_back({spec.name, std::move(chan), *agg, token});
  }
  // The second side is never on shared memory; both are on UCX where the
  // ctest forces it (the same answers through its gather writes).
  bool on_shm = sides[0].chan->transport() == "shared memory";
  if (!on_shm)
    WARN("on " << sides[0].chan->transport() << " (ACTORFLOW_DATA_SHM=off?): both sides on it");
  REQUIRE(sides[1].chan->transport() != "shared memory");
  std::vector<tensor> held; // the last answers, kept while the next come (a worker's parameters)
  constexpr int steps = 12;
  for (int k = 1; k <= steps; ++k) {
    INFO(mode << " push " << k);
    auto grad = tensor::filled(dtype::float32, {n}, 0.0f);
    float* g = grad.mutable_data<float>();
    for (int64_t i = 0; i < n; ++i)
      g[i] = static_cast<float>((i * k + 7 * i) % 101) * 0.011f - 0.55f;
    std::vector<tensor> answers;
    for (auto& sd : sides) {
      auto step = static_cast<uint64_t>(k - 1);
      auto seq = static_cast<uint64_t>(k);
      if (sd.chan) {
        auto r = sd.chan->aggregate(wire::kind::push, sd.name, 0, step, {grad}, 10s, sd.token, seq);
        REQUIRE(r);
        CHECK(r->first == static_cast<uint64_t>(k));
        answers.push_back(std::move(r->second));
        continue;
      }
      tensor flat;
      std::string failed;
      self
        ->request(sd.agg, 10s, push_atom::value, uint32_t{0}, step,
                  push_credentials{sd.token, seq, "test"}, std::vector<tensor>{grad})
        .receive([&](uint64_t, tensor& p, bool) { flat = std::move(p); },
                 [&](caf::error& e) { failed = describe(e); });
      REQUIRE(failed.empty());
      answers.push_back(std::move(flat));
    }
    for (size_t i = 0; i < answers.size(); ++i) {
      INFO("over " << sides_names[i]);
      REQUIRE(answers[i].type() == dtype::float32);
      REQUIRE(answers[i].shape() == shape_type{n});
      CHECK(std::memcmp(answers[i].bytes(), answers[2].bytes(), answers[2].nbytes()) == 0);
    }
    if (!held.empty()) {
      // The parameters moved on (each answer is its step's) ...
      CHECK(std::memcmp(held[2].bytes(), answers[2].bytes(), answers[2].nbytes()) != 0);
      // ... and the answers held meanwhile did not change.
      for (size_t i = 0; i < held.size(); ++i)
        CHECK(std::memcmp(held[i].bytes(), held[2].bytes(), held[2].nbytes()) == 0);
    }
    held = std::move(answers);
  }
  if (on_shm)
    CHECK(sides[0].chan->answers_in_place() == steps);
}
