// The runtime's failure semantics inside one process: executor deadlines,
// graph ownership and ids, sessions that end.
#include <catch2/catch.hpp>

#include <chrono>
#include <mutex>
#include <thread>

#include "caf/all.hpp"

#include "actors/embedded_cluster.hpp"
#include "actors/executor.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "kernels/kernels.hpp"
#include "messages/error.hpp"

using namespace std::chrono_literals;

namespace af {

namespace {

template <class F>
bool eventually(F cond, std::chrono::milliseconds timeout = 10s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

struct executor_fixture {
  executor_fixture() : cfg(node_options{}), sys(cfg) {
    exec = sys.spawn(executor_impl, std::string{"/job:t/replica:0/task:0/device:CPU:0"},
                     std::shared_ptr<kernels::backend>{kernels::make_cpu_backend()},
                     std::shared_ptr<kernels::backend>{});
  }
  ~executor_fixture() {
    caf::anon_send_exit(exec, caf::exit_reason::user_shutdown);
  }

  std::pair<uint64_t, uint64_t> load() {
    caf::scoped_actor self{sys, true};
    std::pair<uint64_t, uint64_t> out{99, 99};
    self->request(exec, 5s, info_atom::value)
      .receive([&](uint64_t g, uint64_t s) { out = {g, s}; }, [](caf::error&) {});
    return out;
  }

  /// y = x + (an edge from op 7 of another partition that never sends it).
  static partition waiting_partition(uint64_t id, uint32_t timeout_ms) {
    partition p;
    p.graph = id;
    p.step_timeout_ms = timeout_ms;
    partition_op op;
    op.id = 8;
    op.op = "add";
    op.name = "needs_edge";
    op.fetch = true;
    op_input a;
    a.kind = op_input::constant;
    a.value = tensor::scalar(1.0f);
    op_input b;
    b.kind = op_input::remote;
    b.op = 7;
    op.inputs = {a, b};
    p.ops.push_back(op);
    return p;
  }

  system_config cfg;
  caf::actor_system sys;
  executor_actor exec;
};

} // namespace

TEST_CASE("a step whose edge never comes fails at its deadline, naming what it waited for",
          "[runtime]") {
  executor_fixture f;
  caf::scoped_actor self{f.sys, true};
  self->request(f.exec, 5s, register_atom::value, executor_fixture::waiting_partition(42, 200))
    .receive([](caf::ok_atom) {}, [](caf::error& e) { FAIL(describe(e)); });
  caf::error err;
  self->request(f.exec, 10s, run_step_atom::value, uint64_t{42}, uint64_t{1}, std::vector<feed>{})
    .receive([](step_result&) { FAIL("the step cannot finish"); }, [&](caf::error& e) { err = e; });
  REQUIRE(err);
  INFO(describe(err));
  CHECK(is(err, af_error::timeout)); // the executor's own deadline, not the 10 s request timeout
  CHECK(describe(err).find("200 ms") != std::string::npos);
  CHECK(describe(err).find("'needs_edge'") != std::string::npos);
  CHECK(f.load().second == 0);
}

TEST_CASE("an inbox opened by an edge for a step that never runs is dropped at the deadline",
          "[runtime]") {
  executor_fixture f;
  caf::scoped_actor self{f.sys, true};
  self->request(f.exec, 5s, register_atom::value, executor_fixture::waiting_partition(5, 100))
    .receive([](caf::ok_atom) {}, [](caf::error& e) { FAIL(describe(e)); });
  self->send(f.exec, edge_atom::value, uint64_t{5}, uint64_t{77}, int32_t{7}, tensor::scalar(2.0f),
             int64_t{0});
  CHECK(eventually([&] { return f.load().second == 1; }));
  CHECK(eventually([&] { return f.load().second == 0; }));
  CHECK(f.load().first == 1); // the graph itself stays
}

TEST_CASE("a graph id held by one session is refused to another", "[runtime]") {
  executor_fixture f;
  caf::scoped_actor a{f.sys, true};
  caf::scoped_actor b{f.sys, true};
  a->request(f.exec, 5s, register_atom::value, executor_fixture::waiting_partition(9, 1000))
    .receive([](caf::ok_atom) {}, [](caf::error& e) { FAIL(describe(e)); });
  caf::error err;
  b->request(f.exec, 5s, register_atom::value, executor_fixture::waiting_partition(9, 1000))
    .receive([](caf::ok_atom) { FAIL("a second owner took the id"); }, [&](caf::error& e) { err = e; });
  CHECK(is(err, af_error::invalid_argument));
  CHECK(describe(err).find("taken") != std::string::npos);
  // The owner itself may register again (the same graph, replaced).
  a->request(f.exec, 5s, register_atom::value, executor_fixture::waiting_partition(9, 1000))
    .receive([](caf::ok_atom) {}, [](caf::error& e) { FAIL(describe(e)); });
}

TEST_CASE("an executor forgets the graphs of an owner that terminates", "[runtime]") {
  executor_fixture f;
  auto owner = f.sys.spawn([exec = f.exec](caf::event_based_actor* self) -> caf::behavior {
    self->request(exec, 5s, register_atom::value, executor_fixture::waiting_partition(3, 1000))
      .then([self](caf::ok_atom) { self->quit(); });
    return {[](int) {}};
  });
  CHECK(eventually([&] { return f.load().first == 0; }));
  (void) owner;
}

TEST_CASE("a session that ends leaves no graphs on the executors", "[runtime]") {
  auto ec = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(ec);
  auto probe = (*ec)->session_for("worker", 0);
  REQUIRE(probe);
  {
    auto s = (*ec)->session_for("worker", 0);
    REQUIRE(s);
    output v;
    {
      auto d = s->device("/job:ps/task:0");
      v = *s->variable("v", {}, initializer::constant(2));
    }
    REQUIRE(!s->initialize());
    auto r = s->run(s->mul(v, v));
    REQUIRE(r);
    CHECK(r->at(0) == 4);
    CHECK(probe->executor_load("worker", 0)->first == 1);
  }
  CHECK(eventually([&] { return probe->executor_load("worker", 0)->first == 0; }));
}

TEST_CASE("graph ids of concurrent sessions never collide", "[runtime]") {
  auto ec = embedded_cluster::start({{"worker", 1}});
  REQUIRE(ec);
  std::vector<session> sessions;
  std::vector<output> outs;
  for (int i = 0; i < 8; ++i) {
    sessions.push_back(std::move(*(*ec)->session_for("worker", 0)));
    auto& s = sessions.back();
    auto x = s.constant(tensor::scalar(static_cast<float>(i)));
    outs.push_back(s.add(x, x));
  }
  // Twice: a session whose graph another one replaced would compute the other's.
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 8; ++i)
      CHECK(sessions[i].run(outs[i])->at(0) == 2.0 * i);
  CHECK(sessions[0].executor_load("worker", 0)->first == 8);
}

TEST_CASE("an event-based actor runs steps through its own step runner without blocking",
          "[runtime]") {
  auto ec = embedded_cluster::start({{"ps", 1}, {"worker", 1}});
  REQUIRE(ec);
  auto s = (*ec)->session_for("worker", 0);
  REQUIRE(s);
  output w, x, y;
  {
    auto d = s->device("/job:ps/task:0");
    w = *s->variable("w", {2}, initializer::constant(3));
  }
  x = s->placeholder("x");
  y = s->mul(w, x); // on the worker, reading w from the ps
  REQUIRE(!s->initialize());
  auto step = s->prepare({y});
  REQUIRE(step);
  // The actor runs two steps back to back from its behavior: each callback
  // starts the next; nothing in it waits.
  struct outcome_t {
    std::mutex mtx;
    std::vector<std::vector<float>> values;
    std::string error;
    bool done = false;
  };
  auto out = std::make_shared<outcome_t>();
  auto& sys = (*ec)->system("worker", 0);
  auto runner_actor = sys.spawn([step = *step, x, y, out](caf::event_based_actor* self) {
    auto runner = std::make_shared<step_runner>();
    self->set_down_handler([self, runner](caf::down_msg& dm) { runner->on_down(self, dm); });
    auto feed_of = [x](float v) {
      return std::map<int32_t, tensor>{{x.id, tensor::from_values<float>({2}, {v, 2 * v})}};
    };
    auto record = [out](caf::expected<step_outputs>& r, int32_t id) {
      std::lock_guard<std::mutex> guard{out->mtx};
      if (!r)
        out->error = describe(r.error());
      else
        out->values.push_back(r->values.at(id).values<float>());
    };
    runner->run(self, step, feed_of(1), false,
                [=](caf::expected<step_outputs> r) {
                  record(r, y.id);
                  runner->run(self, step, feed_of(10), false,
                              [=](caf::expected<step_outputs> r2) {
                                record(r2, y.id);
                                std::lock_guard<std::mutex> guard{out->mtx};
                                out->done = true;
                                self->quit();
                              });
                });
    return caf::behavior{[](int) {}};
  });
  auto deadline = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    {
      std::lock_guard<std::mutex> guard{out->mtx};
      if (out->done || std::chrono::steady_clock::now() > deadline)
        break;
    }
    std::this_thread::sleep_for(5ms);
  }
  std::lock_guard<std::mutex> guard{out->mtx};
  REQUIRE(out->done);
  CHECK(out->error.empty());
  REQUIRE(out->values.size() == 2);
  CHECK(out->values[0] == std::vector<float>{3, 6});
  CHECK(out->values[1] == std::vector<float>{30, 60});
  (void) runner_actor;
}

} // namespace af
