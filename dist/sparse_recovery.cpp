// A sparse worker's links through the death of a ps (dist/sparse_recovery.hpp).
#include "dist/sparse_recovery.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

bool ps_may_be_gone(const caf::error& err, bool broken) {
  return is(err, af_error::peer_down) || is(err, af_error::unreachable)
         || (broken && is(err, af_error::timeout));
}

sparse_recovery::sparse_recovery(recover_fn recover, join_fn join, connect_fn connect,
                                 std::vector<param_shard> shards, find_fn find)
  : recover_(std::move(recover)), join_(std::move(join)), connect_(std::move(connect)),
    find_(std::move(find)) {
  for (auto& shard : shards) {
    mtx_.push_back(std::make_unique<std::mutex>());
    gens_.push_back(std::make_unique<std::atomic<uint64_t>>(0));
    endpoint e;
    e.shard = std::move(shard);
    now_.push_back(std::move(e));
  }
}

sparse_recovery::endpoint sparse_recovery::current(size_t k) {
  std::lock_guard<std::mutex> guard{*mtx_[k]};
  return now_[k];
}

caf::expected<sparse_recovery::endpoint> sparse_recovery::recover(size_t k, uint64_t seen,
                                                                  const caf::error& why) {
  return recover(k, seen, describe(why));
}

caf::expected<sparse_recovery::endpoint> sparse_recovery::recover(size_t k, uint64_t seen,
                                                                  const std::string& why) {
  std::lock_guard<std::mutex> guard{*mtx_[k]};
  auto& now = now_[k];
  if (now.generation != seen)
    return now; // another link of this ps recovered it meanwhile
  if (auto err = failure())
    return err; // a recovery failed: the worker ends with it, no link waits again
  auto r = recover_(k, step.load(), why, false);
  if (!r) {
    std::lock_guard<std::mutex> failed{failure_mtx_};
    if (!failure_)
      failure_ = r.error();
    return std::move(r.error());
  }
  if (!(r->shard.actor == now.shard.actor)) {
    // A new process: its aggregator is new, and this worker joins it once
    // (it monitors the worker from then on, as the first one did).
    auto joined = join_(k, r->shard.actor);
    if (!joined)
      return std::move(joined.error());
    now.token = std::move(joined->first);
    now.last_seq = joined->second;
    now.moves += 1;
    recoveries += 1;
  }
  now.shard = r->shard;
  now.restored_step = r->global_step;
  now.generation += 1;
  gens_[k]->store(now.generation, std::memory_order_release);
  return now;
}

caf::expected<sparse_recovery::endpoint> sparse_recovery::rejoin(size_t k, uint64_t seen,
                                                                 const caf::error& why) {
  std::lock_guard<std::mutex> guard{*mtx_[k]};
  auto& now = now_[k];
  if (now.generation != seen)
    return now; // another link of this ps joined again (or recovered it) meanwhile
  if (auto err = failure())
    return err;
  if (!find_)
    return why;
  // Looked up anew: this worker's handle of the aggregator went with the
  // broken link (a request through it reaches nothing).
  auto agg = find_(k);
  if (!agg)
    return make_error(af_error::left, fmt::format("{}; joining it again failed: {}",
                                                  reason_of(why), describe(agg.error())));
  auto joined = join_(k, *agg);
  if (!joined)
    return make_error(af_error::left, fmt::format("{}; joining it again failed: {}",
                                                  reason_of(why), describe(joined.error())));
  log::get()->info("{} took this worker as left ({}); joined it again", now.shard.task,
                   reason_of(why));
  now.shard.actor = *agg;
  now.token = std::move(joined->first);
  now.rejoins += 1;
  now.generation += 1;
  gens_[k]->store(now.generation, std::memory_order_release);
  rejoined += 1;
  return now;
}

caf::error sparse_recovery::failure() {
  std::lock_guard<std::mutex> guard{failure_mtx_};
  return failure_;
}

caf::error recovering_ps_link::catch_up() {
  auto now = r_.current(k_);
  // Seen even if the connection fails: a ps that died again right after
  // its recovery is then waited for again (recover() with the generation
  // as it is now), not given up on after three tries that wait for nothing.
  generation_ = now.generation;
  auto chan = r_.connect(now.shard);
  if (!chan)
    return std::move(chan.error());
  restored_ = now.restored_step;
  if (now.moves != moves_) {
    moved_ = true;
    inner_->reconnect(std::move(*chan), now.token, now.last_seq);
  } else {
    inner_->reconnect(std::move(*chan));
    if (now.rejoins != rejoins_)
      inner_->set_token(now.token); // the same aggregator: its numbers go on
  }
  moves_ = now.moves;
  rejoins_ = now.rejoins;
  return caf::none;
}

caf::error recovering_ps_link::rejoin(caf::error why) {
  auto now = std::chrono::steady_clock::now();
  if (refused_left_ == 0)
    rejoin_deadline_ = now + r_.rejoin_window;
  else if (now >= rejoin_deadline_)
    return make_error(af_error::left,
                      fmt::format("{} (this worker joined it again {} time(s) within {} ms, and "
                                  "was taken as left each time)",
                                  reason_of(why), refused_left_, r_.rejoin_window.count()));
  refused_left_ += 1;
  auto e = r_.rejoin(k_, generation_, why);
  if (!e)
    return std::move(e.error());
  // Every request still out, again, in order, on a new connection with the
  // new token (the old connection's answers are dropped with it).
  if (auto caught = catch_up()) {
    if (!ps_may_be_gone(caught, true))
      return caught;
    out_.front().unsent = std::move(caught); // the ps went meanwhile: recovered next
    return caf::none;
  }
  for (auto& r : out_)
    if (auto fatal = send(r))
      r.unsent = std::move(fatal);
  return caf::none;
}

caf::error recovering_ps_link::send(request& r) {
  r.unsent = caf::none;
  caf::error err;
  switch (r.kind) {
    case request::gather:
      err = inner_->start_gather_rows(r.var, r.ids);
      break;
    case request::read:
      err = inner_->start_read(r.var);
      break;
    case request::push: {
      // To a new aggregator: at the step it was restored at if that is
      // earlier (async: the chief's view of the step may lag this worker's);
      // a later one is dropped as late and answered at once (sync).
      auto at = moved_ ? std::min(r.step, restored_) : r.step;
      moved_ = false;
      err = inner_->start_push(at, r.values);
      break;
    }
  }
  if (err && ps_may_be_gone(err, inner_->broken())) {
    r.unsent = std::move(err); // its answer recovers the ps and sends it again
    return caf::none;
  }
  return err;
}

caf::error recovering_ps_link::start(request r) {
  if (out_.empty() && generation_ != r_.generation(k_))
    if (auto err = catch_up(); err && !ps_may_be_gone(err, true))
      return err;
  if (auto err = send(r))
    return err;
  out_.push_back(std::move(r));
  return caf::none;
}

caf::error recovering_ps_link::start_gather_rows(const std::string& var, const tensor& ids) {
  request r;
  r.kind = request::gather;
  r.var = var;
  r.ids = ids;
  return start(std::move(r));
}

caf::error recovering_ps_link::start_read(const std::string& var) {
  request r;
  r.kind = request::read;
  r.var = var;
  return start(std::move(r));
}

caf::error recovering_ps_link::start_push(uint64_t step, const sparse_push_values& values) {
  request r;
  r.kind = request::push;
  r.step = step;
  r.values = values;
  return start(std::move(r));
}

caf::expected<sparse_ps_link::answer> recovering_ps_link::finish() {
  if (out_.empty())
    return make_error(af_error::internal, "an answer asked of a ps link with no request out");
  for (int tries = 0;; ++tries) {
    auto& front = out_.front();
    caf::error err = front.unsent;
    if (!err) {
      auto a = inner_->finish();
      if (a) {
        if (front.kind == request::push)
          refused_left_ = 0; // the next refusal as left starts a window of its own
        out_.pop_front();
        return a;
      }
      err = std::move(a.error());
    }
    if (is(err, af_error::left) && front.kind == request::push) {
      // The ps's aggregator took this worker as left (its CAF link broke
      // while the ps was stopped): joined again, the push goes again. Not
      // one of the three tries: the ps is there, it answered.
      if (auto failed = rejoin(std::move(err))) {
        out_.pop_front();
        return failed;
      }
      --tries;
      continue;
    }
    if (!ps_may_be_gone(err, inner_->broken()) || tries == 3) {
      out_.pop_front();
      return err;
    }
    auto now = r_.recover(k_, generation_, err);
    if (!now) {
      out_.pop_front();
      return std::move(now.error());
    }
    // Every request still out, again, in order, on a connection to the ps
    // as it runs now (the old one's requests are lost with it).
    if (auto caught = catch_up()) {
      front.unsent = std::move(caught);
      continue;
    }
    // One refused (not the ps's death) answers with that error in its own
    // turn, without reading the inner link; the rest still go out, so that
    // the inner link's answers stay with the requests in out_.
    for (auto& r : out_)
      if (auto fatal = send(r))
        r.unsent = std::move(fatal);
  }
}

} // namespace af
