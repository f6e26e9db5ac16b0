/// The data channel's requests: a variable op, a push or pull to an
/// aggregator, an edge value to an executor, and the reply to each.
#include "net/data_plane.hpp"
#include "net/data_link.hpp"
#include "net/tls_io.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/bf16.hpp"
#include "messages/error.hpp"

namespace af {

using namespace plane_io;

namespace {

/// Whether a socket wait of `have` serves a call that wants `want`: within
/// 1/64 (a retried update's share of what is left moves by a few ms from
/// one call to the next; a wait that much longer or shorter changes nothing
/// a caller can tell).
bool near_enough(std::chrono::milliseconds have, std::chrono::milliseconds want) {
  auto diff = have > want ? have - want : want - have;
  return diff <= want / 64;
}

} // namespace

data_channel::wait_scope::wait_scope(data_channel& channel, std::chrono::milliseconds wait)
  : ch(channel), saved(channel.timeout_) {
  ch.in_scope_ = true;
  auto want = wait.count() > 0 ? wait : ch.timeout_;
  auto have = ch.call_wait_.count() > 0 ? ch.call_wait_ : ch.timeout_;
  ch.timeout_ = want;
  if (ch.fd_ < 0 || have == want || (ch.stream_ == nullptr && near_enough(have, want)))
    return;
  set_timeout(ch.fd_, SO_RCVTIMEO, want);
  set_timeout(ch.fd_, SO_SNDTIMEO, want);
  ch.call_wait_ = want == saved ? std::chrono::milliseconds{0} : want;
}

data_channel::wait_scope::~wait_scope() {
  ch.in_scope_ = false;
  ch.timeout_ = saved;
  // SO_RCVTIMEO set to what was left of the call, or TLS after a wait of
  // its own: the channel's timeout again now. Else the call's wait stays
  // until an op of another kind (restore_timeouts) or a call that wants a
  // different one.
  if (!touched && (ch.stream_ == nullptr || ch.call_wait_.count() == 0))
    return;
  ch.call_wait_ = std::chrono::milliseconds{0};
  if (ch.fd_ >= 0) {
    set_timeout(ch.fd_, SO_RCVTIMEO, saved);
    set_timeout(ch.fd_, SO_SNDTIMEO, saved);
  }
}

void data_channel::restore_timeouts() {
  if (in_scope_ || call_wait_.count() == 0)
    return;
  call_wait_ = std::chrono::milliseconds{0};
  if (fd_ >= 0) {
    set_timeout(fd_, SO_RCVTIMEO, timeout_);
    set_timeout(fd_, SO_SNDTIMEO, timeout_);
  }
}

caf::expected<std::pair<tensor, uint64_t>>
data_channel::call(var_op op, const std::string& var, const tensor* operand, bool want_value,
                   uint64_t request_id, std::chrono::milliseconds wait) {
  if (!valid_var_op(static_cast<uint8_t>(op)))
    return make_error(af_error::invalid_argument,
                      "unknown variable op code " + std::to_string(static_cast<int>(op)) + " for '"
                        + var + "'");
  auto what = std::string{to_string(op)} + " of '" + var + "'";
  if (fd_ < 0)
    return make_error(af_error::peer_down, "the data connection to " + peer_ + " is closed");
  if (var.size() > wire::max_name)
    return make_error(af_error::invalid_argument, "variable name of " + std::to_string(var.size())
                                                    + " bytes is too long for the data plane");
  // A connection quiet for a while may be closed by the node's idle timeout
  // just as this request goes out (the check below sees no EOF yet). The
  // node then never read it: a read, which changes nothing, is sent again
  // once on a fresh connection. Other ops are not (after a node's crash
  // they might have been applied); their caller sees peer_down.
  bool quiet = std::chrono::steady_clock::now() - last_reply_ >= std::chrono::milliseconds{100};
  // This call's own wait for the reply (a try of a retried update): the
  // channel's timeout again afterwards. Opened first, so that the socket's
  // timeouts are set (if they must be) once for the call, not reset by
  // reopen_if_closed_by_peer and set again.
  wait_scope scope{*this, wait};
  reopen_if_closed_by_peer();
  wire::header h;
  h.kind = wire::request_kind(op);
  h.want_value = want_value ? 1 : 0;
  h.name_len = static_cast<uint32_t>(var.size());
  h.version = request_id; // a request's version field carries its id (core/wire_format.hpp)
  if (operand != nullptr && !wire::describe_tensor(*operand, h))
    return make_error(af_error::invalid_argument,
                      what + ": rank " + std::to_string(operand->shape().size())
                        + " is more than the data plane carries (8)");
  // One deadline for the try: the whole send and the reply (a node that
  // stops reading part way through a large operand is not given a fresh
  // wait for each piece it took).
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  send_bound bound{deadline, cancel_ ? cancel_.get() : nullptr};
  if (auto err = upgrade_if_due(deadline))
    return err;
  for (int attempt = 0;; ++attempt) {
    bool retry = attempt == 0 && quiet && op == var_op::read;
    bool large = h.payload_bytes > (std::size_t{1} << 20);
    if (!send_frame(io(deadline), h, &var, operand ? operand->bytes() : nullptr, &bound)) {
      auto err = fail(what, errno, timeout_, true);
      if (retry && reconnect())
        continue;
      return err;
    }
    if (fd_ >= 0 && (large || ms_left(bound) + 20 < timeout_.count())) {
      // The send took a while: the reply gets what is left of the try.
      auto left = std::max<long long>(ms_left(bound), 1);
      set_timeout(fd_, SO_RCVTIMEO, std::chrono::milliseconds{left});
      // (SO_SNDTIMEO: the record layer's slices put back what they changed.)
      scope.touched = true;
    }
    auto r = read_reply(what, deadline);
    if (!r && retry && fd_ < 0 && r.error().category() == error_category
        && r.error().code() == static_cast<uint8_t>(af_error::peer_down) && reconnect())
      continue;
    return r;
  }
}

caf::error data_channel::await_readable(const std::string& what,
                                        std::chrono::steady_clock::time_point until,
                                        std::chrono::milliseconds wait) {
  // In slices, so that a cancel is seen within 20 ms; the deadline is the
  // try's (send and reply together).
  for (;;) {
    if (bytes_->has_pending())
      return {};
    pollfd pfd{fd_, POLLIN, 0};
    int rc = ::poll(&pfd, 1, 20);
    // EINTR is the Ctrl-C itself (its handler sets the flag checked below).
    if (rc > 0 || (rc < 0 && errno != EINTR))
      return {};
    if (std::chrono::steady_clock::now() >= until)
      return fail(what, EAGAIN, wait);
    if (cancel_->load()) {
      drop();
      return make_error(af_error::cancelled, what + " on " + peer_
                                               + " was abandoned; the connection is opened "
                                                 "again for the next call");
    }
  }
}

caf::expected<std::pair<tensor, uint64_t>>
data_channel::read_reply(const std::string& what, std::chrono::steady_clock::time_point until,
                         std::chrono::milliseconds wait) {
  wire::header r;
  size_t early = poll_for_reply(&r, sizeof(r));
  // (Bytes of the reply in hand: it came, there is nothing to wait for.)
  // (On shared memory the ring's read looks at cancel_ itself.)
  if (early == 0 && cancel_ && !bytes_->waits_itself())
    if (auto err = await_readable(what, until, wait))
      return err;
  const link io = this->io(until);
  size_t got = 0;
  bool whole = read_all(io, reinterpret_cast<char*>(&r) + early, sizeof(r) - early, &got);
  got += early;
  if (!whole) {
    if (errno == ECANCELED) {
      drop();
      return make_error(af_error::cancelled, what + " on " + peer_
                                               + " was abandoned; the connection is opened "
                                                 "again for the next call");
    }
    int err = errno;
    if (stream_ == nullptr && got >= 2
        && looks_like_tls(reinterpret_cast<const unsigned char*>(&r), got)) {
      drop();
      return make_error(af_error::unreachable,
                        peer_ + " answered " + what + " with TLS: its data plane runs with "
                          "[security]; this process needs the same [security] (the cluster's CA, "
                          "a certificate and key) in its cluster config");
    }
    return fail(what, err, wait);
  }
  reply_flags_ = 0;
  auto problem = wire::validate(r);
  if (problem.empty() && r.kind != static_cast<uint8_t>(wire::kind::reply))
    problem = "a request frame sent as a reply";
  if (!problem.empty()) {
    drop();
    return make_error(af_error::internal, peer_ + " sent a bad data-plane frame: " + problem);
  }
  if (r.status != 0) {
    if (!valid_af_error(r.status)) {
      // Not one of our codes: a peer of another version, or not ours at all.
      drop();
      return make_error(af_error::internal,
                        fmt::format("data plane of {}: peer sent an invalid status byte {} in reply "
                                    "to {}",
                                    peer_, static_cast<unsigned>(r.status), what));
    }
    std::string text(r.payload_bytes, '\0');
    if (!read_all(io, text.data(), text.size()))
      return fail(what, errno);
    // The text is describe() of the node's error: drop its "code: " prefix.
    auto code = static_cast<af_error>(r.status);
    auto prefix = std::string{to_string(code)} + ": ";
    if (text.rfind(prefix, 0) == 0)
      text = text.substr(prefix.size());
    return make_error(code, text);
  }
  tensor value;
  if (r.has_tensor && (r.reserved & shm_channel::reply_in_slot) != 0 && shm_
      && bytes_ == moved_bytes_.get()) {
    // The node put the payload in an answer slot (net/shm_ring.hpp): used
    // in place, no copy; the slot goes back when the last copy is dropped.
    int k = (r.reserved & shm_channel::reply_slot_one) != 0 ? 1 : 0;
    auto held = shm_->take_answer(k, r.payload_bytes);
    if (!held)
      return fail(what, EBADMSG);
    if (r.dtype == wire::bf16_dtype) { // widened out of the slot, which goes back at once
      value.reset(dtype::float32, wire::shape_of(r));
      bf16::widen(reinterpret_cast<const uint16_t*>(held.get()), value.mutable_data<float>(),
                  static_cast<size_t>(value.num_elements()));
    } else {
      value = tensor::over(static_cast<dtype>(r.dtype), wire::shape_of(r), std::move(held));
    }
    answers_in_place_ += 1;
  } else if (r.has_tensor && r.dtype == wire::bf16_dtype) {
    // Parameters in bf16 (the answer to a push in bf16): widened to float32.
    value.reset(dtype::float32, wire::shape_of(r));
    bf16_in_.resize(static_cast<size_t>(value.num_elements()));
    if (r.payload_bytes > 0 && !read_all(io, bf16_in_.data(), r.payload_bytes, nullptr, &until))
      return fail(what, errno);
    bf16::widen(bf16_in_.data(), value.mutable_data<float>(), bf16_in_.size());
  } else if (r.has_tensor) {
    try {
      value.reset(static_cast<dtype>(r.dtype), wire::shape_of(r));
    } catch (const std::bad_alloc&) {
      drop(); // the payload is still in the stream
      return make_error(af_error::resource_exhausted, what + ": cannot allocate "
                                                        + std::to_string(r.payload_bytes)
                                                        + " bytes for the reply (out of memory)");
    }
    if (r.payload_bytes > 0
        && !read_all(io, value.mutable_bytes(), r.payload_bytes, nullptr, &until))
      return fail(what, errno);
  }
  last_reply_ = std::chrono::steady_clock::now();
  reply_flags_ = r.reserved;
  if (r.has_tensor)
    largest_answer_ = std::max<uint64_t>(largest_answer_, r.payload_bytes);
  if (ucx_)
    ucx_carried_ = true;
  if ((shm_possible_ && !shm_) || (ucx_possible_ && !ucx_))
    shm_due_ = true; // a data plane answered: offer shared memory before the next request
  return std::make_pair(std::move(value), r.version);
}

caf::error data_channel::send_edge(const std::string& device, uint64_t graph,
                                   const std::string& token, uint64_t step, int32_t op,
                                   int64_t sent_ns, const tensor& value,
                                   std::chrono::milliseconds wait) {
  auto what = fmt::format("the value of op {} (step {} of graph {}) for {}", op, step, graph, device);
  if (fd_ < 0)
    return make_error(af_error::peer_down, "the data connection to " + peer_ + " is closed");
  if (device.size() + sizeof(wire::edge_prefix) > wire::max_name)
    return make_error(af_error::invalid_argument, what + ": the device name is too long for the data plane");
  wait_scope scope{*this, wait}; // before reopen_if_closed_by_peer, as in call()
  reopen_if_closed_by_peer();
  wire::edge_prefix pre;
  pre.graph = graph;
  pre.sent_ns = sent_ns;
  pre.op = op;
  if (token.size() != sizeof(pre.token))
    return make_error(af_error::invalid_argument,
                      what + ": the graph's edge token has " + std::to_string(token.size())
                        + " bytes, not " + std::to_string(sizeof(pre.token)));
  std::memcpy(pre.token, token.data(), sizeof(pre.token));
  std::string name(sizeof(pre), '\0');
  std::memcpy(name.data(), &pre, sizeof(pre));
  name += device;
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::edge);
  h.name_len = static_cast<uint32_t>(name.size());
  h.version = step;
  if (!value.empty() && !wire::describe_tensor(value, h))
    return make_error(af_error::invalid_argument,
                      what + ": rank " + std::to_string(value.shape().size())
                        + " is more than the data plane carries (8)");
  // One deadline for the send and the ack together.
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  send_bound bound{deadline, cancel_ ? cancel_.get() : nullptr};
  if (auto err = upgrade_if_due(deadline))
    return err;
  if (!send_frame(io(deadline), h, &name, value.empty() ? nullptr : value.bytes(), &bound))
    return fail(what, errno, timeout_, true);
  if (fd_ >= 0) {
    set_timeout(fd_, SO_RCVTIMEO, std::chrono::milliseconds{std::max<long long>(ms_left(bound), 1)});
    scope.touched = true;
  }
  auto r = read_reply(what, deadline);
  if (!r)
    return std::move(r.error());
  return {};
}

caf::expected<std::pair<uint64_t, tensor>>
data_channel::aggregate(wire::kind kind, const std::string& name, uint32_t worker, uint64_t step,
                        const std::vector<tensor>& values, std::chrono::milliseconds wait,
                        const std::string& token, uint64_t seq, bool* dropped_late) {
  bool push = kind == wire::kind::push || kind == wire::kind::push_params;
  if (dropped_late != nullptr)
    *dropped_late = false;
  auto what = fmt::format("{} of worker {} to aggregator '{}'", push ? "push" : "pull", worker, name);
  if (!wire::aggregator_kind(static_cast<uint8_t>(kind)) || kind == wire::kind::push_sparse)
    return make_error(af_error::invalid_argument,
                      what + ": not a dense push or pull frame (a sparse push is push_sparse())");
  if (fd_ < 0)
    return make_error(af_error::peer_down, "the data connection to " + peer_ + " is closed");
  wire::push_prefix pre;
  if (push) {
    if (auto err = check_push_prefix(what, name.size(), worker, token))
      return err;
  } else if (name.size() > wire::max_name || worker > UINT16_MAX) {
    return make_error(af_error::invalid_argument, what + ": name or worker index too large");
  }
  reopen_if_closed_by_peer();
  wire::header h;
  h.kind = static_cast<uint8_t>(kind);
  h.name_len = static_cast<uint32_t>(name.size() + (push ? sizeof(pre) : 0));
  h.version = step;
  h.reserved = static_cast<uint16_t>(worker);
  std::vector<iovec> iov;
  iov.reserve(values.size() + 3);
  iov.push_back({&h, sizeof(h)});
  if (push) {
    std::memcpy(pre.token, token.data(), sizeof(pre.token));
    pre.seq = seq;
    iov.push_back({&pre, sizeof(pre)});
  }
  if (!name.empty())
    iov.push_back({const_cast<char*>(name.data()), name.size()});
  const size_t first_value = iov.size();
  if (push && !values.empty())
    if (auto err = append_float_values(what, values, iov, h))
      return err;
  // [train] wire_dtype = "bf16": the floats rounded into one buffer of
  // bf16, sent in their place (the node answers in bf16 too).
  const bool bf16 = wire_bf16_ && kind == wire::kind::push && h.has_tensor != 0;
  if (bf16) {
    bf16_out_.resize(static_cast<size_t>(h.dims[0]));
    size_t at = 0;
    for (size_t i = first_value; i < iov.size(); ++i) {
      size_t n = iov[i].iov_len / sizeof(float);
      bf16::narrow(static_cast<const float*>(iov[i].iov_base), bf16_out_.data() + at, n);
      at += n;
    }
    iov.resize(first_value);
    iov.push_back({bf16_out_.data(), bf16_out_.size() * sizeof(uint16_t)});
    h.dtype = wire::bf16_dtype;
    h.payload_bytes = bf16_out_.size() * sizeof(uint16_t);
  }
  // A sync push waits for the other workers: widen this call's receive timeout.
  // The node answers (its own timeout, naming the missing workers) by wait + 2 s:
  // wait longer, so that its reason arrives rather than a bare socket timeout.
  auto wait_for = std::max(wait + std::chrono::seconds(5), timeout_);
  auto deadline = std::chrono::steady_clock::now() + wait_for;
  send_bound bound{deadline, cancel_ ? cancel_.get() : nullptr};
  if (auto err = upgrade_if_due(deadline))
    return err;
  // Set after the offer, on the socket the push goes on: an offer that met
  // the node's idle close opens a fresh connection, which has the channel's
  // timeout. (On shared memory or UCX the reads go by the deadline, not the
  // socket's timeout: two system calls a push fewer.)
  const bool socket_waits = !bytes_->waits_itself();
  if (socket_waits && fd_ >= 0)
    set_timeout(fd_, SO_RCVTIMEO, wait_for);
  wire::header pad;
  if (h.payload_bytes > 0 && pad_before(pad, sizeof(h) + h.name_len)) {
    static const char zeros[shm_channel::payload_alignment] = {};
    iov.insert(iov.begin(), {{&pad, sizeof(pad)}, {const_cast<char*>(zeros), pad.payload_bytes}});
  }
  bool sent = write_all(io(deadline), iov.data(), static_cast<int>(iov.size()), &bound);
  if (!sent) {
    auto err = fail(what, errno, wait_for, true);
    return err;
  }
  auto r = read_reply(what, deadline);
  if (socket_waits && fd_ >= 0)
    set_timeout(fd_, SO_RCVTIMEO, timeout_);
  if (!r && bf16 && is(r.error(), af_error::invalid_argument)
      && describe(r.error()).find("unknown dtype code 14") != std::string::npos)
    return make_error(af_error::unsupported,
                      describe(r.error()) + ": " + peer_ + " runs a build older than [train] "
                        "wire_dtype = \"bf16\" and cannot read a push in bf16; run one build "
                        "across the job, or set wire_dtype = \"float32\"");
  if (!r)
    return std::move(r.error());
  if (dropped_late != nullptr)
    *dropped_late = push && (reply_flags_ & wire::reply_flags::dropped_late) != 0;
  if (kind == wire::kind::push)
    note_whole_pushes(name);
  return std::make_pair(r->second, std::move(r->first));
}

void data_channel::note_whole_pushes(const std::string& name) {
  auto at = std::find(whole_pushes_.begin(), whole_pushes_.end(), name);
  bool whole = (reply_flags_ & wire::reply_flags::whole_pushes) != 0;
  if (whole && at == whole_pushes_.end())
    whole_pushes_.push_back(name);
  else if (!whole && at != whole_pushes_.end())
    whole_pushes_.erase(at);
}

bool data_channel::pad_before(wire::header& pad, uint64_t before_payload) const {
  if (shm_ == nullptr || bytes_ != moved_bytes_.get())
    return false;
  constexpr uint64_t align = shm_channel::payload_alignment;
  if ((shm_->written() + before_payload) % align == 0)
    return false;
  // The pad frame's own header moves the payload too: its padding is what
  // is left to the boundary after both.
  pad.kind = static_cast<uint8_t>(wire::kind::shm_pad);
  pad.payload_bytes = (align - (shm_->written() + sizeof(pad) + before_payload) % align) % align;
  return true;
}

} // namespace af
