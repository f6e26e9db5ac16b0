// A prepared step run on its caller's thread (actors/step_here.hpp): which
// steps may, that the values are the executor's bit for bit, and its errors.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "caf/all.hpp"

#include "actors/node_watch.hpp"
#include "actors/step_here.hpp"
#include "dist/embedded_cluster.hpp"
#include "messages/error.hpp"
#include "train/config.hpp"
#include "train/local.hpp"
#include "train/model.hpp"

using namespace af;
using namespace std::chrono_literals;

namespace {

/// The digits MLP's worker step (loss, then gradients) prepared on
/// `device` of a session of worker 0, with the feeds of its first batch.
struct mlp_step {
  std::shared_ptr<prepared_step> step;
  std::map<int32_t, tensor> feeds;
  std::vector<int32_t> fetches;
};

mlp_step prepare_mlp(session& s, const std::string& device) {
  train::train_config c;
  c.model = "mlp";
  c.hidden = {16};
  c.data = "digits";
  auto data = train::load_data(c);
  REQUIRE(data);
  auto params = train::parameters("mlp", data->train.features, data->train.classes, c.hidden, 7);
  REQUIRE(params);
  mlp_step out;
  train::replica r;
  {
    auto scope = s.device(device);
    REQUIRE(scope);
    auto built = train::build_replica(s.builder(), *params, "mlp", "replica/");
    REQUIRE(built);
    r = std::move(*built);
  }
  std::vector<output> fetches{r.loss};
  fetches.insert(fetches.end(), r.grads.begin(), r.grads.end());
  for (auto f : fetches)
    out.fetches.push_back(f.id);
  auto step = s.prepare(fetches);
  REQUIRE(step);
  out.step = *step;
  auto values = train::initial_values(*params);
  REQUIRE(values);
  train::batcher batches{data->train, 32, 0, 1, 7};
  for (auto& f : train::feeds(r, *values, batches.at(0)))
    out.feeds[f.first.id] = std::move(f.second);
  return out;
}

/// The step's outputs through the executor (a step_runner in an actor of `sys`).
step_outputs through_executor(caf::actor_system& sys, const mlp_step& m) {
  struct box_t {
    std::mutex mtx;
    std::condition_variable cv;
    std::optional<caf::expected<step_outputs>> out;
  };
  auto box = std::make_shared<box_t>();
  sys.spawn([step = m.step, feeds = m.feeds, box](caf::event_based_actor* self) {
    auto runner = std::make_shared<step_runner>();
    self->set_down_handler([self, runner](caf::down_msg& dm) { runner->on_down(self, dm); });
    runner->run(self, step, feeds, false, [self, box, runner](caf::expected<step_outputs> r) {
      std::lock_guard<std::mutex> guard{box->mtx};
      box->out = std::move(r);
      box->cv.notify_all();
      self->quit();
    });
    return caf::behavior{[](int) {}};
  });
  std::unique_lock<std::mutex> lock{box->mtx};
  REQUIRE(box->cv.wait_for(lock, 20s, [&] { return box->out.has_value(); }));
  REQUIRE(*box->out);
  return std::move(**box->out);
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.type() == b.type() && a.shape() == b.shape()
         && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

} // namespace

TEST_CASE("a worker's step on its own CPU runs on the caller's thread with the executor's bits",
          "[runtime][step-here]") {
  // Catches: a step the in-thread path takes but computes otherwise than the
  // executor (another kernel, order or backend: the job's parameters would
  // drift from a run through the executor), or a step it should take and
  // does not (no gain).
  auto ec = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(ec);
  auto s = (*ec)->session_for("worker", 0);
  REQUIRE(s);
  auto m = prepare_mlp(*s, "/job:worker/task:0");
  auto& sys = (*ec)->system("worker", 0);
  auto here = step_here::make(m.step, sys.node());
  REQUIRE(here != nullptr);
  CHECK(here->device().find("/job:worker/replica:0/task:0/device:CPU:0") != std::string::npos);
  auto ours = here->run(m.feeds);
  REQUIRE(ours);
  auto theirs = through_executor(sys, m);
  for (auto id : m.fetches) {
    CAPTURE(id);
    REQUIRE(ours->values.count(id) == 1);
    REQUIRE(theirs.values.count(id) == 1);
    CHECK(same_bits(ours->values.at(id), theirs.values.at(id)));
  }
  // A second run with the same feeds: the same values again (nothing kept
  // from the first run changes the second).
  auto again = here->run(m.feeds);
  REQUIRE(again);
  for (auto id : m.fetches)
    CHECK(same_bits(again->values.at(id), ours->values.at(id)));
  CHECK(here->runs() == 2);
}

TEST_CASE("a step on another node, or reading a variable, goes to the executor",
          "[runtime][step-here]") {
  // Catches an in-thread path taken where it cannot hold: a step placed on
  // another node's device (its executor is elsewhere), or one that reads a
  // variable (only the executor asks the variable's actor for it).
  auto ec = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(ec);
  auto s = (*ec)->session_for("worker", 0);
  REQUIRE(s);
  auto& sys = (*ec)->system("worker", 0);
  SECTION("placed on the ps") {
    auto m = prepare_mlp(*s, "/job:ps/task:0");
    CHECK(step_here::make(m.step, sys.node()) == nullptr);
    // ... and on the ps's own node it would run there.
    CHECK(step_here::make(m.step, (*ec)->system("ps", 0).node()) != nullptr);
  }
  SECTION("reading a variable") {
    output y;
    {
      auto d = s->device("/job:worker/task:0");
      REQUIRE(d);
      auto w = s->variable("w", {2}, initializer::constant(3));
      REQUIRE(w);
      y = s->mul(*w, s->placeholder("x"));
    }
    REQUIRE(!s->initialize());
    auto step = s->prepare({y});
    REQUIRE(step);
    CHECK(step_here::make(*step, sys.node()) == nullptr);
  }
}

TEST_CASE("a step run on the caller's thread says which placeholder it lacks, and runs after",
          "[runtime][step-here]") {
  // Catches a missing feed that crashes (a map lookup of a value never
  // computed) or leaves the run's values behind for the next run.
  auto ec = embedded_cluster::start({{"worker", 1}});
  REQUIRE(ec);
  auto s = (*ec)->session_for("worker", 0);
  REQUIRE(s);
  auto m = prepare_mlp(*s, "/job:worker/task:0");
  auto here = step_here::make(m.step, (*ec)->system("worker", 0).node());
  REQUIRE(here != nullptr);
  auto partial = m.feeds;
  partial.erase(partial.begin());
  auto bad = here->run(partial);
  REQUIRE(!bad);
  CHECK(describe(bad.error()).find("needs a value") != std::string::npos);
  CHECK(here->runs() == 0);
  auto good = here->run(m.feeds);
  CHECK(good);
}

TEST_CASE("a step run on the caller's thread counts in its executor's step latency",
          "[runtime][step-here]") {
  // Catches the worker's steps missing from actorflow_step_latency_seconds
  // (docs/watching.md): run here, they never reach the executor, whose
  // histogram a training node's dashboard reads; a failed run is not a step.
  auto ec = embedded_cluster::start({{"worker", 1}});
  REQUIRE(ec);
  auto s = (*ec)->session_for("worker", 0);
  REQUIRE(s);
  auto m = prepare_mlp(*s, "/job:worker/task:0");
  auto here = step_here::make(m.step, (*ec)->system("worker", 0).node());
  REQUIRE(here != nullptr);
  auto exec = caf::actor_cast<caf::actor_addr>(m.step->partitions.front().exec);
  auto latency = step_latency_of(exec, false);
  REQUIRE(latency != nullptr);
  auto before = latency->read().count;
  REQUIRE(here->run(m.feeds));
  REQUIRE(here->run(m.feeds));
  auto partial = m.feeds;
  partial.erase(partial.begin());
  REQUIRE(!here->run(partial));
  auto after = latency->read();
  CHECK(after.count == before + 2);
  CHECK(after.sum_s > 0);
}
