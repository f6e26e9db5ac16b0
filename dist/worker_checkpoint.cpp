// The chief's held-out evaluation and checkpoints (its replica's, or the
// shards' state assembled into the logical parameters), and the checkpoint
// helpers of dist/worker.hpp.
#include "dist/worker_state.hpp"

#include <algorithm>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

namespace worker_detail {

namespace {

void collect_shards(self_pointer self, std::shared_ptr<train::checkpoint> ckpt, int attempt,
                    std::function<void()> write, std::function<void()> skip);

} // namespace

void evaluate(self_pointer self, std::function<void(double, double)> then) {
  auto& st = self->state;
  if (!st.setup.eval || st.setup.data->test.size() == 0) {
    then(-1, -1);
    return;
  }
  auto b = train::whole(st.setup.data->test);
  std::map<int32_t, tensor> feeds;
  for (auto& f : train::feeds(st.setup.model, current(self), b))
    feeds[f.first.id] = std::move(f.second);
  auto n = static_cast<double>(st.setup.data->test.size());
  st.runner.run(self, st.setup.eval, std::move(feeds), false,
                [self, then, n](caf::expected<step_outputs> out) {
                  auto& st = self->state;
                  if (!out) {
                    fail(self, std::move(out.error()), "evaluating on the held-out set");
                    return;
                  }
                  double loss = out->values[st.setup.model.loss.id].at(0);
                  double acc = st.setup.model.correct.valid()
                                 ? out->values[st.setup.model.correct.id].at(0) / n
                                 : -1;
                  then(loss, acc);
                });
}

void checkpoint(self_pointer self, std::function<void()> then) {
  auto& st = self->state;
  if (!st.setup.save) {
    then();
    return;
  }
  st.last_checkpoint = clock_type::now();
  st.checkpointed_step = st.global_step;
  auto ckpt = std::make_shared<train::checkpoint>();
  ckpt->global_step = st.global_step;
  ckpt->config = train::to_toml(st.setup.cfg);
  // The position at the step of the values saved: in async, the
  // aggregators' step when they answer, which the other workers moved on
  // from the chief's last seen step.
  auto position = [self](uint64_t global_step) {
    auto& s = self->state.setup;
    return data_position(self->state.mode, s.workers, s.start_step, s.start_position,
                         self->state.local_step, global_step);
  };
  ckpt->data_position = position(st.global_step);
  auto write = [self, ckpt, then, position] {
    if (!self->state.own)
      ckpt->data_position = position(ckpt->global_step);
    self->state.checkpointed_step = std::max(self->state.checkpointed_step, ckpt->global_step);
    auto where = self->state.setup.save(*ckpt);
    if (!where) {
      auto& st = self->state;
      st.checkpoint_failures += 1;
      st.checkpoint_error = fmt::format("{}: checkpoint at global step {} failed: {}", who(self),
                                        ckpt->global_step, describe(where.error()));
      log::get()->error("{}", st.checkpoint_error);
    }
    then();
  };
  if (st.own) {
    aggregator_state mine; // the replica's, in the aggregators' form
    for (const auto& p : st.setup.params)
      mine.names.push_back(p.name);
    mine.values = st.own->values;
    mine.slots = st.own->slots;
    add_variables(*ckpt, mine, st.setup.cfg.optimizer.kind);
    write();
    return;
  }
  collect_shards(self, ckpt, 0, write, then);
}

namespace {

/// Asks every shard for its state and puts it into `ckpt`, then `write`.
/// sync: every shard must be at one step, or the checkpoint would join
/// variables of different steps. While the chief's own push is answered the
/// shards are at one step, unless rounds go on without the chief (backup
/// workers, a deadline): then the shards may be caught either side of a
/// step, and the collection is tried again (a few times; the last try is
/// written with a warning naming the steps). async and ssp: each shard's step
/// as it answers (they differ by the pushes between their answers); the
/// checkpoint's is the latest.
void collect_shards(self_pointer self, std::shared_ptr<train::checkpoint> ckpt, int attempt,
                    std::function<void()> write, std::function<void()> skip) {
  auto& st = self->state;
  struct gather {
    size_t missing;
    std::vector<aggregator_state> states;
    std::vector<bool> answered;
    uint64_t hook = 0;
    bool failed = false;
  };
  auto g = std::make_shared<gather>();
  g->missing = st.setup.shards.size();
  g->states.resize(st.setup.shards.size());
  g->answered.assign(st.setup.shards.size(), false);
  auto on_error = std::make_shared<std::function<void(size_t, caf::error)>>();
  *on_error = [self, g, skip](size_t k, caf::error err) {
    if (g->failed)
      return;
    g->failed = true;
    drop_hook(self, g->hook);
    auto task = self->state.setup.shards[k].task;
    // A ps that died: this checkpoint is skipped (the last one stays
    // the latest); the next push finds the ps gone and waits for it.
    if (self->state.recovery
        && (ps_gone(err) || err == caf::sec::request_timeout
            || err == caf::sec::request_receiver_down)) {
      // sync, every member's gradient in each round: while the chief
      // checkpoints it pushes nothing, so no round closes, and a ps that
      // died by now died at the chief's step (not a timeout: a stopped ps
      // may go on). Its restore must be at that step, where every worker
      // pushes the next round to it again, not at a survivor's step after
      // that round closed there, which would drop that round's update on
      // it (K + 1 lost, seen in the soak).
      const auto& c = self->state.setup.cfg;
      if (self->state.mode == "sync" && err != caf::sec::request_timeout
          && c.step_deadline_ms == 0
          && (c.replicas_to_aggregate == 0 || c.replicas_to_aggregate >= self->state.setup.workers))
        self->state.held_round[k] = true;
      log::get()->warn("{}: checkpoint at global step {} skipped: {} did not answer ({})",
                       who(self), self->state.global_step, task, describe(err));
      skip();
      return;
    }
    fail(self, std::move(err), "saving the state of " + task);
  };
  if (st.recovery)
    g->hook = add_hook(self, [g, on_error](size_t k) {
      if (!g->answered[k])
        (*on_error)(k, make_error(af_error::peer_down, "its aggregator went down"));
    });
  for (size_t k = 0; k < st.setup.shards.size(); ++k) {
    const auto& s = st.setup.shards[k];
    self->request(s.actor, st.setup.timeout, save_atom::value)
      .then(
        [self, ckpt, g, k, attempt, write, skip](aggregator_state& state) {
          if (g->failed)
            return;
          g->answered[k] = true;
          g->states[k] = std::move(state);
          if (--g->missing > 0)
            return;
          drop_hook(self, g->hook);
          auto& setup = self->state.setup;
          auto [low, high] = std::minmax_element(
            g->states.begin(), g->states.end(),
            [](const auto& a, const auto& b) { return a.global_step < b.global_step; });
          if (self->state.mode == "sync" && low->global_step != high->global_step) {
            constexpr int tries = 5;
            if (attempt + 1 < tries) {
              collect_shards(self, ckpt, attempt + 1, write, skip);
              return;
            }
            log::get()->warn("{}: the checkpoint's shards are at global steps {} to {} after {} "
                             "tries (rounds go on without the chief); it is written as of step "
                             "{}",
                             who(self), low->global_step, high->global_step, tries,
                             high->global_step);
          }
          ckpt->variables.clear();
          ckpt->global_step = 0;
          if (auto err = add_shard_states(*ckpt, g->states, setup.params, setup.shards,
                                          setup.cfg.optimizer.kind)) {
            fail(self, std::move(err), "assembling the checkpoint from the shards' pieces");
            return;
          }
          write();
        },
        [on_error, k](caf::error& err) { (*on_error)(k, std::move(err)); });
  }
  if (st.recovery)
    fire_known_down(self, g->hook);
}

} // namespace

} // namespace worker_detail

uint64_t data_position(const std::string& mode, uint32_t workers, uint64_t start_step,
                       uint64_t start_position, uint64_t local_steps, uint64_t global_step) {
  if (!train::step_per_push(mode))
    return start_position + local_steps;
  auto pushes = global_step > start_step ? global_step - start_step : 0;
  return start_position + pushes / std::max<uint32_t>(1, workers);
}

void add_variables(train::checkpoint& ckpt, const aggregator_state& state,
                   const std::string& optimizer_kind) {
  auto names = train::slot_names(optimizer_kind);
  for (size_t i = 0; i < state.names.size() && i < state.values.size(); ++i) {
    train::saved_variable v;
    v.name = state.names[i];
    v.value = state.values[i];
    for (size_t k = 0; k < names.size() && i < state.slots.size() && k < state.slots[i].size(); ++k)
      v.slots[names[k]] = state.slots[i][k];
    ckpt.variables.push_back(std::move(v));
  }
}

caf::error assemble_variables(train::checkpoint& ckpt, const std::vector<train::parameter>& params,
                              const std::vector<param_shard>& shards) {
  std::vector<train::piece> pieces;
  for (const auto& s : shards)
    pieces.insert(pieces.end(), s.pieces.begin(), s.pieces.end());
  auto logical = train::logical_variables(params, pieces, ckpt.variables);
  if (!logical)
    return make_error(logical.error().code, logical.error().what);
  ckpt.variables = std::move(*logical);
  return caf::none;
}

caf::error add_shard_states(train::checkpoint& ckpt, const std::vector<aggregator_state>& states,
                            const std::vector<train::parameter>& params,
                            const std::vector<param_shard>& shards,
                            const std::string& optimizer_kind) {
  for (const auto& state : states) {
    add_variables(ckpt, state, optimizer_kind);
    ckpt.global_step = std::max(ckpt.global_step, state.global_step);
  }
  // The checkpoint holds the logical parameters, whatever the pieces.
  return assemble_variables(ckpt, params, shards);
}

} // namespace af
