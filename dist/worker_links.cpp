// The worker's connection to a ps's data plane (plane_pusher: its own,
// with one shard; in a detached link actor each, with several) and its
// other detached actors, each of which blocks (a ps recovery, an
// all-reduce) so that the worker actor does not.
#include "dist/worker_state.hpp"
#include "actors/system.hpp"

#include "caf/all.hpp"

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"

namespace af::worker_detail {

plane_pusher::plane_pusher(std::string host, uint16_t port, std::string peer,
                           std::chrono::milliseconds timeout, std::function<void(uint64_t)> before,
                           std::shared_ptr<tls_context> tls, bool bf16)
  : host_(std::move(host)), port_(port), peer_(std::move(peer)), timeout_(timeout),
    before_(std::move(before)), tls_(std::move(tls)), bf16_(bf16) {
}

plane_pusher::~plane_pusher() = default;

caf::expected<std::tuple<uint64_t, tensor, bool>>
plane_pusher::push(const std::string& name, uint32_t worker, uint64_t step,
                   const std::vector<tensor>& values, uint32_t wait_ms, uint8_t kind,
                   uint64_t local_step, const std::string& token, uint64_t seq) {
  if (before_ && kind != static_cast<uint8_t>(wire::kind::pull))
    before_(local_step);
  if (!chan_ || chan_->broken()) {
    // No spinning for the reply: a push waits for the other workers'
    // steps, and on a small machine the spin takes the CPU they need
    // (spinning 50 us cost the digits job up to 10 %, 200 us 30 %).
    auto c = data_channel::connect(host_, port_, peer_, timeout_, {}, tls_);
    if (!c)
      return std::move(c.error());
    chan_ = std::move(*c);
    chan_->set_wire_bf16(bf16_); // [train] wire_dtype
  }
  bool dropped_late = false;
  // [train] pipeline_sync, pipeline_async: streamed where the connection is plain TCP
  // (data_channel::push_streamed goes store-and-forward elsewhere).
  auto r = kind == static_cast<uint8_t>(wire::kind::push_streamed)
             ? chan_->push_streamed(name, worker, step, values, std::chrono::milliseconds{wait_ms},
                                    token, seq, &dropped_late)
             : chan_->aggregate(static_cast<wire::kind>(kind), name, worker, step, values,
                                std::chrono::milliseconds{wait_ms}, token, seq, &dropped_late);
  if (!r)
    return std::move(r.error());
  return std::make_tuple(r->first, std::move(r->second), dropped_late);
}

caf::behavior plane_link(caf::event_based_actor* self, std::string host, uint16_t port,
                         std::string peer, std::chrono::milliseconds timeout,
                         std::function<void(uint64_t)> before, bool bf16) {
  auto pusher = std::make_shared<plane_pusher>(std::move(host), port, std::move(peer), timeout,
                                               std::move(before), system_tls(self->system()),
                                               bf16);
  return {
    [=](push_atom, const std::string& name, uint32_t worker, uint64_t step,
        const std::vector<tensor>& values, uint32_t wait_ms, uint8_t kind, uint64_t local_step,
        const std::string& token, uint64_t seq) -> caf::result<uint64_t, tensor, bool> {
      auto r = pusher->push(name, worker, step, values, wait_ms, kind, local_step, token, seq);
      if (!r)
        return std::move(r.error());
      return {std::get<0>(*r), std::move(std::get<1>(*r)), std::get<2>(*r)};
    },
  };
}

std::function<void(uint64_t)> before_push_of(const worker_setup& setup, size_t k) {
  if (!setup.before_push)
    return {};
  auto hook = setup.before_push;
  return [hook, k](uint64_t local_step) { hook(k, local_step); };
}

caf::behavior recovery_link(caf::event_based_actor*,
                            std::function<caf::expected<recovered_shard>(
                              size_t, uint64_t, const std::string&, bool)>
                              fn,
                            std::function<caf::expected<aggregator_actor>(size_t)> find,
                            std::shared_ptr<recovery_box> box) {
  return {
    [=](aggregator_atom, uint64_t k) -> caf::result<aggregator_actor> {
      if (!find)
        return make_error(af_error::unsupported, "no lookup of a ps's aggregator");
      auto agg = find(static_cast<size_t>(k));
      if (!agg)
        return std::move(agg.error());
      return std::move(*agg);
    },
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

caf::behavior reduce_link(caf::event_based_actor*, std::shared_ptr<allreduce_group> group) {
  return {
    [=](allreduce_atom, tensor& flat) -> caf::result<tensor> {
      if (auto err = group->allreduce_mean(flat.mutable_data<float>(), flat.num_elements()))
        return err;
      return flat;
    },
  };
}

} // namespace af::worker_detail
