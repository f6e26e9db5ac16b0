/// A request frame as the server hands it to its plane_handler
/// (net/plane_handler.hpp): the payload read, skipped or refused, and the
/// reply sent, on the connection it came on.
#include "net/plane_handler.hpp"
#include "net/data_link.hpp"
#include "net/served_connection.hpp"

#include <sched.h>
#include <sys/socket.h>
#include <algorithm>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

using namespace plane_io;

const std::string& plane_request::peer() const {
  return conn_.peer;
}

const std::string& plane_request::node_name() const {
  return conn_.node_name;
}

std::string plane_request::transport() const {
  // After an offer of UCX the frames go over it, the TLS stream kept only
  // for liveness: what carries them names itself.
  return conn_.io.bytes->name();
}

bool plane_request::read_payload(void* dst, bool quiet) {
  if (h_.payload_bytes == 0)
    return true;
  return read_bytes(dst, h_.payload_bytes, quiet);
}

bool plane_request::read_part(void* dst, size_t n, bool quiet) {
  if (n == 0)
    return true;
  consumed_ += n;
  return read_bytes(dst, n, quiet);
}

bool plane_request::read_bytes(void* dst, size_t n, bool quiet) {
  auto how = read_timed(conn_.io, dst, n, conn_.frame_ms, conn_.frame_ms, false);
  if (quiet)
    return how == read_end::done;
  return !conn_.ended(how, "payload");
}

bool plane_request::in_place_possible() const {
  // (A connection moved to UCX has no rings; the payload must fit the ring.)
  return conn_.shm != nullptr && conn_.ucx == nullptr && conn_.lent == nullptr
         && conn_.shm->peekable() && h_.payload_bytes <= conn_.shm->ring_bytes();
}

bool plane_request::peek_bytes(size_t n, bool quiet, const std::byte** at) {
  // As read_timed's reads of a payload on the rings (byte_channel.cpp's
  // shm_bound): the frame timeout for each wait.
  shm_channel::bound b;
  b.deadline = conn_.io.deadline;
  b.cancel = conn_.io.cancel;
  b.spin = conn_.io.spin;
  b.first_ms = conn_.frame_ms;
  b.stall_ms = conn_.frame_ms;
  auto st = conn_.shm->peek(n, conn_.io.fd, b, at);
  if (st == shm_channel::status::done)
    return true;
  auto how = st == shm_channel::status::closed    ? read_end::closed
             : st == shm_channel::status::timeout ? read_end::stalled
             : st == shm_channel::status::idle    ? read_end::stalled
                                                  : read_end::failed;
  if (how == read_end::failed)
    last_tls_error = "its shared-memory ring is corrupt (counters out of range, a flood of "
                     "doorbell bytes, or a segment it shrank or punched)";
  if (!quiet)
    conn_.ended(how, "payload");
  return false;
}

std::shared_ptr<std::byte> plane_request::lend_payload(const std::byte* at) {
  conn_.lent = conn_.shm->lend(at);
  conn_.lent_bytes = h_.payload_bytes;
  consumed_ = h_.payload_bytes; // a refusal now skips nothing: the bytes are lent, not read
  return conn_.lent;
}

bool served_connection::take_back_lent() {
  if (lent == nullptr)
    return true;
  // The handler's call is over; a holder (an aggregator's round, a message
  // still being destroyed on its thread) drops its copy at once or soon:
  // yield a little, then look every 50 us, up to the frame timeout.
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds{frame_ms};
  for (int looks = 0; lent.use_count() > 1; ++looks) {
    if (looks < 64) {
      sched_yield();
      continue;
    }
    if (std::chrono::steady_clock::now() >= until) {
      log::get()->warn("{} data plane: dropped {}: a payload it sent, read in place from "
                       "shared memory, was still in use {} ms after its answer",
                       node_name, peer, frame_ms);
      lent.reset(); // the mapping lives on while it is held
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds{50});
  }
  // The holders' last reads of the bytes happen before the writer reuses
  // them (their decrement is a release; this load's fence, an acquire).
  std::atomic_thread_fence(std::memory_order_acquire);
  lent.reset();
  shm->release(lent_bytes, io.fd);
  lent_bytes = 0;
  return true;
}

bool plane_request::skip_payload() {
  read_end how = read_end::done;
  auto skip = plane_io::skip_payload(conn_.io, h_.payload_bytes, conn_.frame_ms, how);
  if (skip == skipped::lost) {
    conn_.ended(how, "payload");
    return false;
  }
  if (skip == skipped::too_large) {
    send_error(conn_.io, af_error::invalid_argument,
               "a payload that is no tensor (the connection is closed: its payload was not "
               "read)");
    return false;
  }
  return true;
}

bool plane_request::refuse(af_error code, const std::string& text) {
  read_end how = read_end::done;
  if (refuse_request(conn_.io, code, text, h_.payload_bytes - consumed_, conn_.frame_ms, how))
    return true;
  conn_.ended(how, "payload");
  return false;
}

namespace {

/// A reply's frame on `conn`: on shared memory with answer slots
/// (net/shm_ring.hpp), a tensor payload goes into a free slot (the same
/// copy as into the ring) and only the header, naming the slot, into the
/// ring: the client uses the payload in place. With no slot free (the
/// client holds both) it goes through the ring as before.
///
/// The payload is `count` pieces, one after the other.
bool send_reply(served_connection& conn, wire::header& h, const iovec* pieces, size_t count,
                void (*copied)(void*) = nullptr, void* context = nullptr) {
  if (h.has_tensor != 0 && h.payload_bytes >= shm_channel::min_slot_answer && conn.shm != nullptr
      && conn.ucx == nullptr && h.payload_bytes <= conn.shm->slot_bytes()) {
    if (int k = conn.shm->put_answer(pieces, count, h.payload_bytes); k >= 0) {
      if (copied != nullptr)
        copied(context);
      wire::header slotted = h;
      slotted.reserved |= shm_channel::reply_in_slot | (k == 1 ? shm_channel::reply_slot_one : 0);
      iovec iov{&slotted, sizeof(slotted)};
      return write_all(conn.io, &iov, 1);
    }
  }
  // The header and the pieces in as few writes as the batch allows (one
  // for the usual few pieces: a gather write, no copy of its own).
  constexpr size_t batch = 64;
  iovec iov[batch];
  size_t n = 0, next = 0;
  iov[n++] = {&h, sizeof(h)};
  do {
    for (; next < count && n < batch; ++next)
      if (pieces[next].iov_len > 0)
        iov[n++] = pieces[next];
    if (!write_all(conn.io, iov, static_cast<int>(n)))
      return false;
    n = 0;
  } while (next < count);
  return true;
}

bool send_reply(served_connection& conn, wire::header& h, const void* payload) {
  iovec piece{const_cast<void*>(payload), h.payload_bytes};
  return send_reply(conn, h, &piece, h.payload_bytes > 0 ? 1 : 0);
}

} // namespace

bool plane_request::reply(wire::header& h, const void* payload) {
  h.kind = static_cast<uint8_t>(wire::kind::reply);
  return sent(send_reply(conn_, h, payload), h);
}

bool plane_request::reply(wire::header& h, const iovec* pieces, size_t count,
                          void (*copied)(void*), void* context) {
  h.kind = static_cast<uint8_t>(wire::kind::reply);
  return sent(send_reply(conn_, h, pieces, count, copied, context), h);
}

bool plane_request::sent(bool ok, const wire::header& h) {
  if (ok) {
    if (conn_.counted != nullptr)
      conn_.counted->bytes_sent.fetch_add(sizeof(h) + h.payload_bytes, std::memory_order_relaxed);
    return true;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK)
    log::get()->warn("{} data plane: dropped {}: it took nothing of its reply for {} ms",
                     conn_.node_name, conn_.peer, conn_.frame_ms);
  return false;
}

bool plane_request::refuse(const caf::error& err) {
  return refuse(wire_code(err), describe(err));
}

bool plane_request::plain_tcp() const {
  return conn_.io.bytes->plain_tcp() && conn_.shm == nullptr && conn_.ucx == nullptr
         && !conn_.tls;
}

long plane_request::read_some(void* dst, size_t max) {
  if (max == 0 || !plain_tcp())
    return 0;
  auto n = conn_.io.bytes->read_some(conn_.io, dst, max);
  if (n > 0)
    consumed_ += static_cast<uint64_t>(n);
  return n;
}

bool plane_request::reply_head(wire::header& h) {
  h.kind = static_cast<uint8_t>(wire::kind::reply);
  iovec iov{&h, sizeof(h)};
  if (!write_all(conn_.io, &iov, 1))
    return sent(false, h); // says why
  if (conn_.counted != nullptr) // the payload is counted as it goes
    conn_.counted->bytes_sent.fetch_add(sizeof(h), std::memory_order_relaxed);
  return true;
}

long plane_request::send_some(const iovec* pieces, size_t count) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(pieces);
  msg.msg_iovlen = std::min<size_t>(count, 64);
  for (;;) {
    auto n = ::sendmsg(conn_.io.fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      if (conn_.counted != nullptr)
        conn_.counted->bytes_sent.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      return static_cast<long>(n);
    }
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return 0;
    return -1;
  }
}

bool plane_request::send_all(const iovec* pieces, size_t count) {
  constexpr size_t batch = 64;
  iovec iov[batch];
  uint64_t bytes = 0;
  for (size_t next = 0; next < count;) {
    size_t n = 0;
    for (; next < count && n < batch; ++next)
      if (pieces[next].iov_len > 0) {
        iov[n++] = pieces[next];
        bytes += pieces[next].iov_len;
      }
    if (n > 0 && !write_all(conn_.io, iov, static_cast<int>(n))) {
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        log::get()->warn("{} data plane: dropped {}: it took nothing of its reply for {} ms",
                         conn_.node_name, conn_.peer, conn_.frame_ms);
      return false;
    }
  }
  if (conn_.counted != nullptr)
    conn_.counted->bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

bool plane_request::reply_error(af_error code, const std::string& text) {
  return send_error(conn_.io, code, text);
}

bool plane_request::reply_error(const caf::error& err) {
  return send_error(conn_.io, wire_code(err), describe(err));
}

} // namespace af
