#include "actors/step_here.hpp"

#include <chrono>
#include <unordered_set>
#include <utility>
#include <vector>

#include "actors/node_watch.hpp"
#include "actors/op_compute.hpp"
#include "core/variable_spec.hpp"
#include "kernels/sparse.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

/// True if `op` is a kernel op whose inputs are all in its own partition
/// (earlier ops, feeds, constants) and whose value goes nowhere else.
bool kernel_only(const partition_op& op) {
  var_op update = var_op::read;
  if (parse_var_op(op.op, update) || kernels::parse_scatter_op(op.op))
    return false;
  if (!op.consumers.empty())
    return false;
  for (const auto& in : op.inputs)
    if (in.kind != op_input::local && in.kind != op_input::feed && in.kind != op_input::constant)
      return false;
  return true;
}

} // namespace

step_here::step_here(std::shared_ptr<prepared_step> step)
  : step_(std::move(step)), backend_(kernels::make_cpu_backend()) {
  const auto& ops = step_->partitions.front().part.ops;
  last_read_.resize(ops.size());
  std::unordered_set<int32_t> read_later;
  for (size_t i = ops.size(); i-- > 0;) {
    const auto& inputs = ops[i].inputs;
    last_read_[i].assign(inputs.size(), false);
    for (size_t j = inputs.size(); j-- > 0;)
      if (inputs[j].kind != op_input::constant)
        last_read_[i][j] = read_later.insert(inputs[j].op).second;
  }
}

std::unique_ptr<step_here> step_here::make(std::shared_ptr<prepared_step> step,
                                           const caf::node_id& here) {
  if (!step || step->partitions.size() != 1)
    return nullptr;
  const auto& p = step->partitions.front();
  if (!p.exec || p.exec->node() != here || p.device.find("/device:CPU:") == std::string::npos)
    return nullptr;
  for (const auto& op : p.part.ops)
    if (!kernel_only(op))
      return nullptr;
  auto exec = caf::actor_cast<caf::actor_addr>(p.exec);
  std::unique_ptr<step_here> out{new step_here(std::move(step))};
  out->latency_ = step_latency_of(exec, false);
  return out;
}

const std::string& step_here::device() const {
  return step_->partitions.front().device;
}

caf::expected<step_outputs> step_here::run(const std::map<int32_t, tensor>& feeds) {
  const auto& p = step_->partitions.front();
  auto started = std::chrono::steady_clock::now();
  // As step_runner::dispatch: every feed is checked before anything runs.
  for (auto ph : p.feeds) {
    auto it = feeds.find(ph);
    if (it == feeds.end()) {
      auto n = step_->nodes.find(ph);
      return make_error(af_error::invalid_argument,
                        "placeholder '"
                          + (n == step_->nodes.end() ? std::to_string(ph) : n->second.name)
                          + "' needs a value: pass it in run()'s feeds");
    }
    auto& slot = values_[ph];
    slot.value = it->second;
    slot.set = true;
  }
  step_outputs out;
  auto& args = args_; // its memory kept between runs
  std::string note;
  for (size_t i = 0; i < p.part.ops.size(); ++i) {
    const auto& op = p.part.ops[i];
    args.clear();
    for (size_t j = 0; j < op.inputs.size(); ++j) {
      const auto& in = op.inputs[j];
      if (in.kind == op_input::constant) {
        args.push_back(in.value);
        continue;
      }
      auto v = values_.find(in.op);
      if (v == values_.end() || !v->second.set) {
        forget();
        return make_error(af_error::invalid_argument,
                          in.kind == op_input::feed
                            ? "op '" + op.name + "' needs a placeholder that was not fed"
                            : "op '" + op.name + "': an input is missing (a bug)");
      }
      // Its last read moves it (no copy of its shape); it is not read again.
      if (last_read_[i][j])
        args.push_back(std::move(v->second.value));
      else
        args.push_back(v->second.value);
    }
    auto value = compute_op(*backend_, nullptr, p.device, op, args, note);
    if (!value) {
      forget();
      return std::move(value.error());
    }
    if (op.fetch)
      out.values[op.id] = *value;
    auto& slot = values_[op.id];
    slot.value = std::move(*value);
    slot.set = true;
  }
  forget();
  runs_ += 1;
  if (latency_)
    latency_->observe(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - started)
                        .count());
  return out;
}

void step_here::forget() {
  args_.clear();
  for (auto& entry : values_) {
    entry.second.value = tensor{};
    entry.second.set = false;
  }
}

} // namespace af
