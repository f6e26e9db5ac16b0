#pragma once
/// The shared-memory link of the all-reduce ring (dist/allreduce.hpp): a
/// one-way byte ring from a rank to its right neighbour when both are
/// processes of one host. Its own file, not net/shm_ring.hpp's two-way
/// channel, because the ring reads in place: a rank adds the floats it
/// receives straight from the segment into its buffer (no copy out into a
/// scratch buffer), which a channel that copies into the caller's memory
/// cannot do.
///
/// Set-up, as the data plane's shared memory (docs/security.md): the writer
/// creates a POSIX segment (mode 0600, O_EXCL, its pages reserved with
/// posix_fallocate), names it to the reader over their TCP connection; the
/// reader opens it only if it is a regular file of this user, of the size
/// offered, with no other name, maps it and removes its name, and the writer
/// removes it too on the answer: nothing is left in /dev/shm, and the kernel
/// frees the memory when both have unmapped it (or died). Segments of dead
/// processes (killed between create and the reader's open) are removed by
/// the next create of this user.
///
/// Wake-ups, as the data plane's rings: the TCP connection stays open beside
/// the segment as the doorbell and the liveness channel. A side that has
/// nothing to do looks for a while (yielding the CPU), then raises its
/// waiting flag in the segment and polls the socket; the other side sends one
/// byte only when it sees the flag (and has moved enough since its last bell,
/// or ends its call, or is about to sleep itself). A peer that dies closes
/// its socket, which the sleeping side sees at once.
///
/// Not guarded against SIGBUS (net/shm_ring.cpp's guard is for a node that
/// maps its clients' segments): both ends are ranks of one job under one
/// user, who could as well ptrace each other; a stranger cannot open the
/// segment (0600, and the owner is checked).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "caf/expected.hpp"

#include "net/shm_segment.hpp"

namespace af {

/// One direction of the ring's link, mapped: the writer's or the reader's end.
class shm_link {
public:
  /// Bytes of the ring (a power of two). A writer that can put all of a
  /// call's bytes in at once sleeps less: a 2-rank all-reduce of 4 MiB
  /// writes 4 MiB and a 32-byte header per call, and on the 2-vCPU test VM
  /// a 4 MiB ring (full for the last 32 bytes) slept 4.3 times a call
  /// against 0.6 with 8 MiB (0.99 of the raw exchange instead of 0.93); with
  /// 1 MiB, 4-8 ms a call instead of 1.2-1.5 under load.
  static constexpr uint64_t default_ring_bytes = uint64_t{8} << 20;
  /// The most a reader maps for one link.
  static constexpr uint64_t max_segment_bytes = uint64_t{256} << 20;
  /// The names of the segments in /dev/shm start with this (then the pid).
  static constexpr const char* name_prefix = "/actorflow-ar-";

  /// The writer's end: a fresh segment with a ring of `ring_bytes`, named
  /// (name()) until unlink().
  static caf::expected<std::unique_ptr<shm_link>> create(uint64_t ring_bytes = default_ring_bytes);

  /// The reader's end: maps segment `name` of `bytes` (as the offer says),
  /// checks that it is one of ours, of this user and of that size, and
  /// removes its name.
  static caf::expected<std::unique_ptr<shm_link>> open(const std::string& name, uint64_t bytes);

  ~shm_link();
  shm_link(const shm_link&) = delete;
  shm_link& operator=(const shm_link&) = delete;

  const std::string& name() const { return name_; }
  uint64_t segment_bytes() const { return bytes_; }

  /// Removes the segment's name (idempotent): the mapping stays.
  void unlink();

  /// Writer: where the next bytes go, and how many fit there contiguously
  /// (`n`; 0: the ring is full).
  char* room(uint64_t& n);
  /// Writer: publishes the `n` bytes written at room().
  void commit(uint64_t n);

  /// Reader: the oldest unread bytes, and how many are contiguous there
  /// (`n`; 0: none).
  const char* data(uint64_t& n);
  /// Reader: frees the first `n` bytes of data() for the writer.
  void consume(uint64_t n);

  /// True once the peer's counter was found out of bounds: the link is
  /// broken (room() and data() then give nothing).
  bool corrupt() const { return corrupt_; }

  /// Raises (or lowers) this end's waiting flag: the writer waits for room,
  /// the reader for data. Raise it, look again, then sleep on the socket.
  void sleeping(bool on);

  /// Rings the peer's bell (one byte on `fd`, the link's TCP connection) if
  /// it sleeps waiting for this end, and `force` or enough bytes moved since
  /// the last bell. Before this end sleeps or ends its call: force.
  void wake_peer(int fd, bool force);

  /// In the segment: the counters and flags (net/shm_segment.hpp).
  using control = shm_segment::ring_control;

private:
  shm_link() = default;

  std::string name_;
  bool named_ = false;
  bool writer_ = false;
  bool corrupt_ = false;
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t ring_ = 0;
  control* ctl_ = nullptr;
  char* data_ = nullptr;
  uint64_t pos_ = 0;    ///< writer: head; reader: tail (ours alone)
  uint64_t belled_ = 0; ///< pos_ when the peer was last rung
};

} // namespace af
