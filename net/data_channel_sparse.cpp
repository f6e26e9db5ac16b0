/// The data channel's sparse requests: a table's rows by id (gather_rows),
/// several variables' rows and values at once (gather_many) and a sparse
/// push to an aggregator (push_sparse). Layouts: docs/wire.md.
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

caf::expected<std::chrono::steady_clock::time_point>
data_channel::begin_request(const std::string& what, size_t name_bytes,
                            std::chrono::milliseconds wait) {
  if (name_bytes > wire::max_name)
    return make_error(af_error::invalid_argument, what + ": the name is too long for the data plane");
  if (fd_ < 0)
    return make_error(af_error::peer_down, "the data connection to " + peer_ + " is closed");
  auto deadline = std::chrono::steady_clock::now() + wait;
  if (pending_.empty()) {
    // Between batches only: a fresh connection, or the move to shared
    // memory (an offer and its answer), must not come between requests out.
    reopen_if_closed_by_peer();
    if (auto err = upgrade_if_due(deadline))
      return err;
    if (fd_ < 0)
      return make_error(af_error::peer_down, what + ": the data connection to " + peer_
                                               + " is closed");
  }
  return deadline;
}

caf::error data_channel::send_pipelined(std::string what,
                                        std::chrono::steady_clock::time_point deadline,
                                        std::chrono::milliseconds wait, std::vector<iovec>& iov) {
  send_bound bound{deadline, cancel_ ? cancel_.get() : nullptr};
  if (!write_all(io(deadline), iov.data(), static_cast<int>(iov.size()), &bound))
    return fail(what, errno, wait, true);
  pending_.push_back({std::move(what), deadline, wait});
  return caf::none;
}

caf::error data_channel::send_gather_rows(const std::string& var, const tensor& ids,
                                          std::chrono::milliseconds wait) {
  auto what = "gather_rows of '" + var + "'";
  if (ids.empty() || ids.shape().size() != 1
      || (ids.type() != dtype::int32 && ids.type() != dtype::int64))
    return make_error(af_error::invalid_argument,
                      what + ": ids " + (ids.empty() ? std::string{"empty"} : ids.summary())
                        + ", expected a 1-D int32 or int64 tensor");
  auto w = wait.count() > 0 ? wait : timeout_;
  auto deadline = begin_request(what, var.size(), w);
  if (!deadline)
    return std::move(deadline.error());
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::gather_rows);
  h.name_len = static_cast<uint32_t>(var.size());
  wire::describe_tensor(ids, h); // rank 1
  std::vector<iovec> iov{{&h, sizeof(h)},
                         {const_cast<char*>(var.data()), var.size()},
                         {const_cast<std::byte*>(ids.bytes()), ids.nbytes()}};
  return send_pipelined(std::move(what), *deadline, w, iov);
}

caf::error data_channel::send_read(const std::string& var, std::chrono::milliseconds wait) {
  auto what = std::string{to_string(var_op::read)} + " of '" + var + "'";
  auto w = wait.count() > 0 ? wait : timeout_;
  auto deadline = begin_request(what, var.size(), w);
  if (!deadline)
    return std::move(deadline.error());
  wire::header h;
  h.kind = wire::request_kind(var_op::read);
  h.want_value = 1;
  h.name_len = static_cast<uint32_t>(var.size());
  std::vector<iovec> iov{{&h, sizeof(h)}, {const_cast<char*>(var.data()), var.size()}};
  return send_pipelined(std::move(what), *deadline, w, iov);
}

caf::error data_channel::send_gather_many(const std::vector<gather_ask>& parts,
                                          std::chrono::milliseconds wait) {
  std::string what = fmt::format("gather_many of {} parts", parts.size());
  if (!parts.empty())
    what += fmt::format(" ('{}'{})", parts.front().var, parts.size() > 1 ? ", ..." : "");
  if (parts.empty() || parts.size() > wire::max_gather_parts)
    return make_error(af_error::invalid_argument,
                      fmt::format("{}: 1 to {} parts", what, wire::max_gather_parts));
  // The payload (docs/wire.md): the parts' count, their descriptions, the
  // names, zeros to a multiple of 8, then each rows part's ids from its
  // own buffer.
  const auto n = static_cast<uint32_t>(parts.size());
  std::vector<wire::gather_part> desc(n);
  uint64_t names = 0, bytes = 8 + sizeof(wire::gather_part) * uint64_t{n};
  for (uint32_t i = 0; i < n; ++i) {
    const auto& p = parts[i];
    if (p.var.empty() || p.var.size() > wire::max_name)
      return make_error(af_error::invalid_argument,
                        fmt::format("{}: part {} names a variable of {} bytes (1 to {})", what, i,
                                    p.var.size(), wire::max_name));
    desc[i].name_len = static_cast<uint32_t>(p.var.size());
    names += p.var.size();
    if (p.ids.empty()) {
      desc[i].what = static_cast<uint32_t>(wire::gather_part_kind::value);
      continue;
    }
    if (p.ids.type() != dtype::int64 || p.ids.shape().size() != 1 || p.ids.num_elements() == 0)
      return make_error(af_error::invalid_argument,
                        fmt::format("{}: the ids of part {} ('{}') are {}, expected 1-D int64",
                                    what, i, p.var, p.ids.summary()));
    desc[i].what = static_cast<uint32_t>(wire::gather_part_kind::rows);
    desc[i].count = static_cast<uint64_t>(p.ids.num_elements());
    bytes += p.ids.nbytes();
  }
  static const std::byte zeros[8] = {};
  const uint64_t pad = (8 - names % 8) % 8;
  bytes += names + pad;
  auto w = wait.count() > 0 ? wait : timeout_;
  auto deadline = begin_request(what, 0, w);
  if (!deadline)
    return std::move(deadline.error());
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::gather_many);
  h.has_tensor = 1;
  h.dtype = static_cast<uint8_t>(dtype::int32);
  h.rank = 1;
  h.dims[0] = static_cast<int64_t>(bytes / 4);
  h.payload_bytes = bytes;
  const uint32_t head[2] = {n, 0};
  std::vector<iovec> iov;
  iov.reserve(4 + 2 * parts.size());
  iov.push_back({&h, sizeof(h)});
  iov.push_back({const_cast<uint32_t*>(head), sizeof(head)});
  iov.push_back({desc.data(), desc.size() * sizeof(wire::gather_part)});
  for (const auto& p : parts)
    iov.push_back({const_cast<char*>(p.var.data()), p.var.size()});
  if (pad > 0)
    iov.push_back({const_cast<std::byte*>(zeros), pad});
  for (const auto& p : parts)
    if (!p.ids.empty())
      iov.push_back({const_cast<std::byte*>(p.ids.bytes()), p.ids.nbytes()});
  return send_pipelined(std::move(what), *deadline, w, iov);
}

caf::expected<std::vector<data_channel::answer>>
data_channel::split_gather_many(const tensor& payload, size_t parts) {
  auto bad = [&](const std::string& why) {
    return make_error(af_error::internal, "a gather_many answer of " + payload.summary()
                                            + " for " + std::to_string(parts) + " parts: " + why);
  };
  const auto bytes = payload.nbytes();
  if (bytes < 8 || payload.empty())
    return bad("shorter than its count");
  const std::byte* p = payload.bytes();
  uint32_t n = 0;
  std::memcpy(&n, p, sizeof(n));
  if (n != parts || 8 + sizeof(wire::gathered_part) * uint64_t{n} > bytes)
    return bad(fmt::format("it describes {} parts", n));
  std::vector<wire::gathered_part> desc(n);
  std::vector<uint64_t> sizes(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::memcpy(&desc[i], p + 8 + sizeof(wire::gathered_part) * i, sizeof(wire::gathered_part));
    sizes[i] = desc[i].bytes;
    // Each part within the payload before the offsets are summed: sizes
    // near 2^64 would wrap them back onto the payload's end.
    if (sizes[i] > bytes)
      return bad(fmt::format("part {} claims {} bytes", i, sizes[i]));
  }
  auto at = wire::gather_many_offsets(sizes);
  if (at.back() != bytes)
    return bad(fmt::format("its parts end at byte {}", at.back()));
  // Each part a tensor over the payload's buffer: the whole payload lives
  // while any part does.
  auto whole = std::make_shared<tensor>(payload);
  std::vector<answer> out(n);
  for (uint32_t i = 0; i < n; ++i) {
    const auto& d = desc[i];
    if (!valid_dtype(d.dtype) || d.rank > wire::max_rank)
      return bad(fmt::format("part {} has dtype code {} and rank {}", i, d.dtype, d.rank));
    shape_type shape(d.dims, d.dims + d.rank);
    unsigned __int128 count = 1;
    for (auto dim : shape) {
      if (dim < 0)
        return bad(fmt::format("part {} has a negative dimension", i));
      count *= static_cast<uint64_t>(dim);
    }
    if (count * dtype_size(static_cast<dtype>(d.dtype)) != d.bytes)
      return bad(fmt::format("part {} is {} bytes for its shape {}", i, d.bytes,
                             shape_string(shape)));
    std::shared_ptr<std::byte> at_part(whole, const_cast<std::byte*>(whole->bytes() + at[i]));
    out[i].value = tensor::over(static_cast<dtype>(d.dtype), std::move(shape), std::move(at_part));
    out[i].version = d.version;
  }
  return out;
}

caf::error data_channel::send_push_sparse(const std::string& name, uint32_t worker, uint64_t step,
                                          const std::vector<tensor>& dense,
                                          const std::vector<tensor>& ids,
                                          const std::vector<tensor>& rows,
                                          std::chrono::milliseconds wait,
                                          const std::string& token, uint64_t seq) {
  auto what = fmt::format("sparse push of worker {} to aggregator '{}'", worker, name);
  if (auto err = check_push_prefix(what, name.size(), worker, token))
    return err;
  wire::push_prefix pre;
  if (ids.size() != rows.size())
    return make_error(af_error::invalid_argument,
                      fmt::format("{}: {} ids for {} rows (one of each per table)", what,
                                  ids.size(), rows.size()));
  std::memcpy(pre.token, token.data(), sizeof(pre.token));
  pre.seq = seq;
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::push_sparse);
  h.name_len = static_cast<uint32_t>(name.size() + sizeof(pre));
  h.version = step;
  h.reserved = static_cast<uint16_t>(worker);
  // The payload (docs/wire.md): the tables' row counts, the dense floats,
  // then each table's int64 ids and its rows; every piece from its own
  // buffer (int32 ids are widened first).
  std::vector<uint64_t> counts(ids.size());
  std::vector<std::vector<int64_t>> widened(ids.size());
  std::vector<iovec> iov;
  iov.reserve(4 + dense.size() + 2 * ids.size());
  iov.push_back({&h, sizeof(h)});
  iov.push_back({&pre, sizeof(pre)});
  iov.push_back({const_cast<char*>(name.data()), name.size()});
  uint64_t bytes = 0;
  bool abstain = dense.empty() && ids.empty();
  if (!abstain && !counts.empty()) {
    iov.push_back({counts.data(), counts.size() * sizeof(uint64_t)});
    bytes += counts.size() * sizeof(uint64_t);
  }
  for (const auto& d : dense) {
    if (d.type() != dtype::float32)
      return make_error(af_error::dtype_mismatch,
                        what + ": dense values must be float32, got " + d.summary());
    if (d.nbytes() > 0)
      iov.push_back({const_cast<std::byte*>(d.bytes()), d.nbytes()});
    bytes += d.nbytes();
  }
  for (size_t t = 0; t < ids.size(); ++t) {
    const auto& id = ids[t];
    const auto& row = rows[t];
    if (id.empty() || id.shape().size() != 1
        || (id.type() != dtype::int32 && id.type() != dtype::int64))
      return make_error(af_error::invalid_argument,
                        fmt::format("{}: ids of table {} are {}, expected 1-D int32 or int64",
                                    what, t, id.empty() ? std::string{"empty"} : id.summary()));
    if (row.type() != dtype::float32 || row.shape().empty() || row.shape()[0] != id.shape()[0])
      return make_error(af_error::invalid_argument,
                        fmt::format("{}: rows of table {} are {}, expected float32 [{}, ...]",
                                    what, t, row.empty() ? std::string{"empty"} : row.summary(),
                                    id.shape()[0]));
    counts[t] = static_cast<uint64_t>(id.shape()[0]);
    if (id.type() == dtype::int32) {
      const auto* src = id.data<int32_t>();
      widened[t].assign(src, src + id.num_elements());
      if (!widened[t].empty())
        iov.push_back({widened[t].data(), widened[t].size() * sizeof(int64_t)});
    } else if (id.nbytes() > 0) {
      iov.push_back({const_cast<std::byte*>(id.bytes()), id.nbytes()});
    }
    bytes += counts[t] * sizeof(int64_t);
    if (row.nbytes() > 0)
      iov.push_back({const_cast<std::byte*>(row.bytes()), row.nbytes()});
    bytes += row.nbytes();
  }
  if (!abstain) {
    // Described as 4-byte words, so that validate() bounds it as any tensor.
    h.has_tensor = 1;
    h.dtype = static_cast<uint8_t>(dtype::int32);
    h.rank = 1;
    h.dims[0] = static_cast<int64_t>(bytes / 4);
    h.payload_bytes = bytes;
  }
  // As aggregate(): a sync push waits for the other workers, and the node
  // answers its own timeout by wait + 2 s.
  auto w = std::max(wait + std::chrono::seconds(5), timeout_);
  auto deadline = begin_request(what, name.size() + sizeof(pre), w);
  if (!deadline)
    return std::move(deadline.error());
  return send_pipelined(std::move(what), *deadline, w, iov);
}

caf::expected<data_channel::answer> data_channel::next_reply() {
  if (pending_.empty())
    return make_error(af_error::internal, "a reply read from " + peer_ + " with no request out");
  auto req = std::move(pending_.front());
  pending_.pop_front();
  if (fd_ < 0)
    return make_error(af_error::peer_down, req.what + ": the data connection to " + peer_
                                             + " broke before its answer came");
  // The reply's wait: set only when it changes (a syscall), and the
  // channel's own again once no request is out.
  if (pending_rcv_.count() == 0)
    pending_rcv_ = timeout_;
  if (req.wait != pending_rcv_) {
    set_timeout(fd_, SO_RCVTIMEO, req.wait);
    pending_rcv_ = req.wait;
  }
  auto r = read_reply(req.what, req.deadline, req.wait);
  if (pending_.empty() && pending_rcv_ != timeout_) {
    if (fd_ >= 0)
      set_timeout(fd_, SO_RCVTIMEO, timeout_);
    pending_rcv_ = timeout_;
  }
  if (!r)
    return std::move(r.error());
  answer out;
  out.value = std::move(r->first);
  out.version = r->second;
  out.dropped_late = (reply_flags_ & wire::reply_flags::dropped_late) != 0;
  return out;
}

bool data_channel::await_reply(std::chrono::steady_clock::time_point until) {
  if (pending_.empty() || fd_ < 0 || bytes_->has_pending())
    return true;
  // Past the request's own deadline next_reply() fails at once (a ps that
  // went silent with its connection open: stopped, or its host cut off).
  const auto deadline = pending_.front().deadline;
  if (std::chrono::steady_clock::now() >= deadline)
    return true;
  until = std::min(until, deadline);
  if (bytes_->waits_itself()) {
    if (bytes_ != moved_bytes_.get() || (shm_ == nullptr && ucx_ == nullptr))
      return true;
    ring_bound b;
    b.deadline = until;
    // A look, then the futex or UCX's event fd (and the socket).
    b.spin = std::chrono::microseconds{0};
    auto st = shm_ ? shm_->await_bytes(fd_, b) : ucx_->await_bytes(fd_, b);
    return st != ring_status::timeout || std::chrono::steady_clock::now() >= deadline;
  }
  auto left =
    std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
  pollfd pfd{fd_, POLLIN, 0};
  int rc = ::poll(&pfd, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30)));
  if (rc < 0 && errno == EINTR)
    return false; // looked at again
  // Bytes, the end or an error (next_reply() says which); or its deadline.
  return rc != 0 || std::chrono::steady_clock::now() >= deadline;
}

caf::expected<std::pair<tensor, uint64_t>>
data_channel::gather_rows(const std::string& var, const tensor& ids,
                          std::chrono::milliseconds wait) {
  // A read: sent again once on a fresh connection if the node closed a
  // quiet one just as it went out (as call() does for read).
  bool quiet = fd_ >= 0
               && std::chrono::steady_clock::now() - last_reply_ >= std::chrono::milliseconds{100};
  for (int attempt = 0;; ++attempt) {
    bool sent = false;
    caf::expected<answer> r{caf::error{}};
    if (auto err = send_gather_rows(var, ids, wait)) {
      r = std::move(err);
    } else {
      sent = true;
      r = next_reply();
    }
    if (!r && attempt == 0 && quiet && fd_ < 0 && r.error().category() == error_category
        && (!sent || r.error().code() == static_cast<uint8_t>(af_error::peer_down))
        && reconnect())
      continue;
    if (!r)
      return std::move(r.error());
    return std::make_pair(std::move(r->value), r->version);
  }
}

caf::expected<uint64_t> data_channel::push_sparse(const std::string& name, uint32_t worker,
                                                  uint64_t step, const std::vector<tensor>& dense,
                                                  const std::vector<tensor>& ids,
                                                  const std::vector<tensor>& rows,
                                                  std::chrono::milliseconds wait,
                                                  const std::string& token, uint64_t seq,
                                                  bool* dropped_late) {
  if (dropped_late != nullptr)
    *dropped_late = false;
  if (auto err = send_push_sparse(name, worker, step, dense, ids, rows, wait, token, seq))
    return err;
  auto r = next_reply();
  if (!r)
    return std::move(r.error());
  if (dropped_late != nullptr)
    *dropped_late = r->dropped_late;
  return r->version;
}

} // namespace af
