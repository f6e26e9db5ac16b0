#include "dist/worker.hpp"
#include "dist/worker_state.hpp"
#include "actors/system.hpp"
#include "actors/result_at_exit.hpp"

#include <algorithm>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

namespace worker_detail {

std::string who(self_pointer self) {
  return fmt::format("worker {}", self->state.setup.index);
}

void fail(self_pointer self, caf::error err, const std::string& during) {
  auto& st = self->state;
  if (st.finished)
    return;
  st.finished = true;
  auto msg = fmt::format("{} at local step {} (global step {}), {}: {}", who(self), st.local_step,
                         st.global_step, during, describe(err));
  if (is(err, af_error::cancelled))
    log::get()->info("{}", msg); // asked for (train stop): not a failure to shout about
  else
    log::get()->error("{}", msg);
  // Said with its token, and why: the chief fails the job when a worker
  // failed. Without one (it failed before it joined) the aggregator takes
  // it only if no process joined under the index: a process refused at its
  // join does not retire the live member of its index.
  for (size_t k = 0; k < st.setup.shards.size(); ++k)
    if (st.setup.shards[k].actor)
      caf::anon_send(st.setup.shards[k].actor, done_atom::value, st.setup.index,
                     k < st.tokens.size() ? st.tokens[k] : std::string{},
                     is(err, af_error::cancelled) ? std::string{} : msg);
  // Keep the cause's code (a timeout stays a timeout; internal means a bug).
  auto code = af_error::internal;
  if (err.category() == error_category && valid_af_error(err.code()))
    code = static_cast<af_error>(err.code());
  else if (err == caf::sec::request_timeout)
    code = af_error::timeout;
  else if (err == caf::sec::request_receiver_down)
    code = af_error::peer_down;
  st.done(make_error(code, msg));
  self->quit();
}

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

/// Whether this worker's reports carry its parameters and gradients: the
/// chief of a job that writes TensorBoard histograms.
bool wants_histograms(const worker_setup& setup) {
  return setup.index == 0 && setup.cfg.histogram_every > 0 && !setup.cfg.logdir.empty();
}

const std::vector<tensor>& current(self_pointer self) {
  auto& st = self->state;
  return st.own ? st.own->values : st.params;
}

void after_step(self_pointer self) {
  auto& st = self->state;
  // What is due: worker_loop::after_step. The clock is read only when a
  // checkpoint may be due by time (a clock read per step otherwise).
  bool chief = st.setup.index == 0;
  bool can_save = static_cast<bool>(st.setup.save);
  double since = chief && can_save && st.setup.cfg.checkpoint_secs > 0
                   ? seconds_since(st.last_checkpoint)
                   : 0.0;
  auto plan = st.after_step(st.setup.cfg, st.setup.total_steps, chief,
                            static_cast<bool>(st.setup.eval), can_save, since);
  auto step = plan.step;
  bool last = plan.last;
  bool report = plan.report;
  bool eval = plan.eval;
  bool ckpt = plan.checkpoint;
  auto next = [self, last] {
    if (last)
      finish(self);
    else
      run_step(self);
  };
  auto then_ckpt = [self, ckpt, next] {
    if (ckpt)
      checkpoint(self, next);
    else
      next();
  };
  if (!report && !eval) {
    then_ckpt();
    return;
  }
  auto progress = [self, then_ckpt, report, step](double test_loss, double acc) {
    auto& st = self->state;
    if (report && st.setup.on_progress) {
      worker_progress p;
      p.worker = st.setup.index;
      p.local_step = st.local_step;
      p.global_step = st.global_step;
      p.step = step;
      if (st.mode == "average")
        p.rounds = st.rounds(st.setup.cfg.average_every);
      p.loss = st.loss_count ? st.loss_sum / static_cast<double>(st.loss_count) : 0;
      p.accuracy = acc;
      p.test_loss = test_loss;
      p.evaluated = acc >= 0 || test_loss >= 0;
      p.seconds = seconds_since(st.started);
      // Skipped steps trained on no example.
      p.examples_per_s = p.seconds > 0 ? static_cast<double>((st.local_step - st.skipped)
                                                             * st.setup.cfg.batch_size)
                                           / p.seconds
                                       : 0;
      if (wants_histograms(st.setup)) {
        p.values = current(self);
        p.gradients = st.last_grads;
      }
      st.last_loss = p.loss;
      st.loss_sum = 0;
      st.loss_count = 0;
      // The chief's reports carry the job's accounting (the others' are
      // not printed: no request on their step's path).
      if (st.setup.index == 0 && !st.setup.shards.empty() && st.setup.shards[0].actor) {
        // Once, whichever comes first: the answer, an error, or ps 0 going
        // down (then CAF never answers).
        struct once_state {
          bool done = false;
          uint64_t hook = 0;
        };
        auto once = std::make_shared<once_state>();
        auto go_on = [self, p, then_ckpt, once](aggregator_stats* s) mutable {
          if (once->done)
            return;
          once->done = true;
          drop_hook(self, once->hook);
          if (s)
            p.stats = std::move(*s);
          self->state.setup.on_progress(p);
          then_ckpt();
        };
        if (st.recovery)
          once->hook = add_hook(self, [go_on](size_t k) mutable {
            if (k == 0)
              go_on(nullptr);
          });
        self->request(st.setup.shards[0].actor, st.setup.timeout, stats_atom::value)
          .then([go_on](aggregator_stats& s) mutable { go_on(&s); },
                [go_on](caf::error&) mutable { go_on(nullptr); });
        if (st.recovery)
          fire_known_down(self, once->hook);
        return;
      }
      st.setup.on_progress(p);
    }
    then_ckpt();
  };
  if (eval)
    evaluate(self, progress);
  else
    progress(-1, -1);
}

void finish(self_pointer self) {
  auto& st = self->state;
  double seconds = seconds_since(st.started);
  for (size_t k = 0; k < st.setup.shards.size(); ++k)
    if (st.setup.shards[k].actor)
      caf::anon_send(st.setup.shards[k].actor, done_atom::value, st.setup.index,
                     k < st.tokens.size() ? st.tokens[k] : std::string{}, std::string{});
  auto complete = [self, seconds](double test_loss, double acc) {
    auto& st = self->state;
    auto result = [self, seconds, test_loss, acc] {
      auto& st = self->state;
      if (st.finished)
        return;
      st.finished = true;
      worker_result r;
      r.local_steps = st.local_step;
      r.global_step = st.global_step;
      r.seconds = seconds;
      r.loss = st.last_loss;
      r.accuracy = acc;
      r.test_loss = test_loss;
      r.refused = st.refused;
      r.skipped = st.skipped;
      r.pulls = st.pulls;
      r.computed = st.computed;
      r.steps_here = st.here ? st.here->runs() : 0;
      r.last_refusal = st.last_refusal;
      r.checkpoint_failures = st.checkpoint_failures;
      r.checkpoint_error = st.checkpoint_error;
      r.params = current(self);
      r.shards = st.setup.shards;
      r.ps_recoveries = st.ps_recoveries;
      st.done(std::move(r));
      self->quit();
    };
    // sync and async: run_worker_task saves once every worker is done (async's
    // others still push after the chief's last step). average and allreduce:
    // the last round (all-reduce) had every worker in it; nothing moves after.
    if (st.setup.save && st.own)
      checkpoint(self, result);
    else
      result();
  };
  if (st.setup.index == 0)
    evaluate(self, complete);
  else
    complete(-1, -1);
}

void use_gradients(self_pointer self, std::vector<tensor> grads) {
  auto& st = self->state;
  const auto mode = st.mode;
  if (mode == "sync" || train::step_per_push(mode)) {
    auto push = [self](std::vector<tensor> grads) {
      auto& st = self->state;
      st.pending = grads; // shares the buffers
      exchange(self, &grads, false, [self](uint64_t step, std::vector<tensor> params) {
        auto& st = self->state;
        st.pending.clear();
        // sync: a push that an aggregator dropped as late (its answer says
        // so; the global step cannot: a push dropped just after its round
        // closed is answered with the step that round made, as one in time)
        // makes it ask before its next pushes; two in time in a row stop that.
        if (st.mode == "sync") {
          st.in_time = st.answered_late ? 0 : std::min<uint32_t>(st.in_time + 1, 2);
          if (st.in_time == 0)
            st.late_suspect = true;
          else if (st.in_time >= 2)
            st.late_suspect = false;
        }
        st.global_step = step;
        st.params = std::move(params);
        st.params_stale = false;
        st.local_step += 1;
        after_step(self);
      });
    };
    // After computing (the slow part), before sending: a step that closed
    // on every shard meanwhile is not sent.
    if (asks_closed(st)) {
      ask_closed(self, [self, push, grads = std::move(grads)]() mutable {
        if (all_closed(self->state))
          skip_step(self);
        else
          push(std::move(grads));
      });
      return;
    }
    push(std::move(grads));
    return;
  }
  if (mode == "allreduce") {
    // Every worker must take part in the collective, so a worker whose
    // gradient is not finite contributes zeros (the mean then counts it as
    // a zero gradient) instead of a NaN that would reach every replica.
    if (auto bad = first_non_finite(self, grads, "the gradient"); !bad.empty()) {
      if (!note_refusal(self, bad + ": contributing zeros to this step's all-reduce"))
        return;
      for (auto& g : grads)
        g = tensor::filled(g.type(), g.shape(), 0);
    } else {
      st.refused_in_a_row = 0;
    }
    auto shapes = std::make_shared<std::vector<shape_type>>();
    for (auto& g : grads)
      shapes->push_back(g.shape());
    auto flat = train::flatten(grads);
    if (grads.size() == 1)
      flat.mutable_bytes(); // the reduction writes in place: not into the step's output
    // The group fails a collective that stops moving (its own timeout names
    // the missing rank) and the link is linked to this actor: a CAF timer
    // here would race that reason and cut short a long transfer.
    self->request(st.reducer, caf::infinite, allreduce_atom::value, std::move(flat))
      .then(
        [self, shapes](tensor& mean) {
          auto& st = self->state;
          auto parts = train::unflatten(mean, *shapes);
          if (!parts) {
            fail(self, make_error(parts.error().code, parts.error().what), "all-reduce");
            return;
          }
          if (auto ok = st.own->apply(st.setup.cfg.optimizer, *parts, st.global_step); !ok) {
            fail(self, make_error(ok.error().code, ok.error().what), "applying the update");
            return;
          }
          st.local_step += 1;
          st.global_step += 1;
          after_step(self);
        },
        [self](caf::error& err) { fail(self, std::move(err), "all-reduce of the gradients"); });
    return;
  }
  // average: a local step on the worker's own replica; every k, the average.
  // A gradient that is not finite is left out (it would poison the replica's
  // slots for good, which the average does not replace).
  if (auto bad = first_non_finite(self, grads, "gradient"); !bad.empty()) {
    if (!note_refusal(self, bad + ": the local update is skipped"))
      return;
  } else if (auto ok = st.own->apply(st.setup.cfg.optimizer, grads, st.average_step());
             !ok) {
    fail(self, make_error(ok.error().code, ok.error().what), "applying the local update");
    return;
  } else {
    st.refused_in_a_row = 0;
  }
  st.local_step += 1;
  if (!st.round_due(st.setup.cfg.average_every, st.setup.total_steps)) {
    after_step(self);
    return;
  }
  auto values = st.own->values;
  // The aggregator's step for a round: the local steps every worker has run.
  st.global_step = st.average_step();
  exchange(self, &values, false, [self](uint64_t step, std::vector<tensor> params) {
    auto& st = self->state;
    st.global_step = step;
    st.own->values = std::move(params);
    after_step(self);
  });
}

namespace {

void run_step_now(self_pointer self, bool delayed);

/// True (and the worker ended) if its client asked it to stop.
bool stop_requested(self_pointer self) {
  auto& st = self->state;
  if (!st.setup.stop || !st.setup.stop->load())
    return false;
  if (st.setup.stopped) {
    auto& c = *st.setup.stopped;
    c.set = true;
    c.local_steps = st.local_step;
    c.global_step = st.global_step;
    c.skipped = st.skipped;
    c.pulls = st.pulls;
    c.computed = st.computed;
  }
  fail(self, make_error(af_error::cancelled, "its client stopped the job"), "before its step");
  return true;
}

} // namespace

void run_step(self_pointer self) {
  auto& st = self->state;
  if (st.finished)
    return;
  if (stop_requested(self))
    return;
  if (st.setup.step_delay.count() > 0) {
    self->delayed_send(self, st.setup.step_delay, step_atom::value);
    return;
  }
  run_step_now(self, false);
}

namespace {

/// The step's outputs: its loss counted, its gradients used.
void took_step(self_pointer self, caf::expected<step_outputs> out) {
  auto& st = self->state;
  if (!out) {
    fail(self, std::move(out.error()), "running the step");
    return;
  }
  st.computed += 1;
  st.loss_sum += out->values[st.setup.model.loss.id].at(0);
  st.loss_count += 1;
  std::vector<tensor> grads;
  for (auto g : st.setup.model.grads)
    grads.push_back(std::move(out->values[g.id]));
  if (st.setup.tamper)
    st.setup.tamper(st.local_step, grads);
  if (wants_histograms(st.setup))
    st.last_grads = grads; // shares the buffers
  use_gradients(self, std::move(grads));
}

/// The step's forward and gradients, then use_gradients: on this actor's
/// thread where the step allows (actors/step_here.hpp), else through the
/// executor.
void compute(self_pointer self) {
  auto& st = self->state;
  if (st.finished)
    return;
  if (st.in_here) {
    // The last step ended with nothing asked (worker_state::in_here): this
    // one starts from the mailbox, not inside that one's call.
    self->send(self, here_atom::value);
    return;
  }
  auto b = st.batches->at(st.setup.start_position + st.local_step);
  std::map<int32_t, tensor> feeds;
  for (auto& f : train::feeds(st.setup.model, current(self), b))
    feeds[f.first.id] = std::move(f.second);
  if (st.here) {
    st.in_here = true;
    took_step(self, st.here->run(feeds));
    st.in_here = false;
    return;
  }
  st.runner.run(self, st.setup.step, std::move(feeds), false,
                [self](caf::expected<step_outputs> out) { took_step(self, std::move(out)); });
}

/// A step; `delayed`: after step_delay (a straggler's slow part, before
/// its compute): a worker that was late first asks whether this step
/// closed without it meanwhile, and skips it if so.
void run_step_now(self_pointer self, bool delayed) {
  auto& st = self->state;
  if (st.finished)
    return;
  st.closed.assign(st.setup.shards.size(), false);
  st.closed_at.assign(st.setup.shards.size(), 0);
  // On parameters of the round it computes for: pulled now if a step was
  // skipped without them (skip_step).
  auto go = [self] {
    if (!self->state.params_stale) {
      compute(self);
      return;
    }
    pull_params(self, [self] {
      auto& st = self->state;
      // Every round just pulled is open: none is known closed. Unless the
      // job's last one closed since it asked: then nothing is computed (its
      // push would open a round past the job's end, which the other workers,
      // done, would let it close alone), and the step counts as skipped.
      st.closed.assign(st.closed.size(), false);
      st.closed_at.assign(st.closed_at.size(), 0);
      if (st.global_step >= st.setup.total_steps) {
        st.skipped += 1;
        st.local_step += 1;
        after_step(self);
        return;
      }
      compute(self);
    });
  };
  if (delayed && asks_closed(st)) {
    ask_closed(self, [self, go] {
      if (all_closed(self->state))
        skip_step(self);
      else
        go();
    });
    return;
  }
  go();
}

/// The worker's ways to its ps shards: one shard, pushed to on this actor's
/// own thread (it is detached: nothing else wakes for a push); several, a
/// detached link each, so that their pushes go at once. With recover_ps,
/// the recovery link, and a watch on each aggregator.
void connect_shards(self_pointer self) {
  auto& st = self->state;
  const auto& s = st.setup;
  if (s.shards.size() == 1)
    st.direct = std::make_unique<plane_pusher>(s.shards[0].host, s.shards[0].data_port,
                                               s.shards[0].task, s.timeout, before_push_of(s, 0),
                                               system_tls(self->system()),
                                               s.cfg.wire_dtype == "bf16");
  else
    for (const auto& shard : s.shards) {
      auto link = self->spawn<caf::detached + caf::linked>(plane_link, shard.host,
                                                          shard.data_port, shard.task, s.timeout,
                                                          before_push_of(s, st.links.size()),
                                                          s.cfg.wire_dtype == "bf16");
      st.links.push_back(link);
    }
  if (s.recover_ps && !s.shards.empty())
    st.recovery = self->spawn<caf::detached + caf::linked>(recovery_link, s.recover_ps,
                                                          s.find_ps, st.recovered);
  if (st.recovery)
    for (const auto& shard : s.shards)
      if (shard.actor)
        self->monitor(shard.actor);
}

caf::behavior worker_impl(self_pointer self, worker_setup setup,
                          std::function<void(caf::expected<worker_result>)> done) {
  auto& st = self->state;
  st.setup = std::move(setup);
  // `done` gets the result once the actor has ended and told every actor
  // that watches it (actors/result_at_exit.hpp: the caller may destroy the
  // actor system next); a worker that ends any other way (an exception, a
  // linked link actor that failed) gets the reason. First, before anything
  // can monitor or link to this actor.
  auto index = st.setup.index;
  auto result = result_at_exit<caf::expected<worker_result>>::attach(
    self, std::move(done), [index](const caf::error& reason) -> caf::expected<worker_result> {
      return make_error(af_error::internal,
                        fmt::format("worker {} ended before it finished: {}", index,
                                    describe(reason)));
    });
  st.done = [result](caf::expected<worker_result> r) { result->set(std::move(r)); };
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    for (size_t k = 0; k < st.setup.shards.size(); ++k)
      if (st.setup.shards[k].actor && st.setup.shards[k].actor.address() == dm.source) {
        st.shard_down[k] = true;
        auto hooks = st.down_hooks; // a hook drops itself
        for (auto& h : hooks)
          h.second(k);
        return;
      }
    st.runner.on_down(self, dm);
  });
  const auto& s = st.setup;
  st.batches.emplace(s.data->train, s.cfg.batch_size, s.index, s.workers, s.cfg.seed);
  // A step wholly on this process's CPU runs on this actor's thread.
  st.here = step_here::make(s.step, self->node());
  st.mode = s.cfg.mode;
  st.avg_step0 = s.start_step;
  st.avg_local0 = 0;
  st.global_step = s.start_step;
  st.shard_step.assign(s.shards.size(), s.start_step);
  st.tokens.assign(s.shards.size(), std::string{});
  st.push_seq.assign(s.shards.size(), 0);
  st.shard_down.assign(s.shards.size(), false);
  st.held_round.assign(s.shards.size(), false);
  st.closed.assign(s.shards.size(), false);
  st.closed_at.assign(s.shards.size(), 0);
  // Backup workers: a round may close without this worker from the start,
  // so its first pushes ask (a worker that keeps up stops after two
  // answers in time).
  st.late_suspect = s.cfg.mode == "sync"
                    && (s.cfg.replicas_to_aggregate > 0 || s.cfg.step_deadline_ms > 0);
  st.checkpointed_step = s.start_step;
  st.reported_step = s.start_step;
  connect_shards(self);
  if (s.cfg.mode == "allreduce") {
    st.reducer = self->spawn<caf::detached + caf::linked>(reduce_link, s.group);
    auto own = train::replica_state::make(s.initial, s.cfg.optimizer);
    if (own && !s.initial_slots.empty())
      own->slots = s.initial_slots;
    if (!own) {
      self->send(self, caf::ok_atom::value);
      st.done(make_error(own.error().code, own.error().what));
      st.finished = true;
    } else {
      st.own = std::move(*own);
    }
  }
  st.started = clock_type::now();
  st.last_checkpoint = st.started;
  // Start: take the parameters (sync, async: from the aggregators; average:
  // the chief's initial values, which every replica starts from).
  if (!st.finished) {
    if (s.cfg.mode == "allreduce") {
      self->send(self, caf::ok_atom::value);
    } else {
      join_all(self, [self] {
      exchange(self, nullptr, false, [self](uint64_t step, std::vector<tensor> params) {
        auto& st = self->state;
        st.global_step = step;
        st.started = clock_type::now();
        if (st.setup.cfg.mode == "average") {
          auto own = train::replica_state::make(std::move(params), st.setup.cfg.optimizer);
          if (!own) {
            fail(self, make_error(own.error().code, own.error().what), "starting");
            return;
          }
          st.own = std::move(*own);
          if (!st.setup.initial_slots.empty())
            st.own->slots = st.setup.initial_slots;
        } else {
          st.params = std::move(params);
          st.params_stale = false;
        }
        if (st.global_step >= st.setup.total_steps)
          finish(self);
        else
          run_step(self);
      });
      });
    }
  }
  return {
    [self](switch_atom, const std::string& aggregator, const std::string& mode, uint64_t step) {
      // Told by an aggregator that it switched: into sync it joins every ps
      // again before its next push (worker_loop::told_of_switch).
      if (self->state.told_of_switch(mode))
        log::get()->debug("{}: aggregator '{}' switched to {} at global step {}: joining every "
                          "ps again before the next push",
                          who(self), aggregator, mode, step);
    },
    [self](pushed_atom) {
      auto f = std::move(self->state.pushed);
      self->state.pushed = nullptr;
      if (f)
        f();
    },
    [self](here_atom) {
      compute(self);
    },
    [self](step_atom) {
      // After a step_delay: the stop may have come meanwhile.
      if (!self->state.finished && !stop_requested(self))
        run_step_now(self, true);
    },
    [self](caf::ok_atom) {
      if (self->state.finished) {
        self->quit();
        return;
      }
      self->state.started = clock_type::now();
      run_step(self);
    },
  };
}

} // namespace

} // namespace worker_detail

caf::actor spawn_worker(caf::actor_system& sys, worker_setup setup,
                        std::function<void(caf::expected<worker_result>)> done) {
  // Detached: a thread of its own. Its step is the busiest loop of its
  // process, and each message it gets on the shared scheduler costs a wake
  // of a pool thread that the others contend for (a digits worker: 12 futex
  // calls and 8.5 context switches a step there, 8.5 and 5.3 here).
  return sys.spawn<caf::detached>(worker_detail::worker_impl, std::move(setup), std::move(done));
}

} // namespace af
