// The all-reduce group's collectives (dist/allreduce.hpp); its set-up is in
// allreduce_rendezvous.cpp.
#include "dist/allreduce.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "net/socket.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr uint32_t header_magic = 0x41464348; // "AFCH"
/// Bytes a shared-memory link moves per step: a rank alternates between
/// taking (adding) and forwarding in pieces of this size, the pipeline.
constexpr size_t shm_slice = 256 * 1024;

// On TCP a send or a receive moves all it can (no slice): the kernel hands
// over what has arrived, so a rank still alternates between receiving (and
// reducing) and forwarding as the bytes come. With 256 KiB slices a 2-rank
// 4 MiB all-reduce made about 42 sends and receives a rank per call against
// the raw exchange's 7; each costs its fixed part, which an idle machine
// shows (0.87-0.99 of the raw exchange there).

void add(float* __restrict target, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i)
    target[i] += src[i];
}

void add_and_divide(float* __restrict target, const float* __restrict src, size_t n, float divisor) {
  // x / 2^k and x * 2^-k are the same float for every x (both are the exact
  // quotient, rounded once): the multiply, several times cheaper, where the
  // bits do not change. Other sizes divide.
  int exponent = 0;
  if (std::frexp(divisor, &exponent) == 0.5f) {
    const float inverse = 1.0f / divisor;
    for (size_t i = 0; i < n; ++i)
      target[i] = (target[i] + src[i]) * inverse;
    return;
  }
  for (size_t i = 0; i < n; ++i)
    target[i] = (target[i] + src[i]) / divisor;
}

/// Reads and drops the doorbell bytes waiting on `fd`; false if the peer
/// closed it (or it failed).
bool drain_bells(int fd) {
  char bells[64];
  for (;;) {
    auto r = ::recv(fd, bells, sizeof(bells), MSG_DONTWAIT);
    if (r > 0)
      continue;
    if (r < 0 && errno == EINTR)
      continue;
    return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

const char* op_name(uint8_t kind) {
  switch (kind) {
    case 1:
      return "allreduce_sum";
    case 2:
      return "allreduce_mean";
    case 3:
      return "broadcast";
    default:
      return "an unknown call";
  }
}

} // namespace

// -- collectives -----------------------------------------------------------------

std::string allreduce_group::who() const {
  return fmt::format("allreduce group '{}' rank {}", group_, rank_);
}

std::string allreduce_group::describe_call(op kind, size_t n, uint32_t root) {
  if (kind == op::broadcast)
    return fmt::format("broadcast of {} floats from rank {}", n, root);
  return fmt::format("{} of {} floats", op_name(static_cast<uint8_t>(kind)), n);
}

caf::error allreduce_group::fail(caf::error err) {
  broken_ = describe(err);
  // The neighbours see the sockets close at once and fail in turn, instead
  // of waiting for their timeouts.
  if (left_fd_ >= 0)
    ::shutdown(left_fd_, SHUT_RDWR);
  if (right_fd_ >= 0 && right_fd_ != left_fd_)
    ::shutdown(right_fd_, SHUT_RDWR);
  return err;
}

caf::error allreduce_group::allreduce_mean(float* data, size_t n) {
  return reduce(op::mean, data, n);
}

caf::error allreduce_group::allreduce_sum(float* data, size_t n) {
  return reduce(op::sum, data, n);
}

caf::error allreduce_group::reduce(op kind, float* data, size_t n) {
  if (!broken_.empty())
    return make_error(af_error::aborted, who() + " is broken since an earlier call failed ("
                                           + broken_ + "); build a new group");
  if (n > 0 && data == nullptr)
    return make_error(af_error::invalid_argument, who() + ": " + describe_call(kind, n, 0)
                                                    + " with no data");
  if (size_ == 1)
    return caf::none; // the sum and the mean of one
  // Segment c of the data: its first float and its length. Rank r owns the
  // sum of segment r + 1 at the end of the reduce-scatter.
  auto seg_len = [&](uint32_t c) { return n / size_ + (c < n % size_ ? 1 : 0); };
  auto seg_off = [&](uint32_t c) { return c * (n / size_) + std::min<size_t>(c, n % size_); };
  auto seg = [&](int64_t c) { return static_cast<uint32_t>(((c % size_) + size_) % size_); };
  try {
    // (A link from the left in shared memory is added from in place.)
    if (!in_shm_ && scratch_.size() < seg_len(0))
      scratch_.resize(seg_len(0));
  } catch (const std::bad_alloc&) {
    return make_error(af_error::resource_exhausted,
                      fmt::format("{}: no memory for a {}-float buffer for {}", who(), seg_len(0),
                                  describe_call(kind, n, 0)));
  }
  auto* bytes = reinterpret_cast<char*>(data);
  auto* scratch = reinterpret_cast<char*>(scratch_.data());
  auto& outs = outs_;
  auto& ins = ins_;
  outs.clear();
  ins.clear();
  auto steps = 2 * (size_ - 1);
  outs.push_back({reinterpret_cast<const char*>(&sent_), sizeof(sent_), -1});
  ins.push_back({in_part::header, reinterpret_cast<char*>(&received_), sizeof(received_)});
  for (uint32_t t = 0; t < steps; ++t) {
    // What is sent in step t is what arrived (and was reduced) in step t - 1:
    // part t of the incoming stream (part 0 is the header).
    int after = t == 0 ? -1 : static_cast<int>(t);
    bool scatter = t < size_ - 1;
    auto s = static_cast<int64_t>(scatter ? t : t - (size_ - 1));
    auto send_seg = scatter ? seg(rank_ - s) : seg(rank_ + 1 - s);
    auto recv_seg = scatter ? seg(rank_ - s - 1) : seg(rank_ - s);
    outs.push_back({bytes + seg_off(send_seg) * sizeof(float), seg_len(send_seg) * sizeof(float), after});
    in_part in{scatter ? in_part::reduce : in_part::copy,
               scatter ? scratch : bytes + seg_off(recv_seg) * sizeof(float),
               seg_len(recv_seg) * sizeof(float)};
    if (scatter) {
      in.target = data + seg_off(recv_seg);
      if (kind == op::mean && t == size_ - 2)
        in.divisor = static_cast<float>(size_);
    }
    ins.push_back(in);
  }
  return run(kind, n, 0, outs, ins);
}

caf::error allreduce_group::broadcast(float* data, size_t n, uint32_t root) {
  if (!broken_.empty())
    return make_error(af_error::aborted, who() + " is broken since an earlier call failed ("
                                           + broken_ + "); build a new group");
  if (root >= size_)
    return make_error(af_error::invalid_argument,
                      fmt::format("{}: broadcast from rank {}, but the group has ranks 0 to {}", who(),
                                  root, size_ - 1));
  if (n > 0 && data == nullptr)
    return make_error(af_error::invalid_argument,
                      who() + ": " + describe_call(op::broadcast, n, root) + " with no data");
  if (size_ == 1)
    return caf::none;
  // Along the ring from the root: each rank forwards what it has received,
  // except the last one (the root's left).
  auto* bytes = reinterpret_cast<char*>(data);
  auto& outs = outs_;
  auto& ins = ins_;
  outs.clear();
  ins.clear();
  outs.push_back({reinterpret_cast<const char*>(&sent_), sizeof(sent_), -1});
  ins.push_back({in_part::header, reinterpret_cast<char*>(&received_), sizeof(received_)});
  if (rank_ != root)
    ins.push_back({in_part::copy, bytes, n * sizeof(float)});
  if (right() != root)
    outs.push_back({bytes, n * sizeof(float), rank_ == root ? -1 : 1});
  return run(op::broadcast, n, root, outs, ins);
}

caf::error allreduce_group::check_header(op kind, size_t n, uint32_t root) {
  const auto& h = received_;
  if (h.magic != header_magic)
    return make_error(af_error::internal,
                      fmt::format("{}: rank {} sent something that is not a call header; is it of "
                                  "another version?",
                                  who(), left()));
  if (h.kind == sent_.kind && h.count == sent_.count && h.root == sent_.root
      && h.call == sent_.call && h.ranks == sent_.ranks)
    return caf::none;
  auto theirs = h.kind == static_cast<uint8_t>(op::broadcast)
                  ? fmt::format("broadcast of {} floats from rank {}", h.count, h.root)
                  : fmt::format("{} of {} floats", op_name(h.kind), h.count);
  return make_error(af_error::invalid_argument,
                    fmt::format("{}: rank {}'s call #{} is {} (group of {}), this rank's call "
                                "#{} is {}; every rank must make the same calls in the same order",
                                who(), left(), h.call, theirs, h.ranks, sent_.call,
                                describe_call(kind, n, root)));
}

/// Where a call stands: the part being sent and the one being received.
struct allreduce_group::progress {
  op kind;
  size_t n;
  uint32_t root;
  std::vector<out_part>& outs;
  std::vector<in_part>& ins;
  /// The call, described for errors (only then: a call formats nothing).
  std::string call() const { return describe_call(kind, n, root); }
  size_t oi = 0;       ///< outgoing part being sent (0: our header)
  size_t sent = 0;     ///< its bytes sent
  size_t limit = 0;    ///< its bytes that may be sent now
  size_t ii = 0;       ///< incoming part being received
  size_t received = 0; ///< its bytes received
  size_t done = 0;     ///< its bytes processed (reduced, checked): forwardable

  /// Bytes of incoming part `part` processed so far.
  size_t processed(int part) const {
    auto p = static_cast<size_t>(part);
    return p < ii ? ins[p].bytes : p == ii ? done : 0;
  }
  bool sending() const { return oi < outs.size(); }
  /// Our header goes first, before anything we read can fail the call: a
  /// peer in another call learns of it from the header, not from our hang-up.
  bool receiving() const { return oi > 0 && ii < ins.size(); }
};

caf::error allreduce_group::closed(const progress& p, uint32_t peer, const char* how) {
  return fail(make_error(af_error::peer_down,
                         fmt::format("{}: rank {} closed its connection ({}) during {}; did it "
                                     "fail, leave the group or die?",
                                     who(), peer, how, p.call())));
}

caf::error allreduce_group::run(op kind, size_t n, uint32_t root, std::vector<out_part>& outs,
                                std::vector<in_part>& ins) {
  sent_ = call_header{};
  sent_.magic = header_magic;
  sent_.kind = static_cast<uint8_t>(kind);
  sent_.root = root;
  sent_.ranks = size_;
  sent_.call = ++calls_;
  sent_.count = n;
  received_ = call_header{};
  stats_ = call_stats{};
  progress p{kind, n, root, outs, ins};
  for (;;) {
    while (p.oi < outs.size() && p.sent == outs[p.oi].bytes) {
      ++p.oi;
      p.sent = 0;
    }
    while (p.ii < ins.size() && p.done == ins[p.ii].bytes) {
      ++p.ii;
      p.received = p.done = 0;
    }
    if (p.oi == outs.size() && p.ii == ins.size()) {
      // A neighbour asleep on what we moved last hears of it now (the bells
      // are otherwise rung every so many bytes, and before we sleep).
      if (out_shm_)
        out_shm_->wake_peer(right_fd_, true);
      if (in_shm_)
        in_shm_->wake_peer(left_fd_, true);
      return caf::none;
    }
    bool moved = false;
    // Reading first: what the left sent before it failed (its header, say)
    // tells more than the right's hang-up.
    if (p.receiving())
      if (auto err = pull(p, moved))
        return err;
    p.limit = 0;
    if (p.sending())
      if (auto err = push(p, moved))
        return err;
    if (!moved)
      if (auto err = idle(p))
        return err;
  }
}

caf::error allreduce_group::absorb(progress& p, const char* src, size_t k) {
  auto& in = p.ins[p.ii];
  if (in.kind == in_part::reduce) {
    // `src` holds the floats from p.done on (a float that a recv split waits
    // in the scratch buffer for its rest).
    auto from = p.done / sizeof(float);
    p.received += k;
    auto to = p.received / sizeof(float);
    auto* floats = reinterpret_cast<const float*>(src);
    if (in.divisor != 0)
      add_and_divide(in.target + from, floats, to - from, in.divisor);
    else
      add(in.target + from, floats, to - from);
    p.done = to * sizeof(float);
    return caf::none;
  }
  if (src != in.buf + p.received) // from the segment; a recv put them in place
    std::memcpy(in.buf + p.received, src, k);
  p.received += k;
  if (in.kind == in_part::copy) {
    p.done = p.received;
  } else if (p.received == in.bytes) {
    if (auto err = check_header(p.kind, p.n, p.root))
      return fail(std::move(err));
    p.done = p.received;
  }
  return caf::none;
}

caf::error allreduce_group::pull(progress& p, bool& moved) {
  auto& in = p.ins[p.ii];
  if (in_shm_) {
    uint64_t avail = 0;
    const char* src = in_shm_->data(avail);
    if (in_shm_->corrupt())
      return fail(make_error(af_error::internal,
                             fmt::format("{}: rank {} broke the counters of their shared-memory "
                                         "link during {}",
                                         who(), left(), p.call())));
    size_t k = std::min<uint64_t>({avail, in.bytes - p.received, shm_slice});
    if (in.kind == in_part::reduce)
      k -= k % sizeof(float); // (whole floats are committed: this is for safety)
    if (k == 0)
      return caf::none;
    // Straight from the segment: added into place, or copied there.
    if (auto err = absorb(p, src, k))
      return err;
    in_shm_->consume(k);
    in_shm_->wake_peer(left_fd_, false);
    moved = true;
    return caf::none;
  }
  // The rest of this part, and the next part in the same receive where its
  // bytes may land before this one is absorbed: the header's check comes
  // first, so after a header only into the scratch buffer (a reduce), and
  // two reduces share the scratch buffer.
  iovec iov[2] = {{in.buf + p.received, in.bytes - p.received}, {nullptr, 0}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 1;
  if (p.ii + 1 < p.ins.size()) {
    const auto& next = p.ins[p.ii + 1];
    if (next.kind == in_part::reduce ? in.kind != in_part::reduce : in.kind != in_part::header) {
      iov[1] = {next.buf, next.bytes};
      msg.msg_iovlen = 2;
    }
  }
  auto r = ::recvmsg(left_fd_, &msg, MSG_DONTWAIT);
  if (r > 0) {
    ++stats_.receives;
    moved = true;
    auto k = static_cast<size_t>(r);
    auto here = std::min(k, in.bytes - p.received);
    const char* src = in.kind == in_part::reduce ? in.buf + p.done : in.buf + p.received;
    if (auto err = absorb(p, src, here))
      return err;
    if (k == here)
      return caf::none;
    // This part is whole and absorbed (a header checked): the next one's bytes.
    ++p.ii;
    p.received = p.done = 0;
    return absorb(p, p.ins[p.ii].buf, k - here);
  }
  ++stats_.empty;
  if (r == 0)
    return closed(p, left(), "end of stream");
  if (errno == ECONNRESET)
    return closed(p, left(), std::strerror(errno));
  if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
    return fail(make_error(af_error::peer_down,
                           fmt::format("{}: receiving from rank {} failed during {}: {}", who(),
                                       left(), p.call(), std::strerror(errno))));
  return caf::none;
}

caf::error allreduce_group::push(progress& p, bool& moved) {
  auto& o = p.outs[p.oi];
  p.limit = o.after < 0 ? o.bytes : std::min(o.bytes, p.processed(o.after));
  if (out_shm_ && p.limit < o.bytes)
    p.limit -= p.limit % sizeof(float); // whole floats into the segment: the reader adds them
  if (p.limit <= p.sent)
    return caf::none;
  if (out_shm_) {
    uint64_t room = 0;
    char* dst = out_shm_->room(room);
    if (out_shm_->corrupt())
      return fail(make_error(af_error::internal,
                             fmt::format("{}: rank {} broke the counters of their shared-memory "
                                         "link during {}",
                                         who(), right(), p.call())));
    size_t k = std::min<uint64_t>({room, p.limit - p.sent, shm_slice});
    if (k == 0)
      return caf::none;
    std::memcpy(dst, o.src + p.sent, k);
    out_shm_->commit(k);
    p.sent += k;
    out_shm_->wake_peer(right_fd_, false);
    moved = true;
    return caf::none;
  }
  // All that may go now, and the next part's sendable bytes with it when
  // this one goes whole: the call's header rides with the first data.
  iovec iov[2] = {{const_cast<char*>(o.src + p.sent), p.limit - p.sent}, {nullptr, 0}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 1;
  if (p.limit == o.bytes && p.oi + 1 < p.outs.size()) {
    const auto& next = p.outs[p.oi + 1];
    size_t ready = next.after < 0 ? next.bytes : std::min(next.bytes, p.processed(next.after));
    if (ready > 0) {
      iov[1] = {const_cast<char*>(next.src), ready};
      msg.msg_iovlen = 2;
    }
  }
  auto r = ::sendmsg(right_fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (r > 0) {
    auto k = static_cast<size_t>(r);
    ++stats_.sends;
    stats_.largest_send = std::max(stats_.largest_send, k);
    auto here = std::min(k, o.bytes - p.sent);
    p.sent += here;
    if (k > here) { // into the next part
      ++p.oi;
      p.sent = k - here;
    }
    moved = true;
    return caf::none;
  }
  ++stats_.empty;
  if (errno == EPIPE || errno == ECONNRESET) {
    return closed(p, right(), std::strerror(errno));
  } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    return fail(make_error(af_error::peer_down,
                           fmt::format("{}: sending to rank {} at {} failed during {}: {}", who(),
                                       right(), right_address_, p.call(), std::strerror(errno))));
  }
  return caf::none;
}

caf::error allreduce_group::idle(progress& p) {
  bool want_in = p.receiving();
  bool want_room = p.sending() && p.limit > p.sent;
  auto in_ready = [&] {
    uint64_t k = 0;
    in_shm_->data(k);
    return k > 0 || in_shm_->corrupt();
  };
  auto out_ready = [&] {
    uint64_t k = 0;
    out_shm_->room(k);
    return k > 0 || out_shm_->corrupt();
  };
  auto ready = [&] {
    return (want_in && in_shm_ && in_ready()) || (want_room && out_shm_ && out_ready());
  };
  // No looking again for a while before sleeping: on the 2-vCPU test VM
  // under load, looks of 50-200 us (pause between looks) found the peer's
  // bytes once in 300 sleeps and made a 4 MiB call 0.4-0.8 ms slower (with
  // sched_yield between looks, 28 ms instead of 3: a yield hands the CPU to
  // another process for a whole time slice). The peer is rarely running at
  // the same moment there; a sleeper on a socket is woken at once.
  // Flags up, the peers rung for what they wait for, one more look: then a
  // bell cannot be missed (the peer publishes, then looks at the flag).
  if (want_in && in_shm_)
    in_shm_->sleeping(true);
  if (want_room && out_shm_)
    out_shm_->sleeping(true);
  auto lower = [&] {
    if (in_shm_)
      in_shm_->sleeping(false);
    if (out_shm_)
      out_shm_->sleeping(false);
  };
  if (out_shm_)
    out_shm_->wake_peer(right_fd_, true);
  if (in_shm_)
    in_shm_->wake_peer(left_fd_, true);
  if (ready()) {
    lower();
    return caf::none;
  }
  // Sleep until a socket is ready (data, room or a bell). While there is
  // something left to send, the right socket is watched for its peer
  // hanging up too.
  pollfd pfds[2];
  nfds_t count = 0;
  int in_slot = -1;
  int out_slot = -1;
  if (want_in) {
    in_slot = static_cast<int>(count);
    pfds[count++] = {left_fd_, static_cast<short>(POLLIN | (in_shm_ ? POLLRDHUP : 0)), 0};
  }
  if (p.sending()) {
    out_slot = static_cast<int>(count);
    short ev = POLLRDHUP | (out_shm_ ? POLLIN : want_room ? POLLOUT : 0);
    pfds[count++] = {right_fd_, ev, 0};
  }
  ++stats_.sleeps;
  auto rc = ::poll(pfds, count, static_cast<int>(std::min<int64_t>(timeout_.count(),
                                                                   std::numeric_limits<int>::max())));
  lower();
  if (rc < 0 && errno == EINTR)
    return caf::none;
  if (rc < 0)
    return fail(make_error(af_error::internal, fmt::format("{}: poll failed during {}: {}", who(),
                                                           p.call(), std::strerror(errno))));
  if (rc == 0) {
    std::string waited;
    if (want_in)
      waited = fmt::format("rank {} to send (part {} of {}: {} of {} bytes)", left(), p.ii + 1,
                           p.ins.size(), p.received, p.ins[p.ii].bytes);
    else
      waited = fmt::format("rank {} at {} to take its data ({} of {} bytes of part {} of {})",
                           right(), right_address_, p.sent, p.outs[p.oi].bytes, p.oi + 1,
                           p.outs.size());
    return fail(make_error(af_error::timeout,
                           fmt::format("{}: {} made no progress for {} ms waiting for {}; is it "
                                       "alive and in the same call?",
                                       who(), p.call(), timeout_.count(), waited)));
  }
  // The bells are taken now, also when the data came with them: a bell left
  // in the socket made the next sleep a poll that returned at once (1.2
  // wasted polls a rank per 4 MiB call on shared memory). A socket that
  // also carries the left's data on TCP is not drained.
  bool left_open = true;
  bool right_open = true;
  if (in_slot >= 0 && in_shm_ && (pfds[in_slot].revents & POLLIN) != 0)
    left_open = drain_bells(left_fd_);
  if (out_slot >= 0 && out_shm_ && (pfds[out_slot].revents & POLLIN) != 0
      && (right_fd_ != left_fd_ || in_shm_))
    right_open = drain_bells(right_fd_);
  // What the left put in the segment before it went (its header, say) is
  // taken before any hang-up is judged.
  if (want_in && in_shm_ && in_ready())
    return caf::none;
  if (in_slot >= 0) {
    auto ev = pfds[in_slot].revents;
    if (!in_shm_ && ev != 0)
      return caf::none; // read what there is before judging the right's hang-up
    bool gone = ((ev & POLLIN) != 0 && !left_open) || (ev & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    if (gone)
      return closed(p, left(), "hung up");
  }
  if (out_slot >= 0) {
    auto ev = pfds[out_slot].revents;
    bool gone = (ev & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    if (out_shm_)
      gone = gone || ((ev & POLLIN) != 0 && !right_open);
    else
      gone = gone && !((ev & POLLOUT) != 0 && want_room);
    if (gone)
      return closed(p, right(), "hung up");
  }
  return caf::none;
}

} // namespace af
