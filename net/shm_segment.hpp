#pragma once
/// A POSIX shared-memory segment between two processes of one user on one
/// host: what the data plane's rings (net/shm_ring.hpp) and the all-reduce
/// ring's links (dist/allreduce_shm.hpp) both do to create, offer, check and
/// map one (docs/security.md "Shared memory"). The layout inside is theirs.

#include <atomic>
#include <cstdint>
#include <string>

#include "caf/error.hpp"
#include "caf/expected.hpp"

namespace af::shm_segment {

/// One direction's counters, in the segment. The writer alone moves `head`,
/// the reader alone `tail`. Each waiting flag is raised by the side that goes
/// to sleep and taken down (exchange) by the other, which then rings its
/// bell: so each cache line holds what one side's copy loop touches, not
/// what one side writes: `head` with `reader_waiting` (the writer looks at
/// it as it publishes), `tail` with `writer_waiting` (likewise the reader).
/// Counters are bytes since the start, so that head - tail is what the ring
/// holds and never wraps in practice (2^64). Neither side trusts the other's
/// counter: head - tail over the ring's size (the one checked at open(),
/// not the header's) fails the ring as corrupt.
struct ring_control {
  alignas(64) std::atomic<uint64_t> head;
  std::atomic<uint32_t> reader_waiting; ///< the reader sleeps: wake it
  alignas(64) std::atomic<uint64_t> tail;
  std::atomic<uint32_t> writer_waiting; ///< the writer sleeps for room: wake it
};

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the rings' counters are shared between processes: they must be lock-free");

/// A segment just created, mapped and still named.
struct created {
  std::string name;
  void* base = nullptr;
};

/// A fresh segment of `bytes` named `prefix` + pid-counter-random: created
/// exclusively (O_EXCL, mode 0600), its pages reserved (posix_fallocate, so
/// that a full /dev/shm is an error here and not a SIGBUS later) and mapped.
/// Segments under `prefix` whose creator (the pid in the name) is gone are
/// removed first. On an error nothing is left named or mapped.
caf::expected<created> create(const char* prefix, uint64_t bytes);

/// What open() says when it refuses, so that each user's errors name its
/// own kind of segment.
struct words {
  const char* unreachable; ///< why shm_open may fail (the peer elsewhere)
  const char* unreserved;  ///< appended to "only N of its M bytes are reserved"
  const char* one_per;     ///< "one segment per ..." for a hard-linked one
};

/// True when `name` starts with `prefix`, holds only [A-Za-z0-9._-] after
/// it and has 200 characters at most.
bool plain_name(const std::string& name, const char* prefix);

/// The error for refusing segment `name`: "shared memory '<name>': <why>".
caf::error refuse(const std::string& name, const std::string& why);

/// The peer's segment `name` of `bytes`, mapped, if it is a regular file of
/// this user of exactly that size with all its pages reserved (a sparse one
/// is removed) and no other name; its name is removed once mapped (or
/// not). The caller checked the name (plain_name) and the size.
caf::expected<void*> open(const std::string& name, uint64_t bytes, const words& w);

/// A segment's name as an error may show it: printable, cut short.
std::string printable(const std::string& name);

} // namespace af::shm_segment
