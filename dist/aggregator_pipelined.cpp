// The data plane's path for streamed dense sync pushes (wire::kind::
// push_streamed): a push in the common case joins the aggregator's
// pipelined round (dist/pipelined_round.hpp) on the data-plane thread that
// reads it, under the aggregator's lock, and that thread then feeds it
// piece by piece and streams the answer back as chunks are applied. The
// bookkeeping is the sparse path's and the store-and-forward release's
// (common_case, note_push, park_ticket, commit_pipelined): a pipelined round
// parks one ticket per member in the aggregator's round, so that the actor's
// timeouts, departures, switches and restores end it as they end any round.
#include "dist/aggregator_detail.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af::aggregator_detail {

namespace {

/// One member's streamed push in the pipelined round, as its data-plane
/// thread sees it. Every call but answer_pieces takes the aggregator's lock.
class streamed_member final : public round_member {
public:
  streamed_member(std::shared_ptr<aggregator_plane> plane, std::shared_ptr<pipelined_round> round,
                  std::shared_ptr<plane_wait> wait, uint64_t generation, uint32_t worker)
    : round_member(std::move(plane), std::move(round), worker), wait_(std::move(wait)),
      generation_(generation) {
    // nop
  }

  uint64_t next_step() const override { return round_->step() + 1; }

  std::string abandoned() const override {
    return fmt::format("the round of global step {} is abandoned", round_->step());
  }

  caf::expected<size_t> arrived(size_t floats) override {
    std::unique_lock<std::mutex> lock{plane_->mtx};
    if (auto err = ended())
      return err;
    auto before = round_->applied();
    round_->arrived(worker_, floats);
    if (round_->applied() != before) {
      // The chunk that completes the round commits it, on this thread.
      auto self = plane_->self;
      if (round_->applied() == round_->chunks() && self && self->state.pipelined == round_)
        commit_pipelined(self);
      plane_->answered.notify_all();
    }
    if (auto err = ended())
      return err;
    return round_->ready_floats();
  }

  void fail(caf::error why) override {
    std::unique_lock<std::mutex> lock{plane_->mtx};
    abort_round(std::move(why));
  }

  caf::expected<size_t> wait_ready(size_t have, std::chrono::milliseconds wait) override {
    std::unique_lock<std::mutex> lock{plane_->mtx};
    auto ready = [&] {
      return round_->ready_floats() > have || round_->state() != pipelined_round::phase::running
             || (wait_->answered && wait_->generation.load() == generation_);
    };
    if (!plane_->answered.wait_for(lock, wait, ready)) {
      auto self = plane_->self;
      abort_round(make_error(
        af_error::timeout,
        fmt::format("aggregator '{}': the pipelined round of global step {} waited {} ms for "
                    "the rest of the pushes of {}; the step is abandoned, no variable changed",
                    self ? self->state.spec.name : std::string{"(stopped)"}, round_->step(),
                    wait.count(), round_->behind())));
    }
    if (auto err = ended())
      return err;
    return round_->ready_floats();
  }

  caf::expected<uint64_t> outcome(std::chrono::milliseconds wait) override {
    std::unique_lock<std::mutex> lock{plane_->mtx};
    if (!plane_->answered.wait_for(lock, wait, [&] { return answered(); })) {
      wait_->generation.fetch_add(1); // a late answer is not taken for the next push's
      return make_error(af_error::timeout,
                        fmt::format("the pipelined round of global step {} did not end within "
                                    "{} ms of its last chunk",
                                    round_->step(), wait.count()));
    }
    if (wait_->error)
      return wait_->error;
    return wait_->global_step;
  }

private:
  bool answered() const { return wait_->answered && wait_->generation.load() == generation_; }

  /// Why the round ended without this member's answer (none while it runs
  /// or once it committed).
  caf::error ended() const {
    if (answered() && wait_->error)
      return wait_->error;
    if (round_->state() == pipelined_round::phase::aborted)
      return round_->abort_reason();
    return caf::none;
  }

  /// Aborts the round (if it still is the aggregator's) for `why`: its
  /// tickets hear it, no variable changes (lock held).
  void abort_round(caf::error why) {
    auto self = plane_->self;
    if (!self || self->state.pipelined != round_) {
      round_->abort(std::move(why)); // the aggregator let it go: only this thread holds it
      return;
    }
    auto& st = self->state;
    log::get()->warn("aggregator '{}': the pipelined round of global step {} is abandoned: {}",
                     st.spec.name, st.global_step, describe(why));
    if (why.code() == static_cast<uint8_t>(af_error::non_finite)) {
      st.stats.refused += 1;
      member(st, worker_).stats.refused += 1;
      st.stats.last_refusal = describe(why);
    }
    fail_all(st, st.round.release(), why);
    plane_->answered.notify_all();
  }

  std::shared_ptr<plane_wait> wait_;
  uint64_t generation_;
};

/// Whether a streamed push of `worker` may join a pipelined round: sync
/// without tables, norm guard, replicas_to_aggregate or deadlines (backup
/// workers close a step without some members, and the guard needs the whole
/// gradient first), and the common case.
bool pipelinable(const aggregator_actor_state& st, uint32_t worker, uint64_t step,
                 const push_credentials& who) {
  if (st.spec.mode != "sync" || st.tables > 0 || st.guard.enabled()
      || st.spec.replicas_to_aggregate > 0 || st.spec.step_deadline_ms > 0
      || !common_case(st, worker, step, who, false))
    return false;
  // common_case's sync rules but one: a pipelined round may hold a CAF
  // promise (a member's abstention, parked by the actor: join_round).
  return !st.round.is_standby(worker) && (step == st.global_step || st.members[worker].fresh)
         && !st.round.has_arrived(worker);
}

} // namespace

std::vector<pipelined_round::variable> round_variables(const aggregator_actor_state& st) {
  std::vector<pipelined_round::variable> vars;
  for (size_t i = 0; i < st.vars.size(); ++i)
    vars.push_back({st.vars[i].cell.get(), st.spec.variables[i], st.offsets[i], st.sizes[i]});
  return vars;
}

push_result join_pipelined(self_pointer self, uint32_t worker, uint64_t step,
                           const push_credentials& who, const std::vector<tensor>& values,
                           const char* what) {
  auto& st = self->state;
  auto round = st.pipelined;
  if (!round->is_member(worker) || st.round.has_arrived(worker))
    return make_error(af_error::invalid_argument,
                      fmt::format("aggregator '{}': {} pushed step {} into the pipelined round of "
                                  "global step {}, {}",
                                  st.spec.name, worker_name(st, worker), step, st.global_step,
                                  round->is_member(worker)
                                    ? "which its streamed push joined already"
                                    : "which began without it (it was no member then)"));
  if (values.empty()) {
    if (!round->abstain(worker))
      return make_error(af_error::invalid_argument,
                        fmt::format("aggregator '{}': {} abstained from the pipelined round of "
                                    "global step {}, of which it is the last member",
                                    st.spec.name, worker_name(st, worker), st.global_step));
    member(st, worker).stats.refused += 1; // an abstention, counted as join_round counts it
  } else {
    // Its values whole, as a streamed push's pieces that all arrived at once
    // (the mean sums the members in the same order either way).
    auto parts = unpack(self, worker, values, what, who.finite_checked);
    if (!parts)
      return std::move(parts.error());
    float* dst = round->buffer(worker);
    for (size_t i = 0; i < st.vars.size(); ++i)
      std::copy((*parts)[i], (*parts)[i] + st.sizes[i], dst + st.offsets[i]);
    round->joined(worker);
    member(st, worker).contributed = true;
  }
  auto r = park(self, worker, step, who);
  // Chunks every member now has are applied; the last one commits.
  if (!values.empty())
    round->arrived(worker, round->total());
  if (round->applied() == round->chunks() && st.pipelined == round)
    commit_pipelined(self);
  st.plane->answered.notify_all();
  return r;
}

plane_streamed_push streamed_path(std::shared_ptr<aggregator_plane> plane) {
  return [plane](uint32_t worker, uint64_t step, const push_credentials& who)
           -> std::optional<caf::expected<std::unique_ptr<streamed_push>>> {
    using result = caf::expected<std::unique_ptr<streamed_push>>;
    std::unique_lock<std::mutex> lock{plane->mtx};
    auto self = plane->self;
    if (!self)
      return std::nullopt; // not started, or gone: the actor's path says so
    auto& st = self->state;
    if (st.spec.mode == "async")
      return join_streamed_async(plane, worker, step, who);
    if (!pipelinable(st, worker, step, who))
      return std::nullopt;
    if (!st.pipelined) {
      if (st.round.in_progress())
        return std::nullopt; // pushes of this round came store-and-forward: it stays so
      if (st.spec.pipeline_auto && !st.tuner.pipelined())
        return std::nullopt; // pipeline_sync = "auto" wants store-and-forward rounds now
      // The round's members: every worker it waits for, in index order (the
      // order its mean sums them in).
      std::vector<uint32_t> members;
      for (uint32_t w = 0; w < st.round.workers(); ++w)
        if (!st.round.is_done(w) && !st.round.is_standby(w))
          members.push_back(w);
      if (std::find(members.begin(), members.end(), worker) == members.end())
        return std::nullopt;
      auto round = std::make_shared<pipelined_round>();
      if (auto err = round->begin(round_variables(st), st.spec.optimizer, st.slot_names,
                                  st.global_step, std::move(members)))
        return result{std::move(err)};
      st.pipelined = std::move(round);
    } else if (!st.pipelined->is_member(worker)) {
      return std::nullopt;
    }
    st.pipelined->joined(worker);
    // What the actor's handler does for such a push, in its order (as the
    // sparse path: dist/aggregator_plane.cpp).
    member(st, worker).retries = 0;
    note_push(st, worker, step);
    st.stats.pushes_on_plane += 1;
    member(st, worker).fresh = false;
    member(st, worker).contributed = true;
    auto waiting = thread_wait();
    push_ticket ticket;
    ticket.wait = waiting;
    ticket.generation = waiting->generation.fetch_add(1) + 1;
    ticket.answered = &plane->answered;
    waiting->answered = false;
    waiting->error = caf::error{};
    park_ticket(st, worker, st.global_step, who.seq, ticket);
    schedule_sweep(st, plane->addr);
    return result{std::unique_ptr<streamed_push>{new streamed_member(
      plane, st.pipelined, waiting, ticket.generation, worker)}};
  };
}

} // namespace af::aggregator_detail
