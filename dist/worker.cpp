#include "dist/worker.hpp"
#include "actors/system.hpp"

#include <limits>
#include <map>
#include <mutex>
#include <optional>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "net/data_plane.hpp"
#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

using clock_type = std::chrono::steady_clock;
using allreduce_atom = caf::atom_constant<caf::atom("allreduce")>;
using step_atom = caf::atom_constant<caf::atom("step")>;

/// A detached actor that owns one data-plane connection to a ps node and
/// makes the blocking push and pull calls there, so the worker never blocks.
/// `before` (a test hook, may be empty) runs before each push with the
/// worker's local step.
caf::behavior plane_link(caf::event_based_actor* self, std::string host, uint16_t port,
                         std::string peer, std::chrono::milliseconds timeout,
                         std::function<void(uint64_t)> before) {
  auto chan = std::make_shared<std::unique_ptr<data_channel>>();
  auto tls = system_tls(self->system()); // the process's [security], if any
  return {
    [=](push_atom, const std::string& name, uint32_t worker, uint64_t step,
        const std::vector<tensor>& values, uint32_t wait_ms, uint8_t kind, uint64_t local_step,
        const std::string& token, uint64_t seq) -> caf::result<uint64_t, tensor> {
      if (before && kind != static_cast<uint8_t>(wire::kind::pull))
        before(local_step);
      if (!*chan || (*chan)->broken()) {
        // No spinning for the reply: a push waits for the other workers'
        // steps, and on a small machine the spin takes the CPU they need
        // (spinning 50 us cost the digits job up to 10 %, 200 us 30 %).
        auto c = data_channel::connect(host, port, peer, timeout, {}, tls);
        if (!c)
          return std::move(c.error());
        *chan = std::move(*c);
      }
      auto r = (*chan)->aggregate(static_cast<wire::kind>(kind), name, worker, step, values,
                                  std::chrono::milliseconds{wait_ms}, token, seq);
      if (!r)
        return std::move(r.error());
      return {r->first, std::move(r->second)};
    },
  };
}

/// The setup's before_push hook bound to shard `k` (empty without one).
std::function<void(uint64_t)> before_push_of(const worker_setup& setup, size_t k) {
  if (!setup.before_push)
    return {};
  auto hook = setup.before_push;
  return [hook, k](uint64_t local_step) { hook(k, local_step); };
}

using recover_atom = caf::atom_constant<caf::atom("recoverps")>;

/// What the recovery link hands the worker beside its reply (the reply is
/// the restored step): the shard as it runs again, by index.
struct recovery_box {
  std::mutex mtx;
  std::map<size_t, recovered_shard> done;
};

/// A detached actor that waits for a ps that died to come back
/// (worker_setup::recover_ps blocks: it pings, and on the chief restores).
caf::behavior recovery_link(caf::event_based_actor*,
                            std::function<caf::expected<recovered_shard>(
                              size_t, uint64_t, const std::string&, bool)>
                              fn,
                            std::shared_ptr<recovery_box> box) {
  return {
    [=](recover_atom, uint64_t k, uint64_t step, const std::string& why,
        bool held) -> caf::result<uint64_t> {
      auto r = fn(static_cast<size_t>(k), step, why, held);
      if (!r)
        return std::move(r.error());
      auto restored = r->global_step;
      std::lock_guard<std::mutex> guard{box->mtx};
      box->done[static_cast<size_t>(k)] = std::move(*r);
      return restored;
    },
  };
}

/// A detached actor that runs the blocking all-reduce of the worker's group.
caf::behavior reduce_link(caf::event_based_actor*, std::shared_ptr<allreduce_group> group) {
  return {
    [=](allreduce_atom, tensor& flat) -> caf::result<tensor> {
      if (auto err = group->allreduce_mean(flat.mutable_data<float>(), flat.num_elements()))
        return err;
      return flat;
    },
  };
}

struct worker_state {
  worker_setup setup;
  std::function<void(caf::expected<worker_result>)> done;
  step_runner runner;
  std::vector<caf::actor> links;  ///< per shard
  caf::actor reducer;             ///< allreduce
  caf::actor recovery;            ///< waits for a ps that died (recover_ps)
  std::shared_ptr<recovery_box> recovered = std::make_shared<recovery_box>();
  uint64_t ps_recoveries = 0;     ///< ps tasks it waited for and went on with
  /// Called with a shard's index when its aggregator goes down (monitored
  /// with recover_ps): a control request to it (save, stats) is never
  /// answered by CAF then, and would wait its whole timeout.
  std::map<uint64_t, std::function<void(size_t)>> down_hooks;
  uint64_t next_hook = 0;
  /// Per shard: its aggregator went down and the shard was not recovered
  /// yet. CAF drops what is sent to a dead node's proxy without an answer,
  /// so a control request made after the down message would wait its whole
  /// timeout (60 s once in the soak): fire_known_down answers it at once.
  std::vector<bool> shard_down;
  /// Per shard (chief, sync): it died while this worker held the round (its
  /// checkpoint's save found it gone), so it cannot have closed a round past
  /// this worker's step: recover_ps restores it at this worker's step.
  std::vector<bool> held_round;
  std::optional<train::batcher> batches;
  std::vector<tensor> params;     ///< sync / async: as pulled
  std::optional<train::replica_state> own; ///< average / allreduce
  /// The mode the job runs: the config's until a live switch changes it.
  std::string mode;
  /// average: the global step and local step its rounds count from (the
  /// job's start, or a switch into average).
  uint64_t avg_step0 = 0;
  uint64_t avg_local0 = 0;
  /// The gradient being pushed: after a switch into average it becomes the
  /// replica's first local step instead of being lost.
  std::vector<tensor> pending;
  uint64_t global_step = 0;       ///< the least of the shards' (average: the round's step)
  /// Each shard's global step as it last answered: a push to shard k
  /// carries shard k's own (after a live switch the ps tasks' steps may
  /// differ for good; the least of them would be late on the others).
  std::vector<uint64_t> shard_step;
  /// Per shard: the token its aggregator answered this worker's join with
  /// (its pushes and done carry it; empty before the join), and the number
  /// of its last push there (a retry sends the same number again).
  std::vector<std::string> tokens;
  std::vector<uint64_t> push_seq;
  uint64_t local_step = 0;        ///< steps this worker ran in this process
  double loss_sum = 0;
  uint64_t loss_count = 0;
  double last_loss = 0;
  uint64_t refused = 0;
  uint64_t refused_in_a_row = 0;  ///< steps abstained from since the last finite one
  std::string last_refusal;
  uint64_t checkpoint_failures = 0; ///< checkpoints it could not write
  std::string checkpoint_error;     ///< the last one's reason
  clock_type::time_point started;
  clock_type::time_point last_checkpoint;
  uint64_t checkpointed_step = 0; ///< global step of the last checkpoint (or the start)
  uint64_t reported_step = 0;     ///< async: global step of the last progress line (or the start)
  bool finished = false;
  /// A ps switched into sync (it told this actor): the worker joins every
  /// ps again before its next push, so that its sync rounds begin with the
  /// same step's push on each (aggregation_round::set_standby).
  bool rejoin = false;
  static constexpr const char* name = "worker";
};

using self_pointer = caf::stateful_actor<worker_state>*;

void run_step(self_pointer self);
void after_step(self_pointer self);

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

/// average (and allreduce): the job's step of this replica, its local steps
/// counted from where its rounds began (the start, or a switch into average).
uint64_t average_step(const worker_state& st) {
  return st.avg_step0 + (st.local_step - st.avg_local0);
}

/// The parameters the worker's next step runs with.
const std::vector<tensor>& current(self_pointer self) {
  auto& st = self->state;
  return st.own ? st.own->values : st.params;
}

std::vector<shape_type> shapes_of(const param_shard& s) {
  std::vector<shape_type> out;
  for (const auto& p : s.pieces)
    out.push_back(p.shape);
  return out;
}

/// Takes shard `k`'s flat answer into `into` (one tensor per parameter): a
/// whole parameter is its piece (no copy), a partitioned one gets the rows of
/// this shard's pieces; it is complete once every shard has answered.
caf::error take(self_pointer self, size_t k, const tensor& flat, std::vector<tensor>& into) {
  auto& s = self->state.setup.shards[k];
  auto parts = train::unflatten(flat, shapes_of(s));
  if (!parts)
    return make_error(parts.error().code, "parameters from " + s.task + ": " + parts.error().what);
  for (size_t j = 0; j < s.pieces.size(); ++j)
    if (auto ok = train::put_piece(s.pieces[j], std::move((*parts)[j]), into[s.pieces[j].param]);
        !ok)
      return make_error(ok.error().code, "parameters from " + s.task + ": " + ok.error().what);
  return caf::none;
}

/// A sentence naming the worker, the variable and the element if `values`
/// (one per parameter) holds a NaN or an infinity; "" if all are finite.
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

/// Counts and logs a step this worker abstains from; false (and the worker
/// failed) once it has abstained from max_nonfinite_steps steps in a row
/// (train_config): past that the model has diverged (or was restored
/// broken), and abstaining for ever would keep an async job from reaching
/// its step count, or let a job end "done" having applied nothing.
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

void exchange(self_pointer self, const std::vector<tensor>* values, bool abstain,
              std::function<void(uint64_t, std::vector<tensor>)> then);
void change_mode(self_pointer self, size_t shard);
void join_all(self_pointer self, std::function<void()> then);

/// One exchange's answers, gathered from every shard.
struct exchange_gather {
  size_t missing = 0;
  uint64_t step = UINT64_MAX;
  std::vector<tensor> params;
  std::vector<int> tries; ///< per shard: how often it was waited for (a ps that died)
  bool failed = false;
};

void push_shard(self_pointer self, std::shared_ptr<exchange_gather> g, size_t k,
                std::vector<tensor> part, uint64_t step, wire::kind kind, bool has_values,
                std::function<void(uint64_t, std::vector<tensor>)> then, uint64_t seq);

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
    // The step is over (without this worker's contribution): the next one
    // takes the next batch (average counted its local step already).
    if (st.mode != "average")
      st.local_step += 1;
    after_step(self);
  });
}

/// Pushes (or pulls, if `values` is null) to every shard; `then` gets the
/// global step and the parameters once all have answered. Values that are
/// not finite are pushed to no shard: with several ps, a refusal by one
/// while the others applied their parts would apply part of a step.
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
    auto keep = std::make_shared<std::vector<tensor>>(*values); // shares the buffers
    join_all(self, [self, keep, abstain_step, then] {
      exchange(self, keep.get(), abstain_step, then);
    });
    return;
  }
  auto g = std::make_shared<exchange_gather>();
  g->missing = st.setup.shards.size();
  g->params.resize(st.setup.params.size());
  g->tries.assign(st.setup.shards.size(), 0);
  for (size_t k = 0; k < st.setup.shards.size(); ++k) {
    const auto& s = st.setup.shards[k];
    std::vector<tensor> part;
    // A partitioned parameter's rows are copied out; a whole one goes as is.
    if (values != nullptr && !abstain_step)
      for (const auto& p : s.pieces)
        part.push_back(train::slice_rows((*values)[p.param], p.row_begin, p.row_end));
    // average pushes the round's step (the same local steps on every shard).
    bool average = st.mode == "average";
    auto step = average ? st.global_step : st.shard_step[k];
    auto kind = values == nullptr ? wire::kind::pull
                : average         ? wire::kind::push_params
                                  : wire::kind::push;
    push_shard(self, g, k, std::move(part), step, kind, values != nullptr, then, 0);
  }
}

/// Whether a push's error says the ps's process is gone (its data
/// connection closed, or it cannot be connected to): worth waiting for it.
bool ps_gone(const caf::error& err) {
  return is(err, af_error::peer_down) || is(err, af_error::unreachable);
}

/// Runs `hook` with the shard's index if a shard's aggregator goes down
/// before the returned id is dropped (drop_hook).
uint64_t add_hook(self_pointer self, std::function<void(size_t)> hook) {
  auto id = ++self->state.next_hook;
  self->state.down_hooks[id] = std::move(hook);
  return id;
}

void drop_hook(self_pointer self, uint64_t id) {
  self->state.down_hooks.erase(id);
}

/// Runs hook `id` for each shard whose aggregator is known to be down
/// already (its down message came before the hook was added). Call it
/// after the requests the hook guards were sent.
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

/// Examples behind one push: average pushes after average_every steps.
uint32_t examples_per_push(const worker_state& st) {
  return static_cast<uint32_t>(
    st.setup.cfg.batch_size
    * (st.mode == "average" ? std::max<uint32_t>(1, st.setup.cfg.average_every) : 1));
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
          self->unlink_from(st.links[k]);
          self->send_exit(st.links[k], caf::exit_reason::user_shutdown);
          st.links[k] = self->spawn<caf::detached + caf::linked>(
            plane_link, r.shard.host, r.shard.data_port, r.shard.task, st.setup.timeout,
            before_push_of(st.setup, k));
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
  // `part` shares its buffers: the copy kept for a retry costs nothing.
  self->request(st.links[k], caf::infinite, push_atom::value, s.aggregator, st.setup.index,
                step, part, wait, static_cast<uint8_t>(kind), st.local_step, st.tokens[k], seq)
    .then(
      [self, g, k, then](uint64_t step, tensor& flat) {
        if (g->failed)
          return;
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
          then(g->step, std::move(g->params));
      },
      [self, g, k, part, step, kind, has_values, then, seq](caf::error& err) {
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
        // The ps's process died: wait for it to come back (the chief
        // restores its variables), then push this part again at the step
        // it was restored at (a later one would be ahead of it).
        if (st.recovery && ps_gone(err) && g->tries[k] < 3) {
          g->tries[k] += 1;
          recover_shard(
            self, k, step, err,
            [self, g, k, part, step, kind, has_values, then, seq](uint64_t restored) {
              if (g->failed)
                return;
              auto next = std::min(step, restored);
              self->state.shard_step[k] = next;
              push_shard(self, g, k, part, next, kind, has_values, then, seq);
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
        fail(self, std::move(err), during());
      });
}

void finish(self_pointer self);
void after_step(self_pointer self);
void use_gradients(self_pointer self, std::vector<tensor> grads);

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

/// Evaluates the current parameters on the held-out set (chief), then `then`.
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

void collect_shards(self_pointer self, std::shared_ptr<train::checkpoint> ckpt, int attempt,
                    std::function<void()> write, std::function<void()> skip);

/// Collects the state to checkpoint (chief), then `then`.
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
          for (const auto& state : g->states) {
            add_variables(*ckpt, state, setup.cfg.optimizer.kind);
            ckpt->global_step = std::max(ckpt->global_step, state.global_step);
          }
          // The checkpoint holds the logical parameters, whatever the pieces.
          if (auto err = assemble_variables(*ckpt, setup.params, setup.shards)) {
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

/// After a step: report, evaluate, checkpoint as due; then the next step.
void after_step(self_pointer self) {
  auto& st = self->state;
  const auto& c = st.setup.cfg;
  // sync and async count the shared global step; average and allreduce
  // workers their own steps (the same on every worker).
  const auto& mode = st.mode;
  bool shared = mode == "sync" || train::step_per_push(mode);
  uint64_t step = shared ? st.global_step : average_step(st);
  bool last = step >= st.setup.total_steps;
  bool chief = st.setup.index == 0;
  // async: when the global step crossed a multiple of log_every (it moves
  // by every worker's pushes: counting this worker's steps, a job of 200
  // steps with log_every 50 printed at 50 and at the end only).
  bool async = train::step_per_push(mode);
  bool report = last
                || (c.log_every > 0
                    && (async ? st.global_step / c.log_every > st.reported_step / c.log_every
                              : st.local_step % c.log_every == 0));
  if (report)
    st.reported_step = st.global_step;
  bool eval = chief && st.setup.eval && c.eval_every > 0 && st.local_step % c.eval_every == 0 && !last;
  // By steps: when the global step crossed a multiple of checkpoint_steps
  // since the last one (async moves it by other workers' pushes too).
  // average: only at a round's end, when the chief's replica holds the
  // job's averaged parameters (mid-round it holds its own, and the step and
  // data position would not agree).
  bool round_end = mode != "average"
                   || (st.local_step - st.avg_local0) % std::max<uint32_t>(1, c.average_every) == 0;
  bool ckpt = chief && st.setup.save && !last && round_end
              && ((c.checkpoint_steps > 0
                   && st.global_step / c.checkpoint_steps > st.checkpointed_step / c.checkpoint_steps)
                  || (c.checkpoint_secs > 0 && seconds_since(st.last_checkpoint) >= c.checkpoint_secs));
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
      if (st.mode == "average") {
        uint64_t k = std::max<uint32_t>(1, st.setup.cfg.average_every);
        p.rounds = (st.global_step + k - 1) / k;
      }
      p.loss = st.loss_count ? st.loss_sum / static_cast<double>(st.loss_count) : 0;
      p.accuracy = acc;
      p.test_loss = test_loss;
      p.evaluated = acc >= 0 || test_loss >= 0;
      p.seconds = seconds_since(st.started);
      p.examples_per_s = p.seconds > 0 ? static_cast<double>(st.local_step * st.setup.cfg.batch_size)
                                           / p.seconds
                                       : 0;
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

/// What a step's gradients do in each mode.
void use_gradients(self_pointer self, std::vector<tensor> grads) {
  auto& st = self->state;
  const auto mode = st.mode;
  if (mode == "sync" || train::step_per_push(mode)) {
    st.pending = grads; // shares the buffers
    exchange(self, &grads, false, [self](uint64_t step, std::vector<tensor> params) {
      auto& st = self->state;
      st.pending.clear();
      st.global_step = step;
      st.params = std::move(params);
      st.local_step += 1;
      after_step(self);
    });
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
  } else if (auto ok = st.own->apply(st.setup.cfg.optimizer, grads,
                                     average_step(st));
             !ok) {
    fail(self, make_error(ok.error().code, ok.error().what), "applying the local update");
    return;
  } else {
    st.refused_in_a_row = 0;
  }
  st.local_step += 1;
  auto k = std::max<uint32_t>(1, st.setup.cfg.average_every);
  auto locals = st.local_step - st.avg_local0;
  if (locals % k != 0 && st.avg_step0 + locals < st.setup.total_steps) {
    after_step(self);
    return;
  }
  auto values = st.own->values;
  // The aggregator's step for a round: the local steps every worker has run.
  st.global_step = st.avg_step0 + locals;
  exchange(self, &values, false, [self](uint64_t step, std::vector<tensor> params) {
    auto& st = self->state;
    st.global_step = step;
    st.own->values = std::move(params);
    after_step(self);
  });
}

void run_step_now(self_pointer self);

/// True (and the worker ended) if its client asked it to stop.
bool stop_requested(self_pointer self) {
  auto& st = self->state;
  if (!st.setup.stop || !st.setup.stop->load())
    return false;
  fail(self, make_error(af_error::cancelled, "its client stopped the job"), "before its step");
  return true;
}

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
  run_step_now(self);
}

void run_step_now(self_pointer self) {
  auto& st = self->state;
  if (st.finished)
    return;
  auto b = st.batches->at(st.setup.start_position + st.local_step);
  std::map<int32_t, tensor> feeds;
  for (auto& f : train::feeds(st.setup.model, current(self), b))
    feeds[f.first.id] = std::move(f.second);
  st.runner.run(self, st.setup.step, std::move(feeds), false,
                [self](caf::expected<step_outputs> out) {
                  auto& st = self->state;
                  if (!out) {
                    fail(self, std::move(out.error()), "running the step");
                    return;
                  }
                  st.loss_sum += out->values[st.setup.model.loss.id].at(0);
                  st.loss_count += 1;
                  std::vector<tensor> grads;
                  for (auto g : st.setup.model.grads)
                    grads.push_back(std::move(out->values[g.id]));
                  if (st.setup.tamper)
                    st.setup.tamper(st.local_step, grads);
                  use_gradients(self, std::move(grads));
                });
}

/// Registers with every shard's aggregator (its name and address for their
/// messages, a monitor so that its death ends its membership at once, and,
/// for a worker not in the job's config, membership itself), then `then`.
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

caf::behavior worker_impl(self_pointer self, worker_setup setup,
                          std::function<void(caf::expected<worker_result>)> done) {
  auto& st = self->state;
  st.setup = std::move(setup);
  // `done` is called exactly once: by the worker, or, if the worker ends any
  // other way (an exception, a linked link actor that failed), when it ends.
  struct once {
    std::mutex mtx;
    std::function<void(caf::expected<worker_result>)> f;
    void operator()(caf::expected<worker_result> r) {
      std::function<void(caf::expected<worker_result>)> g;
      {
        std::lock_guard<std::mutex> guard{mtx};
        g = std::move(f);
        f = nullptr;
      }
      if (g)
        g(std::move(r));
    }
  };
  auto cb = std::make_shared<once>();
  cb->f = std::move(done);
  st.done = [cb](caf::expected<worker_result> r) { (*cb)(std::move(r)); };
  auto index = st.setup.index;
  self->attach_functor([cb, index](const caf::error& reason) {
    (*cb)(make_error(af_error::internal, fmt::format("worker {} ended before it finished: {}", index,
                                                     describe(reason))));
  });
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
  st.mode = s.cfg.mode;
  st.avg_step0 = s.start_step;
  st.avg_local0 = 0;
  st.global_step = s.start_step;
  st.shard_step.assign(s.shards.size(), s.start_step);
  st.tokens.assign(s.shards.size(), std::string{});
  st.push_seq.assign(s.shards.size(), 0);
  st.shard_down.assign(s.shards.size(), false);
  st.held_round.assign(s.shards.size(), false);
  st.checkpointed_step = s.start_step;
  st.reported_step = s.start_step;
  for (const auto& shard : s.shards) {
    auto link = self->spawn<caf::detached + caf::linked>(plane_link, shard.host, shard.data_port,
                                                        shard.task, s.timeout,
                                                        before_push_of(s, st.links.size()));
    st.links.push_back(link);
  }
  if (s.recover_ps && !s.shards.empty())
    st.recovery = self->spawn<caf::detached + caf::linked>(recovery_link, s.recover_ps,
                                                          st.recovered);
  if (st.recovery)
    for (const auto& shard : s.shards)
      if (shard.actor)
        self->monitor(shard.actor);
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
      // Told by an aggregator that it switched (only into sync, for now).
      log::get()->debug("{}: aggregator '{}' switched to {} at global step {}: joining every ps "
                        "again before the next push",
                        who(self), aggregator, mode, step);
      if (mode == "sync")
        self->state.rejoin = true;
    },
    [self](step_atom) {
      // After a step_delay: the stop may have come meanwhile.
      if (!self->state.finished && !stop_requested(self))
        run_step_now(self);
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

caf::actor spawn_worker(caf::actor_system& sys, worker_setup setup,
                        std::function<void(caf::expected<worker_result>)> done) {
  return sys.spawn(worker_impl, std::move(setup), std::move(done));
}

} // namespace af
