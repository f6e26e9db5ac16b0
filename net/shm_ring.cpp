#include "net/shm_ring.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <cerrno>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "messages/error.hpp"
#include "net/shm_segment.hpp"

namespace af {

// shm_channel::control: one direction's counters and waiting flags
// (net/shm_segment.hpp); a flag says how its side sleeps (below).

namespace {

/// "AFDPSHM4": version 4 has answer slots after the rings (its size is no
/// longer 4 KiB + two rings, and replies may name a slot: an older node
/// refuses the segment, an older client's is refused here, saying so, and
/// the client stays on TCP); version 3 may send wire::kind::shm_pad frames;
/// version 2 wakes a sleeper by a futex in the segment (version 1, by a
/// doorbell byte only, would sleep through our wake-ups).
constexpr uint64_t segment_magic = 0x344d485350444641;
/// The magic's first 7 bytes, "AFDPSHM": a segment of another version.
constexpr uint64_t magic_family = 0x004d485350444641;
constexpr uint64_t magic_family_mask = 0x00ffffffffffffff;
/// magic, ring and slot sizes, the two controls (128, 256), the slots'
/// words (384, 448)
constexpr uint64_t header_bytes = 4096;
constexpr uint64_t slot_alignment = 4096;
/// A slot's word: the node may write it, or it is the client's (from the
/// reply that names it until the last copy of its buffer is dropped).
constexpr uint32_t slot_free = 0;
constexpr uint32_t slot_taken = 1;
constexpr uint64_t min_ring = uint64_t{64} << 10;
/// Bytes copied before the other side is told (counters published): small
/// enough that the two copies (into the ring, out of it) overlap, large
/// enough that the doorbells stay few. 64 KiB and 256 KiB measured alike
/// within the noise of a loaded 2-vCPU VM (64 KiB a little ahead on reads);
/// a 16 MiB ring was no faster than 4 MiB (docs/wire.md "Shared memory").
constexpr uint64_t publish_chunk = uint64_t{64} << 10;
/// A sleeping peer is woken (its doorbell byte) once this much has moved
/// since its last bell, and whenever this side finishes or must wait itself:
/// when the two ends share a busy CPU, a wake-up per published chunk cost
/// ~40 us per 64 KiB (runs of 1.2-1.6 GB/s instead of 4-7 GB/s).
constexpr uint64_t bell_bytes = uint64_t{1} << 20;
/// More doorbell bytes than this during one wait: not a peer of ours.
constexpr size_t max_bells_per_wait = 4096;
/// A waiting flag: the side is awake, asleep on the flag as a futex, or
/// asleep in poll on the socket (then it wants a doorbell byte).
constexpr uint32_t awake = 0;
constexpr uint32_t on_futex = 1;
constexpr uint32_t on_socket = 2;
struct segment_header {
  uint64_t magic;
  uint64_t ring_bytes;
  uint64_t slot_bytes; ///< each answer slot's (0: none)
};

// -- SIGBUS guard -------------------------------------------------------------
//
// The peer keeps a descriptor of the segment (or a link to it) and can
// shrink it (ftruncate) or punch holes in it; a page this process then
// touches is past the file's end, or cannot be had, and the kernel sends
// SIGBUS: a dead node for a bad client. So the mapped segments are listed
// here, and a SIGBUS at an address in one of them maps zero pages over that
// whole segment (MAP_FIXED, anonymous: the access then goes on) and marks it
// poisoned; its channel fails as corrupt at its next check. Any other
// SIGBUS goes to the handler that was there before, or kills the process as
// it would have. (As Wayland compositors guard their clients' pools.)

struct guarded_segment {
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> bytes{0};
  std::atomic<bool> poisoned{false};
};

constexpr int max_guarded = 1024;
guarded_segment guarded[max_guarded];
struct sigaction bus_before {};

void on_sigbus(int sig, siginfo_t* info, void* context) {
  auto at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (auto& g : guarded) {
    uintptr_t base = g.base.load(std::memory_order_acquire);
    size_t bytes = g.bytes.load(std::memory_order_acquire);
    if (base != 0 && at >= base && at - base < bytes) {
      // mmap is async-signal-safe (a system call).
      void* zero = ::mmap(reinterpret_cast<void*>(base), bytes, PROT_READ | PROT_WRITE,
                          MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (zero != MAP_FAILED) {
        g.poisoned.store(true, std::memory_order_release);
        return;
      }
      break;
    }
  }
  if ((bus_before.sa_flags & SA_SIGINFO) != 0 && bus_before.sa_sigaction != nullptr) {
    bus_before.sa_sigaction(sig, info, context);
    return;
  }
  if ((bus_before.sa_flags & SA_SIGINFO) == 0 && bus_before.sa_handler != SIG_DFL
      && bus_before.sa_handler != SIG_IGN) {
    bus_before.sa_handler(sig);
    return;
  }
  // The default: returning re-runs the faulting access, which now kills.
  ::signal(SIGBUS, SIG_DFL);
}

/// A slot of `guarded` for [base, base + bytes); -1 when all are taken (the
/// caller then does without shared memory).
int guard_segment(void* base, size_t bytes) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &bus_before);
  });
  // A slot's bytes are 0 while it is free or being taken: the handler
  // matches no address in it until both are set (the segment is not
  // touched before this returns).
  for (int i = 0; i < max_guarded; ++i) {
    uintptr_t free_slot = 0;
    if (guarded[i].base.load() == 0
        && guarded[i].base.compare_exchange_strong(free_slot, reinterpret_cast<uintptr_t>(base))) {
      guarded[i].poisoned.store(false);
      guarded[i].bytes.store(bytes, std::memory_order_release);
      return i;
    }
  }
  return -1;
}

void unguard_segment(int slot) {
  if (slot < 0)
    return;
  guarded[slot].bytes.store(0, std::memory_order_release);
  guarded[slot].base.store(0, std::memory_order_release);
}

shm_channel::control* control_at(void* base, int which) {
  return reinterpret_cast<shm_channel::control*>(static_cast<char*>(base) + 128 * (which + 1));
}

std::atomic<uint32_t>* slot_word_at(void* base, int k) {
  return reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(base) + 384 + 64 * k);
}

void ring_bell(int fd) {
  char byte = 1;
  // Never blocks: at most one byte is in flight per wait (the flag is taken
  // by exchange), and a full socket would mean a peer that reads none.
  [[maybe_unused]] auto n = ::send(fd, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

// The futex is the waiting flag itself, in the shared segment (so not a
// FUTEX_PRIVATE one): the waker takes the flag (exchange) and wakes it.
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex is 32 bits");

/// Sleeps while `word` holds `expected`, at most `us`: 0 woken, else -1 and
/// errno (EAGAIN: it held something else already; ETIMEDOUT; EINTR).
long futex_wait(std::atomic<uint32_t>& word, uint32_t expected, long long us) {
  timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, &ts,
                   nullptr, 0);
}

/// Wakes the peer asleep on `flag`, if it is (by the way it sleeps): true if
/// it was.
bool wake_peer(std::atomic<uint32_t>& flag, int fd) {
  if (flag.load() == awake)
    return false;
  uint32_t how = flag.exchange(awake);
  if (how == on_futex)
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&flag), FUTEX_WAKE, 1, nullptr, nullptr, 0);
  else if (how != awake)
    ring_bell(fd);
  return how != awake;
}

} // namespace

/// Unguarded and unmapped when the channel and every buffer it lent
/// (lend()) are gone: a holder of a payload read in place never touches
/// unmapped memory, whatever became of the connection.
struct shm_channel::mapping {
  void* base = nullptr; ///< the segment
  uint64_t bytes = 0;
  int guard = -1; ///< its slot in the SIGBUS guard
  void* twice = nullptr; ///< the incoming ring, twice in a row (map_incoming_twice)
  uint64_t twice_bytes = 0;
  int twice_guard = -1;
  /// The client's own note of the answer slots it has lent (take_answer):
  /// a node that names a slot again before it was given back is refused,
  /// whatever the slot's word in the segment says.
  std::atomic<bool> answer_lent[answer_slots] = {};

  mapping() = default;
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
  ~mapping() {
    unguard_segment(twice_guard);
    if (twice != nullptr)
      ::munmap(twice, twice_bytes);
    unguard_segment(guard);
    if (base != nullptr)
      ::munmap(base, bytes);
  }

  bool poisoned() const {
    for (int slot : {guard, twice_guard})
      if (slot >= 0 && guarded[slot].poisoned.load(std::memory_order_acquire))
        return true;
    return false;
  }
};

bool shm_channel::disabled_by_environment() {
  const char* v = std::getenv("ACTORFLOW_DATA_SHM");
  if (v == nullptr)
    return false;
  std::string s = v;
  return s == "off" || s == "0" || s == "no" || s == "false";
}

bool shm_channel::same_host(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t llen = sizeof(local), plen = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0
      || ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0
      || local.ss_family != peer.ss_family)
    return false;
  if (peer.ss_family == AF_INET) {
    auto p = reinterpret_cast<sockaddr_in*>(&peer)->sin_addr.s_addr;
    auto l = reinterpret_cast<sockaddr_in*>(&local)->sin_addr.s_addr;
    return (ntohl(p) >> 24) == 127 || p == l;
  }
  if (peer.ss_family == AF_INET6) {
    auto& p = reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr;
    auto& l = reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&p))
      return true;
    if (IN6_IS_ADDR_V4MAPPED(&p) && p.s6_addr[12] == 127)
      return true;
    return std::memcmp(&p, &l, sizeof(p)) == 0;
  }
  return false;
}

caf::expected<std::unique_ptr<shm_channel>> shm_channel::create(uint64_t ring_bytes,
                                                                uint64_t slot_bytes) {
  if (ring_bytes < min_ring || (ring_bytes & (ring_bytes - 1)) != 0
      || header_bytes + 2 * ring_bytes > max_segment_bytes)
    return make_error(af_error::invalid_argument,
                      fmt::format("a shared-memory ring of {} bytes: it must be a power of two "
                                  "from {} to {} bytes",
                                  ring_bytes, min_ring, (max_segment_bytes - header_bytes) / 2));
  if (slot_bytes % slot_alignment != 0 || slot_bytes > max_segment_bytes
      || header_bytes + 2 * ring_bytes + answer_slots * slot_bytes > max_segment_bytes)
    return make_error(af_error::invalid_argument,
                      fmt::format("shared-memory answer slots of {} bytes: a multiple of {} bytes "
                                  "that keeps the segment within {} bytes",
                                  slot_bytes, slot_alignment, max_segment_bytes));
  auto seg = shm_segment::create(name_prefix,
                                 header_bytes + 2 * ring_bytes + answer_slots * slot_bytes);
  if (!seg)
    return std::move(seg.error());
  std::unique_ptr<shm_channel> ch{new shm_channel};
  ch->name_ = std::move(seg->name);
  ch->named_ = true;
  ch->bytes_ = header_bytes + 2 * ring_bytes + answer_slots * slot_bytes;
  void* p = seg->base;
  ch->base_ = p;
  ch->map_ = std::make_shared<mapping>();
  ch->map_->base = p;
  ch->map_->bytes = ch->bytes_;
  ch->map_->guard = guard_segment(p, ch->bytes_);
  if (ch->map_->guard < 0)
    return make_error(af_error::resource_exhausted,
                      fmt::format("no room to guard another shared-memory segment ({} at once)",
                                  max_guarded));
  ch->ring_ = ring_bytes;
  auto* h = static_cast<segment_header*>(p);
  h->magic = segment_magic;
  h->ring_bytes = ring_bytes;
  h->slot_bytes = slot_bytes;
  ch->out_ = control_at(p, 0); // to the node
  ch->in_ = control_at(p, 1);
  ch->out_data_ = static_cast<char*>(p) + header_bytes;
  ch->in_data_ = ch->out_data_ + ring_bytes;
  ch->set_slots(slot_bytes); // (fresh pages: every slot's word says free)
  ch->map_incoming_twice(); // else reads copy (peekable() false)
  return ch;
}

caf::expected<std::unique_ptr<shm_channel>> shm_channel::open(const std::string& name, uint64_t bytes) {
  auto refuse = [&](const std::string& why) { return shm_segment::refuse(name, why); };
  if (!shm_segment::plain_name(name, name_prefix))
    return refuse("not a name of an actorflow segment");
  if (bytes < header_bytes + 2 * min_ring || bytes > max_segment_bytes)
    return refuse(fmt::format("{} bytes is no segment of two rings", bytes));
  auto mapped = shm_segment::open(name, bytes,
                                  {"is the peer on another host?",
                                   " (the client must posix_fallocate it)", "connection"});
  if (!mapped)
    return std::move(mapped.error());
  void* p = *mapped;
  std::unique_ptr<shm_channel> ch{new shm_channel};
  ch->name_ = name;
  ch->server_ = true;
  ch->base_ = p;
  ch->bytes_ = bytes;
  ch->map_ = std::make_shared<mapping>();
  ch->map_->base = p;
  ch->map_->bytes = bytes;
  ch->map_->guard = guard_segment(p, bytes);
  if (ch->map_->guard < 0)
    return refuse(fmt::format("no room to guard another segment ({} at once)", max_guarded));
  // The sizes are read once, here: the client may rewrite its header, but
  // this side goes by what it checked.
  auto* h = static_cast<const volatile segment_header*>(p);
  const uint64_t magic = h->magic, ring = h->ring_bytes, slot = h->slot_bytes;
  if (magic != segment_magic && (magic & magic_family_mask) == magic_family) {
    auto version = static_cast<char>(magic >> 56);
    return refuse(fmt::format("it is of another actorflow version (layout AFDPSHM{}, this node's is "
                              "AFDPSHM{}): the connection stays on TCP; run the same build on "
                              "both ends for shared memory",
                              std::isprint(static_cast<unsigned char>(version)) ? version : '?',
                              static_cast<char>(segment_magic >> 56)));
  }
  if (magic != segment_magic)
    return refuse("its header is not ours");
  if (ring < min_ring || ring > max_segment_bytes || (ring & (ring - 1)) != 0
      || slot % slot_alignment != 0 || slot > max_segment_bytes
      || header_bytes + 2 * ring + answer_slots * slot != bytes)
    return refuse(fmt::format("{} bytes is no segment of two rings of {} bytes and {} answer slots "
                              "of {} bytes",
                              bytes, ring, answer_slots, slot));
  ch->ring_ = ring;
  ch->out_ = control_at(p, 1); // to the client
  ch->in_ = control_at(p, 0);
  ch->in_data_ = static_cast<char*>(p) + header_bytes;
  ch->out_data_ = ch->in_data_ + ring;
  ch->set_slots(slot);
  ch->map_incoming_twice(); // else reads copy (peekable() false)
  return ch;
}

void shm_channel::set_slots(uint64_t slot_bytes) {
  slot_ = slot_bytes;
  if (slot_ == 0)
    return;
  slots_ = static_cast<char*>(base_) + header_bytes + 2 * ring_;
  for (int k = 0; k < answer_slots; ++k)
    slot_state_[k] = slot_word_at(base_, k);
}

bool shm_channel::map_incoming_twice() {
  // Address space for two rings, then the incoming ring's pages mapped
  // into both halves (mremap of a shared mapping with old size 0 makes a
  // second mapping of the same pages): the byte after the ring's last is
  // its first again, so a frame that wraps around the end reads as one.
  const uint64_t two = 2 * ring_;
  void* area = ::mmap(nullptr, two, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (area == MAP_FAILED)
    return false;
  map_->twice = area;
  map_->twice_bytes = two;
  for (uint64_t half = 0; half < 2; ++half) {
    void* at = static_cast<char*>(area) + half * ring_;
    // The system call itself: UCX's memory hooks (libucm) replace mremap()
    // with one that drops the new address (it mapped the ring at 0).
    auto got = ::syscall(SYS_mremap, in_data_, 0, ring_, MREMAP_MAYMOVE | MREMAP_FIXED, at);
    if (got == -1 || reinterpret_cast<void*>(got) != at)
      return false;
  }
  map_->twice_guard = guard_segment(area, two);
  if (map_->twice_guard < 0)
    return false;
  in_twice_ = static_cast<const std::byte*>(area);
  return true;
}

shm_channel::~shm_channel() {
  unlink();
  map_.reset(); // unmapped now, unless a buffer lent from it lives on
}

bool shm_channel::poisoned() const {
  return map_ != nullptr && map_->poisoned();
}

void shm_channel::unlink() {
  if (named_)
    ::shm_unlink(name_.c_str());
  named_ = false;
}

namespace {

/// Reads the doorbell bytes waiting on `fd` (and sees its close): false when
/// there are more than any peer of ours sends in one wait (`rung` counts them).
bool take_bells(int fd, size_t& rung, bool& closed) {
  char bells[64];
  for (;;) {
    auto r = ::recv(fd, bells, sizeof(bells), MSG_DONTWAIT);
    if (r > 0) {
      rung += static_cast<size_t>(r);
      if (rung > max_bells_per_wait)
        return false;
      continue;
    }
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      closed = true;
    if (r == 0 || errno != EINTR)
      return true;
  }
}

} // namespace

bool shm_channel::sleep_on(std::atomic<uint32_t>& flag, uint32_t how, int fd, long long us,
                           size_t& rung, bool& closed) {
  int poll_ms = 0;
  if (how == on_futex) {
    // Woken (0) or the flag already taken (EAGAIN): the peer moved on, so
    // it lives; only a sleep that ran out looks at the socket. Such a return
    // is a bell (a peer of ours wakes a sleep once): a peer that keeps
    // changing the word or waking it would otherwise have this side look
    // again at once, for ever, without a sleep; past the bells of a wait
    // it is refused as a flood.
    if (futex_wait(flag, on_futex, us) == 0 || errno != ETIMEDOUT)
      return ++rung <= max_bells_per_wait;
  } else {
    poll_ms = static_cast<int>((us + 999) / 1000);
  }
  pollfd pfd{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  int rc = ::poll(&pfd, 1, poll_ms);
  if (rc > 0) {
    if ((pfd.revents & POLLIN) && !take_bells(fd, rung, closed))
      return false;
    if (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
      closed = true;
  } else if (rc < 0 && errno != EINTR) {
    closed = true;
  }
  return true;
}

template <class Ready>
shm_channel::status shm_channel::wait(Ready ready, std::atomic<uint32_t>& flag, int fd,
                                      const bound& b, bool first,
                                      std::chrono::steady_clock::time_point last_progress,
                                      adaptive_spin& memo) {
  using clock = std::chrono::steady_clock;
  // A short spin first, while spins pay (net/adaptive_spin.hpp).
  if (memo.spin(b.spin, ready))
    return status::done;
  // A futex wake-up costs the waker one system call and no socket: a
  // doorbell byte through loopback TCP costs a send, the receive path and
  // a recv (about as much as the TCP frame it stands in for).
  auto now = clock::now();
  auto futex_until = now + std::chrono::milliseconds{b.futex_ms};
  int stall = first && b.first_ms > 0 ? b.first_ms : b.stall_ms;
  // A peer rings once per sleep of ours (it takes the flag with an
  // exchange): bytes beyond a few per wait are not bells but a peer that
  // floods the socket to burn this side's CPU.
  size_t rung = 0;
  for (;;) {
    if (poisoned())
      return status::corrupt;
    now = clock::now();
    uint32_t how = now < futex_until ? on_futex : on_socket;
    flag.store(how);
    if (ready()) {
      flag.store(awake);
      return status::done;
    }
    auto limit = b.deadline;
    if (stall > 0)
      limit = std::min(limit, last_progress + std::chrono::milliseconds{stall});
    if (now >= limit) {
      flag.store(awake);
      return first && b.first_ms > 0 ? status::idle : status::timeout;
    }
    // Asleep on the futex: the socket and the cancel flag are looked at
    // every check_ms; in poll: the socket wakes it, the ring is looked at
    // again at least every second (every 20 ms with a cancel flag).
    // (check_ms under 1: 1, else the futex's sleeps would be a busy loop.)
    int check_ms = std::max(b.check_ms, 1);
    int poll_ms = b.cancel != nullptr ? 20 : std::max(check_ms, 1000);
    auto slice = how == on_futex ? std::min<clock::time_point>(
                                     futex_until, now + std::chrono::milliseconds{check_ms})
                                 : now + std::chrono::milliseconds{poll_ms};
    auto until = std::min(limit, slice);
    long long us = std::chrono::duration_cast<std::chrono::microseconds>(until - now).count() + 1;
    bool closed = false;
    bool sane = sleep_on(flag, how, fd, us, rung, closed);
    flag.store(awake);
    if (!sane)
      return status::corrupt;
    if (ready())
      return status::done;
    if (closed)
      return status::closed;
    if (b.cancel != nullptr && b.cancel->load())
      return status::cancelled;
  }
}

shm_channel::status shm_channel::write(const iovec* iov, int count, int fd, const bound& b,
                                       uint64_t* moved) {
  using clock = std::chrono::steady_clock;
  uint64_t head = out_->head.load(std::memory_order_relaxed); // ours alone
  uint64_t published = head;
  uint64_t belled = head;
  uint64_t start = head;
  auto last_progress = clock::now();
  bool broken = false;
  auto publish = [&](bool wake = false) {
    if (head != published) {
      out_->head.store(head);
      published = head;
    }
    // (A forced bell also covers what an earlier publish left unbelled.)
    if (published != belled && (wake || published - belled >= bell_bytes)
        && wake_peer(out_->reader_waiting, fd))
      belled = published;
  };
  auto room = [&]() -> uint64_t {
    uint64_t used = head - out_->tail.load(std::memory_order_acquire);
    if (used > ring_) {
      broken = true;
      return 1; // "ready": the caller sees `broken`
    }
    return ring_ - used;
  };
  status st = status::done;
  for (int i = 0; i < count && st == status::done; ++i) {
    auto* p = static_cast<const char*>(iov[i].iov_base);
    uint64_t len = iov[i].iov_len;
    while (len > 0) {
      uint64_t free = room();
      if (broken || poisoned()) {
        st = status::corrupt;
        break;
      }
      if (free == 0) {
        publish(true);
        st = wait([&] { return room() > 0; }, out_->writer_waiting, fd, b, false, last_progress,
                  write_spin_);
        if (st != status::done)
          break;
        last_progress = clock::now();
        continue;
      }
      uint64_t off = head & (ring_ - 1);
      uint64_t chunk = std::min({len, free, ring_ - off, publish_chunk - (head - published)});
      std::memcpy(out_data_ + off, p, chunk);
      head += chunk;
      p += chunk;
      len -= chunk;
      if (head - published >= publish_chunk)
        publish();
    }
  }
  if (st == status::done && broken)
    st = status::corrupt;
  publish(true);
  if (moved != nullptr)
    *moved = head - start;
  return st;
}

shm_channel::status shm_channel::await_bytes(int fd, const bound& b) {
  uint64_t tail = in_->tail.load(std::memory_order_relaxed); // ours alone
  auto ready = [&] { return in_->head.load(std::memory_order_acquire) != tail; };
  if (ready())
    return status::done;
  // The socket carries only doorbell bytes: taken off, so that the end of
  // a peer that died shows behind them even to a look that does not wait
  // (wait() sees it only while it sleeps on the socket).
  char bells[64];
  for (int i = 0; i < 16; ++i) { // a peer rings once per sleep: a few at most
    auto r = ::recv(fd, bells, sizeof(bells), MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      return ready() ? status::done : status::closed;
    if (r < static_cast<ssize_t>(sizeof(bells)))
      break;
  }
  if (ready())
    return status::done;
  if (std::chrono::steady_clock::now() >= b.deadline)
    return status::timeout;
  return wait(ready, in_->reader_waiting, fd, b, false, std::chrono::steady_clock::now(),
              read_spin_);
}

shm_channel::status shm_channel::read(void* dst, uint64_t n, int fd, const bound& b, uint64_t* moved) {
  using clock = std::chrono::steady_clock;
  uint64_t tail = in_->tail.load(std::memory_order_relaxed); // ours alone
  uint64_t published = tail;
  uint64_t belled = tail;
  uint64_t start = tail;
  auto* out = static_cast<char*>(dst);
  auto last_progress = clock::now();
  auto publish = [&](bool wake = false) {
    if (tail != published) {
      in_->tail.store(tail);
      published = tail;
    }
    // (A forced bell also covers what an earlier publish left unbelled.)
    if (published != belled && (wake || published - belled >= bell_bytes)
        && wake_peer(in_->writer_waiting, fd))
      belled = published;
  };
  status st = status::done;
  while (n > 0) {
    uint64_t avail = in_->head.load(std::memory_order_acquire) - tail;
    if (avail > ring_ || poisoned()) {
      st = status::corrupt;
      break;
    }
    if (avail == 0) {
      publish(true);
      st = wait([&] { return in_->head.load(std::memory_order_acquire) != tail; }, in_->reader_waiting,
                fd, b, tail == start, last_progress, read_spin_);
      if (st != status::done)
        break;
      last_progress = clock::now();
      continue;
    }
    uint64_t off = tail & (ring_ - 1);
    uint64_t chunk = std::min({n, avail, ring_ - off, publish_chunk});
    if (out != nullptr) {
      std::memcpy(out, in_data_ + off, chunk);
      out += chunk;
    }
    tail += chunk;
    n -= chunk;
    if (tail - published >= publish_chunk)
      publish();
  }
  publish(true);
  if (moved != nullptr)
    *moved = tail - start;
  return st;
}

shm_channel::status shm_channel::peek(uint64_t n, int fd, const bound& b, const std::byte** at) {
  if (in_twice_ == nullptr || n > ring_)
    return status::corrupt; // (callers ask peekable() and ring_bytes() first)
  const uint64_t tail = in_->tail.load(std::memory_order_relaxed); // ours alone
  auto last_progress = std::chrono::steady_clock::now();
  for (;;) {
    uint64_t avail = in_->head.load(std::memory_order_acquire) - tail;
    if (avail > ring_ || poisoned())
      return status::corrupt;
    if (avail >= n)
      break;
    // Nothing is taken, so the writer is not woken for room: it has room
    // for all n bytes (n fits the ring, and everything before them is taken).
    auto st = wait([&] { return in_->head.load(std::memory_order_acquire) - tail != avail; },
                   in_->reader_waiting, fd, b, false, last_progress, read_spin_);
    if (st != status::done)
      return st;
    last_progress = std::chrono::steady_clock::now();
  }
  *at = in_twice_ + (tail & (ring_ - 1));
  return status::done;
}

void shm_channel::release(uint64_t n, int fd) {
  if (n == 0)
    return;
  in_->tail.store(in_->tail.load(std::memory_order_relaxed) + n);
  wake_peer(in_->writer_waiting, fd);
}

int shm_channel::put_answer(const void* src, uint64_t n) {
  iovec piece{const_cast<void*>(src), n};
  return put_answer(&piece, 1, n);
}

int shm_channel::put_answer(const iovec* pieces, size_t count, uint64_t n) {
  if (n > slot_ || poisoned())
    return -1;
  for (int k = 0; k < answer_slots; ++k) {
    // The client's last holder stored `free` after its last read of the
    // slot (a release): this acquire orders the copy after it.
    if (slot_state_[k]->load(std::memory_order_acquire) != slot_free)
      continue;
    auto* to = slots_ + k * slot_;
    for (size_t i = 0, at = 0; i < count && at < n; ++i) {
      size_t len = std::min<uint64_t>(pieces[i].iov_len, n - at); // never past the slot
      std::memcpy(to + at, pieces[i].iov_base, len);
      at += len;
    }
    // Published with the reply that names the slot (the ring's head is
    // stored after it, and the client loads the head before the bytes).
    slot_state_[k]->store(slot_taken, std::memory_order_relaxed);
    return k;
  }
  return -1;
}

std::shared_ptr<std::byte> shm_channel::take_answer(int k, uint64_t n) {
  if (k < 0 || k >= answer_slots || n > slot_
      || slot_state_[k]->load(std::memory_order_acquire) != slot_taken
      || map_->answer_lent[k].exchange(true))
    return nullptr;
  auto* word = slot_state_[k];
  // The last copy's drop hands the slot back (its reads happen before: the
  // release); the mapping lives until then.
  return std::shared_ptr<std::byte>(reinterpret_cast<std::byte*>(slots_ + k * slot_),
                                    [keep = map_, word, k](std::byte*) {
                                      keep->answer_lent[k].store(false);
                                      word->store(slot_free, std::memory_order_release);
                                    });
}

std::shared_ptr<std::byte> shm_channel::lend(const std::byte* at) const {
  // A count of its own (the connection tells from it when every holder is
  // done: plane_request::payload_in_place), and a share of the mapping.
  return std::shared_ptr<std::byte>(const_cast<std::byte*>(at), [keep = map_](std::byte*) {});
}

} // namespace af
