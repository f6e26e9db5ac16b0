#pragma once
// The tutorial's examples as test scenarios, run against any cluster: an
// embedded one (tests/test_tutorial_embedded.cpp) or real node processes
// (tests/test_tutorial_processes.cpp).

#include <catch2/catch.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <set>
#include <string>

#include "caf/all.hpp"

#include "actors/embedded_cluster.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "kernels/kernels.hpp"
#include "messages/error.hpp"
#include "process_cluster.hpp"

namespace af::testing {

using namespace std::chrono_literals;

/// What a scenario needs from a cluster: its spec and sessions on its tasks.
class cluster_under_test {
public:
  virtual ~cluster_under_test() = default;
  virtual const cluster_spec& spec() const = 0;
  virtual caf::expected<session> open(const std::string& job, int32_t task,
                                      session_options opts) = 0;

  /// What connect() uses when a scenario does not say.
  session_options defaults;

  session connect(const std::string& job, int32_t task) {
    return connect(job, task, defaults);
  }

  session connect(const std::string& job, int32_t task, session_options opts) {
    auto s = open(job, task, opts);
    if (!s)
      FAIL("cannot open a session on /job:" << job << "/task:" << task << ": "
                                            << describe(s.error()));
    return std::move(*s);
  }

  /// The address the spec gives /job:J/task:T.
  std::string address(const std::string& job, int32_t task) const {
    return spec().address(job, task)->to_string();
  }
};

class embedded_under_test : public cluster_under_test {
public:
  explicit embedded_under_test(const std::map<std::string, int>& jobs,
                               node_options opts = embedded_cluster::defaults()) {
    auto ec = embedded_cluster::start(jobs, opts);
    if (!ec)
      FAIL("embedded cluster failed to start: " << describe(ec.error()));
    cluster_ = std::move(*ec);
  }
  const cluster_spec& spec() const override { return cluster_->spec(); }
  caf::expected<session> open(const std::string& job, int32_t task, session_options opts) override {
    return cluster_->session_for(job, task, opts);
  }

private:
  std::unique_ptr<embedded_cluster> cluster_;
};

class processes_under_test : public cluster_under_test {
public:
  explicit processes_under_test(const std::map<std::string, int>& jobs, node_options opts = {}) {
    auto pc = process_cluster::start(jobs, opts);
    if (!pc)
      FAIL(describe(pc.error()));
    procs_ = std::move(*pc);
    node_options client;
    client.threads = 2;
    cfg_ = std::make_unique<system_config>(client);
    sys_ = std::make_unique<caf::actor_system>(*cfg_);
  }
  ~processes_under_test() override {
    sys_.reset(); // the client first, then the nodes
    procs_.reset();
  }
  const cluster_spec& spec() const override { return procs_->spec(); }
  caf::expected<session> open(const std::string& job, int32_t task, session_options opts) override {
    return session::make(*sys_, procs_->spec(), "/job:" + job + "/task:" + std::to_string(task), opts);
  }
  process_cluster& processes() { return *procs_; }

private:
  std::unique_ptr<process_cluster> procs_;
  std::unique_ptr<system_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
};

template <class T>
T value_of(caf::expected<T> x) {
  if (!x)
    FAIL(describe(x.error()));
  return std::move(*x);
}

inline void require_ok(const caf::error& err) {
  if (err)
    FAIL(describe(err));
}

inline tensor scalar(float v) {
  return tensor::scalar(v);
}

// -- the tutorial's examples ---------------------------------------------------

/// 单机单卡: w (2x2 of 2) and b (2x2 of 5) on /cpu:0, add and mul on /gpu:0.
inline void single_device_example(cluster_under_test& c) {
  auto s = c.connect("local", 0);
  output w, b;
  {
    auto cpu = value_of(s.device("/cpu:0"));
    w = value_of(s.variable("w", {2, 2}, initializer::constant(2)));
    b = value_of(s.variable("b", {2, 2}, initializer::constant(5)));
  }
  auto gpu = value_of(s.device("/gpu:0"));
  auto addwb = s.add(w, b, "addwb");
  auto mutwb = s.mul(w, b, "mutwb");
  require_ok(s.initialize());
  run_trace trace;
  auto res = value_of(s.run({addwb, mutwb}, &trace));
  CHECK(res[0].values<float>() == std::vector<float>{7, 7, 7, 7});
  CHECK(res[0].shape() == shape_type{2, 2});
  CHECK(res[1].values<float>() == std::vector<float>{10, 10, 10, 10});
  // The trace: the ops asked for GPU:0, ran on CPU:0 of task 0 (no GPU here),
  // and say so; the variables were read on /cpu:0.
  for (const char* op : {"addwb", "mutwb"}) {
    auto e = trace.find(op);
    REQUIRE(e != nullptr);
    CHECK(e->requested == "/device:GPU:0");
    if (kernels::cuda_device_count() == 0) {
      CHECK(e->device == "/job:local/replica:0/task:0/device:CPU:0");
      CHECK(e->note.find("soft placement") != std::string::npos);
      CHECK(e->note.find("GPU:0") != std::string::npos);
    } else {
      CHECK(e->device == "/job:local/replica:0/task:0/device:GPU:0");
    }
    CHECK(e->node == c.address("local", 0));
  }
  for (const char* var : {"w", "b"}) {
    auto e = trace.find(var);
    REQUIRE(e != nullptr);
    CHECK(e->requested == "/device:CPU:0");
    CHECK(e->device == "/job:local/replica:0/task:0/device:CPU:0");
  }
}

/// Two clients on the two servers of one job share `var` by name.
inline void shared_variable_example(cluster_under_test& c) {
  auto s1 = c.connect("local", 0);
  auto s2 = c.connect("local", 1);
  auto v1 = value_of(s1.variable("var", {}));
  auto v2 = value_of(s2.variable("var", {}));
  require_ok(s1.initialize());
  require_ok(s2.initialize());
  CHECK(value_of(s1.run(v1)).at(0) == 0);
  CHECK(value_of(s2.run(v2)).at(0) == 0);
  auto after = value_of(s1.run(s1.assign_add(v1, s1.constant(scalar(1)))));
  CHECK(after.at(0) == 1); // assign_add returns the new value, as in TF
  CHECK(value_of(s1.run(v1)).at(0) == 1);
  run_trace trace;
  CHECK(value_of(s2.run(v2, &trace)).at(0) == 1);
  // Both sessions see one variable, on task 0 of the job.
  CHECK(s1.device_of(v1) == "/job:local/replica:0/task:0/device:CPU:0");
  CHECK(s2.device_of(v2) == s1.device_of(v1));
  REQUIRE(trace.find("var") != nullptr);
  CHECK(trace.find("var")->node == c.address("local", 0));
  CHECK(trace.by_device() == "/job:local/replica:0/task:0/device:CPU:0\n   var\n");
  // A tensor operand (not a variable) travels with the request to the node.
  auto tripled = value_of(s2.run(s2.mul(v2, s2.constant(scalar(3)))));
  CHECK(tripled.at(0) == 3);
}

/// var1 on task 0 and var2 on task 1: the trace from either client shows each on its task.
inline void placement_example(cluster_under_test& c) {
  auto s1 = c.connect("local", 0);
  auto s2 = c.connect("local", 1);
  auto make = [](session& s, output& v1, output& v2) {
    {
      auto d = value_of(s.device("/job:local/task:0"));
      v1 = value_of(s.variable("var1", {}));
    }
    auto d = value_of(s.device("/job:local/task:1"));
    v2 = value_of(s.variable("var2", {}));
  };
  output a1, a2, b1, b2;
  make(s1, a1, a2);
  make(s2, b1, b2);
  require_ok(s1.initialize());
  for (auto* s : {&s1, &s2}) {
    output v1 = s == &s1 ? a1 : b1;
    output v2 = s == &s1 ? a2 : b2;
    run_trace t1, t2;
    value_of(s->run(v1, &t1));
    value_of(s->run(v2, &t2));
    REQUIRE(t1.entries.size() == 1);
    REQUIRE(t2.entries.size() == 1);
    CHECK(t1.entries[0].device == "/job:local/replica:0/task:0/device:CPU:0");
    CHECK(t1.entries[0].node == c.address("local", 0));
    CHECK(t2.entries[0].device == "/job:local/replica:0/task:1/device:CPU:0");
    CHECK(t2.entries[0].node == c.address("local", 1));
  }
}

/// Two independent clients that each create `var` on the same task get the same variable.
inline void same_variable_example(cluster_under_test& c) {
  auto s1 = c.connect("local", 0);
  auto s2 = c.connect("local", 1);
  output v1, v2;
  {
    auto d = value_of(s1.device("/job:local/task:1"));
    v1 = value_of(s1.variable("var", {}));
  }
  {
    auto d = value_of(s2.device("/job:local/task:1"));
    v2 = value_of(s2.variable("var", {}));
  }
  value_of(s1.run(s1.assign(v1, s1.constant(scalar(42)))));
  CHECK(value_of(s2.run(v2)).at(0) == 42);
  auto vars = value_of(s2.list_variables("local", 1));
  REQUIRE(vars.size() == 1);
  CHECK(vars[0].spec.name == "var");
  CHECK(vars[0].initialized);
  CHECK(vars[0].version == 1);
  CHECK(value_of(s1.list_variables("local", 0)).empty());
}

/// One client waits for initialization while another initializes it later.
inline void wait_for_initialization_example(cluster_under_test& c) {
  auto waiter = c.connect("local", 0);
  auto chief = c.connect("local", 1);
  auto wv = value_of(waiter.variable("var", {}));
  auto cv = value_of(chief.variable("var", {}, initializer::constant(3)));
  CHECK(value_of(waiter.uninitialized()) == std::vector<std::string>{"var"});
  auto waiting = std::async(std::launch::async, [&] { return waiter.wait_initialized(20s); });
  // The delay before the chief initializes; the waiter must still be waiting.
  REQUIRE(waiting.wait_for(300ms) == std::future_status::timeout);
  require_ok(chief.initialize());
  REQUIRE(waiting.wait_for(20s) == std::future_status::ready);
  require_ok(waiting.get());
  CHECK(value_of(waiter.uninitialized()).empty());
  CHECK(value_of(waiter.run(wv)).at(0) == 3);
  (void) cv;
  // A short wait on a variable nobody initializes fails and names it.
  auto lonely = value_of(waiter.variable("lonely", {2}));
  auto err = waiter.wait_initialized(200ms, {lonely});
  REQUIRE(err);
  CHECK(is(err, af_error::timeout));
  CHECK(describe(err).find("lonely") != std::string::npos);
  CHECK(describe(err).find("200 ms") != std::string::npos);
}

/// One ps holding `var`, two workers incrementing it five times each.
inline void ps_and_two_workers_example(cluster_under_test& c) {
  auto ps = c.connect("ps", 0);
  auto w0 = c.connect("worker", 0);
  auto w1 = c.connect("worker", 1);
  auto declare = [](session& s) {
    auto d = value_of(s.device("/job:ps/task:0"));
    return value_of(s.variable("var", {}));
  };
  auto pv = declare(ps);
  auto v0 = declare(w0);
  auto v1 = declare(w1);
  CHECK(ps.device_of(pv) == "/job:ps/replica:0/task:0/device:CPU:0");
  CHECK(w0.device_of(v0) == ps.device_of(pv));
  require_ok(ps.initialize());
  require_ok(w0.wait_initialized(10s));
  require_ok(w1.wait_initialized(10s));
  auto inc0 = w0.assign_add(v0, w0.constant(scalar(1)));
  auto inc1 = w1.assign_add(v1, w1.constant(scalar(1)));
  std::vector<double> observed;
  std::multiset<double> returned;
  for (int round = 0; round < 5; ++round) {
    // Both workers increment at once; then the ps looks at the value.
    auto a = std::async(std::launch::async, [&] { return w0.run(inc0); });
    auto b = std::async(std::launch::async, [&] { return w1.run(inc1); });
    returned.insert(value_of(a.get()).at(0));
    returned.insert(value_of(b.get()).at(0));
    observed.push_back(value_of(ps.run(pv)).at(0));
  }
  CHECK(observed == std::vector<double>{2, 4, 6, 8, 10});
  // Each increment is atomic: the ten updates returned ten distinct values.
  CHECK(returned == std::multiset<double>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
}

/// Many clients incrementing one remote variable at once lose no update.
inline void concurrent_increments_example(cluster_under_test& c, int clients, int each) {
  std::vector<session> sessions;
  std::vector<output> incs;
  for (int i = 0; i < clients; ++i) {
    sessions.push_back(c.connect("worker", 0));
    auto& s = sessions.back();
    auto d = value_of(s.device("/job:ps/task:0"));
    auto v = value_of(s.variable("counter", {}));
    if (i == 0)
      require_ok(s.initialize({v}));
    incs.push_back(s.assign_add(v, s.constant(scalar(1))));
  }
  std::vector<std::future<std::vector<double>>> results;
  for (int i = 0; i < clients; ++i)
    results.push_back(std::async(std::launch::async, [&, i] {
      std::vector<double> seen;
      for (int k = 0; k < each; ++k) {
        auto v = sessions[i].run(incs[i]);
        if (!v)
          return std::vector<double>{-1};
        seen.push_back(v->at(0));
      }
      return seen;
    }));
  std::set<double> all;
  size_t count = 0;
  for (auto& r : results)
    for (double v : r.get()) {
      all.insert(v);
      ++count;
    }
  auto total = static_cast<size_t>(clients * each);
  CHECK(count == total);
  CHECK(all.size() == total); // every increment saw its own value: none lost, none doubled
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == static_cast<double>(total));
}

/// Bad input through the client API: each error is typed and names the thing.
inline void bad_input_example(cluster_under_test& c) {
  auto opts = c.defaults;
  opts.timeout = opts.connect_timeout = 2000ms;
  auto s = c.connect("local", 0, opts);
  // unknown devices
  {
    auto d = value_of(s.device("/job:nope/task:0"));
    auto v = s.variable("v", {});
    REQUIRE(!v);
    CHECK(is(v.error(), af_error::unknown_device));
    CHECK(describe(v.error()).find("'nope'") != std::string::npos);
  }
  {
    auto d = value_of(s.device("/job:local/task:7"));
    auto v = s.variable("v", {});
    REQUIRE(!v);
    CHECK(describe(v.error()).find("task index 7") != std::string::npos);
  }
  {
    auto d = s.device("/device:TPU:0");
    REQUIRE(!d);
    CHECK(is(d.error(), af_error::invalid_device));
    CHECK(describe(d.error()).find("TPU") != std::string::npos);
  }
  // shape mismatch on get-or-create, and on assign
  auto v = value_of(s.variable("shaped", {2, 2}));
  auto again = s.variable("shaped", {3});
  REQUIRE(!again);
  CHECK(is(again.error(), af_error::shape_mismatch));
  CHECK(describe(again.error()).find("[2,2]") != std::string::npos);
  CHECK(describe(again.error()).find("[3]") != std::string::npos);
  // uninitialized read
  auto read = s.run(v);
  REQUIRE(!read);
  CHECK(is(read.error(), af_error::uninitialized));
  CHECK(describe(read.error()).find("'shaped'") != std::string::npos);
  require_ok(s.initialize({v}));
  auto bad_assign = s.run(s.assign(v, s.constant(tensor::filled(dtype::float32, {3}, 1))));
  REQUIRE(!bad_assign);
  CHECK(is(bad_assign.error(), af_error::shape_mismatch));
  // an op on mismatched shapes
  auto other = value_of(s.variable("other", {3}, initializer::ones()));
  require_ok(s.initialize({other}));
  auto bad_add = s.run(s.add(v, other));
  REQUIRE(!bad_add);
  CHECK(is(bad_add.error(), af_error::shape_mismatch));
  // the variable kept its value through all of that
  CHECK(value_of(s.run(v)).values<float>() == std::vector<float>{0, 0, 0, 0});
}

} // namespace af::testing
