#pragma once
/// An aggregator's own way of taking a push (sparse or dense) on the data
/// plane's thread: the common push is applied there, under the aggregator's
/// lock (dist/aggregator_plane.cpp), instead of travelling to its actor and
/// back. The aggregator sets it when it is spawned, before its node shares
/// it with the data plane (actors/node.cpp); data-plane threads then only
/// read it (actors/plane_handler.cpp).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/uio.h>

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

/// Floats of a pipelined round's chunk: a streamed push is read, averaged,
/// applied and answered 64 KiB at a time.
constexpr size_t pipelined_chunk_floats = 16384;

/// A dense push streamed (wire::kind::push_streamed) that a pipelined
/// round took (dist/pipelined_round.hpp; sync: the round of every member,
/// async: a round of this push alone): the data-plane thread that reads
/// it reads its floats into buffer(), says how far they arrived, and writes
/// the answer's chunks as they are ready, from answer_pieces(). Every call
/// takes the aggregator's lock but answer_pieces (chunks ready do not change).
class streamed_push {
public:
  virtual ~streamed_push() = default;
  /// Floats of the push and of the answer (the aggregator's flat order).
  virtual size_t total() const = 0;
  /// The global step the round makes (the answer header's version; async:
  /// the one it makes if every push ahead of it commits).
  virtual uint64_t next_step() const = 0;
  /// What an abort abandons, for its error: "the round of global step 7 is
  /// abandoned" (sync), "the push is abandoned" (async).
  virtual std::string abandoned() const = 0;
  /// "variable 'w' element 17": where flat float `index` lies.
  virtual std::string where(size_t index) const = 0;
  /// Where the push's floats are read into.
  virtual float* buffer() = 0;
  /// The push arrived up to `floats`, all of them finite: chunks every
  /// member has are applied. The answer's floats ready now, or why the
  /// round ended without committing.
  virtual caf::expected<size_t> arrived(size_t floats) = 0;
  /// The push broke (its member stopped, a float not finite): the round is
  /// aborted for `why`, every member hears it, no variable changes.
  virtual void fail(caf::error why) = 0;
  /// Waits up to `wait` until more than `have` floats of the answer are
  /// ready: how many are; the round's error if it was aborted (or a timeout,
  /// which aborts it, naming whom it waited for).
  virtual caf::expected<size_t> wait_ready(size_t have, std::chrono::milliseconds wait) = 0;
  /// The answer's floats [from, to) (ready ones) as pieces, appended.
  virtual void answer_pieces(size_t from, size_t to, std::vector<iovec>& out) const = 0;
  /// The round's end, once every chunk is sent: the global step it
  /// committed, or why it was aborted.
  virtual caf::expected<uint64_t> outcome(std::chrono::milliseconds wait) = 0;
};

/// A streamed push offered to the aggregator's pipelined round: worker,
/// step, who sent it. Nothing when it is not the pipelined round's (not
/// sync, a retry, a late or early step, the round already taken store and
/// forward, a norm guard, backup workers ...): the caller reads it whole and
/// hands it to the actor, answering in the streamed reply's form.
using plane_streamed_push = std::function<
  std::optional<caf::expected<std::unique_ptr<streamed_push>>>(uint32_t, uint64_t,
                                                              const push_credentials&)>;

/// The paths an aggregator gives its node's data plane (empty: every push
/// goes to the actor).
struct plane_push_paths {
  plane_sparse_push sparse;
  plane_dense_push dense;

  plane_streamed_push streamed;
  /// Bits every push reply carries (wire::reply_flags::whole_pushes), as
  /// the aggregator sets them (null: none).
  std::shared_ptr<const std::atomic<uint16_t>> reply_flags;
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
