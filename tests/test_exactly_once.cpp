// Exactly-once updates: a retried update (same request id) is applied once and
// answered with the first result; the table of ids is bounded. Then the same
// across real processes, where a reply is lost for real (the node is
// SIGSTOPped past the client's wait), over the data plane and over CAF.
#include <catch2/catch.hpp>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "caf/all.hpp"

#include "dist/aggregator.hpp"
#include "actors/session.hpp"
#include "actors/system.hpp"
#include "actors/variable.hpp"
#include "messages/error.hpp"
#include "members.hpp"
#include "process_cluster.hpp"
#include "scenarios.hpp"
#include "wait.hpp"

using namespace std::chrono_literals;

namespace af::testing {

namespace {

std::unique_ptr<variable_cell> scalar_cell(float start) {
  auto cell = std::make_unique<variable_cell>(
    variable_spec{"v", dtype::float32, {}, "/job:ps/replica:0/task:0/device:CPU:0"});
  REQUIRE(cell->apply(var_op::assign, tensor::scalar(start), false));
  return cell;
}

float value_now(variable_cell& cell) {
  return value_of(cell.apply(var_op::read, tensor{}, true)).value.at(0);
}

} // namespace

// Bug caught: a retry of an update whose answer was lost is applied again
// (assign_add by 1 retried gives +2), or its answer is not the first one's.
TEST_CASE("a retried update with the same request id is applied once and answered with the "
          "first result",
          "[exactly-once]") {
  auto owned = scalar_cell(0);
  auto& cell = *owned;
  auto id = new_request_id();
  auto first = value_of(cell.apply(var_op::assign_add, tensor::scalar(1.0f), true, id));
  CHECK(first.value.at(0) == 1);
  CHECK_FALSE(first.replayed);
  // Another client's update comes in between; then the retry.
  value_of(cell.apply(var_op::assign_add, tensor::scalar(10.0f), false, new_request_id()));
  auto retry = value_of(cell.apply(var_op::assign_add, tensor::scalar(1.0f), true, id));
  CHECK(retry.replayed);
  CHECK(retry.version == first.version);
  CHECK(retry.value.at(0) == 1); // the value after the first try, not the current 11
  CHECK(value_now(cell) == 11);
  // The same for assign_sub and assign.
  auto sub = new_request_id();
  value_of(cell.apply(var_op::assign_sub, tensor::scalar(2.0f), false, sub));
  value_of(cell.apply(var_op::assign_sub, tensor::scalar(2.0f), false, sub));
  CHECK(value_now(cell) == 9);
  // Without an id nothing is deduplicated (old clients, reads).
  value_of(cell.apply(var_op::assign_add, tensor::scalar(1.0f), false));
  value_of(cell.apply(var_op::assign_add, tensor::scalar(1.0f), false));
  CHECK(value_now(cell) == 11);
  CHECK(new_request_id() != new_request_id());
}

// Bug caught: the table grows without bound (a long-lived ps leaks), or an
// id still in it is applied twice.
TEST_CASE("the table of request ids keeps the last 1024 ids of a variable", "[exactly-once]") {
  auto owned = scalar_cell(0);
  auto& cell = *owned;
  std::vector<uint64_t> ids;
  const size_t n = variable_cell::max_remembered + 100;
  for (size_t i = 0; i < n; ++i) {
    ids.push_back(new_request_id());
    value_of(cell.apply(var_op::assign_add, tensor::scalar(1.0f), false, ids.back()));
  }
  CHECK(cell.remembered() == variable_cell::max_remembered);
  CHECK(value_now(cell) == static_cast<float>(n));
  // The newest 1024 are applied once ...
  for (size_t i = n - variable_cell::max_remembered; i < n; ++i)
    CHECK(value_of(cell.apply(var_op::assign_add, tensor::scalar(1.0f), false, ids[i])).replayed);
  CHECK(value_now(cell) == static_cast<float>(n));
  // ... an id pushed out of the table is applied again (docs/runtime.md
  // says so: exactly once within the bound, at least once beyond it).
  CHECK_FALSE(value_of(cell.apply(var_op::assign_add, tensor::scalar(1.0f), false, ids[0])).replayed);
  CHECK(value_now(cell) == static_cast<float>(n + 1));
  CHECK(cell.remembered() == variable_cell::max_remembered);
}

// Bug caught: kept values pin old copies of a large variable without bound,
// or a retry whose value was dropped is applied again or answered with a
// value that is not the one after its try.
TEST_CASE("values kept for retries are bounded in bytes, a retry whose value was dropped says it "
          "was applied",
          "[exactly-once]") {
  // 512 KiB per value: the 4 MiB budget keeps the last 8.
  const int64_t floats = 128 * 1024;
  variable_cell cell{variable_spec{"big", dtype::float32, {floats}, "/job:ps/replica:0/task:0/device:CPU:0"}};
  REQUIRE(cell.apply(var_op::assign, tensor::filled(dtype::float32, {floats}, 0), false));
  std::vector<uint64_t> ids;
  for (int i = 0; i < 20; ++i) {
    ids.push_back(new_request_id());
    value_of(cell.apply(var_op::assign_add, tensor::scalar(1.0f), true, ids.back()));
  }
  // The newest: its own value (20), not applied again.
  auto last = value_of(cell.apply(var_op::assign_add, tensor::scalar(1.0f), true, ids.back()));
  CHECK(last.replayed);
  CHECK(last.value.at(0) == 20);
  // The oldest: still remembered (so not applied again), its value dropped.
  auto old = cell.apply(var_op::assign_add, tensor::scalar(1.0f), true, ids.front());
  REQUIRE_FALSE(old);
  INFO(describe(old.error()));
  CHECK(is(old.error(), af_error::aborted));
  CHECK(describe(old.error()).find("'big'") != std::string::npos);
  CHECK(describe(old.error()).find("applied already") != std::string::npos);
  // Without the value it is answered with the version alone.
  auto quiet = value_of(cell.apply(var_op::assign_add, tensor::scalar(1.0f), false, ids.front()));
  CHECK(quiet.replayed);
  CHECK(value_now(cell) == 20);
}

// Aggregator pushes carry (worker, step), no request id. Bug caught: a sync
// aggregator that applies a worker's retried push of the same step again,
// in the round (its gradient counted twice in the mean) or after it.
TEST_CASE("a sync aggregator takes a worker's push of one step once, however often it comes",
          "[exactly-once]") {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto cell = std::make_shared<variable_cell>(variable_spec{"w", dtype::float32, {2}, ""});
  REQUIRE(cell->initialize(initializer::constant(0), false, "test"));
  aggregator_spec spec;
  spec.name = "test/retry";
  spec.mode = "sync";
  spec.variables = {"w"};
  spec.workers = 2;
  spec.optimizer.kind = "sgd";
  spec.optimizer.lr = 1;
  spec.step_timeout_ms = 60000;
  auto agg = value_of(spawn_aggregator(sys, spec, {{variable_cell_actor{}, cell}}));
  auto grad = [](float x) { return std::vector<tensor>{tensor::filled(dtype::float32, {2}, x)}; };
  using reply_t = caf::expected<std::pair<uint64_t, tensor>>;
  auto answer = [](auto& handle) {
    reply_t out{make_error(af_error::internal, "no reply")};
    handle.receive([&](uint64_t g, tensor& p, bool) { out = std::make_pair(g, std::move(p)); },
                   [&](caf::error& e) { out = std::move(e); });
    return out;
  };
  auto t0 = test::join_for_token(self, agg, 0);
  auto t1 = test::join_for_token(self, agg, 1);
  REQUIRE(t0.size() == 16);
  REQUIRE(t1.size() == 16);
  // Unnumbered (0): the step alone keeps it from counting twice.
  push_credentials w0{t0, 0, "test"};
  push_credentials w1{t1, 0, "test"};
  auto p0 = self->request(agg, 10s, push_atom::value, uint32_t{0}, uint64_t{0}, w0, grad(2));
  // Worker 0 sends its push again (its answer was lost) while the round waits for worker 1.
  auto again = self->request(agg, 10s, push_atom::value, uint32_t{0}, uint64_t{0}, w0, grad(2));
  auto dup = answer(again);
  REQUIRE_FALSE(dup);
  CHECK(is(dup.error(), af_error::already_exists));
  auto p1 = self->request(agg, 10s, push_atom::value, uint32_t{1}, uint64_t{0}, w1, grad(4));
  auto r0 = answer(p0);
  auto r1 = answer(p1);
  REQUIRE(r0);
  REQUIRE(r1);
  CHECK(r0->first == 1);
  // mean(2, 4) = 3, once: w = 0 - 1 * 3 (counted twice it would be -8/3).
  auto w = value_of(cell->apply(var_op::read, tensor{}, true)).value;
  CHECK(w.at(0) == -3);
  // After the round closed, the same push again is dropped as stale.
  auto late = self->request(agg, 10s, push_atom::value, uint32_t{0}, uint64_t{0}, w0, grad(2));
  auto rl = answer(late);
  REQUIRE(rl);
  CHECK(rl->first == 1);
  CHECK(value_of(cell->apply(var_op::read, tensor{}, true)).value.at(0) == -3);
  caf::anon_send_exit(agg, caf::exit_reason::user_shutdown);
}

// Bug caught: a client that saw no answer (the node was stopped past its
// wait) sends the update again and the node applies both: +2 instead of +1;
// or the client does not retry and fails although the node came back in time.
TEST_CASE("an assign_add whose answer was lost while its node was stopped is retried and applied "
          "once",
          "[exactly-once][processes]") {
  node_options opts;
  auto pc = value_of(process_cluster::start({{"ps", 1}, {"worker", 1}}, opts));
  cluster_client c{opts};
  session_options so;
  so.timeout = 9s; // 3 tries: the first waits 3 s
  so.data_plane = GENERATE(true, false);
  recovery_notes notes;
  so.on_recovery = notes.hook();
  auto s = value_of(session::make(*c.sys, pc->spec(), "/job:worker/task:0", so));
  output v;
  {
    auto d = value_of(s.device("/job:ps/task:0"));
    v = value_of(s.variable("v", {}, initializer::constant(0)));
  }
  auto inc = s.assign_add(v, s.constant(tensor::scalar(1.0f)));
  require_ok(s.initialize());
  run_trace trace;
  CHECK(value_of(s.run(std::vector<output>{inc}, &trace)).at(0).at(0) == 1);
  REQUIRE(!trace.entries.empty());
  CHECK(trace.entries.back().note.find(so.data_plane ? "data plane" : "CAF message")
        != std::string::npos);

  REQUIRE(pc->signal("ps", 0, SIGSTOP));
  auto pending = std::async(std::launch::async, [&] { return s.run(inc); });
  // The first try's wait ran out and the update went again: the node, still
  // stopped, holds both (in its socket buffers); now it runs again.
  bool retried = eventually([&] { return notes.count("retry: ") >= 1; }, 20s);
  REQUIRE(pc->signal("ps", 0, SIGCONT));
  REQUIRE(retried);
  REQUIRE(pending.wait_for(20s) == std::future_status::ready);
  auto answer = pending.get();
  INFO(notes.all());
  REQUIRE(answer);
  CHECK(answer->at(0) == 2); // the first (and only) application's result
  CHECK(value_of(s.run(v)).at(0) == 2);
  // The node applied it once: initialize (1) + two updates = version 3.
  auto vars = value_of(s.list_variables("ps", 0));
  REQUIRE(vars.size() == 1);
  CHECK(vars[0].version == 3);
  CHECK(notes.count("retry: assign_add of variable 'v'") >= 1);
}

} // namespace af::testing
