#pragma once
/// All-reduce among the workers of a data-parallel job, with no parameter
/// server: a ring (reduce-scatter, then allgather) over plain TCP, or over
/// shared memory between neighbours that are processes of one host, its
/// rendezvous through the chief's key-value store (actors/kv_store.hpp).
///
/// Why our own ring and not Gloo (libgloo-dev): docs/training.md has the
/// measurements. In short: between two processes on loopback, 4 MiB took
/// 1.0-1.4x the raw-TCP exchange's speed here against 0.5-0.95x for Gloo's
/// rings; its errors name the rank and what was awaited, it throws nothing,
/// and it needs no extra thread.
///
/// Each rank listens on an OS-picked port, publishes "host:port" under
/// "<group>/addr/<rank>", connects to its right neighbour (rank + 1) and
/// accepts its left one (rank - 1); two ranks then keep one connection
/// (rank 0's) for both directions, as a raw exchange's one socket, so that
/// each side's acknowledgements ride on its data. A collective call sends a
/// small header first, so that ranks in different calls (another op, size or root) fail
/// with an error instead of mixing their data. The transfer is pipelined:
/// a rank forwards a piece as soon as it has reduced (or received) it.
///
/// Shared memory: a link (rank -> rank + 1) whose two ends are on one host
/// (shm_channel::same_host of its connection) moves its bytes through a
/// one-way ring in a segment of the writer's (dist/allreduce_shm.hpp), the
/// TCP connection staying beside it as doorbell and liveness channel; the
/// reader adds the received floats straight from the segment. Each link
/// decides during create(), its two ends together (the reader's answer to
/// the writer's offer): a link stays on TCP when either end has
/// ACTORFLOW_DATA_SHM=off (the data plane's switch), the ends are on two
/// hosts, or the segment cannot be made or opened (transport() says why).
/// Two ranks share one connection, which carries either TCP data or bells,
/// never both: if either of their links stays on TCP, both do (both ranks
/// know how both went), and transport() says it fell back and why. The
/// results are the same bits either way.
///
/// Determinism: in the reduce-scatter every element's sum (and its division
/// by the size) is computed once, by one rank, in ring order; the allgather
/// copies those bytes to the others. So every rank ends with bit-identical
/// results, and each applies the same update.
///
/// Failures: a peer that dies or destroys its group closes its sockets; a
/// rank waiting on it fails at once naming it, and closes its own sockets so
/// that the failure travels around the ring instead of leaving the others to
/// their timeouts. A failed group is broken: every later call fails at once;
/// build a new one (under a new group name).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "caf/error.hpp"
#include "caf/expected.hpp"

#include "actors/kv_store.hpp"
#include "dist/allreduce_shm.hpp"

namespace af {

/// A blocking collective group of `size` ranks, usable from a plain thread or
/// a detached actor. One call at a time per group; every rank must make the
/// same calls in the same order with the same counts.
class allreduce_group {
public:
  /// Joins the group as `rank` in [0, size). `group` namespaces the keys in
  /// the store and must be new for each incarnation of the group (the store
  /// keeps old addresses). Listens on `bind_host` (empty or 0.0.0.0: all
  /// interfaces, advertised under the host name) at a port the OS picks.
  /// The whole rendezvous is bounded by `timeout`; its errors name the rank
  /// that was missing and what was waited for. In collectives, `timeout` is
  /// the longest a call waits with no byte moving.
  static caf::expected<std::unique_ptr<allreduce_group>>
  create(uint32_t rank, uint32_t size, const std::string& group, kv_client& store,
         std::chrono::milliseconds timeout, const std::string& bind_host = "127.0.0.1");

  ~allreduce_group(); ///< closes the sockets: the neighbours' pending calls fail

  allreduce_group(const allreduce_group&) = delete;
  allreduce_group& operator=(const allreduce_group&) = delete;

  /// In place: every rank ends with the element-wise mean of all ranks' `data`.
  caf::error allreduce_mean(float* data, size_t n);

  /// In place: every rank ends with the element-wise sum.
  caf::error allreduce_sum(float* data, size_t n);

  /// Every rank ends with `root`'s `data`.
  caf::error broadcast(float* data, size_t n, uint32_t root);

  uint32_t rank() const { return rank_; }
  uint32_t size() const { return size_; }
  const std::string& name() const { return group_; }

  /// "host:port" this rank published.
  const std::string& address() const { return address_; }

  /// The system calls of the last call (for the bench and the tests): its
  /// sends and receives of data and headers on TCP (a link on shared memory
  /// counts none; its doorbells neither) and its sleeps. A 2-rank all-reduce
  /// of 4 MiB on TCP makes a few sends and receives a rank, not one per
  /// 256 KiB, and its header rides in the send of its first data.
  struct call_stats {
    uint64_t sends = 0;        ///< send calls that moved bytes
    uint64_t receives = 0;     ///< receive calls that moved bytes
    uint64_t empty = 0;        ///< send or receive calls that moved nothing
    uint64_t sleeps = 0;       ///< polls
    size_t largest_send = 0;   ///< the most bytes one send moved
  };
  const call_stats& last_call() const { return stats_; }

  /// True after a failed call: every later call fails at once.
  bool broken() const { return !broken_.empty(); }

  /// True if the link to the right neighbour (rank + 1) is shared memory.
  bool shm_to_right() const { return out_shm_ != nullptr; }
  /// True if the link from the left neighbour (rank - 1) is shared memory.
  bool shm_from_left() const { return in_shm_ != nullptr; }
  /// How this rank's two links move their bytes, and why a link that could
  /// not take shared memory stayed on TCP, for the log: "shared memory to
  /// and from rank 1" (two ranks), "shared memory to rank 1, TCP (on another
  /// host) from rank 2", "TCP (ACTORFLOW_DATA_SHM=off here) to rank 1, ...",
  /// "TCP to and from rank 1: shared memory fell back to TCP, as the link
  /// to rank 1 is on TCP (...) and both directions share one connection".
  std::string transport() const;

private:
  enum class op : uint8_t { sum = 1, mean, broadcast };

  struct progress; ///< where a call stands (allreduce.cpp)

  /// One piece of a call's outgoing stream, to the right neighbour.
  struct out_part {
    const char* src;
    size_t bytes;
    int after; ///< index of the incoming part whose processed prefix gates this one; -1: none
  };

  /// One piece of a call's incoming stream, from the left neighbour.
  struct in_part {
    enum kind_type { header, copy, reduce } kind;
    char* buf;               ///< where the bytes land (scratch for reduce)
    size_t bytes;
    float* target = nullptr; ///< reduce: what the received floats are added to
    float divisor = 0;       ///< reduce: divide the sums by it (mean's last step); 0: no
  };

  allreduce_group(uint32_t rank, uint32_t size, std::string group, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), group_(std::move(group)), timeout_(timeout) {}

  caf::error reduce(op kind, float* data, size_t n);
  caf::error run(op kind, size_t n, uint32_t root, std::vector<out_part>& outs,
                 std::vector<in_part>& ins);
  caf::error closed(const progress& p, uint32_t peer, const char* how);
  caf::error pull(progress& p, bool& moved);
  caf::error push(progress& p, bool& moved);
  caf::error absorb(progress& p, const char* src, size_t k);
  caf::error idle(progress& p);
  caf::error negotiate_shm(std::chrono::steady_clock::time_point deadline);
  void one_transport_for_two();
  caf::error check_header(op kind, size_t n, uint32_t root);
  caf::error fail(caf::error err);
  std::string who() const;
  static std::string describe_call(op kind, size_t n, uint32_t root);
  uint32_t left() const { return (rank_ + size_ - 1) % size_; }
  uint32_t right() const { return (rank_ + 1) % size_; }

  uint32_t rank_;
  uint32_t size_;
  std::string group_;
  std::chrono::milliseconds timeout_;
  std::string address_;
  std::string right_address_;
  int left_fd_ = -1;  ///< we read from it (and ring doorbells, with shared memory)
  int right_fd_ = -1; ///< we write to it; two ranks: the same connection as left_fd_
  std::unique_ptr<shm_link> out_shm_; ///< the link to the right in shared memory, if it is
  std::unique_ptr<shm_link> in_shm_;  ///< the link from the left in shared memory, if it is
  std::string out_why_tcp_;           ///< why the link to the right stayed on TCP
  std::string in_why_tcp_;            ///< why the link from the left stayed on TCP
  /// Two ranks: why a link that took shared memory fell back to TCP with the
  /// other (one_transport_for_two); empty if none did.
  std::string fell_back_;
  uint64_t calls_ = 0;
  std::string broken_; ///< why the group broke; empty while healthy
  std::vector<float> scratch_;
  /// The headers of the current call: ours (sent) and the left's (received).
  struct call_header {
    uint32_t magic = 0;
    uint8_t kind = 0;
    uint8_t reserved[3] = {0, 0, 0};
    uint32_t root = 0;
    uint32_t ranks = 0;
    uint64_t call = 0;
    uint64_t count = 0;
  };
  call_header sent_;
  call_header received_;
  call_stats stats_;
  /// A call's parts, kept between calls so that a call allocates nothing.
  std::vector<out_part> outs_;
  std::vector<in_part> ins_;
};

} // namespace af
