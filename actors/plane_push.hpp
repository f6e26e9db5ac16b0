#pragma once
/// An aggregator's own way of taking a push (sparse or dense) on the data
/// plane's thread: the common push is applied there, under the aggregator's
/// lock (dist/aggregator_plane.cpp), instead of travelling to its actor and
/// back. The aggregator sets it when it is spawned, before its node shares
/// it with the data plane (actors/node.cpp); data-plane threads then only
/// read it (actors/plane_handler.cpp).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "caf/expected.hpp"

#include "messages/aggregator.hpp"

namespace af {

/// What the aggregator answers a push taken on the data plane's thread.
/// A dense push's answer carries the parameters in the answer_parts the
/// caller passed (push_credentials::parts), or, where they could not go
/// there, flat in `params`.
struct plane_push_answer {
  uint64_t global_step = 0;
  bool dropped_late = false;
  tensor params;
};

/// A sparse push taken on the data plane's thread: worker, step, who sent
/// it, the values, how long a sync push may wait for its round. Nothing
/// (and `values` untouched) when the push is not the common case (a retry,
/// a late or early step, a stranger, a mode that parks it in the actor...):
/// the caller then hands it to the aggregator's actor, which answers it.
using plane_sparse_push = std::function<std::optional<caf::expected<plane_push_answer>>(
  uint32_t, uint64_t, const push_credentials&, sparse_push_values&, std::chrono::milliseconds)>;

/// A dense push (wire::kind::push) taken on the data plane's thread, as
/// plane_sparse_push: worker, step, who (its `parts` set: where the answer's
/// parameters go), the pushed values (one flat tensor; empty: an
/// abstention), the wait. Nothing, and `values` untouched: the actor's.
using plane_dense_push = std::function<std::optional<caf::expected<plane_push_answer>>(
  uint32_t, uint64_t, const push_credentials&, tensor&, std::chrono::milliseconds)>;

/// The paths an aggregator gives its node's data plane (empty: every push
/// goes to the actor).
struct plane_push_paths {
  plane_sparse_push sparse;
  plane_dense_push dense;
};

/// The answer_parts a data-plane thread lends its pushes' answers: one per
/// thread, reused while no aggregator holds it (one that still does, after
/// a push that timed out or failed, may fill it later: this thread then
/// takes a new one).
inline std::shared_ptr<answer_parts> thread_answer_parts() {
  thread_local auto sink = std::make_shared<answer_parts>();
  if (sink.use_count() > 1)
    sink = std::make_shared<answer_parts>();
  return sink;
}

} // namespace af
