// The data plane's path for streamed dense async pushes (wire::kind::
// push_streamed, [train] pipeline_async): each push is a pipelined round of
// one member (dist/pipelined_round.hpp). Its chunks are applied into the
// round's own copy of the values and slots as they arrive, and stream back
// while later ones still arrive; the variables take the update at its
// commit, under the aggregator's lock, with apply_now's bookkeeping
// (count_applied: staleness, applied, the push number, the global step). An
// aborted push (a NaN in a late chunk, a worker that hangs up half way, a
// timeout) changes nothing, as a store-and-forward push refused whole.
//
// Pushes of several workers are put in a line (aggregator_actor_state::
// pipelined_async) in the order they came: only the first applies its
// chunks; the others read theirs meanwhile, and each starts (its snapshot
// of the variables taken at the global step then) once the one before it
// committed or was aborted. So the variables take, bit for bit, what
// store-and-forward pushes applied in that order give them.
//
// A push that comes whole while streamed ones are in line (store and
// forward: a worker over shared memory or TLS, or over CAF) takes its place
// in the line too, and is applied by apply_now, on the actor's thread, when
// its turn comes (a data-plane thread that ends the push ahead of it sends
// the actor a sweep). A streamed push at the head of the line that sends
// nothing for stalled_head_bound while others wait behind it is refused
// (the actor's sweep): the slow sender pays, not the pushes behind it.
#include "dist/aggregator_detail.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af::aggregator_detail {

namespace {

/// Counts a push taken into the line that ended without its commit as
/// refused (on the aggregator and its worker), as unpack counts a
/// store-and-forward push it refuses: every push counted is applied or
/// refused (lock held).
void count_abandoned(aggregator_actor_state& st, uint32_t worker, const caf::error& why) {
  st.stats.refused += 1;
  member(st, worker).stats.refused += 1;
  st.stats.last_refusal = describe(why);
}

/// The head of the line was taken out (committed, aborted, applied): the
/// next one's turn. A streamed one's stall is timed from now; a whole one
/// is applied by the actor (its promise is answered on its own thread), so
/// it is sent a sweep (lock held).
void next_in_line(aggregator_actor_state& st, aggregator_plane& plane) {
  auto& line = st.pipelined_async;
  if (!line.empty() && line.front().round)
    line.front().progressed = clock_type::now();
  else if (!line.empty())
    if (auto me = caf::actor_cast<aggregator_impl_actor>(plane.addr))
      caf::anon_send(me, sweep_atom::value);
  plane.answered.notify_all();
}

/// One streamed async push, as its data-plane thread sees it. Every call but
/// answer_pieces takes the aggregator's lock.
class async_push final : public round_member {
public:
  async_push(std::shared_ptr<aggregator_plane> plane, std::shared_ptr<pipelined_round> round,
             uint32_t worker, uint64_t expected_step)
    : round_member(std::move(plane), std::move(round), worker), expected_(expected_step) {
    // nop
  }

  uint64_t next_step() const override { return expected_; }

  std::string abandoned() const override { return "the push is abandoned"; }

  caf::expected<size_t> arrived(size_t floats) override {
    std::unique_lock<std::mutex> lock{plane_->mtx};
    round_->arrived(worker_, floats); // applied at once if it is first in line
    if (auto* e = place())
      e->progressed = clock_type::now();
    advance();
    if (auto err = ended())
      return err;
    return round_->ready_floats();
  }

  void fail(caf::error why) override {
    std::unique_lock<std::mutex> lock{plane_->mtx};
    end(std::move(why));
  }

  caf::expected<size_t> wait_ready(size_t have, std::chrono::milliseconds wait) override {
    std::unique_lock<std::mutex> lock{plane_->mtx};
    auto deadline = clock_type::now() + wait;
    for (bool timed_out = false;; timed_out = plane_->answered.wait_until(lock, deadline)
                                             == std::cv_status::timeout) {
      advance(); // its turn may have come: the push before it committed or was aborted
      if (auto err = ended())
        return err;
      if (round_->ready_floats() > have || round_->state() == pipelined_round::phase::committed)
        return round_->ready_floats();
      if (timed_out) {
        end(waited_too_long(wait));
        return round_->abort_reason();
      }
    }
  }

  caf::expected<uint64_t> outcome(std::chrono::milliseconds) override {
    std::unique_lock<std::mutex> lock{plane_->mtx};
    if (auto err = ended())
      return err;
    if (round_->state() != pipelined_round::phase::committed)
      return make_error(af_error::internal,
                        "a streamed async push asked for its outcome before its commit");
    return made_;
  }

private:
  /// Its place in the line; null once it left it (lock held).
  aggregator_actor_state::streamed_async* place() const {
    auto self = plane_->self;
    if (!self)
      return nullptr;
    for (auto& e : self->state.pipelined_async)
      if (e.round == round_)
        return &e;
    return nullptr;
  }

  caf::error ended() const {
    if (round_->state() == pipelined_round::phase::aborted)
      return round_->abort_reason();
    return caf::none;
  }

  /// First in line: starts the push (its snapshot of the variables, at the
  /// global step now) and commits it once every chunk is applied (lock held).
  void advance() {
    if (round_->state() != pipelined_round::phase::running)
      return;
    auto self = plane_->self;
    if (!self) {
      round_->abort(make_error(af_error::aborted, "the aggregator stopped while a streamed push "
                                                  "was being applied; no variable changed"));
      return;
    }
    auto& st = self->state;
    if (st.pipelined_async.empty() || st.pipelined_async.front().round != round_)
      return; // its turn has not come
    if (!round_->started()) {
      if (auto err = round_->start(st.global_step)) {
        end(std::move(err));
        return;
      }
    }
    if (round_->applied() == round_->chunks())
      commit(self);
  }

  /// The variables take the update, counted as apply_now counts it.
  void commit(self_pointer self) {
    auto& st = self->state;
    auto entry = st.pipelined_async.front();
    st.pipelined_async.pop_front();
    if (auto err = round_->commit()) {
      log::get()->warn("aggregator '{}': the streamed push of {} (its step {}) is abandoned: {}",
                       st.spec.name, worker_name(st, worker_), entry.step, describe(err));
      count_abandoned(st, worker_, err);
    } else {
      count_applied(self, worker_, entry.step, entry.seq, true);
      made_ = st.global_step;
    }
    next_in_line(st, *plane_); // the next in line starts
  }

  /// Aborts the push for `why` and takes it out of the line (lock held).
  void end(caf::error why) {
    round_->abort(why);
    auto self = plane_->self;
    if (!self)
      return;
    auto& st = self->state;
    auto& line = st.pipelined_async;
    auto it = std::find_if(line.begin(), line.end(),
                           [&](const auto& e) { return e.round == round_; });
    if (it == line.end())
      return; // ended already (a switch, a restore)
    log::get()->warn("aggregator '{}': the streamed push of {} (its step {}) is abandoned: {}",
                     st.spec.name, worker_name(st, worker_), it->step, describe(why));
    count_abandoned(st, worker_, why);
    bool first = it == line.begin();
    line.erase(it);
    if (first)
      next_in_line(st, *plane_); // the next in line starts
    else
      plane_->answered.notify_all();
  }

  /// The timeout of a push that waited its turn (lock held).
  caf::error waited_too_long(std::chrono::milliseconds wait) const {
    auto self = plane_->self;
    if (!self)
      return make_error(af_error::aborted, "the aggregator stopped while a streamed push waited "
                                           "its turn; no variable changed");
    auto& st = self->state;
    std::string ahead = "none";
    if (!st.pipelined_async.empty() && st.pipelined_async.front().round
        && st.pipelined_async.front().round != round_)
      ahead = st.pipelined_async.front().round->behind();
    return make_error(af_error::timeout,
                      fmt::format("aggregator '{}': the streamed push of {} waited {} ms for its "
                                  "turn behind the streamed push of {}; the push is abandoned, "
                                  "no variable changed",
                                  st.spec.name, worker_name(st, worker_), wait.count(), ahead));
  }

  uint64_t expected_; ///< the global step it makes if every push ahead commits
  uint64_t made_ = 0; ///< the global step its commit made
};

} // namespace

std::optional<caf::expected<std::unique_ptr<streamed_push>>>
join_streamed_async(std::shared_ptr<aggregator_plane> plane, uint32_t worker, uint64_t step,
                    const push_credentials& who) {
  using result = caf::expected<std::unique_ptr<streamed_push>>;
  auto self = plane->self;
  auto& st = self->state;
  // The norm guard scales by the whole gradient's norm: it needs all of it first.
  if (st.tables > 0 || st.guard.enabled() || !common_case(st, worker, step, who, false))
    return std::nullopt;
  // The push numbers taken (seq_taken) count only the pushes committed: a
  // push sent again while the first is still in line (its answer lost, its
  // worker joined again) would join the line too, and be applied twice.
  if (auto err = resent_in_line(st, worker, who.seq))
    return result{std::move(err)};
  auto round = std::make_shared<pipelined_round>();
  if (auto err = round->prepare(round_variables(st), st.spec.optimizer, st.slot_names, {worker}))
    return result{std::move(err)};
  round->joined(worker);
  if (st.pipelined_async.empty()) { // first in line: applied as it arrives
    if (auto err = round->start(st.global_step))
      return result{std::move(err)};
  }
  // What the actor's handler (and take_push) does for such a push, in its order.
  member(st, worker).retries = 0;
  note_push(st, worker, step);
  st.stats.pushes_on_plane += 1;
  uint64_t expected = st.global_step + st.pipelined_async.size() + 1;
  aggregator_actor_state::streamed_async e;
  e.round = round;
  e.worker = worker;
  e.step = step;
  e.seq = who.seq;
  e.progressed = clock_type::now();
  st.pipelined_async.push_back(std::move(e));
  if (st.pipelined_async.size() > 1)
    schedule_sweep(st, plane->addr); // a head that stalls is refused (sweep_async_line)
  return result{std::unique_ptr<streamed_push>{new async_push(plane, round, worker, expected)}};
}

caf::error resent_in_line(const aggregator_actor_state& st, uint32_t worker, uint64_t seq) {
  // The push numbers taken (seq_taken) count only the pushes applied: a
  // push sent again while the first is still in line (its answer lost, its
  // worker joined again) would join the line too, and be applied twice.
  for (const auto& e : st.pipelined_async)
    if (seq != 0 && e.worker == worker && e.seq >= seq)
      return make_error(
        af_error::already_exists,
        fmt::format("aggregator '{}': {} sent its push {} again while its {} push {} is still "
                    "in line to be applied ([train] pipeline_async): refused, not applied "
                    "twice; the first one's answer says whether it was applied",
                    st.spec.name, worker_name(st, worker), seq, e.round ? "streamed" : "whole",
                    e.seq));
  return caf::none;
}

void abort_streamed_async(aggregator_actor_state& st, const caf::error& why, bool answer_whole) {
  if (st.pipelined_async.empty())
    return;
  log::get()->warn("aggregator '{}': {} push(es) in the line of streamed pushes abandoned: {}",
                   st.spec.name, st.pipelined_async.size(), describe(why));
  for (auto& e : st.pipelined_async) {
    if (e.round)
      e.round->abort(why);
    else if (answer_whole)
      e.whole->deliver(why);
    count_abandoned(st, e.worker, why);
  }
  st.pipelined_async.clear();
  if (st.plane)
    st.plane->answered.notify_all();
}

push_result queue_whole_async(self_pointer self, uint32_t worker, uint64_t step,
                              const push_credentials& who, std::vector<tensor>& grads) {
  auto& st = self->state;
  if (auto err = resent_in_line(st, worker, who.seq))
    return err;
  // Checked now, as apply_now would (a refusal counted as its): a push in
  // line is one that will apply.
  if (auto parts = unpack(self, worker, grads, "gradient", who.finite_checked); !parts)
    return std::move(parts.error());
  aggregator_actor_state::streamed_async e;
  e.worker = worker;
  e.step = step;
  e.seq = who.seq;
  e.grads = std::move(grads);
  e.who = who;
  e.who.finite_checked = true;
  e.whole.emplace();
  e.whole->promise = self->make_response_promise<uint64_t, tensor, bool>();
  e.whole->parts = std::move(who.parts); // the message keeps no copy: see answer_tickets
  e.who.parts = nullptr;
  auto promise = e.whole->promise;
  st.pipelined_async.push_back(std::move(e));
  sweep_async_line(self); // applied now if nothing streamed is ahead of it
  return promise;
}

void sweep_async_line(self_pointer self) {
  auto& st = self->state;
  auto& line = st.pipelined_async;
  for (;;) {
    bool moved = false;
    while (!line.empty() && !line.front().round) { // whole pushes: applied in their turn
      auto e = std::move(line.front());
      line.pop_front();
      moved = true;
      tickets answer;
      answer.emplace_back(e.worker, std::move(*e.whole));
      if (auto err = apply_now(self, e.worker, e.step, e.who, e.grads, true))
        answer[0].second.deliver(err);
      else
        answer_tickets(self, answer);
    }
    if (moved)
      next_in_line(st, *st.plane);
    if (!stalled_head(st))
      break;
  }
  if (!line.empty())
    schedule_sweep(self);
}

bool stalled_head(aggregator_actor_state& st) {
  auto& line = st.pipelined_async;
  if (line.size() < 2 || st.spec.step_timeout_ms == 0)
    return false; // a slow push that holds no other up is the frame timeout's
  auto& e = line.front();
  const std::chrono::milliseconds bound{stalled_head_bound(st.spec.step_timeout_ms)};
  auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now()
                                                                     - e.progressed);
  if (!e.round || e.round->state() != pipelined_round::phase::running || e.round->all_arrived()
      || quiet < bound)
    return false;
  auto why = make_error(
    af_error::timeout,
    fmt::format("aggregator '{}': the streamed push of {} sent nothing for {} ms at the head of "
                "the line of streamed pushes ([train] pipeline_async; the bound: {} ms, a "
                "quarter of the step timeout) while {} push(es) waited behind it (where it "
                "stands: {}): refused, the pushes behind it go on, no variable changed; a worker this "
                "slow to send pushes store-and-forward (pipeline_async = false)",
                st.spec.name, worker_name(st, e.worker), quiet.count(), bound.count(),
                line.size() - 1, e.round->behind()));
  log::get()->warn("{}", describe(why));
  e.round->abort(why);
  count_abandoned(st, e.worker, why);
  line.pop_front();
  next_in_line(st, *st.plane);
  return true;
}

} // namespace af::aggregator_detail
