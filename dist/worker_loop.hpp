#pragma once
/// The step loop's counters and decisions of a training worker
/// (dist/worker.hpp), apart from the actor: where the worker is (its local
/// steps, the job's global step, where its averaging rounds count from), and
/// what is due after a step (report, evaluate, checkpoint, the end) or after
/// an average worker's local step (its round's push). Plain data: a test
/// drives it without processes or actors, as dist/aggregation_round.hpp is
/// for the aggregator.

#include <algorithm>
#include <cstdint>
#include <string>

#include "train/config.hpp"
#include "train/local.hpp"

namespace af {

/// What a worker does after a step (worker_loop::after_step).
struct step_plan {
  /// The job's step this step counts as (sync, async, ssp: the global step;
  /// average, allreduce: worker_loop::average_step).
  uint64_t step = 0;
  bool last = false;       ///< the job's steps are done: finish, no next step
  bool report = false;     ///< a progress report
  bool eval = false;       ///< the chief evaluates on the held-out set
  bool checkpoint = false; ///< the chief checkpoints
};

/// What a live switch asks of a worker, told by an aggregator (switch,
/// aggregator, mode, step: messages/aggregator.hpp). The dense worker actor
/// (dist/worker.cpp) and the sparse worker's loop (dist/sparse_job.cpp)
/// both go through it.
struct switch_notice {
  /// A ps switched into sync: the worker joins every ps again before its
  /// next push, so that its sync rounds begin with the same step's push on
  /// each (aggregation_round::set_standby); cleared once it has.
  bool rejoin = false;

  /// An aggregator said it switched to `to`: true if the worker must join
  /// every ps again before its next push (into sync).
  bool told_of_switch(const std::string& to) {
    if (to == "sync")
      rejoin = true;
    return rejoin;
  }
};

/// Where a worker is in the job.
struct worker_loop : switch_notice {
  /// The mode the job runs: the config's until a live switch changes it.
  std::string mode;
  /// average: the global step and local step its rounds count from (the
  /// job's start, or a switch into average).
  uint64_t avg_step0 = 0;
  uint64_t avg_local0 = 0;
  uint64_t global_step = 0;       ///< the least of the shards' (average: the round's step)
  uint64_t local_step = 0;        ///< steps this worker ran in this process
  uint64_t checkpointed_step = 0; ///< global step of the last checkpoint (or the start)
  uint64_t reported_step = 0;     ///< async: global step of the last progress line (or the start)

  /// average (and allreduce): the job's step of this replica, its local steps
  /// counted from where its rounds began (the start, or a switch into average).
  uint64_t average_step() const { return avg_step0 + (local_step - avg_local0); }

  /// What is due after a step of a job of `total_steps` steps under `c`;
  /// `chief`: worker 0; `can_eval`, `can_save`: it has an evaluation step and
  /// a checkpoint writer; `since_checkpoint_s`: seconds since its last
  /// checkpoint (or the start). A report moves reported_step to the global step.
  step_plan after_step(const train::train_config& c, uint64_t total_steps, bool chief,
                       bool can_eval, bool can_save, double since_checkpoint_s) {
    step_plan p;
    // sync and async count the shared global step; average and allreduce
    // workers their own steps (the same on every worker).
    bool shared = mode == "sync" || train::step_per_push(mode);
    p.step = shared ? global_step : average_step();
    p.last = p.step >= total_steps;
    // async: when the global step crossed a multiple of log_every (it moves
    // by every worker's pushes: counting this worker's steps, a job of 200
    // steps with log_every 50 printed at 50 and at the end only).
    bool async = train::step_per_push(mode);
    p.report = p.last
               || (c.log_every > 0
                   && (async ? global_step / c.log_every > reported_step / c.log_every
                             : local_step % c.log_every == 0));
    if (p.report)
      reported_step = global_step;
    p.eval = chief && can_eval && c.eval_every > 0 && local_step % c.eval_every == 0 && !p.last;
    // By steps: when the global step crossed a multiple of checkpoint_steps
    // since the last one (async moves it by other workers' pushes too).
    // average: only at a round's end, when the chief's replica holds the
    // job's averaged parameters (mid-round it holds its own, and the step and
    // data position would not agree).
    bool round_end = mode != "average"
                     || (local_step - avg_local0) % std::max<uint32_t>(1, c.average_every) == 0;
    p.checkpoint = chief && can_save && !p.last && round_end
                   && (train::steps_checkpoint_due(c.checkpoint_steps, global_step,
                                                   checkpointed_step)
                       || (c.checkpoint_secs > 0 && since_checkpoint_s >= c.checkpoint_secs));
    return p;
  }

  /// average, after a local step was counted: true if the round's push is
  /// due (every `average_every` local steps, and at the job's last step);
  /// then the round's global step is the local steps every worker has run.
  bool round_due(uint32_t average_every, uint64_t total_steps) const {
    auto k = std::max<uint32_t>(1, average_every);
    auto locals = local_step - avg_local0;
    return locals % k == 0 || avg_step0 + locals >= total_steps;
  }

  /// average: the job's averaging rounds so far.
  uint64_t rounds(uint32_t average_every) const {
    uint64_t k = std::max<uint32_t>(1, average_every);
    return (global_step + k - 1) / k;
  }
};

/// Where a sparse worker's data stream is (dist/sparse_job.cpp): the next
/// step reads its share of global batch `next` (examples (next * workers +
/// task) * batch_size on, train::example_order). While the job runs sync
/// the position follows the global step at an offset (a round closed
/// without this worker is skipped, as the others moved on; a ps restored
/// from a checkpoint takes it back with the step); in async and ssp it
/// counts this worker's own steps. A live switch keeps the position going
/// on by one a step: the global step counts rounds in sync and pushes in
/// async, so followed through a switch it would jump. Into sync, the first
/// step's answer sets the offset. A checkpoint records `next` as its
/// data_position.
struct data_cursor {
  bool follows_global = false; ///< the job runs sync (as this worker was last told)
  bool anchored = true;        ///< the offset is set (false: the first sync step after a switch)
  int64_t offset = 0;          ///< next - the global step, while it follows it
  uint64_t next = 0;           ///< the global batch of the next step's share
  bool switched = false;       ///< a switch was seen (the position is no longer the step's)

  /// At the start: `sync` the job's mode, `position` where its data resumes
  /// (a checkpoint's data_position, or 0), `global` the aggregators' step.
  static data_cursor start(bool sync, uint64_t position, uint64_t global) {
    data_cursor d;
    d.follows_global = sync;
    d.next = position;
    d.offset = static_cast<int64_t>(position) - static_cast<int64_t>(global);
    return d;
  }

  /// An aggregator said it switched to `mode`.
  void told_of_switch(const std::string& mode) {
    bool sync = mode == "sync";
    if (sync == follows_global)
      return;
    switched = true;
    follows_global = sync;
    anchored = !sync;
  }

  /// After a step whose answers left the job's step at `global`.
  void stepped(uint64_t global) {
    if (!follows_global || !anchored) {
      next += 1;
      if (follows_global) { // the first sync step after a switch
        offset = static_cast<int64_t>(next) - static_cast<int64_t>(global);
        anchored = true;
      }
      return;
    }
    next = static_cast<uint64_t>(std::max<int64_t>(static_cast<int64_t>(global) + offset, 0));
  }
};

} // namespace af
