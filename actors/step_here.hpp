#pragma once
/// A prepared step run on its caller's thread, when it can: one partition,
/// on a CPU device of the caller's own process, of kernel ops only (no
/// variable read or update, no value to or from another partition). Its
/// caller then sends no run_step to the executor and waits for no answer:
/// two messages a step and the wake-ups of the threads that carry them,
/// which on a small model cost more than its kernels (a worker's
/// data-parallel step, whose parameters come as feeds: docs/performance.md
/// "The digits step"). The kernels, their order and the errors are the
/// executor's (actors/op_compute.hpp), so the values are the same bits.
///
///   if (auto here = step_here::make(step, self->node()))
///     auto out = here->run(feeds); // caf::expected<step_outputs>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "caf/expected.hpp"
#include "caf/node_id.hpp"

#include "actors/step_runner.hpp"
#include "core/tensor.hpp"
#include "kernels/kernels.hpp"

namespace af {

class latency_histogram;

class step_here {
public:
  /// Null unless `step` can run on the thread of an actor of node `here`.
  static std::unique_ptr<step_here> make(std::shared_ptr<prepared_step> step,
                                         const caf::node_id& here);

  /// One run with `feeds` (placeholder id -> value): the fetched values, or
  /// the error the executor would give (a placeholder without a value, a
  /// kernel's error naming the op).
  caf::expected<step_outputs> run(const std::map<int32_t, tensor>& feeds);

  /// The device the step was placed on (the executor's full name).
  const std::string& device() const;

  /// Runs so far.
  uint64_t runs() const { return runs_; }

private:
  explicit step_here(std::shared_ptr<prepared_step> step);

  std::shared_ptr<prepared_step> step_;
  std::unique_ptr<kernels::backend> backend_;
  /// A value of this run, by op id: `set` while it holds one. The entries
  /// stay between runs (emptied: no value kept), so a run allocates no node.
  struct value_slot {
    tensor value;
    bool set = false;
  };
  std::unordered_map<int32_t, value_slot> values_;

  /// Per op (in order), per input: true at the last read of that value in
  /// a run, which then moves it into the op's arguments instead of copying.
  std::vector<std::vector<bool>> last_read_;
  std::vector<tensor> args_; ///< an op's arguments (emptied after each run)

  /// Empties every entry of values_ (after a run, or when it fails).
  void forget();
  /// The executor's actorflow_step_latency_seconds (null if it keeps none):
  /// a run here is a step of its device, counted there as its run_step was.
  std::shared_ptr<latency_histogram> latency_;
  uint64_t runs_ = 0;
};

} // namespace af
