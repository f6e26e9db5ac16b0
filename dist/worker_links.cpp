// The worker's detached actors: each blocks (a data-plane push, a ps
// recovery, an all-reduce) so that the worker actor never does.
#include "dist/worker_state.hpp"
#include "actors/system.hpp"

#include "caf/all.hpp"

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"

namespace af::worker_detail {

caf::behavior plane_link(caf::event_based_actor* self, std::string host, uint16_t port,
                         std::string peer, std::chrono::milliseconds timeout,
                         std::function<void(uint64_t)> before, bool bf16) {
  auto chan = std::make_shared<std::unique_ptr<data_channel>>();
  auto tls = system_tls(self->system()); // the process's [security], if any
  return {
    [=](push_atom, const std::string& name, uint32_t worker, uint64_t step,
        const std::vector<tensor>& values, uint32_t wait_ms, uint8_t kind, uint64_t local_step,
        const std::string& token, uint64_t seq) -> caf::result<uint64_t, tensor, bool> {
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
        (*chan)->set_wire_bf16(bf16); // [train] wire_dtype
      }
      bool dropped_late = false;
      // [train] pipeline_sync, pipeline_async: streamed where the connection is plain TCP
      // (data_channel::push_streamed goes store-and-forward elsewhere).
      auto r = kind == static_cast<uint8_t>(wire::kind::push_streamed)
                 ? (*chan)->push_streamed(name, worker, step, values,
                                          std::chrono::milliseconds{wait_ms}, token, seq,
                                          &dropped_late)
                 : (*chan)->aggregate(static_cast<wire::kind>(kind), name, worker, step, values,
                                      std::chrono::milliseconds{wait_ms}, token, seq,
                                      &dropped_late);
      if (!r)
        return std::move(r.error());
      return {r->first, std::move(r->second), dropped_late};
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
