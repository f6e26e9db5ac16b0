// The training worker's step loop decisions (dist/worker_loop.hpp) and the
// chief's event bookkeeping (dist/training_report.hpp) without
// processes or actors: what is due after a step in each mode (report,
// evaluate, checkpoint, the end), when an average worker's round is pushed,
// and what a live switch asks of a worker (switch_notice, data_cursor).
#include <catch2/catch.hpp>

#include <set>
#include <vector>

#include "dist/training_report.hpp"
#include "dist/worker_loop.hpp"

using namespace af;

namespace {

train::train_config loop_config(const std::string& mode) {
  train::train_config c;
  c.mode = mode;
  c.log_every = 10;
  c.eval_every = 5;
  c.checkpoint_steps = 25;
  c.checkpoint_secs = 0;
  c.average_every = 4;
  return c;
}

/// What the steps of a run were due, by the step each plan counted as.
struct due {
  std::set<uint64_t> report, eval, checkpoint;
  uint64_t last = 0; ///< the first step planned as the last
};

/// Runs `steps` steps of `loop` (after each, the global step is `global(local)`),
/// as the worker does: a checkpoint moves checkpointed_step to the global step.
template <class Global>
due drive(worker_loop& loop, const train::train_config& c, uint64_t total, bool chief,
          uint64_t steps, Global global) {
  due out;
  for (uint64_t i = 0; i < steps; ++i) {
    loop.local_step += 1;
    loop.global_step = global(loop.local_step);
    auto p = loop.after_step(c, total, chief, true, true, 0.0);
    if (p.report)
      out.report.insert(p.step);
    if (p.eval)
      out.eval.insert(p.step);
    if (p.checkpoint) {
      out.checkpoint.insert(p.step);
      loop.checkpointed_step = loop.global_step;
    }
    if (p.last && out.last == 0)
      out.last = p.step;
    if (p.last)
      break;
  }
  return out;
}

} // namespace

TEST_CASE("a sync worker reports every log_every steps, the chief evaluates every eval_every and "
          "checkpoints as the global step crosses checkpoint_steps, and the job ends at its "
          "total",
          "[worker]") {
  auto c = loop_config("sync");
  worker_loop chief;
  chief.mode = "sync";
  auto d = drive(chief, c, 100, true, 200, [](uint64_t local) { return local; });
  CHECK(d.report == std::set<uint64_t>{10, 20, 30, 40, 50, 60, 70, 80, 90, 100});
  // not at the last step: the worker evaluates and saves at its end anyway
  CHECK(d.eval == std::set<uint64_t>{5,  10, 15, 20, 25, 30, 35, 40, 45, 50,
                                     55, 60, 65, 70, 75, 80, 85, 90, 95});
  CHECK(d.checkpoint == std::set<uint64_t>{25, 50, 75});
  CHECK(d.last == 100);

  worker_loop other;
  other.mode = "sync";
  auto o = drive(other, c, 100, false, 200, [](uint64_t local) { return local; });
  CHECK(o.report == d.report);
  CHECK(o.eval.empty());
  CHECK(o.checkpoint.empty());
}

TEST_CASE("an async worker reports and checkpoints when the global step, moved by every "
          "worker's pushes, crosses a multiple, not by its own step count",
          "[worker]") {
  auto c = loop_config("async");
  worker_loop loop;
  loop.mode = "async";
  // Three workers push in turn: the global step moves by 3 per step of this one.
  auto d = drive(loop, c, 1000, true, 20, [](uint64_t local) { return 3 * local; });
  CHECK(d.report == std::set<uint64_t>{12, 21, 30, 42, 51, 60});
  CHECK(d.checkpoint == std::set<uint64_t>{27, 51});
  CHECK(loop.reported_step == 60);
  // The end is the job's global step, reached by the others' pushes too.
  worker_loop near_end;
  near_end.mode = "async";
  auto e = drive(near_end, c, 10, true, 100, [](uint64_t local) { return 4 * local; });
  CHECK(e.last == 12);
}

TEST_CASE("an average worker pushes its round every average_every local steps and at the job's "
          "end, counts steps from where its rounds began, and checkpoints only at a round's end",
          "[worker]") {
  auto c = loop_config("average");
  // Due by time at every step: only a round's end may take it.
  c.checkpoint_steps = 0;
  c.checkpoint_secs = 1;
  worker_loop loop;
  loop.mode = "average";
  // Rounds began at global step 100 (a resumed job, or a switch into
  // average) after 3 local steps of another mode.
  loop.avg_step0 = 100;
  loop.avg_local0 = 3;
  loop.local_step = 3;
  loop.global_step = 100;
  loop.checkpointed_step = 100;
  std::vector<uint64_t> pushed;
  std::set<uint64_t> checkpoints;
  uint64_t total = 110;
  for (int i = 0; i < 20; ++i) {
    loop.local_step += 1;
    if (loop.round_due(c.average_every, total)) {
      loop.global_step = loop.average_step(); // the round's step
      pushed.push_back(loop.global_step);
    }
    auto p = loop.after_step(c, total, true, true, true, 5.0);
    CHECK(p.step == loop.average_step());
    if (p.checkpoint) {
      checkpoints.insert(p.step);
      loop.checkpointed_step = loop.global_step;
    }
    if (p.last)
      break;
  }
  CHECK(pushed == std::vector<uint64_t>{104, 108, 110});
  // Mid-round the replica holds its own parameters, not the job's: the
  // checkpoint waits for the round's end (and none at the last step).
  CHECK(checkpoints == std::set<uint64_t>{104, 108});
  CHECK(loop.local_step == 13);
  CHECK(loop.rounds(c.average_every) == 28); // ceil(110 / 4) rounds of the job
}

TEST_CASE("a checkpoint is due by time too, and never at the last step", "[worker]") {
  auto c = loop_config("sync");
  c.checkpoint_steps = 0;
  c.checkpoint_secs = 30;
  worker_loop loop;
  loop.mode = "sync";
  loop.local_step = loop.global_step = 7;
  CHECK_FALSE(loop.after_step(c, 100, true, true, true, 29.9).checkpoint);
  CHECK(loop.after_step(c, 100, true, true, true, 30.0).checkpoint);
  CHECK_FALSE(loop.after_step(c, 100, true, true, false, 30.0).checkpoint); // no writer
  loop.local_step = loop.global_step = 100;
  auto p = loop.after_step(c, 100, true, true, true, 30.0);
  CHECK(p.last);
  CHECK(p.report);
  CHECK_FALSE(p.checkpoint);
}

TEST_CASE("the chief's progress lines print each of ps 0's events once, the last ones kept when "
          "more came than the aggregator keeps, and all of a restarted aggregator's",
          "[worker]") {
  training_detail::event_cursor cur;
  CHECK(cur.take(0, 0) == 0);
  CHECK(cur.take(2, 2) == 2); // joined, joined
  CHECK(cur.take(2, 2) == 0); // nothing new: printed once
  CHECK(cur.take(3, 3) == 1);
  // 40 more while the aggregator keeps its last 32: the 32 it has
  CHECK(cur.take(43, 32) == 32);
  CHECK(cur.seen == 43);
  // ps 0 died and came back: its new aggregator counts from 0 again
  CHECK(cur.take(1, 1) == 1);
  CHECK(cur.take(2, 2) == 1);
}

// Catches a worker that joins every ps again at a switch out of sync (or not
// at one into sync), and a sparse worker's data stream that follows the
// global step through a switch (async counts pushes, sync rounds: it would
// skip or repeat batches) or stops following it in sync (a round closed
// without the worker, a ps restored to an older step).
TEST_CASE("a live switch asks a worker to join again only into sync, and a sparse worker's data "
          "position goes on by one a step across switches",
          "[worker][sparse_switch]") {
  switch_notice n;
  CHECK_FALSE(n.told_of_switch("async"));
  CHECK_FALSE(n.told_of_switch("ssp"));
  CHECK(n.told_of_switch("sync"));
  CHECK(n.rejoin);

  // sync from a checkpoint at step 10 (data position 10): the step's batch.
  auto d = data_cursor::start(true, 10, 10);
  CHECK(d.next == 10);
  d.stepped(11);
  CHECK(d.next == 11);
  d.stepped(13); // rounds 11 and 12 closed without this worker
  CHECK(d.next == 13);
  d.stepped(12); // a ps restored to an older step: its batches again
  CHECK(d.next == 12);
  CHECK_FALSE(d.switched);
  // Into async: the global step now moves by every worker's pushes.
  d.told_of_switch("async");
  CHECK(d.switched);
  d.stepped(40);
  d.stepped(47);
  CHECK(d.next == 14);
  d.told_of_switch("ssp"); // neither follows the step
  d.stepped(60);
  CHECK(d.next == 15);
  // Back into sync: the first step's answer sets the offset, then a round a step.
  d.told_of_switch("sync");
  d.told_of_switch("sync"); // the second ps's word
  d.stepped(61);
  CHECK(d.next == 16);
  d.stepped(62);
  CHECK(d.next == 17);
  d.stepped(64);
  CHECK(d.next == 19);

  // async from a checkpoint whose position is 7: its own steps from there.
  auto a = data_cursor::start(false, 7, 30);
  a.stepped(33);
  CHECK(a.next == 8);
}

TEST_CASE("a checkpoint by steps is due when the global step crosses a multiple of "
          "checkpoint_steps since the last, whatever steps the chief sees",
          "[worker]") {
  // Catches the rule the sparse chief had: due only on a multiple. A chief
  // that sees only odd global steps (two workers pushing in turn) saved
  // nothing until its job's end.
  std::vector<uint64_t> saved;
  uint64_t last = 0;
  for (uint64_t global = 1; global <= 201; global += 2)
    if (train::steps_checkpoint_due(50, global, last)) {
      saved.push_back(global);
      last = global;
    }
  CHECK(saved == std::vector<uint64_t>{51, 101, 151, 201});
  // From where a restored job started (step 120): the next multiple, 150.
  CHECK_FALSE(train::steps_checkpoint_due(50, 149, 120));
  CHECK(train::steps_checkpoint_due(50, 150, 120));
  // Two multiples crossed at once: one checkpoint.
  CHECK(train::steps_checkpoint_due(50, 160, 40));
  CHECK_FALSE(train::steps_checkpoint_due(0, 100, 0)); // 0: never by steps
}
