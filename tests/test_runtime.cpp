// The runtime's failure semantics inside one process: executor deadlines,
// graph ownership and ids, sessions that end.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "caf/all.hpp"

#include "actors/edge_token.hpp"
#include "dist/embedded_cluster.hpp"
#include "actors/executor.hpp"
#include "actors/node.hpp"
#include "dist/aggregator.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "config/cluster_spec.hpp"
#include "kernels/kernels.hpp"
#include "messages/error.hpp"
#include "wait.hpp"

using namespace std::chrono_literals;

namespace af {

namespace {

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

  /// The edge token of the partitions below.
  static std::string test_token() { return std::string(edge_token_bytes, 'k'); }

  /// y = x + (an edge from op 7 of another partition that never sends it).
  static partition waiting_partition(uint64_t id, uint32_t timeout_ms) {
    partition p;
    p.graph = id;
    p.step_timeout_ms = timeout_ms;
    p.edge_token = test_token();
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
  // Without the graph's token: dropped (sent first: an executor takes one
  // sender's messages in order, so the inbox seen below is the second's).
  self->send(f.exec, edge_atom::value, uint64_t{5}, uint64_t{76}, int32_t{7}, tensor::scalar(2.0f),
             int64_t{0}, std::string{"local buffer"}, std::string{});
  self->send(f.exec, edge_atom::value, uint64_t{5}, uint64_t{77}, int32_t{7}, tensor::scalar(2.0f),
             int64_t{0}, std::string{"local buffer"}, executor_fixture::test_token());
  CHECK(eventually([&] { return f.load().second == 1; }));
  CHECK(eventually([&] { return f.load().second == 0; }));
  CHECK(f.load().first == 1); // the graph itself stays
}

TEST_CASE("a partition without a whole edge token is refused at registration", "[runtime]") {
  executor_fixture f;
  caf::scoped_actor self{f.sys, true};
  for (std::string token : {std::string{}, std::string(edge_token_bytes - 1, 'k')}) {
    auto part = executor_fixture::waiting_partition(6, 1000);
    part.edge_token = token;
    caf::error err;
    self->request(f.exec, 5s, register_atom::value, part)
      .receive([](caf::ok_atom) {}, [&](caf::error& e) { err = e; });
    INFO(describe(err));
    CHECK(is(err, af_error::invalid_argument));
    CHECK(describe(err).find("edge token of " + std::to_string(token.size()) + " bytes")
          != std::string::npos);
  }
  CHECK(f.load().first == 0);
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
  CHECK(is(err, af_error::already_exists));
  CHECK(describe(err).find("taken") != std::string::npos);
  // Nor may its owner register it again: open steps would run the new ops.
  caf::error again;
  a->request(f.exec, 5s, register_atom::value, executor_fixture::waiting_partition(9, 1000))
    .receive([](caf::ok_atom) { FAIL("an id in use was replaced"); },
             [&](caf::error& e) { again = e; });
  CHECK(is(again, af_error::already_exists));
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

TEST_CASE("a wait for initialization ends when the variable's node shuts down, not at its "
          "deadline", "[runtime]") {
  // CAF 0.17 answers nothing for the promise of an actor that stops: the
  // waiter of a variable whose ps was shut down waited out its whole timeout
  // (an embedded sparse job whose chief failed its restore: 60 s).
  auto ec = embedded_cluster::start({{"ps", 1}, {"worker", 2}});
  REQUIRE(ec);
  auto chief = (*ec)->session_for("worker", 0);
  auto other = (*ec)->session_for("worker", 1);
  REQUIRE(chief);
  REQUIRE(other);
  output v;
  {
    auto d = other->device("/job:ps/task:0");
    v = *other->variable("v", {}, initializer::constant(2));
  }
  std::mutex mtx;
  std::condition_variable cv;
  bool waiting = false;
  caf::error got;
  bool ended = false;
  std::thread waiter([&] {
    {
      std::lock_guard<std::mutex> g{mtx};
      waiting = true;
    }
    cv.notify_all();
    auto err = other->wait_initialized(60s, {v});
    std::lock_guard<std::mutex> g{mtx};
    got = std::move(err);
    ended = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock{mtx};
    cv.wait(lock, [&] { return waiting; });
  }
  // Parked at the variable (its info counts the waiter), then the ps goes.
  REQUIRE(eventually([&] {
    auto vars = chief->list_variables("ps", 0);
    return vars && vars->size() == 1 && vars->front().waiters == 1;
  }));
  REQUIRE_FALSE(chief->shutdown("ps", 0));
  bool in_time = false;
  {
    std::unique_lock<std::mutex> lock{mtx};
    in_time = cv.wait_for(lock, 20s, [&] { return ended; });
  }
  waiter.join();
  CHECK(in_time);
  REQUIRE(got);
  CHECK_THAT(describe(got), Catch::Contains("'v'") && Catch::Contains("stopped"));
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

TEST_CASE("a computed value fetched is the client's alone once run returns", "[runtime]") {
  // Catches: the executor dropping its step's values only after the answer
  // went out, so that the client raced that erase and now and then found
  // the buffer still shared (the Python module then handed the fetch back
  // read-only, as it does a variable's buffer). With and without a cancel
  // flag: Python's sessions take the cancellable path.
  auto ec = embedded_cluster::start({{"local", 1}});
  REQUIRE(ec);
  session_options cancellable;
  cancellable.cancel = std::make_shared<std::atomic<bool>>(false);
  for (const auto& opts : {session_options{}, cancellable}) {
    auto s = (*ec)->session_for("local", 0, opts);
    REQUIRE(s);
    auto sum = s->add(s->constant(tensor::filled(dtype::float32, {4}, 1)),
                      s->constant(tensor::filled(dtype::float32, {4}, 2)));
    int shared = 0;
    for (int i = 0; i < 3000; ++i) {
      auto r = s->run(sum);
      REQUIRE(r);
      shared += r->use_count() != 1 ? 1 : 0;
    }
    CHECK(shared == 0);
  }
}

namespace {

/// A prepared step of one partition on `exec`: y = 1 + x (x fed).
std::shared_ptr<prepared_step> one_partition_step(executor_actor exec, std::chrono::milliseconds timeout) {
  auto step = std::make_shared<prepared_step>();
  step->timeout = timeout;
  prepared_partition p;
  p.exec = exec;
  p.device = "/job:t/replica:0/task:0/device:CPU:0";
  p.node = "in-process";
  p.task = "/job:t/task:0";
  p.part.step_timeout_ms = static_cast<uint32_t>(timeout.count());
  p.part.variable_timeout_ms = static_cast<uint32_t>(timeout.count());
  partition_op op;
  op.id = 2;
  op.op = "add";
  op.name = "plus_one";
  op.fetch = true;
  op_input one;
  one.kind = op_input::constant;
  one.value = tensor::scalar(1.0f);
  op_input x;
  x.kind = op_input::feed;
  x.op = 1;
  op.inputs = {one, x};
  p.part.ops.push_back(op);
  p.feeds = {1};
  step->partitions.push_back(std::move(p));
  step->partition_of[2] = 0;
  step->nodes[1] = trace_node{"x", "placeholder", "", "", "", ""};
  step->nodes[2] = trace_node{"plus_one", "add", "", "", "", ""};
  return step;
}

using feed_map = std::map<int32_t, tensor>;

/// Results of runs made from inside an event-based actor.
struct runs_seen {
  std::mutex mtx;
  std::condition_variable arrived;
  std::vector<caf::expected<step_outputs>> results;

  void add(caf::expected<step_outputs> r) {
    std::lock_guard<std::mutex> guard{mtx};
    results.push_back(std::move(r));
    arrived.notify_all();
  }

  /// Waits until `n` runs have answered; false after `timeout`.
  bool wait_for(size_t n, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lock{mtx};
    return arrived.wait_for(lock, timeout, [&] { return results.size() >= n; });
  }
};

} // namespace

TEST_CASE("two runs of a step before it is registered both answer, under one registration",
          "[runtime]") {
  executor_fixture f;
  auto step = one_partition_step(f.exec, 5s);
  auto seen = std::make_shared<runs_seen>();
  f.sys.spawn([step, seen](caf::event_based_actor* self) {
    auto runner = std::make_shared<step_runner>();
    self->set_down_handler([self, runner](caf::down_msg& dm) { runner->on_down(self, dm); });
    for (float v : {1.0f, 2.0f})
      runner->run(self, step, {{1, tensor::scalar(v)}}, false,
                  [seen, runner](caf::expected<step_outputs> r) {
                    seen->add(std::move(r));
                  });
    return caf::behavior{[](int) {}};
  });
  REQUIRE(seen->wait_for(2));
  std::lock_guard<std::mutex> guard{seen->mtx};
  for (auto& r : seen->results)
    REQUIRE(r);
  std::multiset<float> values;
  for (auto& r : seen->results)
    values.insert(static_cast<float>(r->values.at(2).at(0)));
  CHECK(values == std::multiset<float>{2, 3});
  CHECK(f.load().first == 1); // one registration served both runs
}

TEST_CASE("a runner whose graph id another owner holds registers under another and leaves the "
          "other's graph alone",
          "[runtime]") {
  executor_fixture f;
  caf::scoped_actor other{f.sys, true};
  other->request(f.exec, 5s, register_atom::value, executor_fixture::waiting_partition(77, 5000))
    .receive([](caf::ok_atom) {}, [](caf::error& e) { FAIL(describe(e)); });
  auto step = one_partition_step(f.exec, 5s);
  auto seen = std::make_shared<runs_seen>();
  f.sys.spawn([step, seen](caf::event_based_actor* self) {
    auto runner = std::make_shared<step_runner>();
    self->set_down_handler([self, runner](caf::down_msg& dm) { runner->on_down(self, dm); });
    auto ids = std::make_shared<std::vector<uint64_t>>(std::vector<uint64_t>{77, 78});
    runner->next_graph_id = [ids] {
      auto id = ids->front();
      ids->erase(ids->begin());
      return id;
    };
    runner->run(self, step, {{1, tensor::scalar(5.0f)}}, false,
                [seen, runner](caf::expected<step_outputs> r) {
                  seen->add(std::move(r));
                });
    return caf::behavior{[](int) {}};
  });
  REQUIRE(seen->wait_for(1));
  {
    std::lock_guard<std::mutex> guard{seen->mtx};
    REQUIRE(seen->results[0]);
    CHECK(seen->results[0]->values.at(2).at(0) == 6);
  }
  CHECK(f.load().first == 2); // the other owner's 77 and our 78
  // The other owner's graph still runs: its step waits for its edge, and
  // times out on its own deadline rather than "not registered".
  caf::error err;
  other->request(f.exec, 10s, run_step_atom::value, uint64_t{77}, uint64_t{1}, std::vector<feed>{})
    .receive([](step_result&) {}, [&](caf::error& e) { err = e; });
  CHECK(!is(err, af_error::not_found));
}

TEST_CASE("a runner never registers two steps under one graph id", "[runtime]") {
  executor_fixture f;
  auto plus_one = one_partition_step(f.exec, 5s);
  auto plus_hundred = one_partition_step(f.exec, 5s);
  plus_hundred->partitions[0].part.ops[0].inputs[0].value = tensor::scalar(100.0f);
  auto seen = std::make_shared<runs_seen>();
  f.sys.spawn([plus_one, plus_hundred, seen](caf::event_based_actor* self) {
    auto runner = std::make_shared<step_runner>();
    self->set_down_handler([self, runner](caf::down_msg& dm) { runner->on_down(self, dm); });
    auto calls = std::make_shared<int>(0);
    runner->next_graph_id = [calls] { return ++*calls <= 2 ? uint64_t{42} : uint64_t{43}; };
    auto record = [seen, runner](caf::expected<step_outputs> r) {
      seen->add(std::move(r));
    };
    feed_map one{{1, tensor::scalar(1.0f)}};
    runner->run(self, plus_one, one, false, [=](caf::expected<step_outputs> r) {
      record(std::move(r));
      runner->run(self, plus_hundred, one, false, [=](caf::expected<step_outputs> r2) {
        record(std::move(r2));
        runner->run(self, plus_one, one, false, record);
      });
    });
    return caf::behavior{[](int) {}};
  });
  REQUIRE(seen->wait_for(3));
  std::lock_guard<std::mutex> guard{seen->mtx};
  std::vector<double> got;
  for (auto& r : seen->results) {
    REQUIRE(r);
    got.push_back(r->values.at(2).at(0));
  }
  CHECK(got == std::vector<double>{2, 101, 2}); // not 101 for the third: no graph was replaced
}

namespace {

/// A backend whose unsorted_segment_sum throws, as a kernel with a bug
/// might (issue 25 F1: tensor::reset's invalid_argument); every other op
/// is unsupported, so the executor hands it to the CPU fallback.
class throwing_backend : public kernels::backend {
public:
  std::string name() const override { return "throwing"; }
  kernels::status binary(kernels::binary_op, const tensor&, const tensor&, tensor&) override {
    return kernels::status::failure("not here", kernels::status::kind::unsupported);
  }
  kernels::status binary_inplace(kernels::binary_op, tensor&, const tensor&) override {
    return kernels::status::failure("not here", kernels::status::kind::unsupported);
  }
  kernels::status unsorted_segment_sum(const tensor&, const tensor&, int64_t, tensor&) override {
    throw std::invalid_argument("a kernel's own exception");
  }
};

/// Graph `id`: one fetched op `kind` of constant inputs.
partition constant_partition(uint64_t id, const std::string& kind, std::vector<tensor> inputs) {
  partition p;
  p.graph = id;
  p.step_timeout_ms = 5000;
  p.edge_token = executor_fixture::test_token();
  partition_op op;
  op.id = 1;
  op.op = kind;
  op.name = "the_" + kind;
  op.fetch = true;
  for (auto& t : inputs) {
    op_input in;
    in.kind = op_input::constant;
    in.value = std::move(t);
    op.inputs.push_back(std::move(in));
  }
  p.ops.push_back(op);
  return p;
}

/// Registers `p` on `exec` and runs its step 1.
caf::expected<step_result> register_and_run(caf::scoped_actor& self, const executor_actor& exec,
                                            const partition& p) {
  caf::error err;
  self->request(exec, 5s, register_atom::value, p)
    .receive([](caf::ok_atom) {}, [&](caf::error& e) { err = std::move(e); });
  if (err)
    return err;
  step_result out;
  self->request(exec, 5s, run_step_atom::value, p.graph, uint64_t{1}, std::vector<feed>{})
    .receive([&](step_result& r) { out = std::move(r); }, [&](caf::error& e) { err = std::move(e); });
  if (err)
    return err;
  return out;
}

} // namespace

TEST_CASE("an exception from a kernel is an error naming the op, and the executor runs the next "
          "step (issue 25 F1, it stopped the node)", "[runtime][kernels]") {
  executor_fixture f;
  auto exec = f.sys.spawn(executor_impl, std::string{"/job:t/replica:0/task:0/device:CPU:0"},
                          std::shared_ptr<kernels::backend>{std::make_shared<throwing_backend>()},
                          std::shared_ptr<kernels::backend>{kernels::make_cpu_backend()});
  caf::scoped_actor self{f.sys, true};
  auto bad = register_and_run(
    self, exec,
    constant_partition(61, "unsorted_segment_sum",
                       {tensor::from_values<float>({1, 2}, {1, 2}),
                        tensor::from_values<int64_t>({1}, {0}), tensor::from_values<int64_t>({}, {2})}));
  REQUIRE_FALSE(bad);
  auto text = describe(bad.error());
  INFO(text);
  CHECK(is(bad.error(), af_error::invalid_argument));
  CHECK(text.find("op 'the_unsorted_segment_sum' (unsorted_segment_sum)") != std::string::npos);
  CHECK(text.find("a kernel's own exception") != std::string::npos);
  auto good = register_and_run(
    self, exec, constant_partition(62, "add", {tensor::scalar(1.0f), tensor::scalar(2.0f)}));
  REQUIRE(good);
  REQUIRE(good->fetched.size() == 1);
  CHECK(good->fetched[0].value.at(0) == 3.0);
  caf::anon_send_exit(exec, caf::exit_reason::user_shutdown);
}

TEST_CASE("a step that an executor cannot finish fails with the executor's reason, through the "
          "runner",
          "[runtime]") {
  executor_fixture f;
  auto step = one_partition_step(f.exec, 300ms);
  // Make the op wait for an edge that never comes.
  auto& op = step->partitions[0].part.ops[0];
  op.name = "needs_edge";
  op.inputs[1].kind = op_input::remote;
  op.inputs[1].op = 7;
  step->partitions[0].feeds.clear();
  auto seen = std::make_shared<runs_seen>();
  f.sys.spawn([step, seen](caf::event_based_actor* self) {
    auto runner = std::make_shared<step_runner>();
    self->set_down_handler([self, runner](caf::down_msg& dm) { runner->on_down(self, dm); });
    runner->run(self, step, {}, false, [seen, runner](caf::expected<step_outputs> r) {
      seen->add(std::move(r));
    });
    return caf::behavior{[](int) {}};
  });
  REQUIRE(seen->wait_for(1));
  std::lock_guard<std::mutex> guard{seen->mtx};
  REQUIRE(!seen->results[0]);
  auto text = describe(seen->results[0].error());
  INFO(text);
  CHECK(is(seen->results[0].error(), af_error::timeout));
  CHECK(text.find("'needs_edge'") != std::string::npos); // the executor's sweep, not the runner's clock
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
    std::condition_variable finished;
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
                                {
                                  std::lock_guard<std::mutex> guard{out->mtx};
                                  out->done = true;
                                }
                                out->finished.notify_all();
                                self->quit();
                              });
                });
    return caf::behavior{[](int) {}};
  });
  std::unique_lock<std::mutex> lock{out->mtx};
  REQUIRE(out->finished.wait_for(lock, 10s, [&] { return out->done; }));
  CHECK(out->error.empty());
  REQUIRE(out->values.size() == 2);
  CHECK(out->values[0] == std::vector<float>{3, 6});
  CHECK(out->values[1] == std::vector<float>{30, 60});
  (void) runner_actor;
}


namespace {

/// A node started with start_node in an actor system of its own, stopped as
/// an embedded cluster stops its members.
struct node_in_process {
  explicit node_in_process(const std::string& job, int32_t task, const node_options& opts)
    : cfg(opts), sys(cfg) {
    auto started = start_node(sys, job, task, "127.0.0.1", 0, opts, {}, node_aggregators());
    if (started)
      node = std::move(*started);
    else
      why = describe(started.error());
  }
  ~node_in_process() { stop(); }

  void stop() {
    if (!node.actor)
      return;
    node.data_plane->stop();
    unregister_local_node(node.address);
    caf::anon_send_exit(node.actor, caf::exit_reason::user_shutdown);
    node.actor = nullptr;
  }

  system_config cfg;
  caf::actor_system sys;
  running_node node;
  std::string why; ///< why it did not start
};

} // namespace

// Catches the process-wide cap on decoded tensors being the last started
// node's: a node that allows 8 MiB refused, through CAF, a 2 MiB tensor
// once a node allowing 1 MiB had started in the same process; and a cap that
// is not given back when its node stops.
TEST_CASE("two nodes of one process with different max_message_bytes each accept a tensor "
          "within their own limit",
          "[runtime][limits]") {
  node_options big_opts;
  big_opts.threads = 2;
  big_opts.max_message_bytes = 8 << 20;
  auto small_opts = big_opts;
  small_opts.max_message_bytes = 1 << 20;
  node_in_process big{"ps", 0, big_opts};
  INFO(big.why);
  REQUIRE(big.node.actor);
  node_in_process small{"ps", 1, small_opts}; // last: it used to set the cap for both
  INFO(small.why);
  REQUIRE(small.node.actor);
  CHECK(max_decoded_tensor_bytes() == 8u << 20);

  auto spec = cluster_spec::from_jobs({{"ps", {big.node.address, small.node.address}}});
  REQUIRE(spec);
  system_config client_cfg{node_options{}};
  caf::actor_system client_sys{client_cfg};
  {
    session_options so;
    so.timeout = 20s;
    so.data_plane = false; // tensors go as CAF messages, decoded in this process
    auto s = session::make(client_sys, *spec, "/job:ps/task:0", so);
    REQUIRE(s);
    auto assign_and_read = [&](const std::string& task, int64_t bytes) -> std::string {
      auto d = s->device(task);
      if (!d)
        return describe(d.error());
      auto elements = bytes / 4;
      auto v = s->variable("v" + std::to_string(bytes), {elements});
      if (!v)
        return describe(v.error());
      auto value = tensor::filled(dtype::float32, {elements}, 3.0);
      auto assigned = s->run(s->assign(*v, s->constant(value)));
      if (!assigned)
        return describe(assigned.error());
      auto read = s->run(*v);
      if (!read)
        return describe(read.error());
      auto got = read->values<float>();
      if (static_cast<int64_t>(got.size()) != elements || got.front() != 3.0f || got.back() != 3.0f)
        return "read back another value";
      return "ok";
    };
    CHECK(assign_and_read("/job:ps/task:0", 2 << 20) == "ok"); // within 8 MiB, over 1 MiB
    CHECK(assign_and_read("/job:ps/task:1", 512 << 10) == "ok"); // within 1 MiB
  }
  // Its node stopped, the larger limit goes with it.
  big.stop();
  CHECK(eventually([] { return max_decoded_tensor_bytes() == 1u << 20; }));
}

} // namespace af
