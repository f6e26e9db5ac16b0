#pragma once
/// The tokens an aggregator's members joined with, shared with its node's
/// data plane, so that a push frame (dense or sparse) whose token is not its
/// worker's is refused on the data plane's thread before its payload is
/// read: a stranger cannot make the node allocate a push's worth of memory
/// per connection only to be refused once it arrived. The aggregator still
/// checks every push in full (dist/aggregator_members.cpp, check_worker);
/// this is the early half of that check. The aggregator writes it at each
/// join; data-plane threads read it.

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace af {

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

private:
  mutable std::mutex mtx_;
  std::vector<std::string> tokens_; ///< by worker index; empty: not joined
  std::vector<std::string> replaced_; ///< by worker index: the token the latest join replaced
  uint64_t refused_ = 0;
};

} // namespace af
