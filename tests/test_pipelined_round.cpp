// The pipelined sync round's core (dist/pipelined_round.hpp) without actors
// or sockets: chunks averaged and applied as every member's copy arrives,
// against the store-and-forward release (aggregation_round's mean_into into
// variable_cell::apply_gradient_by, as update_all_by_mean does it).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "actors/variable.hpp"
#include "dist/aggregation_round.hpp"
#include "dist/pipelined_round.hpp"
#include "messages/error.hpp"
#include "train/optimizer.hpp"

using namespace af;

namespace {

/// The 1 M workload's shape, scaled down: w [n] and b [1].
struct model {
  std::shared_ptr<variable_cell> w, b;

  explicit model(size_t n) {
    w = std::make_shared<variable_cell>(
      variable_spec{"w", dtype::float32, {static_cast<int64_t>(n)}, "/job:ps/task:0"});
    b = std::make_shared<variable_cell>(variable_spec{"b", dtype::float32, {1}, "/job:ps/task:0"});
    REQUIRE(w->initialize(initializer::constant(0.25f), false, ""));
    REQUIRE(b->initialize(initializer::constant(-0.5f), false, ""));
  }

  size_t n() const { return w->spec().shape[0]; }

  /// Value and slots, as bytes, of both variables.
  std::vector<std::byte> bytes(const std::vector<std::string>& slots) const {
    std::vector<std::byte> out;
    for (const auto* c : {w.get(), b.get()}) {
      auto snap = c->snapshot(slots);
      REQUIRE(snap);
      auto add = [&](const tensor& t) {
        out.insert(out.end(), t.bytes(), t.bytes() + t.nbytes());
      };
      add(snap->first);
      for (const auto& s : snap->second)
        add(s);
    }
    return out;
  }

  std::vector<pipelined_round::variable> vars() const {
    return {{w.get(), "w", 0, n()}, {b.get(), "b", n(), 1}};
  }
};

/// One member's gradient of one step: floats spanning magnitudes, so that
/// the order of additions shows in the bits.
std::vector<float> gradient(size_t total, uint32_t seed) {
  std::vector<float> g(total);
  for (auto& x : g) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(seed)) * std::ldexp(1.0f, int(seed % 24) - 40);
  }
  return g;
}

/// The store-and-forward release: the pushes summed in `order`, the mean
/// made and applied block by block to each variable (update_all_by_mean).
void store_and_forward(model& m, const train::optimizer_spec& opt,
                       const std::vector<std::vector<float>>& grads,
                       const std::vector<size_t>& order, uint64_t step) {
  const size_t total = m.n() + 1;
  aggregation_round<int> round{static_cast<uint32_t>(grads.size()), total};
  const std::vector<size_t> offsets{0, m.n()}, sizes{m.n(), 1};
  for (auto w : order)
    round.add({grads[w].data(), grads[w].data() + m.n()}, offsets, sizes,
              std::make_shared<int>(0));
  size_t base = 0;
  for (auto* cell : {m.w.get(), m.b.get()}) {
    size_t n = cell->spec().shape[0];
    REQUIRE_FALSE(cell->apply_gradient_by(
      opt, [&](size_t offset, size_t k, float* out) { round.mean_into(base + offset, k, out); },
      n, step, nullptr, true)); // spread, as update_all_by_mean: w is split across the cores
    base += n;
  }
}

/// The pipelined round of the same pushes, each member's arriving in
/// pieces of uneven sizes, interleaved in a shuffled order.
void pipelined(model& m, const train::optimizer_spec& opt,
               const std::vector<std::vector<float>>& grads, uint64_t step, uint32_t seed,
               size_t* answered_before_last = nullptr) {
  const size_t total = m.n() + 1;
  std::vector<uint32_t> members;
  for (uint32_t w = 0; w < grads.size(); ++w)
    members.push_back(w);
  pipelined_round r;
  REQUIRE_FALSE(r.begin(m.vars(), opt, train::slot_names(opt.kind), step, members));
  std::mt19937 rng{seed};
  std::vector<size_t> at(grads.size(), 0);
  size_t left = grads.size();
  while (left > 0) {
    uint32_t w = rng() % grads.size();
    if (at[w] == total)
      continue;
    size_t n = std::min<size_t>(total - at[w], 1 + rng() % 40000);
    std::memcpy(r.buffer(w) + at[w], grads[w].data() + at[w], n * sizeof(float));
    at[w] += n;
    if (at[w] == total) {
      left -= 1;
      if (left == 0 && answered_before_last != nullptr)
        *answered_before_last = r.ready_floats();
    }
    r.arrived(w, at[w]);
  }
  REQUIRE(r.applied() == r.chunks());
  // The answer is the new values, as the cells hold them after commit.
  std::vector<iovec> pieces;
  r.answer_pieces(0, total, pieces);
  std::vector<float> answer;
  for (const auto& p : pieces) {
    const auto* f = static_cast<const float*>(p.iov_base);
    answer.insert(answer.end(), f, f + p.iov_len / sizeof(float));
  }
  REQUIRE_FALSE(r.commit());
  REQUIRE(r.state() == pipelined_round::phase::committed);
  std::vector<float> now(total);
  REQUIRE_FALSE(m.w->copy_floats(now.data(), m.n()));
  REQUIRE_FALSE(m.b->copy_floats(now.data() + m.n(), 1));
  CHECK(std::memcmp(answer.data(), now.data(), total * sizeof(float)) == 0);
}

train::optimizer_spec optimizer(const std::string& kind) {
  train::optimizer_spec opt;
  opt.kind = kind;
  opt.lr = 0.1;
  opt.momentum = 0.9;
  return opt;
}

} // namespace

TEST_CASE("a pipelined round gives the store-and-forward round's bits at every step, 2 and 3 "
          "members, sgd and momentum",
          "[aggregator][pipeline]") {
  // Catches: a chunk applied before every member's copy of it arrived (the
  // mean of a partly written push), a block cut or offset wrong across the
  // chunk and variable boundaries (w's end, b), the mean summed in another
  // order than the store-and-forward round's, the optimizer's slots not
  // carried from one step to the next, or an answer other than the values
  // installed: each gives other bytes than store-and-forward.
  const auto members = GENERATE(2, 3);
  const auto kind = GENERATE(std::string{"sgd"}, std::string{"momentum"});
  CAPTURE(members, kind);
  const size_t n = 300000;
  auto opt = optimizer(kind);
  auto slots = train::slot_names(kind);
  model a{n}, b{n};
  for (uint64_t step = 0; step < 4; ++step) {
    std::vector<std::vector<float>> grads;
    for (int w = 0; w < members; ++w)
      grads.push_back(gradient(n + 1, static_cast<uint32_t>(1000 * step + 17 * w + 1)));
    // store-and-forward sums in arrival order: for 2 members either order
    // gives the same bits; for 3 the pipelined round sums in worker order.
    std::vector<size_t> order;
    for (int w = 0; w < members; ++w)
      order.push_back(members == 2 ? static_cast<size_t>(1 - w) : static_cast<size_t>(w));
    store_and_forward(a, opt, grads, order, step);
    pipelined(b, opt, grads, step, static_cast<uint32_t>(step + 7));
    auto want = a.bytes(slots), got = b.bytes(slots);
    REQUIRE(want.size() == got.size());
    CHECK(std::memcmp(want.data(), got.data(), want.size()) == 0);
    CHECK(a.w->info().version == b.w->info().version);
  }
}

TEST_CASE("a pipelined round answers chunks before the last push has fully arrived",
          "[aggregator][pipeline]") {
  // Catches: a round that applies only once every push is whole (store and
  // forward again): nothing would be ready to stream back before the end.
  const size_t n = 300000;
  auto opt = optimizer("sgd");
  model m{n};
  std::vector<std::vector<float>> grads{gradient(n + 1, 1), gradient(n + 1, 2)};
  size_t ready = 0;
  pipelined(m, opt, grads, 0, 3, &ready);
  CHECK(ready > 0);
}

TEST_CASE("an aborted pipelined round leaves every value, slot and version as they were, and the "
          "next round works",
          "[aggregator][pipeline]") {
  // Catches: an update written into the variables as chunks close (a member
  // that dies half way leaves a half-updated model), slots moved by an
  // aborted round, or a round that cannot start again after an abort.
  const size_t n = 300000;
  auto opt = optimizer("momentum");
  auto slots = train::slot_names("momentum");
  model a{n}, b{n};
  std::vector<std::vector<float>> first{gradient(n + 1, 5), gradient(n + 1, 6)};
  store_and_forward(a, opt, first, {0, 1}, 0);
  pipelined(b, opt, first, 0, 9);
  auto before = b.bytes(slots);
  auto version = b.w->info().version;
  {
    pipelined_round r;
    REQUIRE_FALSE(r.begin(b.vars(), opt, slots, 1, {0, 1}));
    auto g = gradient(n + 1, 77);
    std::memcpy(r.buffer(0), g.data(), (n + 1) * sizeof(float));
    r.arrived(0, n + 1);
    std::memcpy(r.buffer(1), g.data(), (n / 2) * sizeof(float));
    r.arrived(1, n / 2); // half of member 1's push: half the chunks applied
    CHECK(r.applied() > 0);
    r.abort(make_error(af_error::peer_down, "worker 1 stopped in the middle of its push"));
    CHECK(r.state() == pipelined_round::phase::aborted);
    CHECK(r.commit()); // an aborted round installs nothing
  }
  auto after = b.bytes(slots);
  REQUIRE(before.size() == after.size());
  CHECK(std::memcmp(before.data(), after.data(), before.size()) == 0);
  CHECK(b.w->info().version == version);
  // The next round, from the same state on both sides, still agrees.
  std::vector<std::vector<float>> next{gradient(n + 1, 11), gradient(n + 1, 12)};
  store_and_forward(a, opt, next, {1, 0}, 1);
  pipelined(b, opt, next, 1, 13);
  auto want = a.bytes(slots), got = b.bytes(slots);
  CHECK(std::memcmp(want.data(), got.data(), want.size()) == 0);
}

TEST_CASE("a pipelined round whose variable was assigned meanwhile installs nothing and says so",
          "[aggregator][pipeline]") {
  // Catches: a commit that overwrites an assign made during the round (the
  // round's update was made from the value before it).
  const size_t n = 1000;
  auto opt = optimizer("sgd");
  model m{n};
  pipelined_round r;
  REQUIRE_FALSE(r.begin(m.vars(), opt, {}, 0, {0}));
  std::vector<float> g(n + 1, 1.0f);
  std::memcpy(r.buffer(0), g.data(), g.size() * sizeof(float));
  r.arrived(0, n + 1);
  REQUIRE(r.applied() == r.chunks());
  auto v = tensor::filled(dtype::float32, {static_cast<int64_t>(n)}, 3.0f);
  REQUIRE(m.w->apply(var_op::assign, v, false));
  auto err = r.commit();
  REQUIRE(err);
  CHECK(describe(err).find("'w' was assigned during the round") != std::string::npos);
  std::vector<float> now(n);
  REQUIRE_FALSE(m.w->copy_floats(now.data(), n));
  CHECK(now[0] == 3.0f);
}
