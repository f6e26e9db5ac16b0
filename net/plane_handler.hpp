#pragma once
/// What the data plane serves, apart from how it carries it: the request
/// frames that reach the node's runtime (a variable op, a push or pull to an
/// aggregator, an edge value for an executor) go to a plane_handler, which
/// the runtime implements (actors/variable_directory.hpp). The server
/// (net/data_plane.hpp) reads each frame's header and name, checks the
/// envelope, takes the offers of shared memory and UCX itself, and hands
/// every other request over as a plane_request: it knows nothing of
/// variables, aggregators or executors. TensorFlow's distributed_runtime
/// keeps its worker interface apart from rpc/ the same way.
///
/// The hot path stays as it was: one virtual call per frame, and the payload
/// read straight into the handler's own buffer (read_payload), the reply
/// written straight from it (reply): no copy in between.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <sys/uio.h>

#include "caf/error.hpp"

#include "core/error_code.hpp"
#include "core/wire_format.hpp"
#include "net/data_plane_limits.hpp"

namespace af {

struct served_connection; // net/served_connection.hpp

/// One request frame whose header and name were read, its payload not yet:
/// the handler checks it, reads the payload into its own buffer, and
/// answers, through these calls. Lives on the connection's thread for the
/// handler's call only.
class plane_request {
public:
  plane_request(served_connection& conn, const wire::header& h, const std::string& name,
                const data_plane_limits& limits)
    : conn_(conn), h_(h), name_(name), limits_(limits) {}

  /// The frame's header (validated: core/wire_format.hpp).
  const wire::header& header() const { return h_; }

  /// The frame's name: a variable's, an aggregator's (after a push's
  /// wire::push_prefix) or an executor's device (after wire::edge_prefix).
  const std::string& name() const { return name_; }

  /// "host:port" of the client.
  const std::string& peer() const;

  /// The serving node's name, for messages and logs.
  const std::string& node_name() const;

  /// The server's limits ([node] max_message_bytes, ...).
  const data_plane_limits& limits() const { return limits_; }

  /// How this connection's frames travel: UCX's transport, "shared memory",
  /// "tls" or "tcp".
  std::string transport() const;

  /// Reads the frame's payload (header().payload_bytes) into `dst`, within
  /// the frame timeout. False: the connection is to be dropped; how the read
  /// ended is said in the node's log, unless `quiet` (the caller says it).
  bool read_payload(void* dst, bool quiet = false);

  /// read_payload in pieces of `piece_bytes`, calling `on_piece(offset, n)`
  /// after each piece [offset, offset + n) of `dst` has arrived: a check of
  /// the bytes runs while they are still in the core's cache.
  template <class OnPiece>
  bool read_payload(void* dst, bool quiet, size_t piece_bytes, OnPiece&& on_piece) {
    auto* bytes = static_cast<char*>(dst);
    const size_t total = h_.payload_bytes;
    for (size_t offset = 0; offset < total; offset += piece_bytes) {
      size_t n = std::min(piece_bytes, total - offset);
      if (!read_bytes(bytes + offset, n, quiet))
        return false;
      on_piece(offset, n);
    }
    return true;
  }

  /// The payload in place, without a copy, where the connection holds it in
  /// this process's memory: on shared memory (net/shm_ring.hpp), a payload
  /// no larger than the ring that starts at a multiple of `alignment` (its
  /// elements' size; the frames before it decide). `on_piece(piece, n)` runs as each piece of
  /// `piece_bytes` has arrived (a check of the bytes while they are in the
  /// core's cache, as read_payload's), then the payload comes back as a
  /// buffer that shares the ring's bytes (core/tensor.hpp's tensor::over).
  /// Its bytes stay the frame's: the connection reads its next frame only
  /// once every copy of the buffer but its own is dropped (it waits up to
  /// the frame timeout for that after the handler's call, then closes; the
  /// memory stays mapped while a copy lives). Null with `ok` true: not on
  /// this connection, or no payload (read_payload then); null with `ok`
  /// false: the connection is to be dropped (said in the log unless `quiet`).
  template <class OnPiece>
  std::shared_ptr<std::byte> payload_in_place(bool quiet, size_t alignment, size_t piece_bytes,
                                              OnPiece&& on_piece, bool& ok) {
    ok = true;
    const size_t total = h_.payload_bytes;
    if (total == 0 || consumed_ != 0 || !in_place_possible())
      return nullptr;
    // Where the payload starts in the ring depends on the frames before it:
    // one not aligned for its elements is read (copied) as usual.
    const std::byte* at = nullptr;
    if (!peek_bytes(0, quiet, &at) || reinterpret_cast<uintptr_t>(at) % alignment != 0)
      return nullptr;
    for (size_t offset = 0; offset < total; offset += piece_bytes) {
      size_t n = std::min(piece_bytes, total - offset);
      if (!peek_bytes(offset + n, quiet, &at)) {
        ok = false;
        return nullptr;
      }
      on_piece(at + offset, n);
    }
    return lend_payload(at);
  }

  /// Reads the next `n` bytes of the payload into `dst` (a payload read in
  /// parts: a sparse push's counts, then the tensors they size). A later
  /// refuse() skips only what is left. False: the connection is to be dropped.
  bool read_part(void* dst, size_t n, bool quiet = false);

  /// Skips a payload that is no tensor. False: the connection is to be
  /// dropped (one too large to skip is answered first).
  bool skip_payload();

  /// Refuses the request before its payload is read (a peer that declares a
  /// payload and never sends it still hears why), then skips the payload so
  /// that the connection goes on. False: the connection is to be dropped.
  bool refuse(af_error code, const std::string& text);

  /// refuse() of `err`'s code (internal if it is not actorflow's) and its text.
  bool refuse(const caf::error& err);

  /// The reply: `h` (its kind set to reply here), then its payload_bytes of
  /// `payload`, written straight from that buffer. False: the connection is
  /// to be dropped.
  bool reply(wire::header& h, const void* payload);

  /// The reply with its payload gathered from `count` pieces, written one
  /// after the other (their sizes add up to h.payload_bytes) straight into
  /// the answer slot, the ring or the socket: no copy of their own
  /// (an aggregator's answer from its variables' buffers). `copied(context)`,
  /// if given, runs as soon as the pieces are no longer read: on shared
  /// memory once they are in the answer slot, before the header that hands
  /// the slot over goes into the ring (so their holder lets them go before
  /// the client can read its answer, compute and push again).
  bool reply(wire::header& h, const iovec* pieces, size_t count, void (*copied)(void*) = nullptr,
             void* context = nullptr);

  // -- a streamed reply (wire::kind::push_streamed): plain TCP only --------

  /// True if this connection's bytes go straight over a TCP socket (no TLS,
  /// shared memory or UCX): the only one a streamed reply is written on.
  bool plain_tcp() const;

  /// The reply header `h` alone (its kind set to reply here); its
  /// payload_bytes follow through send_some() and send_all(). False: the
  /// connection is to be dropped.
  bool reply_head(wire::header& h);

  /// Reads into `dst` up to `max` more bytes of the payload that have
  /// arrived already, without waiting (a streamed push read in batches as
  /// large as what is there: fewer calls when the CPU, not the link, is the
  /// limit). The bytes read (0: none there yet, or not plain_tcp()); -1:
  /// the peer closed or the connection broke (the caller says it).
  long read_some(void* dst, size_t max);

  /// Writes what the socket takes now of `pieces`, without waiting: the
  /// bytes written (0: its buffer is full); -1: the connection is to be dropped.
  long send_some(const iovec* pieces, size_t count);

  /// Writes all of `pieces`, waiting as a reply's write does (the socket's
  /// send timeout). False: the connection is to be dropped.
  bool send_all(const iovec* pieces, size_t count);

  /// An error reply (status `code`, `text` as its payload). False: the
  /// connection is to be dropped.
  bool reply_error(af_error code, const std::string& text);

  /// reply_error of `err`'s code (internal if it is not actorflow's) and
  /// its text.
  bool reply_error(const caf::error& err);

private:
  /// A reply's end: counts its bytes (ok) or says why the connection drops.
  bool sent(bool ok, const wire::header& h);
  /// `n` bytes of the payload into `dst`, within the frame timeout.
  bool read_bytes(void* dst, size_t n, bool quiet);
  /// payload_in_place's parts: whether this connection can, the first `n`
  /// bytes of the payload once they are there (`at`: its start), and the
  /// buffer lent (the connection keeps a copy, served_connection::lent).
  bool in_place_possible() const;
  bool peek_bytes(size_t n, bool quiet, const std::byte** at);
  std::shared_ptr<std::byte> lend_payload(const std::byte* at);

  served_connection& conn_;
  const wire::header& h_;
  const std::string& name_;
  const data_plane_limits& limits_;
  uint64_t consumed_ = 0; ///< payload bytes read by read_part
};

/// The runtime's side of the data plane: one call per request frame, on the
/// connection's thread (several connections call at once). Each returns
/// false when the connection is to be dropped (what it had to say, it said
/// through the request), true when the next frame may come.
class plane_handler {
public:
  virtual ~plane_handler() = default;

  /// A variable op (the header's kind is a var_op).
  virtual bool variable_op(plane_request& req) = 0;

  /// A push or pull to an aggregator (wire::aggregator_kind).
  virtual bool aggregate(plane_request& req) = 0;

  /// A value for an executor (wire::kind::edge).
  virtual bool edge(plane_request& req) = 0;

  /// The rows of a table by id (wire::kind::gather_rows). A handler without
  /// tables refuses it.
  virtual bool gather_rows(plane_request& req) {
    return req.refuse(af_error::invalid_argument, "this data plane serves no table rows");
  }

  /// Several rows and values in one frame (wire::kind::gather_many). A
  /// handler without variables refuses it.
  virtual bool gather_many(plane_request& req) {
    return req.refuse(af_error::invalid_argument, "this data plane serves no variables");
  }
};

} // namespace af
