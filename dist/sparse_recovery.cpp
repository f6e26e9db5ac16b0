// A sparse worker's links through the death of a ps (dist/sparse_recovery.hpp).
#include "dist/sparse_recovery.hpp"

#include <algorithm>

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

bool ps_may_be_gone(const caf::error& err, bool broken) {
  return is(err, af_error::peer_down) || is(err, af_error::unreachable)
         || (broken && is(err, af_error::timeout));
}

sparse_recovery::sparse_recovery(recover_fn recover, join_fn join, connect_fn connect,
                                 std::vector<param_shard> shards)
  : recover_(std::move(recover)), join_(std::move(join)), connect_(std::move(connect)) {
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
  std::lock_guard<std::mutex> guard{*mtx_[k]};
  auto& now = now_[k];
  if (now.generation != seen)
    return now; // another link of this ps recovered it meanwhile
  if (auto err = failure())
    return err; // a recovery failed: the worker ends with it, no link waits again
  auto r = recover_(k, step.load(), describe(why), false);
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
    recoveries += 1;
  }
  now.shard = r->shard;
  now.restored_step = r->global_step;
  now.generation += 1;
  gens_[k]->store(now.generation, std::memory_order_release);
  return now;
}

caf::error sparse_recovery::failure() {
  std::lock_guard<std::mutex> guard{failure_mtx_};
  return failure_;
}

caf::error recovering_ps_link::catch_up() {
  auto now = r_.current(k_);
  auto chan = r_.connect(now.shard);
  if (!chan)
    return std::move(chan.error());
  generation_ = now.generation;
  restored_ = now.restored_step;
  if (!now.token.empty() && !(now.shard.actor == joined_)) {
    joined_ = now.shard.actor;
    moved_ = true;
    inner_->reconnect(std::move(*chan), now.token, now.last_seq);
  } else {
    inner_->reconnect(std::move(*chan));
  }
  return caf::none;
}

template <class T, class Op>
caf::expected<T> recovering_ps_link::with_recovery(Op op) {
  for (int tries = 0;; ++tries) {
    caf::error err;
    if (generation_ != r_.generation(k_))
      err = catch_up();
    if (!err) {
      auto out = op();
      if (out)
        return out;
      err = std::move(out.error());
    }
    if (!ps_may_be_gone(err, inner_->broken()) || tries == 3)
      return err;
    auto now = r_.recover(k_, generation_, err);
    if (!now)
      return std::move(now.error());
    // The next round of the loop connects to it (its generation moved).
  }
}

caf::expected<tensor> recovering_ps_link::gather_rows(const std::string& var, const tensor& ids) {
  return with_recovery<tensor>([&] { return inner_->gather_rows(var, ids); });
}

caf::expected<tensor> recovering_ps_link::read(const std::string& var) {
  return with_recovery<tensor>([&] { return inner_->read(var); });
}

caf::expected<std::pair<uint64_t, bool>>
recovering_ps_link::push(uint64_t step, const sparse_push_values& values) {
  return with_recovery<std::pair<uint64_t, bool>>([&] {
    // To a new aggregator: at the step it was restored at if that is
    // earlier (async: the chief's view of the step may lag this worker's);
    // a later one is dropped as late and answered at once (sync).
    auto at = moved_ ? std::min(step, restored_) : step;
    moved_ = false;
    return inner_->push(at, values);
  });
}

} // namespace af
