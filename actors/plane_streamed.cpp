/// A streamed push that a pipelined round took (wire::kind::push_streamed;
/// dist/pipelined_round.hpp), served on its connection's thread: its pieces
/// are read and handed to the round as they arrive, and between them the
/// answer's chunks already applied go back without waiting (the socket's
/// room permitting); once the push is read, the rest of the answer goes as
/// it is ready, then the trailer that says whether the round committed.
/// The thread writes only its own socket. The worker reads its answer while
/// it still sends (net/data_channel_streamed.cpp), or both ends would wait
/// on full socket buffers.
#include "actors/variable_directory.hpp"

#include <algorithm>
#include <vector>

#include <sys/uio.h>

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"
#include "train/optimizer.hpp"

namespace af {

namespace {

/// Bytes of a push read at a time: a pipelined round's chunk.
constexpr size_t piece_bytes = pipelined_chunk_floats * sizeof(float);
/// The most bytes of a push read at a time, when more than a piece has
/// arrived already.
constexpr size_t batch_bytes = 16 * piece_bytes; // 1 MiB

/// What a streamed answer still has to write: `sent` of its bytes are out;
/// the answer's floats up to `ready` are applied (or, after the round
/// ended without committing, the rest of the payload is zeros).
struct answer_stream {
  /// (A constructor, not an aggregate's braces: -Wmissing-field-initializers
  /// named every member the braces left to their defaults.)
  answer_stream(plane_request& r, streamed_push& p, uint64_t bytes)
    : req(r), push(p), total_bytes(bytes) {
    // nop
  }

  plane_request& req;
  streamed_push& push;
  uint64_t total_bytes = 0;
  uint64_t sent = 0;
  size_t ready = 0;
  caf::error failed; ///< why the round ended without committing
  std::vector<iovec> pieces;

  uint64_t available() const {
    return failed ? total_bytes : std::min<uint64_t>(ready * sizeof(float), total_bytes);
  }

  /// The pieces of [sent, available()).
  void gather() {
    pieces.clear();
    auto end = available();
    if (sent >= end)
      return;
    if (failed) {
      static const std::vector<char> zeros(piece_bytes, 0);
      for (uint64_t at = sent; at < end && pieces.size() < 64; at += zeros.size())
        pieces.push_back({const_cast<char*>(zeros.data()),
                          static_cast<size_t>(std::min<uint64_t>(zeros.size(), end - at))});
      return;
    }
    size_t from = static_cast<size_t>(sent / sizeof(float));
    push.answer_pieces(from, static_cast<size_t>(end / sizeof(float)), pieces);
    if (!pieces.empty()) { // a float cut by an earlier partial write
      size_t skip = static_cast<size_t>(sent % sizeof(float));
      pieces[0].iov_base = static_cast<char*>(pieces[0].iov_base) + skip;
      pieces[0].iov_len -= skip;
    }
  }

  /// Writes what the socket takes now. False: the connection is to be dropped.
  bool some() {
    while (sent < available()) {
      gather();
      auto n = req.send_some(pieces.data(), pieces.size());
      if (n < 0)
        return false;
      if (n == 0)
        return true;
      sent += static_cast<uint64_t>(n);
    }
    return true;
  }

  /// Writes all that is available, waiting for the socket.
  bool all() {
    while (sent < available()) {
      gather();
      uint64_t bytes = 0;
      for (const auto& p : pieces)
        bytes += p.iov_len;
      if (!req.send_all(pieces.data(), pieces.size()))
        return false;
      sent += bytes;
    }
    return true;
  }
};

} // namespace

bool variable_directory::stream_push(plane_request& req, streamed_push& push,
                                     const std::string& name, const aggregator_entry& agg) {
  const auto wait = agg.wait;
  const auto& h = req.header();
  const uint32_t worker = h.reserved;
  const size_t total = push.total();
  wire::header head;
  head.has_tensor = 1;
  head.dtype = static_cast<uint8_t>(dtype::float32);
  head.rank = 1;
  head.dims[0] = static_cast<int64_t>(total);
  head.payload_bytes = total * sizeof(float);
  head.version = push.next_step();
  auto stopped = [&](const char* what, uint64_t at) {
    push.fail(make_error(af_error::peer_down,
                         fmt::format("worker {} ({}) {} its streamed push to aggregator '{}' "
                                     "({} of its {} bytes had arrived); {}, no variable changed",
                                     worker, req.peer(), what, name, at, head.payload_bytes,
                                     push.abandoned())));
    log::get()->warn("{} data plane: dropped {}: it {} a streamed push to '{}'", req.node_name(),
                     req.peer(), what, name);
    return false;
  };
  if (!req.reply_head(head))
    return stopped("took no answer to", 0);
  answer_stream out{req, push, head.payload_bytes};
  auto* dst = reinterpret_cast<char*>(push.buffer());
  const auto* floats = push.buffer();
  // The push is read a piece at a time, waiting for it, and with it what
  // else has arrived already, up to batch_bytes: where the link is the
  // limit the pieces are small and the answer overlaps the push finely;
  // where the CPU is (loopback), the bytes pile up while the thread works,
  // and taking them in one go saves the calls, locks and wake-ups of a
  // piece each (docs/performance.md "Pipelining the sync round").
  size_t checked = 0; // floats checked and handed to the round
  for (uint64_t offset = 0; offset < head.payload_bytes;) {
    auto n = static_cast<size_t>(std::min<uint64_t>(piece_bytes, head.payload_bytes - offset));
    if (!req.read_part(dst + offset, n, true))
      return stopped("stopped in the middle of", offset);
    offset += n;
    auto more = req.read_some(
      dst + offset, static_cast<size_t>(std::min<uint64_t>(batch_bytes - n, head.payload_bytes - offset)));
    if (more < 0)
      return stopped("stopped in the middle of", offset);
    offset += static_cast<uint64_t>(more);
    const size_t upto = static_cast<size_t>(offset / sizeof(float));
    if (!out.failed && upto > checked) {
      auto bad = train::first_non_finite(floats + checked, upto - checked);
      if (bad < upto - checked) {
        out.failed = make_error(
          af_error::non_finite,
          fmt::format("the gradient of worker {} for {} is not finite ({}): refused, {} and "
                      "no variable changed",
                      worker, push.where(checked + bad), floats[checked + bad],
                      push.abandoned()));
        push.fail(out.failed);
      } else if (auto r = push.arrived(upto); !r) {
        out.failed = r.error();
      } else {
        out.ready = *r;
      }
    }
    checked = upto;
    if (!out.some()) // a write that does not wait fails only on a broken connection
      return stopped("stopped in the middle of", offset);
  }
  // The push is read: the rest of the answer as the other members' pushes
  // complete its chunks.
  while (out.sent < out.total_bytes) {
    if (!out.failed && out.available() <= out.sent) {
      if (auto r = push.wait_ready(out.ready, wait); !r)
        out.failed = r.error();
      else
        out.ready = *r;
    }
    if (!out.all())
      return stopped("took none of the answer to", head.payload_bytes);
  }
  if (out.failed)
    return req.reply_error(out.failed);
  auto end = push.outcome(wait);
  if (!end)
    return req.reply_error(end.error());
  wire::header trailer;
  trailer.version = *end;
  if (agg.paths && agg.paths->reply_flags) // read after the commit, which may have changed them
    trailer.reserved = agg.paths->reply_flags->load(std::memory_order_relaxed);
  return req.reply(trailer, nullptr);
}

} // namespace af
