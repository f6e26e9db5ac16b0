// The data plane's path for an aggregator's pushes, sparse and dense: the common push
// is taken on the data-plane thread that read it, under the lock the
// aggregator's actor holds in each of its handlers (aggregator_plane), instead
// of travelling to the actor through a scoped actor and back (two wake-ups,
// a context switch each way, and a message per push: about a sixth of an
// async sparse step on 2 vCPUs). async applies it at once; sync adds it to
// the round, and the push that completes the round applies the round and
// answers every member waiting on it. What is not the common case goes to
// the actor untouched, which answers it as it always has.
#include "dist/aggregator_detail.hpp"

#include <fmt/format.h>

#include "caf/all.hpp"

#include "messages/error.hpp"

namespace af {

aggregator_actor_state::~aggregator_actor_state() {
  if (!plane)
    return;
  std::lock_guard<std::mutex> guard{plane->mtx};
  plane->self = nullptr;
  // A data-plane thread waiting on a parked push hears that the actor is
  // gone. (A CAF requester hears nothing: in CAF 0.17 a destroyed
  // response_promise sends no error, so it waits for its own timeout; the
  // worker's links then name the ps.)
  auto err = make_error(af_error::aborted,
                        fmt::format("aggregator '{}' stopped while a push waited for its round",
                                    spec.name));
  for (auto& t : round.release())
    if (t.second.wait)
      t.second.deliver(err);
  aggregator_detail::abort_streamed_async(*this, err, false);
}

void push_ticket::deliver(uint64_t global_step, const tensor& params, bool dropped_late) {
  if (!wait) {
    promise.deliver(global_step, params, dropped_late);
    return;
  }
  if (wait->generation.load() != generation)
    return; // its thread gave up waiting for it (a timeout), and waits for another
  wait->answered = true;
  wait->global_step = global_step;
  wait->dropped_late = dropped_late;
  wait->params = params;
  answered->notify_all();
}

void push_ticket::deliver(const caf::error& err) {
  if (!wait) {
    promise.deliver(err);
    return;
  }
  if (wait->generation.load() != generation)
    return;
  wait->answered = true;
  wait->error = err;
  answered->notify_all();
}

namespace aggregator_detail {

std::unique_lock<std::mutex> hold(self_pointer self) {
  return std::unique_lock<std::mutex>{self->state.plane->mtx};
}

/// Whether the push is one the data plane takes itself: its member's (token,
/// in the job, not done), a new push number, a step the aggregator is at (or,
/// sync after a switch, its first push), and in sync a round it has not
/// pushed to, without a worker on standby's ... Everything the actor's push
/// handlers check before they change anything (check_worker, already_taken,
/// wrong_form, and sync_push's rules): a push that fails one is the actor's.
bool common_case(const aggregator_actor_state& st, uint32_t worker, uint64_t step,
                 const push_credentials& who, bool sync) {
  if (worker > max_worker_index || worker >= st.members.size() || worker >= st.round.workers())
    return false;
  const auto& m = st.members[worker];
  if (!holds_token(m, who.token) || (worker >= st.spec.workers && !m.joined)
      || st.round.is_done(worker) || (who.seq != 0 && who.seq <= m.seq_taken))
    return false;
  if (step > st.global_step)
    return false; // refused by the actor, naming the step
  if (!sync)
    return true;
  // A late push is dropped by the actor; a worker on standby is applied
  // outside the rounds; a round holding CAF promises is released by the
  // actor (a promise is delivered from its own thread).
  return !st.round.is_standby(worker) && (step == st.global_step || m.fresh)
         && !st.round.has_arrived(worker) && st.round_promises == 0;
}

std::shared_ptr<plane_wait> thread_wait() {
  thread_local auto wait = std::make_shared<plane_wait>();
  return wait;
}

namespace {

/// What the two paths share: the lock, the common case's checks, the
/// counts, and in sync the wait for the round. `apply_at_once()` applies
/// the push (async); `join()` adds it to the round (sync). A dense push's
/// answer carries the parameters in `who.parts`, or flat where they could
/// not go there (a sparse one's carries none: the worker reads rows).
template <class ApplyAtOnce, class Join>
std::optional<caf::expected<plane_push_answer>>
take_push(aggregator_plane& plane, uint32_t worker, uint64_t step, const push_credentials& who,
          bool sparse, std::chrono::milliseconds wait, ApplyAtOnce apply_at_once, Join join) {
  using answer = caf::expected<plane_push_answer>;
  std::unique_lock<std::mutex> lock{plane.mtx};
  auto self = plane.self;
  if (!self)
    return std::nullopt; // not started, or gone: the actor's path says so
  auto& st = self->state;
  bool sync = st.spec.mode == "sync";
  // A pipelined round in progress takes streamed pushes only: the actor
  // refuses a plain one, or parks an abstention (join_pipelined); async
  // takes one into the line while streamed pushes are in it (queue_whole_async).
  if ((!sync && st.spec.mode != "async") || (st.tables > 0) != sparse || st.pipelined
      || !st.pipelined_async.empty() || !common_case(st, worker, step, who, sync))
    return std::nullopt;
  // What the actor's handler does for such a push, in its order.
  member(st, worker).retries = 0; // already_taken: a new push
  note_push(st, worker, step);
  st.stats.pushes_on_plane += 1;
  if (!sync) {
    if (auto err = apply_at_once(self))
      return answer{std::move(err)};
    plane_push_answer out{st.global_step, false, tensor{}};
    if (!sparse && !(who.parts && fill_parts(self, *who.parts))) {
      auto p = answer_params(self);
      if (!p)
        return answer{std::move(p.error())};
      out.params = std::move(*p);
    }
    return answer{std::move(out)};
  }
  member(st, worker).fresh = false;
  if (auto err = join(self))
    return answer{std::move(err)};
  auto waiting = thread_wait();
  push_ticket ticket;
  ticket.wait = waiting;
  ticket.generation = waiting->generation.fetch_add(1) + 1;
  ticket.answered = &plane.answered;
  if (!sparse)
    ticket.parts = who.parts; // answer_all fills them, then lets them go
  waiting->answered = false;
  waiting->error = caf::error{};
  waiting->params = tensor{};
  const auto global_step = st.global_step;
  park_ticket(st, worker, global_step, who.seq, std::move(ticket));
  schedule_sweep(st, plane.addr);
  if (st.round.complete(st.spec.replicas_to_aggregate))
    release_sync(self); // answers this push too: no wait below
  // The lock is let go while waiting: the other members' pushes, the
  // actor's deadline or timeout, a switch or a departure release the round.
  if (!plane.answered.wait_for(lock, wait, [&] { return waiting->answered; })) {
    waiting->generation.fetch_add(1); // a late answer is not taken for the next push's
    // The state may be gone meanwhile (the actor ended): named only if not.
    return answer{make_error(
      af_error::timeout,
      fmt::format("aggregator '{}' did not answer the push of worker {} at global step {} "
                  "within {} ms",
                  plane.self ? plane.self->state.spec.name : std::string{"(stopped)"}, worker,
                  global_step, wait.count()))};
  }
  if (waiting->error)
    return answer{waiting->error};
  return answer{
    plane_push_answer{waiting->global_step, waiting->dropped_late, std::move(waiting->params)}};
}

} // namespace

plane_sparse_push plane_path(std::shared_ptr<aggregator_plane> plane) {
  return [plane](uint32_t worker, uint64_t step, const push_credentials& who,
                 sparse_push_values& values, std::chrono::milliseconds wait) {
    return take_push(
      *plane, worker, step, who, true, wait,
      [&](self_pointer self) { return apply_sparse_now(self, worker, step, who, values, true); },
      [&](self_pointer self) { return add_to_round_sparse(self, worker, values); });
  };
}

plane_dense_push plane_dense_path(std::shared_ptr<aggregator_plane> plane) {
  return [plane](uint32_t worker, uint64_t step, const push_credentials& who, tensor& values,
                 std::chrono::milliseconds wait) {
    // One flat tensor, as the actor's push carries it (empty: an abstention).
    thread_local std::vector<tensor> grads;
    grads.clear();
    if (!values.empty())
      grads.push_back(values);
    auto out = take_push(
      *plane, worker, step, who, false, wait,
      [&](self_pointer self) { return apply_now(self, worker, step, who, grads, true); },
      [&](self_pointer self) { return add_to_round(self, worker, who, grads, "gradient"); });
    grads.clear(); // the round keeps its own copy of the tensor
    return out;
  };
}

} // namespace aggregator_detail

} // namespace af
