// The graph library on its own: building, placement against a table of
// devices, the cut into partitions, in-graph replication and the one-process
// evaluator. No CAF and no cluster.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>

#include "graph/evaluate.hpp"
#include "graph/graph.hpp"
#include "graph/partition.hpp"
#include "graph/placement.hpp"
#include "graph/replicate.hpp"
#include "kernels/kernels.hpp"

using namespace af;

namespace {

device_name dev(const std::string& text) {
  auto d = device_name::parse(text);
  REQUIRE(d);
  return *d;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

template <class T>
T value_of(outcome<T> r) {
  if (!r)
    FAIL(to_string(r.error().code) << ": " << r.error().what);
  return std::move(*r);
}

/// ps: one task with CPU:0; worker: task 0 with CPU:0 and CPU:1, task 1 with
/// CPU:0 and GPU:0. Like a cluster spec, it names what it lacks.
outcome<std::vector<std::string>> table_catalog(const std::string& job, int32_t task) {
  static const std::map<std::string, std::vector<std::vector<std::string>>> table = {
    {"ps", {{"CPU:0"}}},
    {"worker", {{"CPU:0", "CPU:1"}, {"CPU:0", "GPU:0"}}},
  };
  auto it = table.find(job);
  if (it == table.end())
    return graph_error{af_error::unknown_job, "job '" + job + "' is not in the cluster (jobs: ps, worker)"};
  if (task < 0 || static_cast<size_t>(task) >= it->second.size())
    return graph_error{af_error::task_out_of_range,
                       "task index " + std::to_string(task) + " is out of range for job '" + job + "'"};
  return it->second[static_cast<size_t>(task)];
}

placement_policy worker1(bool soft = true) {
  placement_policy p;
  p.job = "worker";
  p.task = 1;
  p.soft_placement = soft;
  return p;
}

placed_device placed(const std::string& requested, bool for_variable,
                     const placement_policy& policy = worker1()) {
  return value_of(place(dev(requested), for_variable, policy, table_catalog));
}

graph_error place_error(const std::string& requested, bool for_variable,
                        const placement_policy& policy = worker1()) {
  auto r = place(dev(requested), for_variable, policy, table_catalog);
  REQUIRE_FALSE(r);
  return r.error();
}

std::unique_ptr<kernels::backend> cpu() {
  return kernels::make_cpu_backend();
}

} // namespace

// -- building -----------------------------------------------------------------

TEST_CASE("op names are made unique, variable names are kept as given", "[graph]") {
  graph g;
  auto x = g.placeholder("x");
  auto a = g.add(x, x);
  auto b = g.add(x, x);
  auto c = g.add(x, x);
  CHECK(g.at(a).name == "add"); // bug caught: a suffix on the first use
  CHECK(g.at(b).name == "add_1");
  CHECK(g.at(c).name == "add_2");
  // A name the user took is never handed out again.
  CHECK(g.at(g.neg(x)).name == "neg");
  auto user = g.op("neg", {x}, {}, "neg_1");
  auto next = g.neg(x);
  CHECK(g.at(user).name == "neg_1");
  CHECK(g.at(next).name == "neg_2"); // bug caught: two nodes called neg_1
  // Variables keep their name (their identity in the cluster); an op asking
  // for the same name gets a suffix.
  auto w = value_of(g.variable("w", {2}));
  auto w_op = g.op("neg", {w}, {}, "w");
  CHECK(g.at(w).name == "w");
  CHECK(g.at(w_op).name == "w_1");
  // Updates are named after their variable.
  auto upd = g.assign_add(w, x);
  auto upd2 = g.assign_add(w, x);
  CHECK(g.at(upd).name == "w/assign_add");
  CHECK(g.at(upd2).name == "w/assign_add_1");
  auto names = g.operations();
  CHECK(names.size() == g.size());
  CHECK(names.front() == "x");
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());
}

TEST_CASE("nested scopes merge, inner fields winning, and updates take their variable's scope",
          "[graph]") {
  graph g;
  CHECK(g.current_scope().to_string().empty());
  g.push_scope(dev("/job:ps/task:0/cpu:0"));
  g.push_scope(dev("/gpu:1"));
  CHECK(g.current_scope().to_string() == "/job:ps/task:0/device:GPU:1"); // bug caught: outer wins
  auto w = value_of(g.variable("w", {2}));
  g.pop_scope();
  CHECK(g.current_scope().to_string() == "/job:ps/task:0/device:CPU:0");
  g.pop_scope();
  g.pop_scope(); // one too many is harmless
  CHECK(g.scopes().empty());
  g.push_scope(dev("/job:worker"));
  auto c = g.constant(tensor::scalar(1));
  auto upd = g.assign(w, c);
  CHECK(g.at(w).requested.to_string() == "/job:ps/task:0/device:GPU:1");
  CHECK(g.at(c).requested.to_string() == "/job:worker");
  // bug caught: an update placed by the scope open when it was made
  CHECK(g.at(upd).requested == g.at(w).requested);
}

TEST_CASE("variables: the same name returns the same node, a different one is an error naming both",
          "[graph][errors]") {
  graph g;
  auto w = value_of(g.variable("w", {2, 3}, initializer::ones()));
  CHECK(g.at(w).kind == node_kind::variable);
  CHECK(g.at(w).spec.name == "w");
  CHECK(g.at(w).spec.shape == shape_type{2, 3});
  CHECK(g.at(w).spec.device.empty()); // placement fills it
  CHECK(g.at(w).init.kind == "constant");
  auto again = value_of(g.variable("w", {2, 3}));
  CHECK(again == w);
  CHECK(g.variables().size() == 1);

  auto shape = g.variable("w", {3});
  REQUIRE_FALSE(shape);
  CHECK(shape.error().code == af_error::shape_mismatch);
  CHECK(contains(shape.error().what, "'w'"));
  CHECK(contains(shape.error().what, "[2,3]"));
  CHECK(contains(shape.error().what, "[3]"));

  auto type = g.variable("w", {2, 3}, initializer::zeros(), dtype::float64);
  REQUIRE_FALSE(type);
  CHECK(type.error().code == af_error::dtype_mismatch);
  CHECK(contains(type.error().what, "float32"));
  CHECK(contains(type.error().what, "float64"));

  auto empty = g.variable("", {2});
  REQUIRE_FALSE(empty);
  CHECK(empty.error().code == af_error::invalid_argument);
  CHECK(empty.error().what == "a variable needs a non-empty name");

  auto negative = g.variable("n", {2, -1});
  REQUIRE_FALSE(negative);
  CHECK(negative.error().code == af_error::invalid_argument);
  CHECK(contains(negative.error().what, "'n'"));
  CHECK(contains(negative.error().what, "[2,-1]"));

  // 2^62 elements fit an int64, their 2^64 bytes do not.
  auto huge = g.variable("huge", {int64_t{1} << 31, int64_t{1} << 31});
  REQUIRE_FALSE(huge);
  CHECK(huge.error().code == af_error::invalid_argument);
  CHECK(contains(huge.error().what, "'huge'"));
  CHECK(contains(huge.error().what, "has too many elements"));
  auto count = g.variable("count", {int64_t{1} << 40, int64_t{1} << 40});
  REQUIRE_FALSE(count);
  CHECK(contains(count.error().what, "has too many elements"));
  // Zero elements are fine whatever the other dimensions.
  CHECK(g.variable("none", {0, int64_t{1} << 62}));
  CHECK(g.variables().size() == 2); // failures added nothing

  CHECK(g.find_variable("w") == w);
  CHECK_FALSE(g.find_variable("nope").valid());
  CHECK(g.variable_node(w) != nullptr);
  CHECK(g.variable_node(g.constant(tensor::scalar(1))) == nullptr);
  CHECK(g.variable_node(output{-1}) == nullptr);
}

TEST_CASE("an update of something that is not a variable is an invalid output, named when run",
          "[graph][errors]") {
  graph g;
  auto c = g.constant(tensor::scalar(1), "c");
  CHECK_FALSE(g.assign(c, c).valid());
  CHECK_FALSE(g.assign_add(output{99}, c).valid());
  CHECK_FALSE(g.assign_sub(g.neg(c), c).valid());
  auto bad = g.add(g.assign(c, c), c, "uses_bad");
  auto cl = g.closure({bad.id});
  REQUIRE_FALSE(cl);
  CHECK(cl.error().code == af_error::invalid_argument);
  CHECK(contains(cl.error().what, "op 'uses_bad' has an invalid input"));
  auto root = g.closure({g.assign(c, c).id});
  REQUIRE_FALSE(root);
  CHECK(root.error().code == af_error::invalid_argument);
}

TEST_CASE("closure: what the roots need, ascending, stopping at variables, constants and feeds",
          "[graph]") {
  graph g;
  auto w = value_of(g.variable("w", {2}));
  auto x = g.placeholder("x");
  auto c = g.constant(tensor::scalar(2));
  auto a = g.mul(w, x);
  auto unrelated = g.neg(c);
  auto b = g.add(a, c);
  auto upd = g.assign(w, b);
  auto cl = value_of(g.closure({upd.id}));
  CHECK(cl == std::vector<int32_t>{a.id, b.id, upd.id});
  // bug caught: an op nothing asked for runs
  CHECK(std::find(cl.begin(), cl.end(), unrelated.id) == cl.end());
  CHECK(value_of(g.closure({w.id, x.id})).empty());
  CHECK(value_of(g.closure({b.id, a.id, b.id})) == std::vector<int32_t>{a.id, b.id});
  CHECK(contains(g.to_string(), "mul(" + std::to_string(w.id) + ", " + std::to_string(x.id) + ")"));
}

// -- placement ----------------------------------------------------------------

TEST_CASE("placement completes a requested device by TensorFlow's rules", "[graph][placement]") {
  // A variable with no job: task 0 of the session's job, not the session's task.
  auto v = placed("", true);
  CHECK(v.full == "/job:worker/replica:0/task:0/device:CPU:0");
  CHECK(v.job == "worker");
  CHECK(v.task == 0);
  CHECK(v.local == "CPU:0");
  CHECK(v.note.empty());
  CHECK(v.task_name() == "/job:worker/task:0");
  // A variable with a job but no task: that job's task 0.
  CHECK(placed("/job:ps", true).full == "/job:ps/replica:0/task:0/device:CPU:0");
  // An op with no job: the session's own task.
  CHECK(placed("", false).full == "/job:worker/replica:0/task:1/device:CPU:0");
  // A job but no task: task 0 of it, for ops too.
  CHECK(placed("/job:worker", false).full == "/job:worker/replica:0/task:0/device:CPU:0");
  // No device type: CPU:0; a device the task has: that one.
  CHECK(placed("/task:0", false).full == "/job:worker/replica:0/task:0/device:CPU:0");
  CHECK(placed("/job:worker/task:0/cpu:1", false).local == "CPU:1");
  auto gpu = placed("/gpu:0", false); // task 1 has a GPU
  CHECK(gpu.full == "/job:worker/replica:0/task:1/device:GPU:0");
  CHECK(gpu.note.empty());
  CHECK(placed("/job:ps/task:0/replica:0", true).full == "/job:ps/replica:0/task:0/device:CPU:0");
}

TEST_CASE("a device the task lacks falls back to CPU:0 with a note, or is an error without soft placement",
          "[graph][placement][errors]") {
  auto soft = placed("/job:worker/task:0/gpu:0", false);
  CHECK(soft.full == "/job:worker/replica:0/task:0/device:CPU:0");
  CHECK(soft.note == "soft placement: /job:worker/replica:0/task:0/device:GPU:0 is not available on "
                     "/job:worker/task:0 (it has CPU:0, CPU:1); placed on CPU:0");
  auto hard = place_error("/job:worker/task:0/gpu:0", false, worker1(false));
  CHECK(hard.code == af_error::unknown_device);
  CHECK(hard.what == "/job:worker/replica:0/task:0/device:GPU:0 is not available on /job:worker/task:0 "
                     "(it has CPU:0, CPU:1); enable soft placement or pick one of those");
  // Without soft placement, a device that exists is still fine.
  CHECK(value_of(place(dev("/gpu:0"), false, worker1(false), table_catalog)).local == "GPU:0");
  CHECK(place_error("/job:ps/cpu:1", true, worker1(false)).code == af_error::unknown_device);
}

TEST_CASE("placement errors: a replica other than 0, and whatever the catalog says", "[graph][placement][errors]") {
  auto replica = place_error("/job:ps/replica:1", true);
  CHECK(replica.code == af_error::unknown_device);
  CHECK(replica.what == "device /job:ps/replica:1: replica 1 does not exist (actorflow runs replica 0 "
                        "of each task)");
  auto job = place_error("/job:nope/cpu:0", false);
  CHECK(job.code == af_error::unknown_device);
  CHECK(job.what == "device /job:nope/device:CPU:0: job 'nope' is not in the cluster (jobs: ps, worker)");
  auto task = place_error("/job:ps/task:3", true);
  CHECK(task.code == af_error::unknown_device);
  CHECK(contains(task.what, "device /job:ps/task:3: task index 3 is out of range"));
  // A node that cannot be asked keeps its code: it is not a missing device.
  device_catalog down = [](const std::string&, int32_t) -> outcome<std::vector<std::string>> {
    return graph_error{af_error::unreachable, "cannot reach /job:ps/task:0 at localhost:1"};
  };
  auto r = place(device_name{}, true, worker1(), down);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == af_error::unreachable);
  CHECK(r.error().what == "device (no device): cannot reach /job:ps/task:0 at localhost:1");
}

TEST_CASE("placed_from_full reads a canonical full device", "[graph][placement]") {
  auto p = value_of(placed_from_full("/job:ps/replica:0/task:2/device:GPU:1"));
  CHECK(p.job == "ps");
  CHECK(p.task == 2);
  CHECK(p.local == "GPU:1");
  CHECK(p.full == "/job:ps/replica:0/task:2/device:GPU:1");
  CHECK(p.note.empty());
  auto partial = placed_from_full("/job:ps/task:0");
  REQUIRE_FALSE(partial);
  CHECK(partial.error().code == af_error::invalid_device);
  auto garbage = placed_from_full("ps:0");
  REQUIRE_FALSE(garbage);
  CHECK(garbage.error().code == af_error::invalid_device);
}

// -- partitions ---------------------------------------------------------------

namespace {

/// w and u on the ps; y = matmul(x, w) on worker 0, z = relu(y) and
/// r = z + y + x on worker 1, an update of w from r.
struct two_worker_graph {
  graph g;
  output w, u, x, c, y, z, s, r, upd;

  two_worker_graph() {
    g.push_scope(dev("/job:ps"));
    w = value_of(g.variable("w", {2, 2}, initializer::ones()));
    u = value_of(g.variable("u", {2, 2}, initializer::ones()));
    g.pop_scope();
    for (auto v : {w, u})
      g.at(v).spec.device = value_of(place(g.at(v).requested, true, worker1(), table_catalog)).full;
    x = g.placeholder("x");
    c = g.constant(tensor::scalar(2), "two");
    g.push_scope(dev("/job:worker/task:0"));
    y = g.matmul(x, w);
    y = g.mul(y, x); // x twice in partition 0
    g.pop_scope();
    g.push_scope(dev("/job:worker/task:1"));
    z = g.relu(y);
    s = g.add(z, y);   // y reaches partition 1 twice
    r = g.add(s, x);   // x in partition 1 too
    r = g.mul(r, c);
    r = g.add(r, u);
    g.pop_scope();
    upd = g.assign_add(w, r);
  }

  op_placer placer() const {
    return [](const graph_node& n) { return place(n.requested, false, worker1(), table_catalog); };
  }

  static const planned_op& op_of(const step_plan& plan, output o) {
    const auto& ops = plan.partitions.at(plan.partition_of.at(o.id)).ops;
    auto it = std::find_if(ops.begin(), ops.end(), [&](const planned_op& op) { return op.id == o.id; });
    REQUIRE(it != ops.end());
    return *it;
  }
};

} // namespace

TEST_CASE("a step over two workers and the ps is cut into one partition per device", "[graph][partition]") {
  two_worker_graph t;
  auto plan = value_of(partition(t.g, {t.r.id, t.upd.id}, true, t.placer()));
  REQUIRE(plan.partitions.size() == 3);
  // In the order the devices are first used.
  CHECK(plan.partitions[0].device.full == "/job:worker/replica:0/task:0/device:CPU:0");
  CHECK(plan.partitions[1].device.full == "/job:worker/replica:0/task:1/device:CPU:0");
  // bug caught: an update placed by its scope (the session's task) instead of its variable
  CHECK(plan.partitions[2].device.full == t.g.at(t.w).spec.device);
  CHECK(plan.partition_of.at(t.upd.id) == 2);
  CHECK(plan.roots == std::vector<int32_t>{t.r.id, t.upd.id});
  CHECK(plan.want_values);
  // Each partition's ops in ascending (topological) order.
  for (const auto& p : plan.partitions)
    CHECK(std::is_sorted(p.ops.begin(), p.ops.end(),
                         [](const planned_op& a, const planned_op& b) { return a.id < b.id; }));
  size_t total = 0;
  for (const auto& p : plan.partitions)
    total += p.ops.size();
  CHECK(total == value_of(t.g.closure({t.r.id, t.upd.id})).size());

  // y is read twice on worker 1: it is sent there once.
  const auto& y = two_worker_graph::op_of(plan, t.y);
  CHECK(y.consumers == std::vector<size_t>{1});
  const auto& s = two_worker_graph::op_of(plan, t.s);
  REQUIRE(s.inputs.size() == 2);
  CHECK(s.inputs[0].kind == planned_input::local);
  CHECK(s.inputs[1].kind == planned_input::remote);
  CHECK(s.inputs[1].node == t.y.id);
  CHECK(s.inputs[1].from == 0);
  // r goes from worker 1 to the ps, for the update.
  CHECK(two_worker_graph::op_of(plan, t.r).consumers == std::vector<size_t>{2});
  const auto& upd = two_worker_graph::op_of(plan, t.upd);
  CHECK(upd.op == "assign_add");
  CHECK(upd.name == "w/assign_add");
  REQUIRE(upd.inputs.size() == 2);
  CHECK(upd.inputs[0].kind == planned_input::variable);
  CHECK(upd.inputs[0].node == t.w.id);
  CHECK(upd.inputs[1].kind == planned_input::remote);
  CHECK(upd.inputs[1].from == 1);

  // A variable on another task stays a variable input (the executor reads it).
  const auto& matmul = t.g.at(output{t.y.id - 1});
  REQUIRE(matmul.op == "matmul");
  const auto& mm = two_worker_graph::op_of(plan, output{t.y.id - 1});
  CHECK(mm.inputs[0].kind == planned_input::feed);
  CHECK(mm.inputs[1].kind == planned_input::variable);
  CHECK(mm.inputs[1].node == t.w.id);
  const auto& last = two_worker_graph::op_of(plan, t.r);
  CHECK(last.inputs[1].kind == planned_input::variable);
  CHECK(last.inputs[1].node == t.u.id);
  const auto& scaled = two_worker_graph::op_of(plan, output{t.r.id - 1});
  CHECK(scaled.inputs[1].kind == planned_input::constant);
  CHECK(scaled.inputs[1].node == t.c.id);

  // Feeds per partition, each once.
  CHECK(plan.partitions[0].feeds == std::vector<int32_t>{t.x.id});
  CHECK(plan.partitions[1].feeds == std::vector<int32_t>{t.x.id});
  CHECK(plan.partitions[2].feeds.empty());

  // Fetch what was asked for, want everything a later op or the caller reads.
  CHECK(two_worker_graph::op_of(plan, t.r).fetch);
  CHECK(upd.fetch);
  CHECK(upd.want_value);
  CHECK_FALSE(y.fetch);
  CHECK(y.want_value);
}

TEST_CASE("run as targets, nothing is fetched and a root update does not send its value back",
          "[graph][partition]") {
  two_worker_graph t;
  auto plan = value_of(partition(t.g, {t.upd.id}, false, t.placer()));
  const auto& upd = two_worker_graph::op_of(plan, t.upd);
  CHECK_FALSE(upd.fetch);
  CHECK_FALSE(upd.want_value); // bug caught: every update reads its value back
  CHECK_FALSE(two_worker_graph::op_of(plan, t.r).fetch);
  CHECK(two_worker_graph::op_of(plan, t.r).want_value);
  // An update that another op reads must produce its value, root or not.
  auto after = t.g.neg(t.upd);
  auto plan2 = value_of(partition(t.g, {after.id}, false, t.placer()));
  CHECK(two_worker_graph::op_of(plan2, t.upd).want_value);
  CHECK_FALSE(two_worker_graph::op_of(plan2, t.upd).fetch);
  // Asked for values, a root update fetches and wants its value.
  auto plan3 = value_of(partition(t.g, {t.upd.id}, true, t.placer()));
  CHECK(two_worker_graph::op_of(plan3, t.upd).fetch);
  CHECK(two_worker_graph::op_of(plan3, t.upd).want_value);

  CHECK(plan_signature({1, 2}, true) != plan_signature({1, 2}, false));
  CHECK(plan_signature({1, 2}, true) != plan_signature({2, 1}, true));
  CHECK(plan_signature({1, 2}, true) != plan_signature({12}, true));
  CHECK(plan_signature({3}, false) == plan_signature({3}, false));
}

TEST_CASE("partition errors name the op: an unplaced variable, a device that cannot be had",
          "[graph][partition][errors]") {
  two_worker_graph t;
  t.g.at(t.u).spec.device.clear();
  auto unplaced = partition(t.g, {t.r.id}, true, t.placer());
  REQUIRE_FALSE(unplaced);
  CHECK(contains(unplaced.error().what, "variable 'u' has not been placed"));

  two_worker_graph t2;
  op_placer strict = [](const graph_node& n) {
    return place(n.requested, false, worker1(false), table_catalog);
  };
  auto on_gpu = t2.g.op("neg", {t2.x}, {}, "gpu_op");
  t2.g.at(on_gpu).requested = dev("/job:worker/task:0/gpu:0");
  auto r = partition(t2.g, {on_gpu.id}, true, strict);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == af_error::unknown_device);
  CHECK(contains(r.error().what, "op 'gpu_op': "));
  CHECK(contains(r.error().what, "enable soft placement"));
  // A placer that names the op itself is not named twice.
  op_placer naming = [&](const graph_node& n) -> outcome<placed_device> {
    auto p = strict(n);
    if (!p)
      return graph_error{p.error().code, "op '" + n.name + "': " + p.error().what};
    return p;
  };
  auto once = partition(t2.g, {on_gpu.id}, true, naming);
  REQUIRE_FALSE(once);
  CHECK(once.error().what == r.error().what);
}

// -- replication --------------------------------------------------------------

TEST_CASE("two towers on cpu:0 and cpu:1: the averaged gradient is the whole batch's gradient",
          "[graph][replicate]") {
  graph g;
  auto w = value_of(g.variable("w", {3, 1}, initializer::uniform(-1, 1, 7), dtype::float64));
  auto b = value_of(g.variable("b", {1}, initializer::constant(0.25), dtype::float64));
  tensor xs{dtype::float64, {4, 3}}, ts{dtype::float64, {4, 1}};
  REQUIRE(kernels::fill_uniform(xs, -1, 1, 11).ok());
  REQUIRE(kernels::fill_uniform(ts, -1, 1, 12).ok());
  auto rows = [](const tensor& t, size_t from, size_t n) {
    auto cols = static_cast<size_t>(t.shape()[1]);
    auto all = t.values<double>();
    std::vector<double> v(all.begin() + static_cast<long>(from * cols),
                          all.begin() + static_cast<long>((from + n) * cols));
    return tensor::from_values<double>({static_cast<int64_t>(n), t.shape()[1]}, v);
  };
  auto linear_loss = [&](graph& gr, const tensor& x, const tensor& target) {
    auto y = gr.add(gr.matmul(gr.constant(x, "x"), w), b);
    return gr.reduce_mean(gr.square(gr.sub(y, gr.constant(target, "t"))));
  };
  g.push_scope(dev("/job:worker"));
  auto model = value_of(replicate(
    g, {"/cpu:0", "/cpu:1"}, {w, b},
    [&](graph& gr, size_t i) { return tower{linear_loss(gr, rows(xs, 2 * i, 2), rows(ts, 2 * i, 2)), {}}; },
    "/job:ps"));
  CHECK(g.current_scope().to_string() == "/job:worker"); // the caller's scopes come back
  REQUIRE(model.towers.size() == 2);
  REQUIRE(model.tower_grads.size() == 2);
  REQUIRE(model.mean_grads.size() == 2);
  // Each tower and its gradients on its device; the mean on average_on.
  CHECK(g.at(model.towers[0].loss).requested.to_string() == "/job:worker/device:CPU:0");
  CHECK(g.at(model.towers[1].loss).requested.to_string() == "/job:worker/device:CPU:1");
  CHECK(g.at(model.tower_grads[1][0]).requested.to_string() == "/job:worker/device:CPU:1");
  CHECK(g.at(model.mean_grads[0]).requested.to_string() == "/job:ps");
  CHECK(g.at(model.mean_loss).requested.to_string() == "/job:ps");

  auto whole = linear_loss(g, xs, ts);
  auto whole_grads = value_of(gradients(g, whole, {w, b}));
  variable_values vars;
  REQUIRE(initialize_values(g, vars));
  auto backend = cpu();
  auto got = value_of(evaluate(g, {model.mean_grads[0], model.mean_grads[1], model.mean_loss,
                                   model.tower_grads[0][0], model.tower_grads[1][0]},
                               {}, vars, *backend));
  auto want = value_of(evaluate(g, {whole_grads[0], whole_grads[1], whole}, {}, vars, *backend));
  REQUIRE(got[0].type() == dtype::float64); // the 1/k constant took the variables' dtype
  for (size_t k = 0; k < 3; ++k) {
    REQUIRE(got[k].shape() == want[k].shape());
    for (size_t i = 0; i < want[k].num_elements(); ++i)
      CHECK(got[k].at(i) == Approx(want[k].at(i)).epsilon(1e-12).margin(1e-14));
  }
  // The towers really differ (else averaging proves nothing).
  CHECK(got[3].at(0) != Approx(got[4].at(0)));
}

TEST_CASE("replicate() of one device adds no averaging, and names a bad device", "[graph][replicate][errors]") {
  graph g;
  auto w = value_of(g.variable("w", {2}, initializer::ones()));
  auto one = value_of(replicate(g, {"/cpu:0"}, {w}, [&](graph& gr, size_t) {
    return tower{gr.reduce_sum(gr.square(w)), {}};
  }));
  CHECK(one.mean_grads[0] == one.tower_grads[0][0]);
  CHECK(one.mean_loss == one.towers[0].loss);

  g.push_scope(dev("/job:worker"));
  int built = 0;
  auto bad = replicate(g, {"/cpu:0", "cpu:1"}, {w}, [&](graph& gr, size_t) {
    ++built;
    return tower{gr.reduce_sum(gr.square(w)), {}};
  });
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == af_error::invalid_device);
  CHECK(contains(bad.error().what, "'cpu:1'"));
  CHECK(built == 1);
  CHECK(g.current_scope().to_string() == "/job:worker"); // restored on the error path too

  auto unrelated = value_of(g.variable("v", {2}));
  auto no_grad = replicate(g, {"/cpu:0"}, {unrelated}, [&](graph& gr, size_t) {
    return tower{gr.reduce_sum(w), {}};
  });
  REQUIRE_FALSE(no_grad);
  CHECK(contains(no_grad.error().what, "does not depend on 'v'"));
  CHECK_FALSE(replicate(g, {}, {w}, [&](graph&, size_t) { return tower{}; }));
}

// -- evaluate -----------------------------------------------------------------

TEST_CASE("evaluate runs a step: updates write the variables and yield their new value",
          "[graph][evaluate]") {
  graph g;
  auto v = value_of(g.variable("v", {2}, initializer::constant(1)));
  auto x = g.placeholder("x");
  auto inc = g.assign_add(v, g.constant(tensor::scalar(1))); // a scalar operand broadcasts
  auto sub = g.assign_sub(v, x);
  auto set = g.assign(v, g.constant(tensor::from_values<float>({2}, {7, 8})));
  auto y = g.mul(v, g.constant(tensor::scalar(3)));
  variable_values vars;
  REQUIRE(initialize_values(g, vars));
  auto backend = cpu();
  auto before = value_of(evaluate(g, {v}, {}, vars, *backend)).front();
  CHECK(before.values<float>() == std::vector<float>{1, 1});
  CHECK(value_of(evaluate(g, {inc}, {}, vars, *backend)).front().values<float>() == std::vector<float>{2, 2});
  CHECK(value_of(evaluate(g, {inc}, {}, vars, *backend)).front().values<float>() == std::vector<float>{3, 3});
  CHECK(vars.at("v").values<float>() == std::vector<float>{3, 3});
  // The value fetched earlier shares no buffer with the updated one.
  CHECK(before.values<float>() == std::vector<float>{1, 1});
  auto feed = tensor::from_values<float>({2}, {0.5f, 1});
  CHECK(value_of(evaluate(g, {sub, y}, {{x, feed}}, vars, *backend))[0].values<float>()
        == std::vector<float>{2.5f, 2});
  CHECK(value_of(evaluate(g, {y}, {}, vars, *backend)).front().values<float>()
        == std::vector<float>{7.5f, 6});
  CHECK(value_of(evaluate(g, {set}, {}, vars, *backend)).front().values<float>() == std::vector<float>{7, 8});
  CHECK(vars.at("v").values<float>() == std::vector<float>{7, 8});
  // initialize_values leaves a variable that has a value alone.
  REQUIRE(initialize_values(g, vars));
  CHECK(vars.at("v").values<float>() == std::vector<float>{7, 8});
  // Fetching leaves yields their values.
  auto c = g.constant(tensor::scalar(4));
  auto got = value_of(evaluate(g, {c, x, v}, {{x, feed}}, vars, *backend));
  CHECK(got[0].at(0) == 4);
  CHECK(got[1] == feed);
  CHECK(got[2].values<float>() == std::vector<float>{7, 8});
}

TEST_CASE("evaluate names what is missing or wrong", "[graph][evaluate][errors]") {
  graph g;
  auto v = value_of(g.variable("v", {2}));
  auto d = value_of(g.variable("d", {2}, initializer::zeros(), dtype::float64));
  auto x = g.placeholder("x");
  auto backend = cpu();
  variable_values vars;
  auto read = evaluate(g, {g.neg(v)}, {}, vars, *backend);
  REQUIRE_FALSE(read);
  CHECK(read.error().code == af_error::uninitialized);
  CHECK(contains(read.error().what, "variable 'v' is read before it was initialized"));
  REQUIRE(initialize_values(g, vars));

  auto fed = evaluate(g, {g.add(v, x)}, {}, vars, *backend);
  REQUIRE_FALSE(fed);
  CHECK(fed.error().code == af_error::invalid_argument);
  CHECK(fed.error().what == "placeholder 'x' needs a value: pass it in run()'s feeds");
  auto not_placeholder = evaluate(g, {v}, {{v, tensor::scalar(1)}}, vars, *backend);
  REQUIRE_FALSE(not_placeholder);
  CHECK(not_placeholder.error().code == af_error::invalid_argument);

  auto shape = evaluate(g, {g.matmul(v, v, false, false, "mm")}, {}, vars, *backend);
  REQUIRE_FALSE(shape);
  CHECK(shape.error().code == af_error::shape_mismatch);
  CHECK(contains(shape.error().what, "op 'mm' (matmul): "));
  auto type = evaluate(g, {g.add(v, d, "mixed")}, {}, vars, *backend);
  REQUIRE_FALSE(type);
  CHECK(type.error().code == af_error::dtype_mismatch);
  CHECK(contains(type.error().what, "op 'mixed' (add): "));
  auto unknown = evaluate(g, {g.op("conv2d", {v}, {}, "conv")}, {}, vars, *backend);
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().code == af_error::invalid_argument);
  CHECK(unknown.error().what == "op 'conv' (conv2d): unknown op 'conv2d'");

  auto wrong_shape = evaluate(g, {g.assign(v, g.constant(tensor::scalar(1)))}, {}, vars, *backend);
  REQUIRE_FALSE(wrong_shape); // assign takes the whole value: no scalar broadcast
  CHECK(wrong_shape.error().code == af_error::shape_mismatch);
  CHECK(wrong_shape.error().what == "assign to 'v': value has shape [], variable has [2]");
  auto wrong_type = evaluate(g, {g.assign_add(v, g.constant(tensor::filled(dtype::float64, {2}, 1)))},
                             {}, vars, *backend);
  REQUIRE_FALSE(wrong_type);
  CHECK(wrong_type.error().code == af_error::dtype_mismatch);
  CHECK(wrong_type.error().what == "assign_add to 'v': value has dtype float64, variable has float32");
  auto too_big = evaluate(g, {g.assign_sub(v, g.constant(tensor::filled(dtype::float32, {3}, 1)))}, {},
                          vars, *backend);
  REQUIRE_FALSE(too_big);
  CHECK(too_big.error().code == af_error::shape_mismatch);
  CHECK(vars.at("v").values<float>() == std::vector<float>{0, 0}); // failures wrote nothing

  variable_values empty;
  auto add_uninit = evaluate(g, {g.assign_add(d, g.constant(tensor::filled(dtype::float64, {2}, 1)))},
                             {}, empty, *backend);
  REQUIRE_FALSE(add_uninit);
  CHECK(add_uninit.error().code == af_error::uninitialized);
  CHECK(contains(add_uninit.error().what, "'d'"));
  // assign gives an uninitialized variable its value.
  auto first = evaluate(g, {g.assign(d, g.constant(tensor::filled(dtype::float64, {2}, 5)))}, {}, empty,
                        *backend);
  REQUIRE(first);
  CHECK(empty.at("d").values<double>() == std::vector<double>{5, 5});

  auto bad = g.add(g.assign(x, x), x, "uses_bad");
  auto invalid = evaluate(g, {bad}, {{x, tensor::scalar(1)}}, vars, *backend);
  REQUIRE_FALSE(invalid);
  CHECK(contains(invalid.error().what, "op 'uses_bad' has an invalid input"));
  CHECK_FALSE(evaluate(g, {output{-1}}, {}, vars, *backend));
}

// -- initial values -----------------------------------------------------------

TEST_CASE("initial_value of every initializer kind, and its errors name the variable",
          "[graph][evaluate][errors]") {
  variable_spec spec{"w", dtype::float32, {2, 3}, ""};
  CHECK(value_of(initial_value(spec, initializer::constant(2.5))).values<float>()
        == std::vector<float>(6, 2.5f));
  CHECK(value_of(initial_value(spec, initializer::ones())).values<float>() == std::vector<float>(6, 1));
  CHECK(value_of(initial_value(spec, initializer::zeros())).values<float>() == std::vector<float>(6, 0));
  initializer named_zeros; // kind "zeros" by default, as a message may carry it
  named_zeros.value = 3;
  CHECK(value_of(initial_value(spec, named_zeros)).values<float>() == std::vector<float>(6, 0));
  initializer named_ones;
  named_ones.kind = "ones";
  CHECK(value_of(initial_value(spec, named_ones)).values<float>() == std::vector<float>(6, 1));
  auto d = value_of(initial_value(variable_spec{"d", dtype::float64, {3}, ""}, initializer::constant(0.1)));
  CHECK(d.type() == dtype::float64);
  CHECK(d.at(0) == 0.1); // not rounded through float

  auto u = value_of(initial_value(spec, initializer::uniform(2, 3, 5)));
  CHECK(u.shape() == spec.shape);
  for (auto e : u.values<double>())
    CHECK((e >= 2 && e <= 3));
  CHECK(value_of(initial_value(spec, initializer::uniform(2, 3, 5))) == u); // the seed decides
  CHECK(value_of(initial_value(spec, initializer::uniform(2, 3, 6))) != u);
  auto n = value_of(initial_value(variable_spec{"n", dtype::float64, {4000}, ""},
                                  initializer::normal(10, 0.5, 1)));
  double mean = 0;
  for (auto e : n.values<double>())
    mean += e / 4000;
  CHECK(mean == Approx(10).margin(0.05));

  auto t = tensor::from_values<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK(value_of(initial_value(spec, initializer::from_tensor(t))) == t);
  auto dt = initial_value(spec, initializer::from_tensor(tensor::filled(dtype::float64, {2, 3}, 1)));
  REQUIRE_FALSE(dt);
  CHECK(dt.error().code == af_error::dtype_mismatch);
  CHECK(dt.error().what == "initializer of 'w': tensor has dtype float64, variable has float32");
  auto sh = initial_value(spec, initializer::from_tensor(tensor::filled(dtype::float32, {3, 2}, 1)));
  REQUIRE_FALSE(sh);
  CHECK(sh.error().code == af_error::shape_mismatch);
  CHECK(sh.error().what == "initializer of 'w': tensor has shape [3,2], variable has [2,3]");

  initializer odd;
  odd.kind = "xavier";
  auto kind = initial_value(spec, odd);
  REQUIRE_FALSE(kind);
  CHECK(kind.error().code == af_error::invalid_argument);
  CHECK(kind.error().what
        == "initializer of 'w': unknown kind 'xavier' (use constant, zeros, ones, uniform, normal or tensor)");
  auto range = initial_value(spec, initializer::uniform(1, 1, 0));
  REQUIRE_FALSE(range);
  CHECK(contains(range.error().what, "initializer of 'w': uniform initializer needs low < high"));
  auto ints = initial_value(variable_spec{"i", dtype::int32, {2}, ""}, initializer::normal(0, 1, 0));
  REQUIRE_FALSE(ints);
  CHECK(contains(ints.error().what, "'i'"));

  // 2^62 bytes: no machine has them; the error says how many were asked for.
  variable_spec big{"big", dtype::float32, {int64_t{1} << 30, int64_t{1} << 30}, ""};
  auto oom = initial_value(big, initializer::zeros());
  REQUIRE_FALSE(oom);
  CHECK(oom.error().code == af_error::resource_exhausted);
  CHECK(contains(oom.error().what, "'big'"));
  CHECK(contains(oom.error().what, std::to_string(uint64_t{1} << 62) + " bytes"));
  auto negative = initial_value(variable_spec{"neg", dtype::float32, {-2}, ""}, initializer::zeros());
  REQUIRE_FALSE(negative);
  CHECK(negative.error().code == af_error::invalid_argument);

  graph g;
  REQUIRE(g.variable("a", {2}, initializer::constant(3)));
  REQUIRE(g.variable("b", {2}, odd));
  variable_values vars;
  auto st = initialize_values(g, vars);
  REQUIRE_FALSE(st);
  CHECK(contains(st.error().what, "'b'"));
  CHECK(vars.at("a").values<float>() == std::vector<float>{3, 3});
}
