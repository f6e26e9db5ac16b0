// The worker's exchanges with the ps shards: pushes and pulls through the
// links, joins, a ps that died and came back (recover_ps), and a live switch
// between average and the other modes.
#include "dist/worker_state.hpp"
#include "actors/system.hpp"

#include <algorithm>
#include <limits>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "core/bf16.hpp"
#include "core/log.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "train/partition.hpp"

namespace af::worker_detail {

namespace {

void change_mode(self_pointer self, size_t shard);

/// One exchange's answers, gathered from every shard.
struct exchange_gather {
  size_t missing = 0;
  uint64_t step = UINT64_MAX;
  std::vector<tensor> params;
  std::vector<int> tries; ///< per shard: how often it was waited for (a ps that died)
  std::vector<int> rejoins; ///< per shard: how often it was joined again (refused as left)
  bool failed = false;
};

void push_shard(self_pointer self, std::shared_ptr<exchange_gather> g, size_t k,
                std::vector<tensor> part, uint64_t step, wire::kind kind, bool has_values,
                std::function<void(uint64_t, std::vector<tensor>)> then, uint64_t seq);

/// Takes shard `k`'s flat answer into `into` (one tensor per parameter): a
/// whole parameter is its piece (no copy), a partitioned one gets the rows of
/// this shard's pieces; it is complete once every shard has answered.
caf::error take(self_pointer self, size_t k, const tensor& flat, std::vector<tensor>& into) {
  auto& s = self->state.setup.shards[k];
  if (auto ok = train::take_pieces(s.pieces, flat, into); !ok)
    return make_error(ok.error().code, "parameters from " + s.task + ": " + ok.error().what);
  return caf::none;
}

/// Shard `k`'s answer to this worker's join: the token its pushes carry
/// from now on, and the last push number it took from this worker's index
/// (a process that joined again numbers on from there; a retry in flight
/// keeps its number).
void take_membership(self_pointer self, size_t k, std::string token, uint64_t last_seq) {
  auto& st = self->state;
  st.tokens[k] = std::move(token);
  st.push_seq[k] = std::max(st.push_seq[k], last_seq);
}

/// Pushes nothing to every shard for this step (sync, average: the others'
/// step goes on without this worker's contribution; async: nothing applied),
/// takes the answer, and goes on with the next step.
void abstain(self_pointer self, const std::vector<tensor>* values) {
  exchange(self, values, true, [self](uint64_t step, std::vector<tensor> params) {
    auto& st = self->state;
    st.global_step = step;
    if (st.own)
      st.own->values = std::move(params);
    else
      st.params = std::move(params);
    st.params_stale = false;
    // The step is over (without this worker's contribution): the next one
    // takes the next batch (average counted its local step already).
    if (st.mode != "average")
      st.local_step += 1;
    after_step(self);
  });
}

/// Shard `k`'s ps is gone (`why`): asks the recovery link to wait for it
/// (the chief restores it), takes the shard as it runs again (a new link if
/// its data plane moved), joins its new aggregator, then `then` with the
/// step it was restored at; `failed` if it did not come back.
void recover_shard(self_pointer self, size_t k, uint64_t step, const caf::error& why,
                   std::function<void(uint64_t)> then, std::function<void(caf::error)> failed) {
  auto& st = self->state;
  bool held = st.held_round[k];
  st.held_round[k] = false;
  self->request(st.recovery, caf::infinite, recover_atom::value, static_cast<uint64_t>(k), step,
                describe(why), held)
    .then(
      [self, k, then, failed](uint64_t restored) {
        auto& st = self->state;
        recovered_shard r;
        {
          std::lock_guard<std::mutex> guard{st.recovered->mtx};
          r = st.recovered->done[k];
        }
        auto& shard = st.setup.shards[k];
        if (r.shard.host != shard.host || r.shard.data_port != shard.data_port) {
          if (st.direct) {
            st.direct = std::make_unique<plane_pusher>(r.shard.host, r.shard.data_port,
                                                       r.shard.task, st.setup.timeout,
                                                       before_push_of(st.setup, k),
                                                       system_tls(self->system()),
                                                       st.setup.cfg.wire_dtype == "bf16");
          } else {
            self->unlink_from(st.links[k]);
            self->send_exit(st.links[k], caf::exit_reason::user_shutdown);
            st.links[k] = self->spawn<caf::detached + caf::linked>(
              plane_link, r.shard.host, r.shard.data_port, r.shard.task, st.setup.timeout,
              before_push_of(st.setup, k), st.setup.cfg.wire_dtype == "bf16");
          }
        }
        bool same = r.shard.actor == shard.actor;
        shard = r.shard;
        st.shard_down[k] = false;
        if (same) {
          then(restored);
          return;
        }
        st.ps_recoveries += 1;
        self->monitor(shard.actor);
        // The new aggregator monitors this worker (and counts a worker that
        // joined the job as a member) from here on.
        self->request(shard.actor, st.setup.timeout, join_atom::value, st.setup.index,
                      st.setup.task_name, st.setup.address, examples_per_push(st),
                      caf::actor_cast<caf::actor>(self))
          .then(
            [self, k, then, restored](uint64_t, std::string& token, uint64_t last_seq) {
              take_membership(self, k, std::move(token), last_seq);
              then(restored);
            },
            [failed](caf::error& e) { failed(std::move(e)); });
      },
      [failed](caf::error& e) { failed(std::move(e)); });
}

/// Shard `k`'s aggregator took this worker as left (af_error::left: their
/// CAF link broke while the ps was stopped): looks it up anew on the
/// recovery link (the old handle went with the link), joins it again (a
/// new token; the push numbers go on), then `then`.
void rejoin_shard(self_pointer self, size_t k, std::function<void()> then,
                  std::function<void(caf::error)> failed) {
  auto& st = self->state;
  self->request(st.recovery, caf::infinite, aggregator_atom::value, static_cast<uint64_t>(k))
    .then(
      [self, k, then, failed](aggregator_actor& agg) {
        auto& st = self->state;
        st.setup.shards[k].actor = agg;
        self->request(agg, st.setup.timeout, join_atom::value, st.setup.index,
                      st.setup.task_name, st.setup.address, examples_per_push(st),
                      caf::actor_cast<caf::actor>(self))
          .then(
            [self, k, then](uint64_t, std::string& token, uint64_t last_seq) {
              log::get()->info("worker {}: {} took it as left; joined it again",
                               self->state.setup.index, self->state.setup.shards[k].task);
              take_membership(self, k, std::move(token), last_seq);
              then();
            },
            [failed](caf::error& e) { failed(std::move(e)); });
      },
      [failed](caf::error& e) { failed(std::move(e)); });
}

/// Pushes `part` (or pulls) to shard `k` through its link; its answer goes
/// into `g`, and `then` runs once every shard has answered. A ps that died
/// is waited for (recover_ps) and pushed to again at its restored step, a
/// few times at most per exchange.
void push_shard(self_pointer self, std::shared_ptr<exchange_gather> g, size_t k,
                std::vector<tensor> part, uint64_t step, wire::kind kind, bool has_values,
                std::function<void(uint64_t, std::vector<tensor>)> then, uint64_t seq) {
  auto& st = self->state;
  const auto& s = st.setup.shards[k];
  // Each push gets the next number; its retry (the ps died before it
  // answered) the same one, so that a ps restored from a checkpoint that
  // holds it does not apply it twice.
  if (kind != wire::kind::pull && seq == 0) {
    // Never past 2^64 - 1 back to 0 (unnumbered): a joiner goes on from
    // the number its aggregator last took, which a checkpoint bounds.
    if (st.push_seq[k] == std::numeric_limits<uint64_t>::max()) {
      if (!g->failed) {
        g->failed = true;
        fail(self,
             make_error(af_error::invalid_argument,
                        fmt::format("{} has taken push number 2^64 - 1 of this worker: no "
                                    "number is left (its state is corrupt or forged)",
                                    s.task)),
             "numbering a push");
      }
      return;
    }
    seq = ++st.push_seq[k];
  }
  auto wait = static_cast<uint32_t>(st.setup.cfg.step_timeout_ms);
  // The link answers within its socket's deadlines (the node's step
  // timeout plus a margin, data_channel::aggregate) and is linked to this
  // actor: no timer here, which would wake CAF's clock thread every step.
  // `part` and `then`, kept for the answer and a retry: shared by both
  // callbacks, not copied into each (a copy of a tensor copies its shape).
  struct kept_push {
    std::vector<tensor> part;
    std::function<void(uint64_t, std::vector<tensor>)> then;
  };
  auto kept = std::make_shared<const kept_push>(kept_push{std::move(part), std::move(then)});
  auto answered = [self, g, k, kept](uint64_t step, tensor& flat, bool dropped_late) {
        if (g->failed)
          return;
        if (dropped_late)
          self->state.answered_late = true;
        if (auto err = take(self, k, flat, g->params)) {
          g->failed = true;
          fail(self, std::move(err), "taking the parameters");
          return;
        }
        auto& st = self->state;
        st.shard_step[k] = step;
        // It answers: whatever its checkpoint's save saw, it did not die
        // while this worker held the round.
        st.held_round[k] = false;
        g->step = std::min(g->step, step);
        if (--g->missing == 0)
          kept->then(g->step, std::move(g->params));
      };
  auto failed = [self, g, k, kept, step, kind, has_values, seq](caf::error& err) {
        if (g->failed)
          return;
        auto& st = self->state;
        auto during = [self, k, has_values] {
          const auto& task = self->state.setup.shards[k].task;
          return has_values ? "pushing to " + task : "pulling from " + task;
        };
        // A live switch between average and the others: the aggregator
        // takes the other kind of push now. Learn the mode, change loops.
        if (has_values && err.category() == error_category
            && err.code() == static_cast<uint8_t>(af_error::mode_changed)) {
          g->failed = true;
          // With several ps, shards still in the old mode may have taken
          // this gradient: it is not applied again to the replica.
          if (st.setup.shards.size() > 1)
            st.pending.clear();
          change_mode(self, k);
          return;
        }
        // The ps's aggregator took this worker as left (their link broke
        // while the ps was stopped; the ps kept its state): join it again
        // and push again under the same number. Again if a down of the old
        // link reaches it after the join (it came through that link's
        // proxy): each such refusal is one more down, so a few suffice.
        if (has_values && st.recovery && is(err, af_error::left) && g->rejoins[k] < 8) {
          g->rejoins[k] += 1;
          rejoin_shard(
            self, k,
            [self, g, k, kept, step, kind, has_values, seq] {
              if (!g->failed)
                push_shard(self, g, k, kept->part, step, kind, has_values, kept->then, seq);
            },
            [self, g, during](caf::error e) {
              if (g->failed)
                return;
              g->failed = true;
              fail(self, std::move(e), during() + " (joining it again: it took this worker "
                                                  "as left)");
            });
          return;
        }
        // The ps's process died: wait for it to come back (the chief
        // restores its variables), then push this part again at the step
        // it was restored at (a later one would be ahead of it).
        if (st.recovery && ps_gone(err) && g->tries[k] < 3) {
          g->tries[k] += 1;
          recover_shard(
            self, k, step, err,
            [self, g, k, kept, step, kind, has_values, seq](uint64_t restored) {
              if (g->failed)
                return;
              auto next = std::min(step, restored);
              self->state.shard_step[k] = next;
              push_shard(self, g, k, kept->part, next, kind, has_values, kept->then, seq);
            },
            [self, g, during](caf::error e) {
              if (g->failed)
                return;
              g->failed = true;
              fail(self, std::move(e), during());
            });
          return;
        }
        g->failed = true;
        // The worker checks every part before it pushes any, with the
        // aggregators' own test: a non_finite refusal here means the two
        // disagree, and with several ps the other shards may already have
        // taken their parts. Not something to abstain past: fail.
        if (is(err, af_error::left) && g->rejoins[k] >= 8)
          fail(self, std::move(err),
               during() + " (joined it again 8 times, taken as left each time: its links "
                          "keep breaking; check the ps's load and connection_timeout_ms)");
        else
          fail(self, std::move(err), during());
      };
  if (st.direct) {
    auto r = st.direct->push(s.aggregator, st.setup.index, step, kept->part, wait,
                             static_cast<uint8_t>(kind), st.local_step, st.tokens[k], seq);
    st.pushed = [answered = std::move(answered), failed = std::move(failed),
                 r = std::move(r)]() mutable {
      if (r)
        answered(std::get<0>(*r), std::get<1>(*r), std::get<2>(*r));
      else
        failed(r.error());
    };
    self->send(self, pushed_atom::value);
    return;
  }
  self->request(st.links[k], caf::infinite, push_atom::value, s.aggregator, st.setup.index,
                step, kept->part, wait, static_cast<uint8_t>(kind), st.local_step, st.tokens[k],
                seq)
    .then(std::move(answered), std::move(failed));
}

/// After a live switch between average and the other modes (a push refused
/// as mode_changed by shard `shard`): asks that shard for the job's mode, pulls
/// the parameters, and goes on in that mode's loop.
///   into average: the pulled parameters become its replica (optimizer slots
///     at zero), and the gradient the switch refused is its first local step;
///     rounds count from the pulled global step.
///   out of average: its replica goes (its local steps since the last
///     average are replaced by the job's parameters, as if it had abstained).
/// With several ps the shards switch within milliseconds of each other; a
/// worker that meets the old mode on the next shard changes back and forth
/// until all have switched.
void change_mode(self_pointer self, size_t shard) {
  auto& st = self->state;
  self->request(st.setup.shards[shard].actor, st.setup.timeout, stats_atom::value)
    .then(
      [self](aggregator_stats& s) {
        auto& st = self->state;
        log::get()->info("{}: the job runs {} now (this worker ran {}): changing its loop at "
                         "local step {}",
                         who(self), s.mode, st.mode, st.local_step);
        bool to_average = s.mode == "average";
        st.mode = s.mode;
        exchange(self, nullptr, false, [self, to_average](uint64_t step, std::vector<tensor> params) {
          auto& st = self->state;
          st.global_step = step;
          if (!to_average) {
            st.own.reset();
            st.pending.clear();
            st.params = std::move(params);
            st.params_stale = false;
            after_step(self);
            return;
          }
          auto own = train::replica_state::make(std::move(params), st.setup.cfg.optimizer);
          if (!own) {
            fail(self, make_error(own.error().code, own.error().what), "starting its replica");
            return;
          }
          st.own = std::move(*own);
          st.avg_step0 = step;
          st.avg_local0 = st.local_step;
          auto grads = std::move(st.pending);
          st.pending.clear();
          if (grads.empty())
            after_step(self);
          else
            use_gradients(self, std::move(grads));
        });
      },
      [self, shard](caf::error& err) {
        fail(self, std::move(err),
             "asking " + self->state.setup.shards[shard].task + " for the job's mode after a switch");
      });
}

} // namespace

std::string first_non_finite(self_pointer self, const std::vector<tensor>& values,
                             const char* what) {
  auto& st = self->state;
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& t = values[i];
    if (t.type() != dtype::float32)
      continue;
    auto n = static_cast<size_t>(t.num_elements());
    auto bad = train::first_non_finite(t.data<float>(), n);
    if (bad < n)
      return fmt::format("{} of {} for variable '{}' at local step {} (global step {}) is not "
                         "finite (element {} is {})",
                         what, who(self), st.setup.params[i].name, st.local_step, st.global_step,
                         bad, t.data<float>()[bad]);
  }
  return "";
}

std::vector<tensor> with_feedback(worker_state& st, const std::vector<tensor>& values) {
  if (st.setup.cfg.wire_dtype != "bf16" || st.mode == "average" || st.mode == "allreduce")
    return values;
  st.wire_residual.resize(values.size());
  std::vector<tensor> sent;
  sent.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& g = values[i];
    if (g.type() != dtype::float32 || g.empty()) {
      sent.push_back(g);
      continue;
    }
    auto n = static_cast<size_t>(g.num_elements());
    auto& r = st.wire_residual[i];
    r.resize(n, 0.0f); // zero at the first push (and for a parameter that changed size)
    tensor q{dtype::float32, g.shape()}; // written once: no copy of g first
    bf16::round_with_feedback(g.data<float>(), q.mutable_data<float>(), r.data(), n);
    sent.push_back(std::move(q));
  }
  return sent;
}

bool note_refusal(self_pointer self, std::string why) {
  auto& st = self->state;
  st.refused += 1;
  st.refused_in_a_row += 1;
  log::get()->warn("{}", why);
  st.last_refusal = std::move(why);
  if (st.refused_in_a_row < std::max<uint64_t>(1, st.setup.cfg.max_nonfinite_steps))
    return true;
  fail(self,
       make_error(af_error::non_finite,
                  fmt::format("its last {} steps were all not finite (max_nonfinite_steps = {}; "
                              "the last: {}): the model has diverged or its input is bad; lower "
                              "learning_rate, check the data, or resume from a checkpoint (a "
                              "model that recovers by itself may need a larger "
                              "max_nonfinite_steps in [train])",
                              st.refused_in_a_row, st.setup.cfg.max_nonfinite_steps,
                              st.last_refusal)),
       "training");
  return false;
}

void exchange(self_pointer self, const std::vector<tensor>* values, bool abstain_step,
              std::function<void(uint64_t, std::vector<tensor>)> then) {
  auto& st = self->state;
  if (values != nullptr && !abstain_step) {
    auto bad = first_non_finite(self, *values,
                                st.mode == "average" ? "parameters" : "gradient");
    if (!bad.empty()) {
      if (note_refusal(self, bad + ": abstaining from this step on every ps"))
        abstain(self, values);
      return;
    }
    st.refused_in_a_row = 0;
  }
  if (st.rejoin && values != nullptr) {
    // A ps switched into sync: join every ps before this step's push (the
    // ones in sync take this worker into their rounds from it on; until
    // then they applied its pushes at once). With several ps each one
    // switches at its own moment: only a join that every ps has before the
    // same push makes them pair the same steps of the workers.
    st.rejoin = false;
    // A ps in sync again takes this push whatever its step (standby, fresh).
    st.closed.assign(st.closed.size(), false);
    auto keep = std::make_shared<std::vector<tensor>>(*values); // shares the buffers
    join_all(self, [self, keep, abstain_step, then] {
      exchange(self, keep.get(), abstain_step, then);
    });
    return;
  }
  // [train] wire_dtype = "bf16": what goes on the wire, rounded with error
  // feedback once per step (a retry of a push sends the same values).
  std::vector<tensor> rounded;
  if (values != nullptr && !abstain_step && st.setup.cfg.wire_dtype == "bf16") {
    rounded = with_feedback(st, *values);
    values = &rounded;
  }
  st.answered_late = false;
  auto g = std::make_shared<exchange_gather>();
  g->missing = st.setup.shards.size();
  g->params.resize(st.setup.params.size());
  g->tries.assign(st.setup.shards.size(), 0);
  g->rejoins.assign(st.setup.shards.size(), 0);
  for (size_t k = 0; k < st.setup.shards.size(); ++k) {
    const auto& s = st.setup.shards[k];
    // sync: a shard that said this step closed without this worker gets
    // no part of it (it would drop it as late): its parameters are pulled.
    bool sends = values != nullptr
                 && !(st.mode == "sync" && k < st.closed.size() && st.closed[k]);
    // A partitioned parameter's rows are copied out; a whole one goes as is.
    auto part = sends && !abstain_step ? train::rows_for(s.pieces, *values)
                                       : std::vector<tensor>{};
    // average pushes the round's step (the same local steps on every shard).
    bool average = st.mode == "average";
    auto step = average ? st.global_step : st.shard_step[k];
    // [train] pipeline_sync, pipeline_async: a sync or async gradient
    // streamed (the ps answers in chunks as they are applied:
    // dist/pipelined_round.hpp); an abstention, or any other mode, goes as
    // before.
    const auto& cfg = st.setup.cfg;
    bool streamed = ((st.mode == "sync" && cfg.pipeline_sync)
                     || (st.mode == "async" && cfg.pipeline_async))
                    && !part.empty();
    auto kind = !sends     ? wire::kind::pull
                : average  ? wire::kind::push_params
                : streamed ? wire::kind::push_streamed
                           : wire::kind::push;
    push_shard(self, g, k, std::move(part), step, kind, sends, then, 0);
  }
}

bool asks_closed(const worker_state& st) {
  return st.mode == "sync" && st.late_suspect && !st.rejoin && !st.setup.shards.empty();
}

bool all_closed(const worker_state& st) {
  return !st.closed.empty()
         && std::all_of(st.closed.begin(), st.closed.end(), [](bool c) { return c; });
}

void ask_closed(self_pointer self, std::function<void()> then) {
  auto& st = self->state;
  // Once, per shard, whichever comes first: the answer, an error, or its
  // aggregator going down (a request to a dead node is never answered).
  struct asks {
    size_t missing = 0;
    std::vector<bool> settled;
    uint64_t hook = 0;
  };
  auto a = std::make_shared<asks>();
  a->settled.assign(st.setup.shards.size(), true);
  for (size_t k = 0; k < st.setup.shards.size(); ++k)
    if (st.setup.shards[k].actor && !st.closed[k] && !st.shard_down[k]) {
      a->settled[k] = false;
      a->missing += 1;
    }
  if (a->missing == 0) {
    then();
    return;
  }
  auto settle = [self, a, then](size_t k, bool closed, uint64_t at) {
    if (a->settled[k])
      return;
    a->settled[k] = true;
    auto& st = self->state;
    if (closed && k < st.closed.size()) {
      st.closed[k] = true;
      st.closed_at[k] = at;
    }
    if (--a->missing == 0) {
      drop_hook(self, a->hook);
      if (!st.finished)
        then();
    }
  };
  if (st.recovery)
    a->hook = add_hook(self, [settle](size_t k) mutable { settle(k, false, 0); });
  for (size_t k = 0; k < st.setup.shards.size(); ++k) {
    if (a->settled[k])
      continue;
    self->request(st.setup.shards[k].actor, st.setup.timeout, closed_atom::value, st.setup.index,
                  st.shard_step[k], st.tokens[k])
      .then([settle, k](uint64_t at, bool closed) mutable { settle(k, closed, at); },
            [self, settle, k](caf::error& err) mutable {
              log::get()->debug("{}: asking {} whether its step closed: {}; pushing as before",
                                who(self), self->state.setup.shards[k].task, describe(err));
              settle(k, false, 0);
            });
  }
  if (st.recovery)
    fire_known_down(self, a->hook);
}

void skip_step(self_pointer self) {
  auto& st = self->state;
  st.skipped += 1;
  st.in_time = 0;
  // The round open on each shard: the next step's (the least of them).
  uint64_t open = std::numeric_limits<uint64_t>::max();
  for (size_t k = 0; k < st.closed_at.size(); ++k)
    open = std::min(open, st.closed_at[k]);
  bool pull = st.setup.index == 0 || st.own || open == std::numeric_limits<uint64_t>::max()
              || open >= st.setup.total_steps;
  log::get()->debug("{}: global step {} closed without it (its gradient would be dropped as "
                    "late): not computed or not sent; {} ({} skipped so far)",
                    who(self), st.global_step,
                    pull ? "pulling the parameters"
                         : "the parameters are pulled before it computes",
                    st.skipped);
  if (!pull) {
    for (size_t k = 0; k < st.closed_at.size(); ++k)
      st.shard_step[k] = std::max(st.shard_step[k], st.closed_at[k]);
    st.global_step = std::max(st.global_step, open);
    st.params_stale = true;
    st.local_step += 1; // its batch goes, as a late gradient's would
    after_step(self);
    return;
  }
  pull_params(self, [self] {
    // Its batch goes, as a late gradient's would: the next step reads the next.
    self->state.local_step += 1;
    after_step(self);
  });
}

void pull_params(self_pointer self, std::function<void()> then) {
  self->state.pulls += 1;
  exchange(self, nullptr, false, [self, then](uint64_t step, std::vector<tensor> params) {
    auto& st = self->state;
    st.global_step = step;
    st.params = std::move(params);
    st.params_stale = false;
    then();
  });
}

bool ps_gone(const caf::error& err) {
  return is(err, af_error::peer_down) || is(err, af_error::unreachable);
}

uint64_t add_hook(self_pointer self, std::function<void(size_t)> hook) {
  auto id = ++self->state.next_hook;
  self->state.down_hooks[id] = std::move(hook);
  return id;
}

void drop_hook(self_pointer self, uint64_t id) {
  self->state.down_hooks.erase(id);
}

void fire_known_down(self_pointer self, uint64_t id) {
  auto& st = self->state;
  for (size_t k = 0; k < st.shard_down.size(); ++k) {
    auto h = st.down_hooks.find(id);
    if (h == st.down_hooks.end())
      return; // it dropped itself
    if (st.shard_down[k]) {
      auto hook = h->second;
      hook(k);
    }
  }
}

uint32_t examples_per_push(const worker_state& st) {
  return static_cast<uint32_t>(
    st.setup.cfg.batch_size
    * (st.mode == "average" ? std::max<uint32_t>(1, st.setup.cfg.average_every) : 1));
}

void join_all(self_pointer self, std::function<void()> then) {
  auto& st = self->state;
  struct joins {
    size_t missing = 0;
    std::vector<bool> settled; ///< answered, or handed to the recovery
    uint64_t hook = 0;
    bool failed = false;
  };
  auto j = std::make_shared<joins>();
  j->missing = st.setup.shards.size();
  j->settled.assign(st.setup.shards.size(), false);
  auto examples = examples_per_push(st);
  auto one_done = [self, j, then] {
    if (!j->failed && --j->missing == 0) {
      drop_hook(self, j->hook);
      then();
    }
  };
  // A ps that dies before it answered (the join request to a dead node is
  // never answered): wait for it as a push would; recover_shard joins the
  // new aggregator itself.
  auto recover = [self, j, one_done](size_t k, caf::error why) {
    j->settled[k] = true;
    auto task = self->state.setup.shards[k].task;
    recover_shard(
      self, k, self->state.shard_step[k], why,
      [self, k, one_done](uint64_t restored) {
        self->state.shard_step[k] = restored;
        one_done();
      },
      [self, j, task](caf::error e) {
        if (j->failed)
          return;
        j->failed = true;
        drop_hook(self, j->hook);
        fail(self, std::move(e), "joining the aggregator of " + task);
      });
  };
  if (st.recovery)
    j->hook = add_hook(self, [j, recover](size_t k) {
      if (!j->failed && !j->settled[k])
        recover(k, make_error(af_error::peer_down, "its aggregator went down"));
    });
  for (size_t k = 0; k < st.setup.shards.size(); ++k) {
    const auto& s = st.setup.shards[k];
    if (!s.actor) {
      j->settled[k] = true;
      one_done();
      continue;
    }
    self->request(s.actor, st.setup.timeout, join_atom::value, st.setup.index, st.setup.task_name,
                  st.setup.address, examples, caf::actor_cast<caf::actor>(self))
      .then(
        [self, j, k, one_done](uint64_t, std::string& token, uint64_t last_seq) {
          if (j->settled[k])
            return;
          take_membership(self, k, std::move(token), last_seq);
          j->settled[k] = true;
          one_done();
        },
        [self, j, k, recover, task = s.task](caf::error& err) {
          if (j->failed || j->settled[k])
            return;
          if (self->state.recovery && ps_gone(err)) {
            recover(k, std::move(err));
            return;
          }
          j->failed = true;
          drop_hook(self, j->hook);
          fail(self, std::move(err), "joining the aggregator of " + task);
        });
  }
  if (st.recovery)
    fire_known_down(self, j->hook);
  if (st.setup.shards.empty())
    then();
}

} // namespace af::worker_detail
