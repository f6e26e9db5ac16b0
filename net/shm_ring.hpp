#pragma once
/// The data plane's shared-memory transport between two processes of one
/// host (issue 12, part 1; docs/wire.md "Shared memory").
///
/// One data-plane connection upgrades to it after its first answered op: the
/// client creates a POSIX shared-memory segment, names it in a `shm_offer`
/// frame, the node maps it and removes its name, and so does the client on
/// the answer: from then on nothing of it is left in /dev/shm, whatever
/// happens to either process, and the kernel frees the memory when both have
/// unmapped it (or died). The segment holds two byte rings, one per
/// direction, each written by one side and read by the other; the frames
/// (core/wire_format.hpp) go through them unchanged, byte for byte as they would
/// through the socket. The TCP connection stays open beside them as the
/// liveness channel: a side that waits for bytes or room first looks for a
/// few microseconds (yielding the CPU; skipped while such looks keep
/// failing), then raises its "waiting" flag and sleeps on it (a futex in the
/// segment, the socket looked at every few ms), and after a while in poll on
/// the socket; the other side wakes it (futex wake, or one doorbell byte)
/// only when it sees the flag. A peer that dies closes its socket: the
/// waiting side sees POLLRDHUP within a few ms.

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "caf/expected.hpp"

#include "net/adaptive_spin.hpp"
#include "net/ring_status.hpp"
#include "net/shm_segment.hpp"

namespace af {

/// The rings of one connection, mapped.
class shm_channel {
public:
  /// Bytes of each direction's ring (a power of two).
  static constexpr uint64_t default_ring_bytes = uint64_t{4} << 20;
  /// The most a peer may ask a node to map for one connection.
  static constexpr uint64_t max_segment_bytes = uint64_t{256} << 20;
  /// The names of our segments in /dev/shm start with this (then the pid).
  static constexpr const char* name_prefix = "/actorflow-dp-";

  /// The client's side: a fresh segment of two rings of `ring_bytes` and
  /// answer_slots answer slots of `slot_bytes` each (0: none; else a
  /// multiple of 4096), named (name()) until unlink(). Segments left by dead
  /// processes of this user (killed in the moment between create and
  /// unlink) are removed first.
  static caf::expected<std::unique_ptr<shm_channel>> create(uint64_t ring_bytes = default_ring_bytes,
                                                            uint64_t slot_bytes = 0);

  /// The node's side: maps segment `name` of `bytes` (as the offer says),
  /// checks that it is one of ours (of this layout: a segment of another
  /// actorflow version is refused saying so), of this user and of that size,
  /// and removes its name.
  static caf::expected<std::unique_ptr<shm_channel>> open(const std::string& name, uint64_t bytes);

  ~shm_channel();
  shm_channel(const shm_channel&) = delete;
  shm_channel& operator=(const shm_channel&) = delete;

  const std::string& name() const { return name_; }
  uint64_t segment_bytes() const { return bytes_; }

  /// Removes the segment's name (idempotent): the mapping stays.
  void unlink();

  /// How long a read or write may wait, and what ended it (net/ring_status.hpp:
  /// the same for the UCX link).
  using bound = ring_bound;
  using status = ring_status;

  /// Writes all of `iov` into this side's outgoing ring; `fd` is the
  /// connection's socket (the doorbell). `moved`: bytes written.
  status write(const iovec* iov, int count, int fd, const bound& b, uint64_t* moved = nullptr);

  /// Reads exactly `n` bytes from the incoming ring into `dst` (nullptr:
  /// skips them). `moved`: bytes read.
  status read(void* dst, uint64_t n, int fd, const bound& b, uint64_t* moved = nullptr);

  /// Waits as read() does until the incoming ring has a byte, taking none:
  /// done, closed (the peer's socket), timeout (b's deadline) or corrupt.
  status await_bytes(int fd, const bound& b);

  /// Where a payload starts in the ring for the reader to use it in place
  /// (a multiple of this many bytes from the ring's first): the writer pads
  /// before a frame to get there (wire::kind::shm_pad).
  static constexpr uint64_t payload_alignment = 64;

  /// The bytes written to the outgoing ring so far (where the next byte
  /// goes, counted from the ring's first): the writer's own counter.
  uint64_t written() const { return out_->head.load(std::memory_order_relaxed); }

  /// Bytes of each direction's ring: the most peek() shows at once.
  uint64_t ring_bytes() const { return ring_; }

  // -- answers in place (docs/wire.md "An answer is read in place") --------
  //
  // Beside the rings, the segment may hold answer_slots slots for the node's
  // answers. A slot is the node's to write while its word in the segment
  // says free, the client's from the answer that names it until every copy
  // of the buffer take_answer() lent is dropped (the last one frees it): a
  // client may hold an answer (a worker's parameters) while the next one is
  // written into the other slot. When none is free, or an answer does not
  // fit, it goes through the ring as before: never a wait for a slot.

  /// Answer slots in a segment with slot_bytes() > 0.
  static constexpr int answer_slots = 2;
  /// Answers smaller than this go through the ring (a copy this small costs
  /// less than the slot's bookkeeping saves); a client offers slots only
  /// after an answer of at least this size.
  static constexpr uint64_t min_slot_answer = uint64_t{16} << 10;
  /// In a reply's `reserved`, on shared memory: its payload is not in the
  /// ring but in answer slot 0 (reply_in_slot) or 1 (both bits). The other
  /// bits stay wire::reply_flags'.
  static constexpr uint16_t reply_in_slot = 0x8000;
  static constexpr uint16_t reply_slot_one = 0x4000;

  /// The largest answer slot a client offers (a larger answer goes through
  /// the ring): two of them stay within a few connections of the node's
  /// max_shm_bytes.
  static constexpr uint64_t max_slot_bytes = uint64_t{32} << 20;

  /// Bytes of each answer slot (0: the segment has none).
  uint64_t slot_bytes() const { return slot_; }

  /// The node's side: copies the `n` bytes at `src` into a free slot and
  /// hands the slot to the client: its index, or -1 (no slot free, none
  /// that large, or none at all: the ring carries the answer). The reply
  /// that names the slot must follow in the ring.
  int put_answer(const void* src, uint64_t n);

  /// put_answer of `n` bytes gathered from `count` pieces, copied one after
  /// the other into the slot (an answer from its variables' own buffers).
  int put_answer(const iovec* pieces, size_t count, uint64_t n);

  /// The client's side, for a reply that names slot `k` with `n` bytes: the
  /// slot's bytes, lent (as lend(): the mapping lives while a copy does);
  /// dropping the last copy gives the slot back to the node. Null: no such
  /// slot, too many bytes, or one the node did not hand over (a broken
  /// peer: the connection is corrupt).
  std::shared_ptr<std::byte> take_answer(int k, uint64_t n);

  /// Whether peek() can show bytes in place (the incoming ring could be
  /// mapped twice: it can, short of address space or guard slots).
  bool peekable() const { return in_twice_ != nullptr; }

  /// Zero-copy reads: waits until the incoming ring holds the next `n` bytes
  /// (n <= ring_bytes()) and points `at` to them, in place and contiguous
  /// (the ring is mapped twice in a row: bytes that wrap around its end
  /// follow one another). They stay the ring's: the writer gets their room
  /// back only at release(). Between a peek and its release, no read():
  /// a later peek of more bytes (from the same start) may follow, to look
  /// at a payload piece by piece as it arrives.
  status peek(uint64_t n, int fd, const bound& b, const std::byte** at);

  /// Takes the first `n` bytes that peek() showed (the writer may reuse
  /// their room, and is woken if it waits for it).
  void release(uint64_t n, int fd);

  /// A buffer at `at` (inside this channel's mapping: a peek's bytes) that
  /// keeps the mapping alive while any copy of it lives, even after the
  /// channel is gone (a holder never touches unmapped memory). Its copies
  /// are counted apart from other buffers' (use_count()).
  std::shared_ptr<std::byte> lend(const std::byte* at) const;

  /// True if the peer of connected socket `fd` is this host: a loopback
  /// address, or the address this end of the connection has.
  static bool same_host(int fd);

  /// ACTORFLOW_DATA_SHM=off (or 0, no, false) in the environment: never offer
  /// shared memory (a process told to act as if its peers were other hosts).
  static bool disabled_by_environment();

  /// In the segment, one per direction: its counters and waiting flags
  /// (net/shm_segment.hpp says who moves which).
  using control = shm_segment::ring_control;

private:
  shm_channel() = default;
  /// Waits until `ready()` holds: spins (as `memo` says), then sleeps on
  /// `flag` (futex, then `fd`'s doorbell).
  template <class Ready>
  status wait(Ready ready, std::atomic<uint32_t>& flag, int fd, const bound& b, bool first,
              std::chrono::steady_clock::time_point last_progress, adaptive_spin& memo);
  /// Sleeps on `flag` (raised to `how`) for at most `us`; false: the peer's
  /// socket closed or sent more doorbell bytes than any peer of ours would.
  bool sleep_on(std::atomic<uint32_t>& flag, uint32_t how, int fd, long long us, size_t& rung,
                bool& closed);

  /// The peer shrank or punched the segment and a SIGBUS hit it: zero
  /// pages now, and the channel is corrupt (net/shm_ring.cpp).
  bool poisoned() const;

  /// The segment's mapping and the incoming ring's second view of itself
  /// (twice in a row), each in the SIGBUS guard: unmapped when the channel
  /// and every buffer lent from it are gone (net/shm_ring.cpp).
  struct mapping;
  /// Maps the incoming ring (in_data_) twice in a row: false if it cannot.
  bool map_incoming_twice();
  /// The answer slots of `slot_bytes` each after the rings (0: none).
  void set_slots(uint64_t slot_bytes);

  std::string name_;
  std::shared_ptr<mapping> map_;
  bool named_ = false;
  bool server_ = false;
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t ring_ = 0;
  uint64_t slot_ = 0;                   ///< bytes of each answer slot (0: none)
  char* slots_ = nullptr;               ///< the first slot (the others follow)
  std::atomic<uint32_t>* slot_state_[answer_slots] = {}; ///< free (the node's) or the client's
  control* out_ = nullptr;
  control* in_ = nullptr;
  char* out_data_ = nullptr;
  char* in_data_ = nullptr;
  const std::byte* in_twice_ = nullptr; ///< in_data_'s bytes, then the same bytes again
  adaptive_spin read_spin_;  ///< waits for bytes
  adaptive_spin write_spin_; ///< waits for room
};

} // namespace af
