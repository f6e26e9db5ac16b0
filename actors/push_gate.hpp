#pragma once
/// The tokens an aggregator's members joined with, shared with its node's
/// data plane, so that a push frame (dense or sparse) whose token is not its
/// worker's is refused on the data plane's thread before its payload is
/// read: a stranger cannot make the node allocate a push's worth of memory
/// per connection only to be refused once it arrived. The aggregator still
/// checks every push in full (dist/aggregator_members.cpp, check_worker);
/// this is the early half of that check. The aggregator writes it at each
/// join; data-plane threads read it.
///
/// It also carries the aggregator's own way of taking a sparse push on the
/// data plane's thread (set_sparse_push): the common push is applied there,
/// under the aggregator's lock, instead of travelling to its actor and back.

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "caf/expected.hpp"

#include "messages/aggregator.hpp"

namespace af {

/// What the aggregator answers a push taken on the data plane's thread.
struct plane_push_answer {
  uint64_t global_step = 0;
  bool dropped_late = false;
};

/// A sparse push taken on the data plane's thread: worker, step, who sent
/// it, the values, how long a sync push may wait for its round. Nothing
/// (and `values` untouched) when the push is not the common case (a retry,
/// a late or early step, a stranger, a mode that parks it in the actor...):
/// the caller then hands it to the aggregator's actor, which answers it.
using plane_sparse_push = std::function<std::optional<caf::expected<plane_push_answer>>(
  uint32_t, uint64_t, const push_credentials&, sparse_push_values&, std::chrono::milliseconds)>;

class push_gate {
public:
  /// `worker` pushes with `token` from now on (a join; a new process under
  /// the index replaces the old one's token).
  void admit(uint32_t worker, const std::string& token);

  /// True if `token` is the one `worker` joined with (compared in constant
  /// time: a wrong token's timing says nothing of the right one).
  bool holds(uint32_t worker, const std::string& token) const;

  /// True if `token` is the one `worker`'s latest join replaced: the index
  /// was joined again (by another process while this one was taken as left,
  /// or by this one on a new connection), so a push with it is refused
  /// saying that, not as a stranger's.
  bool replaced(uint32_t worker, const std::string& token) const;

  /// Counts a refusal; true for the 1st, 2nd, 4th, ... (the ones worth a
  /// log line: a stranger in a loop cannot flood the log), with the count.
  bool count_refusal(uint64_t& count);

  /// The aggregator's data-plane path for sparse pushes (set once, when it
  /// is spawned; empty: every push goes to the actor).
  void set_sparse_push(plane_sparse_push f);
  const plane_sparse_push& sparse_push() const { return sparse_push_; }

private:
  mutable std::mutex mtx_;
  /// Set before the gate is shared with the data plane (spawn_aggregator),
  /// then only read: no lock.
  plane_sparse_push sparse_push_;
  std::vector<std::string> tokens_; ///< by worker index; empty: not joined
  std::vector<std::string> replaced_; ///< by worker index: the token the latest join replaced
  uint64_t refused_ = 0;
};

} // namespace af
