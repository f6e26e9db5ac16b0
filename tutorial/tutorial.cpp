#include "tutorial/tutorial.hpp"

#include <algorithm>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "kernels/kernels.hpp"
#include "core/device_name.hpp"
#include "messages/error.hpp"

namespace af::tutorial {

namespace {

using namespace std::chrono_literals;

// Propagate an error out of an example; `lhs` takes the value otherwise.
#define AF_TRY_ASSIGN(lhs, expr)                                                  \
  do {                                                                            \
    auto af_try_ = (expr);                                                        \
    if (!af_try_)                                                                 \
      return std::move(af_try_.error());                                          \
    lhs = std::move(*af_try_);                                                    \
  } while (false)

// Declares `name` as a reference to the value of `expr`, or returns its error.
#define AF_TRY_LET(name, expr)                                                    \
  auto name##_expected_ = (expr);                                                 \
  if (!name##_expected_)                                                          \
    return std::move(name##_expected_.error());                                   \
  auto& name = *name##_expected_

#define AF_TRY(expr)                                                              \
  do {                                                                            \
    if (auto af_err_ = (expr))                                                    \
      return af_err_;                                                             \
  } while (false)

/// The printer, called from one thread at a time; a trailing newline is
/// dropped, since the printer ends each text with its own.
class serialized_printer {
public:
  explicit serialized_printer(const printer& out) : out_(out) {}

  void operator()(std::string text) {
    if (!out_)
      return;
    while (!text.empty() && text.back() == '\n')
      text.pop_back();
    std::lock_guard<std::mutex> guard{mtx_};
    out_(text);
  }

private:
  const printer& out_;
  std::mutex mtx_;
};

/// `err` with "who: " in front of its sentence, so that an example's error
/// says which of its clients got it.
caf::error in_role(const std::string& who, caf::error err) {
  if (!err)
    return err;
  if (err.category() == error_category)
    return make_error(static_cast<af_error>(err.code()), who + ": " + reason_of(err));
  return make_error(af_error::peer_down, who + ": " + describe(err));
}

caf::expected<session> open(const session_source& sessions, const std::string& job, int32_t task) {
  auto s = sessions(job, task);
  if (!s)
    return in_role("opening a session on /job:" + job + "/task:" + std::to_string(task),
                   std::move(s.error()));
  return s;
}

/// Gets or creates `name` inside the device scope `device`.
caf::expected<output> variable_on(session& s, const std::string& device, const std::string& name,
                                  shape_type shape, initializer init = initializer::zeros()) {
  auto scope = s.device(device);
  if (!scope)
    return std::move(scope.error());
  return s.variable(name, std::move(shape), std::move(init));
}

/// The job and task of a full device name.
caf::expected<std::pair<std::string, int32_t>> task_of(const std::string& device) {
  std::string why;
  auto d = device_name::parse(device, &why);
  if (!d || !d->job || !d->task)
    return make_error(af_error::invalid_device, "'" + device + "' names no job and task" +
                                                  (why.empty() ? "" : ": " + why));
  return std::make_pair(*d->job, *d->task);
}

/// The client's steady clock, which traces use.
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

/// Half the longest round trip over which `s` measured the clocks of
/// /job:J/task:T for each T in `tasks`: how far its traces may misplace a time.
caf::expected<int64_t> clock_slack(session& s, const std::string& job,
                                   const std::vector<int32_t>& tasks) {
  int64_t slack = 0;
  for (auto t : tasks) {
    auto clock = s.clock_of(job, t);
    if (!clock)
      return std::move(clock.error());
    slack = std::max(slack, clock->rtt_ns / 2 + 1);
  }
  return slack;
}

/// Rows [from, to) of a 2-D tensor.
tensor rows(const tensor& t, int64_t from, int64_t to) {
  auto cols = t.shape()[1];
  auto all = t.values<float>();
  return tensor::from_values<float>(
    {to - from, cols}, std::vector<float>(all.begin() + from * cols, all.begin() + to * cols));
}

caf::expected<tensor> random_tensor(shape_type shape, double low, double high, uint64_t seed,
                                    bool normal = false) {
  tensor t{dtype::float32, std::move(shape)};
  auto st = normal ? kernels::fill_normal(t, low, high, seed) : kernels::fill_uniform(t, low, high, seed);
  if (!st.ok())
    return make_error(af_error::invalid_argument, "random data: " + st.error);
  return t;
}

/// A barrier for the lockstep rounds of ps_workers that a failing task can
/// break, so that nobody waits for a task that is gone.
class round_barrier {
public:
  explicit round_barrier(size_t parties) : parties_(parties) {}

  /// False if the barrier was broken.
  bool arrive_and_wait() {
    std::unique_lock<std::mutex> guard{mtx_};
    if (broken_)
      return false;
    auto generation = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(guard, [&] { return generation_ != generation || broken_; });
    return !broken_;
  }

  void break_all() {
    std::lock_guard<std::mutex> guard{mtx_};
    broken_ = true;
    cv_.notify_all();
  }

private:
  std::mutex mtx_;
  std::condition_variable cv_;
  size_t parties_;
  size_t arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
};

/// The first error of several threads.
class first_error {
public:
  void set(caf::error err) {
    std::lock_guard<std::mutex> guard{mtx_};
    if (!err_)
      err_ = std::move(err);
  }
  caf::error take() {
    std::lock_guard<std::mutex> guard{mtx_};
    return std::move(err_);
  }

private:
  std::mutex mtx_;
  caf::error err_;
};

} // namespace

// -- helpers -------------------------------------------------------------------

caf::expected<variable_info> wait_for_waiters(session& s, const std::string& job, int32_t task,
                                              const std::string& var, uint32_t count,
                                              std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::optional<uint32_t> last;
  for (;;) {
    auto vars = s.list_variables(job, task);
    if (!vars)
      return std::move(vars.error());
    for (const auto& v : *vars)
      if (v.spec.name == var) {
        if (v.waiters >= count)
          return v;
        last = v.waiters;
      }
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(af_error::timeout,
                        fmt::format("waited {} ms for {} wait request(s) parked on variable '{}' "
                                    "of /job:{}/task:{}; {}",
                                    timeout.count(), count, var, job, task,
                                    last ? fmt::format("it had {}", *last)
                                         : std::string{"the node has no such variable"}));
    std::this_thread::sleep_for(2ms);
  }
}

std::string random_run_id() {
  std::random_device rd;
  uint64_t bits = (uint64_t{rd()} << 32) ^ rd();
  return fmt::format("run-{:016x}", bits);
}

// -- single device ---------------------------------------------------------------

caf::expected<single_device_result> single_device(const session_source& sessions,
                                                  const std::string& job, const printer& out) {
  serialized_printer print{out};
  AF_TRY_LET(s, open(sessions, job, 0));
  output w, b;
  AF_TRY_ASSIGN(w, variable_on(s, "/cpu:0", "w", {2, 2}, initializer::constant(2)));
  AF_TRY_ASSIGN(b, variable_on(s, "/cpu:0", "b", {2, 2}, initializer::constant(5)));
  auto gpu = s.device("/gpu:0");
  if (!gpu)
    return std::move(gpu.error());
  auto addwb = s.add(w, b, "addwb");
  auto mutwb = s.mul(w, b, "mutwb");
  gpu->reset();
  AF_TRY(s.initialize());
  single_device_result r;
  std::vector<tensor> values;
  AF_TRY_ASSIGN(values, s.run({addwb, mutwb}, &r.trace));
  r.sum = values[0];
  r.product = values[1];
  print(r.sum.to_string());
  print(r.product.to_string());
  print("location trace:\n" + r.trace.to_string());
  return r;
}

// -- shared variable -------------------------------------------------------------

caf::expected<shared_var_result> shared_var(const session_source& sessions, const std::string& job,
                                            int32_t second_task, const printer& out) {
  serialized_printer print{out};
  AF_TRY_LET(s1, open(sessions, job, 0));
  AF_TRY_LET(s2, open(sessions, job, second_task));
  output v1, v2;
  AF_TRY_ASSIGN(v1, s1.variable("var", {}));
  AF_TRY_ASSIGN(v2, s2.variable("var", {}));
  AF_TRY(in_role("session 1", s1.initialize()));
  AF_TRY(in_role("session 2", s2.initialize()));
  shared_var_result r;
  r.device_1 = s1.device_of(v1);
  r.device_2 = s2.device_of(v2);
  AF_TRY_ASSIGN(r.initial_1, s1.run(v1));
  print("Initial value of var in session 1: " + r.initial_1.to_string());
  AF_TRY_ASSIGN(r.initial_2, s2.run(v2));
  print("Initial value of var in session 2: " + r.initial_2.to_string());
  AF_TRY_ASSIGN(r.incremented, s1.run(s1.assign_add(v1, s1.constant(tensor::scalar(1)))));
  print("Incremented var in session 1");
  AF_TRY_ASSIGN(r.after_1, s1.run(v1));
  print("Value of var in session 1: " + r.after_1.to_string());
  AF_TRY_ASSIGN(r.after_2, s2.run(v2, &r.trace_2));
  print("Value of var in session 2: " + r.after_2.to_string());
  print("location trace of session 2's read:\n" + r.trace_2.by_device());
  AF_TRY_ASSIGN(r.tripled, s2.run(s2.mul(v2, s2.constant(tensor::scalar(3)))));
  print("var * 3 computed by session 2: " + r.tripled.to_string());
  return r;
}

// -- placement -------------------------------------------------------------------

caf::expected<placement_result> placement(const session_source& sessions, const std::string& job,
                                          const printer& out) {
  serialized_printer print{out};
  AF_TRY_LET(s1, open(sessions, job, 0));
  AF_TRY_LET(s2, open(sessions, job, 1));
  session* ss[2] = {&s1, &s2};
  output vars[2][2];
  for (int i = 0; i < 2; ++i)
    for (int v = 0; v < 2; ++v)
      AF_TRY_ASSIGN(vars[i][v], variable_on(*ss[i], "/job:" + job + "/task:" + std::to_string(v),
                                            "var" + std::to_string(v + 1), {}));
  AF_TRY(s1.initialize()); // initializes both
  placement_result r;
  for (int i = 0; i < 2; ++i)
    for (int v = 0; v < 2; ++v) {
      tensor value;
      AF_TRY_ASSIGN(value, ss[i]->run(vars[i][v], &r.traces[i][v]));
      print(fmt::format("session {} reads var{}:\n{}", i + 1, v + 1, r.traces[i][v].by_device()));
    }
  return r;
}

// -- same variable ---------------------------------------------------------------

caf::expected<same_variable_result> same_variable(const session_source& sessions,
                                                  const std::string& job, const printer& out) {
  serialized_printer print{out};
  AF_TRY_LET(s1, open(sessions, job, 0));
  AF_TRY_LET(s2, open(sessions, job, 1));
  auto on_task1 = "/job:" + job + "/task:1";
  output v1, v2;
  AF_TRY_ASSIGN(v1, variable_on(s1, on_task1, "var", {}));
  same_variable_result r;
  r.operations_1 = s1.operations();
  print(fmt::format("graph 1's operations: [{}]", fmt::join(r.operations_1, ", ")));
  r.operations_2 = s2.operations();
  print(fmt::format("graph 2's operations: [{}]", fmt::join(r.operations_2, ", ")));
  AF_TRY_ASSIGN(v2, variable_on(s2, on_task1, "var", {}));
  tensor assigned;
  AF_TRY_ASSIGN(assigned, s1.run(s1.assign(v1, s1.constant(tensor::scalar(42)))));
  print("session 1 assigned var = " + assigned.to_string());
  AF_TRY_ASSIGN(r.read_by_2, s2.run(v2));
  print("session 2 reads var = " + r.read_by_2.to_string());
  AF_TRY_ASSIGN(r.on_task_1, s2.list_variables(job, 1));
  AF_TRY_ASSIGN(r.on_task_0, s1.list_variables(job, 0));
  for (const auto& v : r.on_task_1)
    print(fmt::format("/job:{}/task:1 holds '{}' (version {})", job, v.spec.name, v.version));
  print(fmt::format("/job:{}/task:0 holds {} variable(s)", job, r.on_task_0.size()));
  return r;
}

// -- wait for initialization -----------------------------------------------------

caf::expected<wait_for_initialization_result>
wait_for_initialization(const session_source& sessions, const std::string& job,
                        wait_for_initialization_params params, const printer& out) {
  serialized_printer print{out};
  AF_TRY_LET(waiter, open(sessions, job, 0));
  AF_TRY_LET(chief, open(sessions, job, 1));
  output wv, cv;
  AF_TRY_ASSIGN(wv, waiter.variable("var", {}));
  AF_TRY_ASSIGN(cv, chief.variable("var", {}, initializer::constant(3)));
  std::pair<std::string, int32_t> home;
  AF_TRY_ASSIGN(home, task_of(chief.device_of(cv)));
  wait_for_initialization_result r;
  AF_TRY_ASSIGN(r.uninitialized_before, waiter.uninitialized());
  print("Server 1: waiting for initialization...");
  auto waiting = std::async(std::launch::async,
                            [&] { return waiter.wait_initialized(params.wait_timeout); });
  // The chief initializes once the variable holds the waiter's request, or
  // once the waiter is done (which it should not be yet).
  auto deadline = std::chrono::steady_clock::now() + params.wait_timeout;
  caf::error not_parked;
  for (;;) {
    if (waiting.wait_for(0ms) == std::future_status::ready) {
      r.waiter_done_early = true;
      break;
    }
    auto vars = chief.list_variables(home.first, home.second);
    if (!vars) {
      not_parked = in_role("the chief, looking for the waiter", std::move(vars.error()));
      break;
    }
    for (const auto& v : *vars)
      if (v.spec.name == "var")
        r.waiters_parked = v.waiters;
    if (r.waiters_parked > 0)
      break;
    if (std::chrono::steady_clock::now() >= deadline) {
      not_parked = make_error(af_error::timeout, "the waiter's request never showed up on 'var'");
      break;
    }
    std::this_thread::sleep_for(2ms);
  }
  print(fmt::format("Server 2: {} waiter(s) parked on var; initializing variables",
                    r.waiters_parked));
  auto init_err = chief.initialize();
  auto wait_err = waiting.get(); // the waiter's session is ours again
  AF_TRY(in_role("the chief", std::move(init_err)));
  AF_TRY(not_parked);
  AF_TRY(in_role("the waiter", std::move(wait_err)));
  print("Server 1: variables initialized!");
  AF_TRY_ASSIGN(r.uninitialized_after, waiter.uninitialized());
  AF_TRY_ASSIGN(r.value, waiter.run(wv));
  print("Server 1: var = " + r.value.to_string());
  output lonely;
  AF_TRY_ASSIGN(lonely, waiter.variable("lonely", {2}));
  r.lonely_error = waiter.wait_initialized(params.lonely_timeout, {lonely});
  print("Server 1: waiting for 'lonely', which nobody initializes: " + describe(r.lonely_error));
  return r;
}

// -- ps and workers --------------------------------------------------------------

caf::expected<ps_workers_result> ps_workers(const session_source& sessions,
                                            ps_workers_params params, const printer& out) {
  serialized_printer print{out};
  ps_workers_result r;
  r.run_id = params.run_id.empty() ? random_run_id() : params.run_id;
  auto declare = [](session& s) { return variable_on(s, "/job:ps/task:0", "var", {}); };
  AF_TRY_LET(ps, open(sessions, "ps", 0));
  output pv;
  AF_TRY_ASSIGN(pv, declare(ps));
  r.ps_device = ps.device_of(pv);
  std::vector<session> workers;
  std::vector<output> worker_vars;
  for (int32_t n = 0; n < params.workers; ++n) {
    AF_TRY_LET(s, open(sessions, "worker", n));
    output v;
    AF_TRY_ASSIGN(v, declare(s));
    r.worker_devices.push_back(s.device_of(v));
    workers.push_back(std::move(s));
    worker_vars.push_back(v);
  }
  r.worker_saw.resize(workers.size());
  round_barrier rounds{workers.size() + 1};
  first_error failed;
  auto fail = [&](const std::string& who, caf::error err) {
    failed.set(in_role(who, std::move(err)));
    rounds.break_all();
  };
  auto parameter_server = [&] {
    if (params.before_initialize)
      if (auto err = params.before_initialize(r.run_id))
        return fail("before the parameter server initialized", std::move(err));
    print("Parameter server: initializing variables (run " + r.run_id + ")...");
    if (auto err = ps.initialize({}, r.run_id))
      return fail("parameter server", std::move(err));
    print("Parameter server: variables initialized");
    for (int32_t i = 0; i < params.increments; ++i) {
      if (params.lockstep && !rounds.arrive_and_wait()) // this round's increments are done
        return;
      auto v = ps.run(pv);
      if (!v)
        return fail("parameter server", std::move(v.error()));
      r.ps_saw.push_back(v->at(0));
      print("Parameter server: var has value " + v->to_string());
      if (params.lockstep && !rounds.arrive_and_wait()) // the next round may start
        return;
      std::this_thread::sleep_for(params.pause);
    }
  };
  auto worker = [&](size_t n) {
    auto who = "Worker " + std::to_string(n);
    auto& s = workers[n];
    print(who + ": waiting for variable initialization...");
    if (auto err = s.wait_initialized(params.wait_timeout, {}, r.run_id))
      return fail(who, std::move(err));
    print(who + ": variables initialized");
    auto inc = s.assign_add(worker_vars[n], s.constant(tensor::scalar(1)));
    for (int32_t i = 0; i < params.increments; ++i) {
      auto v = s.run(inc);
      if (!v)
        return fail(who, std::move(v.error()));
      r.worker_saw[n].push_back(v->at(0));
      print(who + ": incremented var to " + v->to_string());
      if (params.lockstep && !(rounds.arrive_and_wait() && rounds.arrive_and_wait()))
        return;
      std::this_thread::sleep_for(params.pause);
    }
  };
  {
    std::vector<std::thread> tasks;
    tasks.emplace_back(parameter_server);
    for (size_t n = 0; n < workers.size(); ++n)
      tasks.emplace_back(worker, n);
    for (auto& t : tasks)
      t.join();
  }
  AF_TRY(failed.take());
  tensor final_value;
  AF_TRY_ASSIGN(final_value, ps.run(pv));
  r.final_value = final_value.at(0);
  print("Final value of var on /job:ps/task:0: " + final_value.to_string());
  return r;
}

// -- concurrent increments -------------------------------------------------------

caf::expected<concurrent_increments_result> concurrent_increments(const session_source& sessions,
                                                                  int32_t clients, int32_t each,
                                                                  const printer& out) {
  serialized_printer print{out};
  std::vector<session> ss;
  std::vector<output> incs;
  for (int32_t i = 0; i < clients; ++i) {
    AF_TRY_LET(s, open(sessions, "worker", 0));
    output v;
    AF_TRY_ASSIGN(v, variable_on(s, "/job:ps/task:0", "counter", {}));
    if (i == 0)
      AF_TRY(s.initialize({v}));
    incs.push_back(s.assign_add(v, s.constant(tensor::scalar(1))));
    ss.push_back(std::move(s));
  }
  concurrent_increments_result r;
  r.seen.resize(ss.size());
  first_error failed;
  {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ss.size(); ++i)
      threads.emplace_back([&, i] {
        for (int32_t k = 0; k < each; ++k) {
          auto v = ss[i].run(incs[i]);
          if (!v)
            return failed.set(in_role(fmt::format("client {}, increment {}", i, k + 1),
                                      std::move(v.error())));
          r.seen[i].push_back(v->at(0));
        }
      });
    for (auto& t : threads)
      t.join();
  }
  AF_TRY(failed.take());
  for (size_t i = 0; i < r.seen.size(); ++i)
    print(fmt::format("client {}: last increment returned {}", i,
                      r.seen[i].empty() ? 0.0 : r.seen[i].back()));
  return r;
}

// -- towers ----------------------------------------------------------------------

caf::expected<towers_result> towers(const session_source& sessions, const std::string& job,
                                    towers_params params, const printer& out) {
  serialized_printer print{out};
  AF_TRY_LET(s, open(sessions, job, 0));
  tensor x, w_init;
  AF_TRY_ASSIGN(x, random_tensor({8, 4}, -1, 1, params.seed));
  AF_TRY_ASSIGN(w_init, random_tensor({4, 1}, -1, 1, params.seed + 1));
  tensor t{dtype::float32, {8, 1}}; // the target: t = x . [1, -2, 3, 0.5] + 0.25
  for (int64_t i = 0; i < 8; ++i) {
    const float* row = x.data<float>() + i * 4;
    t.mutable_data<float>()[i] = row[0] - 2 * row[1] + 3 * row[2] + 0.5f * row[3] + 0.25f;
  }
  output w, b;
  AF_TRY_ASSIGN(w, variable_on(s, "/cpu:0", "w", {4, 1}, initializer::from_tensor(w_init)));
  AF_TRY_ASSIGN(b, variable_on(s, "/cpu:0", "b", {1}, initializer::zeros()));
  auto model_loss = [&](output xs, output ts, const std::string& name) {
    auto pred = s.add(s.matmul(xs, w), b);
    return s.op("mean", {s.square(s.sub(pred, ts))}, {}, name);
  };
  // the towers: half the batch each, on their own device
  std::vector<output> tower_loss;
  std::vector<std::vector<output>> tower_grads;
  for (int i = 0; i < 2; ++i) {
    auto dev = s.device("/cpu:" + std::to_string(i));
    if (!dev)
      return std::move(dev.error());
    tower_loss.push_back(model_loss(s.constant(rows(x, 4 * i, 4 * i + 4)),
                                    s.constant(rows(t, 4 * i, 4 * i + 4)),
                                    "tower" + std::to_string(i) + "_loss"));
    std::vector<output> g;
    AF_TRY_ASSIGN(g, s.gradients(tower_loss.back(), {w, b}));
    tower_grads.push_back(g);
  }
  // averaged and applied on the CPU that holds the variables
  auto cpu0 = s.device("/cpu:0");
  if (!cpu0)
    return std::move(cpu0.error());
  auto half = s.constant(tensor::scalar(0.5f));
  auto avg_w = s.mul(s.add(tower_grads[0][0], tower_grads[1][0]), half, "avg_w");
  auto avg_b = s.mul(s.add(tower_grads[0][1], tower_grads[1][1]), half, "avg_b");
  // the reference: one device, the whole batch
  std::vector<output> whole;
  AF_TRY_ASSIGN(whole, s.gradients(model_loss(s.constant(x), s.constant(t), "whole_loss"), {w, b}));
  auto lr = s.constant(tensor::scalar(static_cast<float>(params.learning_rate)));
  auto step_w = s.assign_sub(w, s.mul(avg_w, lr));
  auto step_b = s.assign_sub(b, s.mul(avg_b, lr));
  cpu0->reset();
  AF_TRY(s.initialize());

  towers_result r;
  std::vector<tensor> check;
  AF_TRY_ASSIGN(check, s.run({avg_w, avg_b, whole[0], whole[1]}));
  r.averaged_grad_w = check[0];
  r.averaged_grad_b = check[1];
  r.whole_grad_w = check[2];
  r.whole_grad_b = check[3];
  AF_TRY_ASSIGN(r.w_before, s.run(w));
  for (int32_t i = 0; i < params.steps; ++i) {
    std::vector<tensor> got;
    auto began = steady_ns();
    AF_TRY_ASSIGN(got, s.run({tower_loss[0], tower_loss[1], step_w, step_b},
                             i == 0 ? &r.first_step : nullptr));
    if (i == 0) {
      r.first_step_began_ns = began;
      r.first_step_ended_ns = steady_ns();
    }
    r.losses.push_back((got[0].at(0) + got[1].at(0)) / 2);
    if (i == 0) {
      r.w_after_first = got[2];
      std::set<std::string> devices;
      for (const auto& e : r.first_step.entries)
        if (e.kind == "matmul")
          devices.insert(e.device);
      r.tower_devices.assign(devices.begin(), devices.end());
      for (const auto& d : r.tower_devices)
        print("tower ran on " + d);
    }
    if (i % 20 == 0 || i == params.steps - 1)
      print(fmt::format("step {:3}: loss = {:.5f}", i, r.losses.back()));
  }
  AF_TRY_ASSIGN(r.clock_slack_ns, clock_slack(s, job, {0}));
  AF_TRY_ASSIGN(r.w, s.run(w));
  AF_TRY_ASSIGN(r.b, s.run(b));
  print("w = " + r.w.to_string() + ", b = " + r.b.to_string()
        + " (the data came from w = [1 -2 3 0.5], b = 0.25)");
  return r;
}

// -- model parallelism -----------------------------------------------------------

caf::expected<model_parallel_result> model_parallel(const session_source& sessions,
                                                    const std::string& job,
                                                    model_parallel_params params,
                                                    const printer& out) {
  serialized_printer print{out};
  AF_TRY_LET(s, open(sessions, job, 0));
  model_parallel_result r;
  AF_TRY_ASSIGN(r.x, random_tensor({6, 4}, -1, 1, params.seed));
  AF_TRY_ASSIGN(r.w1_initial, random_tensor({4, 5}, 0, 0.5, params.seed + 1, true));
  AF_TRY_ASSIGN(r.w2_initial, random_tensor({5, 3}, 0, 0.5, params.seed + 2, true));
  auto x = s.constant(r.x, "x");
  auto labels = s.constant(tensor::from_values<int32_t>({6}, {0, 2, 1, 1, 0, 2}), "labels");
  auto lr = s.constant(tensor::scalar(static_cast<float>(params.learning_rate)), "lr");
  struct network {
    output loss, hidden, grad_w1, grad_w2, step_w1, step_w2;
  };
  auto build = [&](const std::string& dev1, const std::string& dev2,
                   const std::string& suffix) -> caf::expected<network> {
    network n;
    output w1, w2;
    {
      auto d = s.device(dev1);
      if (!d)
        return std::move(d.error());
      AF_TRY_ASSIGN(w1, s.variable("w1" + suffix, {4, 5}, initializer::from_tensor(r.w1_initial)));
      n.hidden = s.op("relu", {s.matmul(x, w1, false, false, "layer1" + suffix)}, {}, "relu" + suffix);
    }
    {
      auto d = s.device(dev2);
      if (!d)
        return std::move(d.error());
      AF_TRY_ASSIGN(w2, s.variable("w2" + suffix, {5, 3}, initializer::from_tensor(r.w2_initial)));
      auto logits = s.matmul(n.hidden, w2, false, false, "layer2" + suffix);
      n.loss = s.op("mean", {s.softmax_xent(logits, labels)}, {}, "loss" + suffix);
    }
    std::vector<output> g;
    AF_TRY_ASSIGN(g, s.gradients(n.loss, {w1, w2}));
    n.grad_w1 = g[0];
    n.grad_w2 = g[1];
    n.step_w1 = s.assign_sub(w1, s.mul(g[0], lr));
    n.step_w2 = s.assign_sub(w2, s.mul(g[1], lr));
    return n;
  };
  auto task = [&](int t) { return "/job:" + job + "/task:" + std::to_string(t); };
  network split, one_node;
  AF_TRY_ASSIGN(split, build(task(0), task(1), ""));
  AF_TRY_ASSIGN(one_node, build(task(0), task(0), "_one_node"));
  AF_TRY(s.initialize());

  std::vector<tensor> check;
  AF_TRY_ASSIGN(check, s.run({split.loss, split.grad_w1, split.grad_w2, split.hidden, one_node.loss,
                              one_node.grad_w1, one_node.grad_w2}));
  r.loss = check[0];
  r.grad_w1 = check[1];
  r.grad_w2 = check[2];
  r.hidden = check[3];
  r.one_node_loss = check[4];
  r.one_node_grad_w1 = check[5];
  r.one_node_grad_w2 = check[6];
  for (int32_t i = 0; i < params.steps; ++i) {
    std::vector<tensor> got;
    auto began = steady_ns();
    AF_TRY_ASSIGN(got, s.run({split.loss, split.step_w1, split.step_w2},
                             i == 0 ? &r.first_step : nullptr));
    if (i == 0) {
      r.first_step_began_ns = began;
      r.first_step_ended_ns = steady_ns();
    }
    r.losses.push_back(got[0].at(0));
    AF_TRY_ASSIGN(got, s.run({one_node.loss, one_node.step_w1, one_node.step_w2}));
    r.one_node_losses.push_back(got[0].at(0));
    if (i == 0)
      print("first step's trace:\n" + r.first_step.to_string());
    if (i % 10 == 0 || i == params.steps - 1)
      print(fmt::format("step {:2}: loss = {:.5f} (the same network on one node: {:.5f})", i,
                        r.losses.back(), r.one_node_losses.back()));
  }
  AF_TRY_ASSIGN(r.clock_slack_ns, clock_slack(s, job, {0, 1}));
  return r;
}

} // namespace af::tutorial
