#pragma once
// The tutorial's examples (tutorial/tutorial.hpp) with the checks of what each
// must do, run against any cluster: an embedded one or real node processes
// (tests/test_tutorial.cpp, tests/test_compute.cpp).

#include <catch2/catch.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <vector>
#include <mutex>
#include <functional>
#include <set>
#include <string>

#include "caf/all.hpp"

#include "dist/embedded_cluster.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "tutorial/tutorial.hpp"
#include "kernels/kernels.hpp"
#include "messages/error.hpp"
#include "process_cluster.hpp"
#include "value_of.hpp"

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

  /// Where the tutorial's examples get their sessions: open() with `defaults`.
  tutorial::session_source sessions() {
    return [this](const std::string& job, int32_t task) { return open(job, task, defaults); };
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

inline void require_ok(const caf::error& err) {
  if (err)
    FAIL(describe(err));
}

inline tensor scalar(float v) {
  return tensor::scalar(v);
}

/// A client's actor system beside a process cluster, with the cluster's
/// heartbeat settings (tests/test_faults.cpp and the recovery tests).
struct cluster_client {
  explicit cluster_client(const node_options& cluster_opts) {
    auto opts = cluster_opts;
    opts.threads = 2;
    cfg = std::make_unique<system_config>(opts);
    sys = std::make_unique<caf::actor_system>(*cfg);
  }
  std::unique_ptr<system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
};

/// The lines a session logs when it recovers by itself
/// (session_options::on_recovery), collected from any thread.
struct recovery_notes {
  std::mutex mtx;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> hook() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> guard{mtx};
      lines.push_back(line);
    };
  }
  /// Lines that contain `text`.
  size_t count(const std::string& text) {
    std::lock_guard<std::mutex> guard{mtx};
    size_t n = 0;
    for (const auto& l : lines)
      n += l.find(text) != std::string::npos ? 1 : 0;
    return n;
  }
  std::string all() {
    std::lock_guard<std::mutex> guard{mtx};
    std::string out;
    for (const auto& l : lines)
      out += l + "\n";
    return out;
  }
};

// -- the tutorial's examples (tutorial/tutorial.hpp), checked ---------------------

/// 单机单卡: w (2x2 of 2) and b (2x2 of 5) on /cpu:0, add and mul on /gpu:0.
inline void single_device_example(cluster_under_test& c) {
  auto r = value_of(tutorial::single_device(c.sessions(), "local"));
  CHECK(r.sum.values<float>() == std::vector<float>{7, 7, 7, 7});
  CHECK(r.sum.shape() == shape_type{2, 2});
  CHECK(r.product.values<float>() == std::vector<float>{10, 10, 10, 10});
  // The trace: the ops asked for GPU:0, ran on CPU:0 of task 0 (no GPU here),
  // and say so; the variables were read on /cpu:0.
  for (const char* op : {"addwb", "mutwb"}) {
    auto e = r.trace.find(op);
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
    auto e = r.trace.find(var);
    REQUIRE(e != nullptr);
    CHECK(e->requested == "/device:CPU:0");
    CHECK(e->device == "/job:local/replica:0/task:0/device:CPU:0");
    CHECK(e->kind == "read"); // read on its own node: no transfer
  }
}

/// Two clients on the two servers of one job share `var` by name.
inline void shared_variable_example(cluster_under_test& c) {
  auto r = value_of(tutorial::shared_var(c.sessions(), "local", 1));
  CHECK(r.initial_1.at(0) == 0);
  CHECK(r.initial_2.at(0) == 0);
  CHECK(r.incremented.at(0) == 1); // assign_add returns the new value, as in TF
  CHECK(r.after_1.at(0) == 1);
  CHECK(r.after_2.at(0) == 1); // session 2 sees session 1's update: one variable
  // Both sessions see one variable, on task 0 of the job.
  CHECK(r.device_1 == "/job:local/replica:0/task:0/device:CPU:0");
  CHECK(r.device_2 == r.device_1);
  auto e = r.trace_2.find("var");
  REQUIRE(e != nullptr);
  CHECK(e->node == c.address("local", 0));
  CHECK(e->kind == "read");
  CHECK(e->note.find("read by the client over ") != std::string::npos);
  CHECK(r.trace_2.by_device() == "/job:local/replica:0/task:0/device:CPU:0\n   var\n");
  // A tensor operand (not a variable) travels with the request to the node.
  CHECK(r.tripled.at(0) == 3);
}

/// var1 on task 0 and var2 on task 1: the trace from either client shows each on its task.
inline void placement_example(cluster_under_test& c) {
  auto r = value_of(tutorial::placement(c.sessions(), "local"));
  for (int s = 0; s < 2; ++s)
    for (int v = 0; v < 2; ++v) {
      INFO("session " << s + 1 << " reading var" << v + 1);
      const auto& t = r.traces[s][v];
      REQUIRE(t.entries.size() == 1);
      CHECK(t.entries[0].op == "var" + std::to_string(v + 1));
      CHECK(t.entries[0].device
            == "/job:local/replica:0/task:" + std::to_string(v) + "/device:CPU:0");
      CHECK(t.entries[0].node == c.address("local", v));
    }
}

/// Two independent clients that each create `var` on the same task get the same variable.
inline void same_variable_example(cluster_under_test& c) {
  auto r = value_of(tutorial::same_variable(c.sessions(), "local"));
  CHECK(r.operations_1 == std::vector<std::string>{"var"});
  CHECK(r.operations_2.empty()); // each session has its own graph
  CHECK(r.read_by_2.at(0) == 42);
  REQUIRE(r.on_task_1.size() == 1);
  CHECK(r.on_task_1[0].spec.name == "var");
  CHECK(r.on_task_1[0].initialized);
  CHECK(r.on_task_1[0].version == 1); // one assign: the second get-or-create made no new one
  CHECK(r.on_task_0.empty());
}

/// One client waits for initialization while another initializes it later.
inline void wait_for_initialization_example(cluster_under_test& c) {
  auto r = value_of(tutorial::wait_for_initialization(c.sessions(), "local"));
  CHECK(r.uninitialized_before == std::vector<std::string>{"var"});
  // The chief initialized while the waiter's request was parked on var, and
  // the wait had not ended before: it ended because of the initialization.
  CHECK(r.waiters_parked == 1);
  CHECK_FALSE(r.waiter_done_early);
  CHECK(r.uninitialized_after.empty());
  CHECK(r.value.at(0) == 3);
  // A short wait on a variable nobody initializes fails and names it.
  REQUIRE(r.lonely_error);
  CHECK(is(r.lonely_error, af_error::timeout));
  CHECK(describe(r.lonely_error).find("lonely") != std::string::npos);
  CHECK(describe(r.lonely_error).find("200 ms") != std::string::npos);
}

/// Every value the workers' increments returned, in order.
inline std::multiset<double> all_increments(const tutorial::ps_workers_result& r) {
  std::multiset<double> out;
  for (const auto& seen : r.worker_saw)
    out.insert(seen.begin(), seen.end());
  return out;
}

inline std::multiset<double> one_to(int n) {
  std::multiset<double> out;
  for (int i = 1; i <= n; ++i)
    out.insert(i);
  return out;
}

/// One ps holding `var`, two workers incrementing it five times each, in
/// rounds: both workers increment at once, then the ps looks at the value.
inline void ps_and_two_workers_example(cluster_under_test& c) {
  tutorial::ps_workers_params params;
  params.lockstep = true;
  auto r = value_of(tutorial::ps_workers(c.sessions(), params));
  CHECK(r.ps_device == "/job:ps/replica:0/task:0/device:CPU:0");
  CHECK(r.worker_devices
        == std::vector<std::string>{r.ps_device, r.ps_device}); // one variable for all three
  // The ps reads what the round's increments left: none lost, none stale.
  CHECK(r.ps_saw == std::vector<double>{2, 4, 6, 8, 10});
  // Each increment is atomic: the ten updates returned ten distinct values.
  CHECK(all_increments(r) == one_to(10));
  CHECK(r.final_value == 10);
}

/// Many clients incrementing one remote variable at once lose no update.
inline void concurrent_increments_example(cluster_under_test& c, int clients, int each) {
  auto r = value_of(tutorial::concurrent_increments(c.sessions(), clients, each));
  std::set<double> all;
  size_t count = 0;
  for (const auto& seen : r.seen)
    for (double v : seen) {
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
