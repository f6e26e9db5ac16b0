#include "dist/allreduce_shm.hpp"

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "messages/error.hpp"
#include "net/shm_segment.hpp"

namespace af {

// shm_link::control: the link's counters and waiting flags, as the data
// plane's rings' (net/shm_segment.hpp); a sleeping reader or writer polls
// the socket and wants a doorbell byte.

namespace {

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

} // namespace

caf::expected<std::unique_ptr<shm_link>> shm_link::create(uint64_t ring_bytes) {
  if (ring_bytes < min_ring || (ring_bytes & (ring_bytes - 1)) != 0
      || header_bytes + ring_bytes > max_segment_bytes)
    return make_error(af_error::invalid_argument,
                      fmt::format("a shared-memory link of {} bytes: it must be a power of two "
                                  "from {} to {} bytes",
                                  ring_bytes, min_ring, max_segment_bytes - header_bytes));
  auto seg = shm_segment::create(name_prefix, header_bytes + ring_bytes);
  if (!seg)
    return std::move(seg.error());
  std::unique_ptr<shm_link> l{new shm_link};
  l->name_ = std::move(seg->name);
  l->named_ = true;
  l->bytes_ = header_bytes + ring_bytes;
  void* p = seg->base;
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
  auto refuse = [&](const std::string& why) { return shm_segment::refuse(name, why); };
  if (!shm_segment::plain_name(name, name_prefix))
    return refuse("not a name of an all-reduce link");
  uint64_t ring = bytes - header_bytes;
  if (bytes <= header_bytes || bytes > max_segment_bytes || ring < min_ring || (ring & (ring - 1)) != 0)
    return refuse(fmt::format("{} bytes is no segment of a link", bytes));
  auto mapped = shm_segment::open(
    name, bytes, {"is the peer on another host, or in another container?", "", "link"});
  if (!mapped)
    return std::move(mapped.error());
  void* p = *mapped;
  std::unique_ptr<shm_link> l{new shm_link};
  l->name_ = name;
  l->base_ = p;
  l->bytes_ = bytes;
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
