/// The data channel's streamed push (wire::kind::push_streamed; docs/wire.md
/// "A pipelined sync round"): the push goes out without blocking while its
/// answer is read as it comes, both on one poll, since the node answers
/// while it still reads.
#include "net/data_plane.hpp"
#include "net/data_link.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "messages/error.hpp"

namespace af {

using namespace plane_io;

namespace {

/// The streamed reply as it is read: the header, its payload (the
/// parameters, or an error's text), the trailer and its text.

/// A reply header's problem (empty: none).
std::string check_header(const wire::header& h) {
  auto problem = wire::validate(h);
  if (problem.empty() && h.kind != static_cast<uint8_t>(wire::kind::reply))
    problem = "a request frame sent as a reply";
  if (problem.empty() && h.status != 0 && !valid_af_error(h.status))
    problem = fmt::format("an invalid status byte {}", static_cast<unsigned>(h.status));
  return problem;
}

/// The node's error of status `status` with `text` (its describe(): the
/// "code: " prefix dropped).
caf::error node_error(uint8_t status, std::string text) {
  auto code = static_cast<af_error>(status);
  auto prefix = std::string{to_string(code)} + ": ";
  if (text.rfind(prefix, 0) == 0)
    text = text.substr(prefix.size());
  return make_error(code, std::move(text));
}

/// The streamed reply as it is read: the header, its payload (the
/// parameters, or an error's text), the trailer and its text.
struct streamed_reply {
  enum class part { head, payload, trailer, trailer_text, done };
  part at = part::head;
  wire::header head, trailer;
  tensor value;
  std::string text; ///< an error's (the head's or the trailer's)
  char* dst = reinterpret_cast<char*>(&head);
  uint64_t left = sizeof(wire::header);
  bool out_of_memory = false; ///< the parameters could not be allocated

  /// What comes after reply header `x` (the trailer's if `trailer`): its
  /// payload, or the end. A problem with the frame (empty: none).
  std::string after_header(const wire::header& x, bool trailer) {
    if (auto problem = check_header(x); !problem.empty())
      return problem;
    if (x.status != 0) { // an error reply: its text
      text.assign(x.payload_bytes, '\0');
      at = trailer ? part::trailer_text : part::payload;
      dst = text.data();
      left = x.payload_bytes;
      return {};
    }
    if (trailer) {
      at = part::done;
      return x.payload_bytes != 0 ? "a trailer with a payload" : "";
    }
    if (x.has_tensor) {
      try {
        value.reset(static_cast<dtype>(x.dtype), wire::shape_of(x));
      } catch (const std::bad_alloc&) {
        out_of_memory = true;
        return fmt::format("no memory for a reply of {} bytes", x.payload_bytes);
      }
      dst = reinterpret_cast<char*>(value.mutable_bytes());
    } else if (x.payload_bytes != 0) {
      return "a payload that is no tensor";
    }
    at = part::payload;
    left = x.payload_bytes;
    return {};
  }

  /// The part just read in full: on to the next. A problem (empty: none).
  std::string advance() {
    switch (at) {
      case part::head:
        return after_header(head, false);
      case part::payload:
        if (head.status != 0) { // an error reply, no trailer: the push was refused
          at = part::done;
          return {};
        }
        at = part::trailer;
        dst = reinterpret_cast<char*>(&trailer);
        left = sizeof(trailer);
        return {};
      case part::trailer:
        return after_header(trailer, true);
      default:
        at = part::done;
        return {};
    }
  }

  /// Takes what recv() gave (`got` bytes; 0: the peer closed).
  void took(long got) {
    dst += got;
    left -= static_cast<uint64_t>(got);
  }
};

/// Moves `iov` past `sent` bytes written; `next` is the first iovec not
/// wholly sent.
void consumed(std::vector<iovec>& iov, size_t& next, size_t sent) {
  while (sent > 0 && next < iov.size()) {
    auto take = std::min(sent, iov[next].iov_len);
    iov[next].iov_base = static_cast<char*>(iov[next].iov_base) + take;
    iov[next].iov_len -= take;
    sent -= take;
    if (iov[next].iov_len == 0)
      ++next;
  }
  while (next < iov.size() && iov[next].iov_len == 0)
    ++next;
}

} // namespace

bool data_channel::plain_tcp() const {
  return fd_ >= 0 && stream_ == nullptr && bytes_ == &tcp_bytes() && !shm_ && !ucx_;
}

caf::expected<std::pair<uint64_t, tensor>>
data_channel::push_streamed(const std::string& name, uint32_t worker, uint64_t step,
                            const std::vector<tensor>& values, std::chrono::milliseconds wait,
                            const std::string& token, uint64_t seq, bool* dropped_late) {
  auto what = fmt::format("streamed push of worker {} to aggregator '{}'", worker, name);
  if (dropped_late != nullptr)
    *dropped_late = false;
  if (fd_ < 0)
    return make_error(af_error::peer_down, "the data connection to " + peer_ + " is closed");
  reopen_if_closed_by_peer();
  auto wait_for = std::max(wait + std::chrono::seconds(5), timeout_);
  auto deadline = std::chrono::steady_clock::now() + wait_for;
  if (auto err = upgrade_if_due(deadline))
    return err;
  // Whole where the aggregator asked for it (pipeline_sync = "auto" found
  // store-and-forward rounds faster: wire::reply_flags::whole_pushes).
  if (!plain_tcp() || values.empty() || pushes_whole(name))
    return aggregate(wire::kind::push, name, worker, step, values, wait, token, seq,
                     dropped_late);
  if (auto err = check_push_prefix(what, name.size(), worker, token))
    return err;
  wire::push_prefix pre;
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::push_streamed);
  h.name_len = static_cast<uint32_t>(name.size() + sizeof(pre));
  h.version = step;
  h.reserved = static_cast<uint16_t>(worker);
  std::memcpy(pre.token, token.data(), sizeof(pre.token));
  pre.seq = seq;
  std::vector<iovec> iov{{&h, sizeof(h)}, {&pre, sizeof(pre)}};
  if (!name.empty())
    iov.push_back({const_cast<char*>(name.data()), name.size()});
  if (auto err = append_float_values(what, values, iov, h))
    return err;
  // Sends and reads on one poll until the request is out and the reply in.
  size_t next = 0; // the first iovec not wholly sent
  streamed_reply r;
  auto bad_frame = [&](const std::string& problem) -> caf::error {
    drop();
    return make_error(r.out_of_memory ? af_error::resource_exhausted : af_error::internal,
                      fmt::format("{} sent a bad data-plane frame in reply to {}: {}", peer_, what,
                                  problem));
  };
  while (next < iov.size() || r.at != streamed_reply::part::done) {
    if (r.at != streamed_reply::part::done && r.left == 0) { // a part read in full
      if (auto problem = r.advance(); !problem.empty())
        return bad_frame(problem);
      continue;
    }
    pollfd p{fd_, 0, 0};
    if (next < iov.size())
      p.events |= POLLOUT;
    if (r.at != streamed_reply::part::done)
      p.events |= POLLIN;
    auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                     deadline - std::chrono::steady_clock::now())
                     .count();
    if (left_ms <= 0)
      return fail(what, EAGAIN, wait_for, next < iov.size());
    int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left_ms, 20)));
    if (n < 0 && errno != EINTR)
      return fail(what, errno);
    if (cancel_ && cancel_->load())
      return fail(what, ECANCELED);
    if (n <= 0)
      continue;
    if (r.at != streamed_reply::part::done && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      auto got = ::recv(fd_, r.dst, r.left, MSG_DONTWAIT);
      if (got == 0)
        return fail(what, ECONNRESET);
      if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return fail(what, errno);
      if (got > 0)
        r.took(got);
    }
    if ((p.revents & POLLOUT) != 0 && next < iov.size()) {
      msghdr msg{};
      msg.msg_iov = iov.data() + next;
      msg.msg_iovlen = std::min<size_t>(iov.size() - next, 64);
      auto sent = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return fail(what, errno, wait_for, true);
      consumed(iov, next, sent > 0 ? static_cast<size_t>(sent) : 0);
    }
  }
  last_reply_ = std::chrono::steady_clock::now();
  if ((shm_possible_ && !shm_) || (ucx_possible_ && !ucx_))
    shm_due_ = true; // as read_reply: a data plane answered
  if (r.head.status != 0)
    return node_error(r.head.status, std::move(r.text));
  if (r.trailer.status != 0)
    return node_error(r.trailer.status, std::move(r.text)); // what was read is dropped
  reply_flags_ = r.trailer.reserved;
  note_whole_pushes(name);
  if (dropped_late != nullptr)
    *dropped_late = (reply_flags_ & wire::reply_flags::dropped_late) != 0;
  if (!r.value.empty())
    largest_answer_ = std::max<uint64_t>(largest_answer_, r.value.nbytes());
  return std::make_pair(r.trailer.version, std::move(r.value));
}

} // namespace af
