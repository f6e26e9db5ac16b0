#pragma once
/// The distributed-TensorFlow tutorial's examples (../shared/docs/tutorial.md),
/// written once: actorflow-tutorial prints them, the tests check them, on an
/// embedded cluster or on node processes alike.
///
/// Each example takes a session source (where its clients come from), its
/// parameters and an optional printer for the lines the tutorial prints, and
/// returns what happened: values, traces, losses, what each client saw. An
/// example checks nothing itself beyond what it needs to go on; an error of
/// any call comes back as the example's error, naming the client that got it.
///
///   auto ec = af::embedded_cluster::start({{"local", 2}});
///   af::tutorial::session_source src = [&](const std::string& j, int32_t t) {
///     return (*ec)->session_for(j, t);
///   };
///   auto r = af::tutorial::single_device(src, "local", [](const std::string& line) {
///     std::puts(line.c_str());
///   });

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "caf/expected.hpp"

#include "actors/session.hpp"
#include "actors/trace.hpp"
#include "core/tensor.hpp"
#include "messages/variable.hpp"

namespace af::tutorial {

/// A new session on /job:J/task:T (TF's tf.Session(server.target)).
using session_source = std::function<caf::expected<session>(const std::string& job, int32_t task)>;

/// Receives each line (or block of lines) an example prints. Examples that run
/// clients on several threads call it from one thread at a time.
using printer = std::function<void(const std::string& text)>;

// -- 单机单卡: one device --------------------------------------------------------

struct single_device_result {
  tensor sum;     ///< w + b: 2x2 of 7
  tensor product; ///< w * b: 2x2 of 10
  run_trace trace; ///< where w, b, addwb and mutwb ran
};

/// w (2x2 of 2) and b (2x2 of 5) on /cpu:0, addwb = w + b and mutwb = w * b
/// on /gpu:0 (soft placement puts them on CPU:0 without a GPU), from a
/// session on task 0 of `job`.
caf::expected<single_device_result> single_device(const session_source& sessions,
                                                  const std::string& job = "local",
                                                  const printer& print = {});

// -- 多机多卡: two servers share `var` by name ----------------------------------

struct shared_var_result {
  tensor initial_1, initial_2; ///< var as each session read it after initializing
  tensor incremented;          ///< what session 1's assign_add returned
  tensor after_1, after_2;     ///< var as each session read it after the increment
  std::string device_1, device_2; ///< where each session placed var
  run_trace trace_2;           ///< session 2's read after the increment
  tensor tripled;              ///< var * 3 computed by session 2 (a constant operand)
};

/// Sessions on tasks 0 and `second_task` of `job` each declare `var` (0.0),
/// each initialize it, and session 1 adds 1.
caf::expected<shared_var_result> shared_var(const session_source& sessions,
                                            const std::string& job = "local",
                                            int32_t second_task = 1, const printer& print = {});

// -- run_with_location_trace: var1 on task 0, var2 on task 1 ----------------------

struct placement_result {
  /// traces[s][v]: session s (0: on task 0, 1: on task 1) reading var1 (v = 0) or var2 (v = 1).
  run_trace traces[2][2];
};

/// Both sessions declare var1 under /job:J/task:0 and var2 under
/// /job:J/task:1; session 1 initializes both; each session reads each.
caf::expected<placement_result> placement(const session_source& sessions,
                                          const std::string& job = "local",
                                          const printer& print = {});

// -- 计算图: two graphs, one variable ---------------------------------------------

struct same_variable_result {
  std::vector<std::string> operations_1, operations_2; ///< each graph's ops (get_operations)
  tensor read_by_2;                  ///< var as session 2 reads it after session 1 assigned 42
  std::vector<variable_info> on_task_1; ///< what /job:J/task:1 holds afterwards
  std::vector<variable_info> on_task_0; ///< what /job:J/task:0 holds afterwards
};

/// Two independent sessions (tasks 0 and 1) each create `var` under
/// /job:J/task:1; session 1 assigns 42 and session 2 reads it.
caf::expected<same_variable_result> same_variable(const session_source& sessions,
                                                  const std::string& job = "local",
                                                  const printer& print = {});

// -- 谁负责初始化共享变量: who initializes -----------------------------------------

struct wait_for_initialization_params {
  std::chrono::milliseconds wait_timeout{20000};  ///< the waiter's wait_initialized
  std::chrono::milliseconds lonely_timeout{200};  ///< the wait that nobody answers
};

struct wait_for_initialization_result {
  std::vector<std::string> uninitialized_before; ///< what the waiter saw missing at first
  uint32_t waiters_parked = 0; ///< wait requests parked on var when the chief initialized it
  bool waiter_done_early = false; ///< the waiter's wait had ended before the chief initialized
  std::vector<std::string> uninitialized_after;
  tensor value;                ///< var as the waiter reads it: the chief's 3
  caf::error lonely_error;     ///< a short wait on `lonely`, which nobody initializes
};

/// A waiter (task 0) waits for `var` while the chief (task 1) initializes it
/// to 3, once the variable says the waiter is parked on it; then the waiter
/// waits `lonely_timeout` for `lonely`, which nobody initializes. A wait for
/// `var` that fails is the example's error.
caf::expected<wait_for_initialization_result>
wait_for_initialization(const session_source& sessions, const std::string& job = "local",
                        wait_for_initialization_params params = {}, const printer& print = {});

// -- 示例: a parameter server and two workers ------------------------------------

struct ps_workers_params {
  int32_t workers = 2;
  int32_t increments = 5;               ///< per worker
  std::chrono::milliseconds pause{0};   ///< between steps, the tutorial's sleep(1.0)
  std::chrono::milliseconds wait_timeout{30000}; ///< workers waiting for the ps to initialize
  /// The run the ps initializes under and the workers wait for; "" draws a
  /// random one. Workers that waited for any value would take one an earlier
  /// run left on the ps and increment it while the ps re-initializes.
  std::string run_id;
  /// Rounds: every worker increments once, then the ps reads, then the next
  /// round; otherwise each task goes at its own pace, as in the tutorial.
  bool lockstep = false;
  /// Called on the ps's thread after every session declared `var` and before
  /// the ps initializes it (tests look at the parked workers here). An error
  /// ends the example with it.
  std::function<caf::error(const std::string& run_id)> before_initialize;
};

struct ps_workers_result {
  std::string run_id;
  std::string ps_device;                   ///< where the ps placed var
  std::vector<std::string> worker_devices; ///< where each worker placed it
  std::vector<double> ps_saw;              ///< what the ps read while the workers ran, in order
  std::vector<std::vector<double>> worker_saw; ///< per worker: what each increment returned
  double final_value = 0;                  ///< var after every worker is done
};

/// The ps declares `var` on /job:ps/task:0 and initializes it under a run id;
/// each worker waits for that run's value, then adds 1 `increments` times;
/// the ps reads var `increments` times meanwhile. Each task is a session on
/// its own thread.
caf::expected<ps_workers_result> ps_workers(const session_source& sessions,
                                            ps_workers_params params = {},
                                            const printer& print = {});

// -- many clients, one variable --------------------------------------------------

struct concurrent_increments_result {
  std::vector<std::vector<double>> seen; ///< per client: what each of its increments returned
};

/// `clients` sessions on /job:worker/task:0 each add 1 `each` times, all at
/// once, to `counter` on /job:ps/task:0 (initialized to 0 by the first).
caf::expected<concurrent_increments_result> concurrent_increments(const session_source& sessions,
                                                                  int32_t clients, int32_t each,
                                                                  const printer& print = {});

// -- 单机多卡: two towers, gradients averaged on the CPU ----------------------------

struct towers_params {
  int32_t steps = 100;
  double learning_rate = 0.2;
  uint64_t seed = 1; ///< of the data and of w's initial value
};

struct towers_result {
  std::vector<std::string> tower_devices; ///< where the towers' matmuls ran (first step)
  /// Before training: the towers' averaged gradients of w and b, and the
  /// gradients of one device on the whole batch, which they must equal.
  tensor averaged_grad_w, averaged_grad_b, whole_grad_w, whole_grad_b;
  tensor w_before;      ///< w before the first step
  tensor w_after_first; ///< what the first step's update of w returned
  std::vector<double> losses; ///< per step: the loss on the whole batch (mean of the towers')
  tensor w, b;          ///< after the last step
  run_trace first_step; ///< the first training step
  /// When the client began and ended that step, on the trace's clock (the
  /// client's steady clock, in ns): every span of the step lies between them,
  /// give or take `clock_slack_ns`.
  int64_t first_step_began_ns = 0, first_step_ended_ns = 0;
  /// How far the trace may misplace a time taken on a node: half the longest
  /// round trip over which the session measured a node's clock (clock_of).
  int64_t clock_slack_ns = 0;
};

/// A linear model on 8 examples (targets from w = [1 -2 3 0.5], b = 0.25):
/// tower i on /cpu:i of task 0 of `job` takes half the batch; /cpu:0 averages
/// the towers' gradients and applies them. The node needs two CPU devices.
caf::expected<towers_result> towers(const session_source& sessions, const std::string& job = "local",
                                    towers_params params = {}, const printer& print = {});

// -- 模型并行: a two-layer network over two nodes ----------------------------------

struct model_parallel_params {
  int32_t steps = 50;
  double learning_rate = 0.5;
  uint64_t seed = 4; ///< of the data and of the weights' initial values
};

struct model_parallel_result {
  tensor x;                 ///< the inputs [6,4]
  tensor w1_initial, w2_initial;
  /// Before training, the split network (layer 1 on task 0, layer 2 on task
  /// 1) and the same network on task 0 alone, from the same weights.
  tensor loss, grad_w1, grad_w2, hidden; ///< split; hidden: the relu'd layer 1 [6,5]
  tensor one_node_loss, one_node_grad_w1, one_node_grad_w2;
  std::vector<double> losses;          ///< per step, the split network
  std::vector<double> one_node_losses; ///< per step, the one-node network
  run_trace first_step;                ///< the split network's first training step
  /// When the client began and ended that step, on the trace's clock (the
  /// client's steady clock, in ns): every span of the step lies between them,
  /// give or take `clock_slack_ns`.
  int64_t first_step_began_ns = 0, first_step_ended_ns = 0;
  /// How far the trace may misplace a time taken on a node: half the longest
  /// round trip over which the session measured a node's clock (clock_of).
  int64_t clock_slack_ns = 0;
};

/// layer1 = relu(x . w1) on /job:J/task:0, layer2 = x . w2 and the softmax
/// cross-entropy on /job:J/task:1, trained by SGD; the same network on task
/// 0 alone trains beside it as the reference.
caf::expected<model_parallel_result> model_parallel(const session_source& sessions,
                                                    const std::string& job = "local",
                                                    model_parallel_params params = {},
                                                    const printer& print = {});

// -- helpers ---------------------------------------------------------------------

/// Polls /job:J/task:T's variables every few milliseconds until `var` has at
/// least `count` wait requests parked on it, and returns its info; after
/// `timeout`, an af_error::timeout naming the variable and how many it saw.
caf::expected<variable_info> wait_for_waiters(session& s, const std::string& job, int32_t task,
                                              const std::string& var, uint32_t count,
                                              std::chrono::milliseconds timeout);

/// A fresh random run id ("run-" and 16 hex digits).
std::string random_run_id();

} // namespace af::tutorial
