#pragma once
/// One connection a data_plane_server serves (net/data_plane_server.cpp):
/// its byte stream and what its client moved it to, for the functions that
/// serve its frames, one per kind. Not for other users.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "net/byte_channel.hpp"
#include "net/data_plane_counters.hpp"
#include "net/data_link.hpp"
#include "net/shm_ring.hpp"
#include "net/ucx_link.hpp"

namespace af {

struct served_connection {
  /// On socket `fd`, over `tls`'s records if not null.
  served_connection(std::atomic<int64_t>& shm_total, const std::string& node_name,
                    const std::string& peer, int fd, secure_stream* tls, int idle_ms,
                    int frame_ms)
    : shm_share{shm_total}, node_name(node_name), peer(peer), idle_ms(idle_ms),
      frame_ms(frame_ms), tls(tls != nullptr) {
    io.fd = fd;
    move_to(tls != nullptr ? tls_bytes(*tls) : tcp_read_ahead_bytes(fd, idle_ms));
  }

  /// Its share of max_shm_bytes, given back when the connection ends (after
  /// the segment is unmapped: declared first, destroyed last).
  struct give_back {
    std::atomic<int64_t>& total;
    int64_t bytes = 0;
    ~give_back() { total.fetch_sub(bytes); }
  } shm_share;
  const std::string& node_name;
  const std::string& peer;
  /// On shared memory (after the client's offer): the rings, bounded as the
  /// socket's reads and sends are.
  data_link io;
  int idle_ms;
  int frame_ms;
  bool tls; ///< TLS authenticated the client (its records carry the bytes until a move to UCX)
  /// The server's stop, set before it shuts the connections down: a read
  /// that ends then was ended by this node, not by the client.
  const std::atomic<bool>* server_stopping = nullptr;
  std::unique_ptr<shm_channel> shm;
  std::unique_ptr<ucx_channel> ucx; ///< after a client's offer of UCX (net/ucx_link.hpp)
  /// What io.bytes points to, when not the plain socket's. It points into
  /// `shm` or `ucx` (or the TLS stream): declared after them, destroyed first.
  std::unique_ptr<byte_channel> bytes;
  int ucx_refused = 0;              ///< offers refused as not an address: the second closes
  /// A payload lent in place (plane_request::payload_in_place): the
  /// connection's own copy of the buffer, and its bytes in the ring.
  std::shared_ptr<std::byte> lent;
  uint64_t lent_bytes = 0;
  /// The server's counters of the transport the frame being served came by
  /// (serve_frames sets it per frame); plane_request::reply counts its bytes there.
  data_plane_counters::per_transport* counted = nullptr;

  /// After the handler's call: waits until `lent` is the last copy of the
  /// payload lent (if any), then gives its room in the ring back. False:
  /// still held after the frame timeout (logged; the connection closes).
  bool take_back_lent();

  /// Bytes the client sent past an offer before its answer (taken off the
  /// socket with it): a client of ours waits for the answer, so these say
  /// the stream is not one of ours, and a move would lose them.
  bool bytes_past_offer() const { return io.bytes->plain_tcp() && io.bytes->has_pending(); }

  /// From now on the connection's bytes go over `b`.
  void move_to(std::unique_ptr<byte_channel> b) {
    bytes = std::move(b);
    io.bytes = bytes.get();
  }

  /// True if a read ended the connection; says why in the log if the peer went silent.
  bool ended(plane_io::read_end how, const char* where) const;
};

} // namespace af
