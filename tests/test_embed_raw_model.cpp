// The raw baseline of train_embed_10m_2w (bench/embed_raw_model.hpp): its
// workers must read the sparse job's batches, or the line sets the job
// against other work (other rows, other cache behaviour).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "bench/embed_raw_model.hpp"
#include "train/config.hpp"
#include "train/local.hpp"
#include "train/recommender.hpp"

namespace {

using af::bench::click_batches;

/// The job's config of the line, small: users x (dim + 1), items 3, zipf 0.
af::train::train_config job_config(uint64_t seed) {
  af::train::train_config c;
  c.model = "recommender";
  c.data = "synthetic";
  c.users = 5000;
  c.items = 3;
  c.dim = 7;
  c.zipf = 0;
  c.synthetic_examples = 600;
  c.holdout = 0.2;
  c.seed = seed;
  c.batch_size = 16;
  return c;
}

} // namespace

TEST_CASE("train_embed_10m_2w raw workers: their batches are the sparse job's, across epochs",
          "[embed]") {
  // Catches: a raw worker reading other clicks (another data spec or seed),
  // another order, or another worker's share of a global batch than
  // dist/sparse_job.cpp's train_loop (positions (step * workers + task) *
  // batch of train::example_order with the job's seed).
  const auto c = job_config(11);
  auto job = af::train::load_clicks(c);
  REQUIRE(job);
  const auto& train = job->data.train;
  const uint32_t workers = 2;
  for (uint32_t rank = 0; rank < workers; ++rank) {
    click_batches::spec s;
    s.users = c.users;
    s.width = c.dim + 1;
    s.examples = c.synthetic_examples;
    s.seed = c.seed;
    s.batch = static_cast<size_t>(c.batch_size);
    s.rank = rank;
    s.workers = workers;
    auto raw = click_batches::make(s);
    REQUIRE(raw);
    af::train::example_order order(train.labels.size(), c.seed);
    std::vector<size_t> picks;
    // 480 training examples, 32 a global step: 15 steps an epoch, 4 epochs.
    for (uint64_t step = 0; step < 60; ++step) {
      order.positions((step * workers + rank) * s.batch, s.batch, picks);
      std::vector<int64_t> users;
      std::vector<int32_t> items;
      std::vector<float> labels;
      for (auto p : picks) {
        users.push_back(train.ids[af::train::recommender::user_table][p]);
        items.push_back(static_cast<int32_t>(train.ids[af::train::recommender::item_table][p]));
        labels.push_back(train.labels[p]);
      }
      INFO("rank " << rank << ", step " << step);
      REQUIRE(raw->users(step) == users);
      CHECK(raw->items() == items);
      CHECK(raw->labels() == labels);
    }
  }
}

TEST_CASE("train_embed_10m_2w raw workers: both raw runs read the rep's job's clicks", "[embed]") {
  // Catches: the raw workers seeded with their own run's number (other
  // clicks, in another order, than the job they are set against), and the
  // transport-only run drawing its ids uniformly from the whole table
  // (other rows than the job's: a 2.56 GB working set against the clicks'
  // users, which fit the cache far better).
  for (bool model : {true, false}) {
    auto args = af::bench::raw_train_worker_args(1, 8, 7, model, 262144);
    auto has = [&](const std::string& w) {
      return std::find(args.begin(), args.end(), w) != args.end();
    };
    INFO("model " << model);
    CHECK(has("rank=1"));
    CHECK(has("run=8"));
    CHECK(has("seed=7"));
    CHECK(has("ids=clicks"));
    CHECK(has("examples=262144"));
    CHECK(has(model ? "model=fm" : "model=none"));
  }
}
