#include "dist/allreduce_shm.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "messages/error.hpp"

namespace af {

/// The link's counters, in the segment (as net/shm_ring.cpp's): the writer
/// alone moves `head`, the reader alone `tail`; each cache line holds what
/// one side's loop touches. Counters are bytes since the start (head - tail
/// is what the ring holds; 2^64 never wraps in practice). Neither side
/// trusts the other's counter: out of bounds, the link is corrupt.
struct shm_link::control {
  alignas(64) std::atomic<uint64_t> head;
  std::atomic<uint32_t> reader_waiting; ///< the reader sleeps in poll: ring its bell
  alignas(64) std::atomic<uint64_t> tail;
  std::atomic<uint32_t> writer_waiting; ///< the writer sleeps for room: ring its bell
};

namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the link's counters are shared between processes: they must be lock-free");

constexpr uint64_t segment_magic = 0x314b4c5241464641; // "AFFARLK1"
constexpr uint64_t header_bytes = 4096;                 // magic, ring size, the control
constexpr uint64_t min_ring = uint64_t{64} << 10;
/// A sleeping peer is rung once this much has moved since its last bell (and
/// whenever this side ends a piece or must wait itself): a bell per small
/// chunk would wake it for little work each time.
constexpr uint64_t bell_bytes = uint64_t{256} << 10;

struct segment_header {
  uint64_t magic;
  uint64_t ring_bytes;
};

shm_link::control* control_of(void* base) {
  return reinterpret_cast<shm_link::control*>(static_cast<char*>(base) + 128);
}

/// A segment's name as an error may show it: printable, cut short.
std::string printable(const std::string& name) {
  std::string out;
  for (char c : name.substr(0, 80)) {
    auto u = static_cast<unsigned char>(c);
    out += u >= 0x20 && u < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", u);
  }
  return name.size() > 80 ? out + "..." : out;
}

/// Removes segments of ours whose creator (its pid is in the name) is gone:
/// one killed between creating its segment and its reader's open.
void remove_stale_segments() {
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr)
    return;
  std::string prefix = shm_link::name_prefix + 1; // without the '/'
  while (auto* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0)
      continue;
    auto pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      ::shm_unlink(("/" + name).c_str());
  }
  ::closedir(d);
}

} // namespace

caf::expected<std::unique_ptr<shm_link>> shm_link::create(uint64_t ring_bytes) {
  if (ring_bytes < min_ring || (ring_bytes & (ring_bytes - 1)) != 0
      || header_bytes + ring_bytes > max_segment_bytes)
    return make_error(af_error::invalid_argument,
                      fmt::format("a shared-memory link of {} bytes: it must be a power of two "
                                  "from {} to {} bytes",
                                  ring_bytes, min_ring, max_segment_bytes - header_bytes));
  remove_stale_segments();
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  std::unique_ptr<shm_link> l{new shm_link};
  l->name_ = fmt::format("{}{}-{}-{:08x}", name_prefix, ::getpid(), counter++, rd());
  l->bytes_ = header_bytes + ring_bytes;
  int fd = ::shm_open(l->name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return make_error(af_error::resource_exhausted,
                      fmt::format("cannot create shared memory {}: {}", l->name_, std::strerror(errno)));
  l->named_ = true;
  // Reserved now: a full /dev/shm is an error here, not a SIGBUS at the
  // first touch of a page that cannot be had.
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(l->bytes_));
  if (rc != 0) {
    ::close(fd);
    return make_error(af_error::resource_exhausted,
                      fmt::format("cannot reserve {} bytes of shared memory in /dev/shm: {}",
                                  l->bytes_, std::strerror(rc)));
  }
  void* p = ::mmap(nullptr, l->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED)
    return make_error(af_error::resource_exhausted,
                      fmt::format("cannot map {} bytes of shared memory: {}", l->bytes_,
                                  std::strerror(errno)));
  l->base_ = p;
  l->writer_ = true;
  l->ring_ = ring_bytes;
  auto* h = static_cast<segment_header*>(p);
  h->magic = segment_magic;
  h->ring_bytes = ring_bytes;
  l->ctl_ = control_of(p);
  l->data_ = static_cast<char*>(p) + header_bytes;
  return l;
}

caf::expected<std::unique_ptr<shm_link>> shm_link::open(const std::string& name, uint64_t bytes) {
  auto refuse = [&](const std::string& why) {
    return make_error(af_error::invalid_argument, "shared memory '" + printable(name) + "': " + why);
  };
  std::string prefix = name_prefix;
  bool plain = std::all_of(name.begin() + std::min(name.size(), prefix.size()), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_' || c == '.';
  });
  if (name.size() > 200 || name.rfind(prefix, 0) != 0 || !plain)
    return refuse("not a name of an all-reduce link");
  uint64_t ring = bytes - header_bytes;
  if (bytes <= header_bytes || bytes > max_segment_bytes || ring < min_ring || (ring & (ring - 1)) != 0)
    return refuse(fmt::format("{} bytes is no segment of a link", bytes));
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (fd < 0)
    return refuse(fmt::format("cannot open it ({}): is the peer on another host, or in "
                              "another container?",
                              std::strerror(errno)));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()
      || static_cast<uint64_t>(st.st_size) != bytes) {
    ::close(fd); // (not unlinked: it may not be this user's; its writer removes it)
    return refuse("not a segment of this user of the size offered");
  }
  if (static_cast<uint64_t>(st.st_blocks) * 512 < bytes) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return refuse(fmt::format("only {} of its {} bytes are reserved",
                              static_cast<uint64_t>(st.st_blocks) * 512, bytes));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  // Mapped (or not): the name goes now, so that nothing is left in /dev/shm.
  ::shm_unlink(name.c_str());
  // No other name may lead to it: one segment is one link.
  bool linked = ::fstat(fd, &st) != 0 || st.st_nlink != 0;
  ::close(fd);
  if (p == MAP_FAILED)
    return refuse(fmt::format("cannot map it: {}", std::strerror(errno)));
  std::unique_ptr<shm_link> l{new shm_link};
  l->name_ = name;
  l->base_ = p;
  l->bytes_ = bytes;
  if (linked)
    return refuse("it has another name in /dev/shm (a hard link): one segment per link");
  auto* h = static_cast<segment_header*>(p);
  if (h->magic != segment_magic || h->ring_bytes != ring)
    return refuse("its header is not ours");
  l->ring_ = ring;
  l->ctl_ = control_of(p);
  l->data_ = static_cast<char*>(p) + header_bytes;
  // Where the writer's counters are now (0 for a fresh link).
  l->pos_ = l->belled_ = l->ctl_->tail.load(std::memory_order_acquire);
  return l;
}

shm_link::~shm_link() {
  unlink();
  if (base_ != nullptr)
    ::munmap(base_, bytes_);
}

void shm_link::unlink() {
  if (named_)
    ::shm_unlink(name_.c_str());
  named_ = false;
}

char* shm_link::room(uint64_t& n) {
  n = 0;
  if (corrupt_)
    return data_;
  uint64_t used = pos_ - ctl_->tail.load(); // seq_cst: after sleeping()'s store
  if (used > ring_) {
    corrupt_ = true;
    return data_;
  }
  uint64_t off = pos_ & (ring_ - 1);
  n = std::min(ring_ - used, ring_ - off);
  return data_ + off;
}

void shm_link::commit(uint64_t n) {
  pos_ += n;
  ctl_->head.store(pos_); // seq_cst: ordered before wake_peer's look at the flag
}

const char* shm_link::data(uint64_t& n) {
  n = 0;
  if (corrupt_)
    return data_;
  uint64_t avail = ctl_->head.load() - pos_; // seq_cst: after sleeping()'s store
  if (avail > ring_) {
    corrupt_ = true;
    return data_;
  }
  uint64_t off = pos_ & (ring_ - 1);
  n = std::min(avail, ring_ - off);
  return data_ + off;
}

void shm_link::consume(uint64_t n) {
  pos_ += n;
  ctl_->tail.store(pos_);
}

void shm_link::sleeping(bool on) {
  (writer_ ? ctl_->writer_waiting : ctl_->reader_waiting).store(on ? 1 : 0);
}

void shm_link::wake_peer(int fd, bool force) {
  auto& flag = writer_ ? ctl_->reader_waiting : ctl_->writer_waiting;
  if (pos_ == belled_ || (!force && pos_ - belled_ < bell_bytes))
    return;
  // The flag is taken down here, so that one sleep gets one bell.
  if (flag.load() != 0 && flag.exchange(0) != 0) {
    char byte = 1;
    // Never blocks: at most one byte is in flight per sleep of the peer.
    [[maybe_unused]] auto r = ::send(fd, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    belled_ = pos_;
  }
}

} // namespace af
