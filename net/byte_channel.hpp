#pragma once
/// What carries one data-plane connection's bytes: the socket itself (tcp),
/// its TLS record layer (net/tls_io.hpp), shared-memory rings
/// (net/shm_ring.hpp) or UCX (net/ucx_link.hpp), behind one interface. The
/// frame I/O (net/data_link.hpp: write_all, read_timed, read_all) makes one
/// virtual call per transfer (a header, a name, a payload), none per byte;
/// the server and the client hold one per connection and swap it when the
/// connection moves (after an offer of shared memory or UCX). Not for other
/// users.

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace af {

struct data_link; // net/data_link.hpp
class secure_stream;
class shm_channel;
class ucx_channel;

namespace plane_io {
enum class read_end;
struct send_bound;
} // namespace plane_io

class byte_channel {
public:
  virtual ~byte_channel() = default;

  /// write_all's transfer on `io` (net/data_link.hpp).
  virtual bool write(const data_link& io, iovec* iov, int count,
                     const plane_io::send_bound* b) = 0;

  /// read_timed's transfer on `io` (a server's read).
  virtual plane_io::read_end read_timed(const data_link& io, void* buf, size_t n,
                                        int first_wait_ms, int stall_ms, bool poll_first) = 0;

  /// read_all's transfer on `io` (a client's read).
  virtual bool read_all(const data_link& io, void* buf, size_t n, size_t* got,
                        const std::chrono::steady_clock::time_point* until) = 0;

  /// How the bytes travel: "tcp", "tls", "shared memory" or UCX's transport
  /// ("ucx (tcp)").
  virtual std::string name() const = 0;

  /// Bytes already taken off the socket and not yet read (TLS's records):
  /// ask before polling the socket.
  virtual bool has_pending() const { return false; }

  /// Bytes that are there now, up to `max`, without waiting: 0 if none
  /// (or not a plain socket's channel), -1 if the connection closed or broke.
  virtual long read_some(const data_link&, void*, size_t) { return 0; }

  /// The bytes go over the plain socket (no TLS, rings or UCX).
  virtual bool plain_tcp() const { return false; }

  /// Whether its reads look for the reply and the cancel flag themselves
  /// (the rings and UCX spin, then sleep on the socket's doorbell), so that
  /// a client polls the socket for it only when this is false.
  virtual bool waits_itself() const { return false; }
};

/// The plain socket's: stateless, one for every connection.
byte_channel& tcp_bytes();

/// A served plaintext connection's on socket `fd`, with a read-ahead
/// buffer of its own: a small frame costs one recv, and the wait for the
/// next frame sleeps in recv, bounded by `idle_ms` (set as the socket's
/// SO_RCVTIMEO). Reads of its buffer's size or more go straight to the
/// caller's memory.
std::unique_ptr<byte_channel> tcp_read_ahead_bytes(int fd, int idle_ms);

/// Over `tls`'s records; the caller keeps `tls` alive while it is used.
std::unique_ptr<byte_channel> tls_bytes(secure_stream& tls);

/// Over `shm`'s rings; the caller keeps `shm` alive while it is used.
std::unique_ptr<byte_channel> shm_bytes(shm_channel& shm);

/// Over `ucx`; the caller keeps `ucx` alive while it is used.
std::unique_ptr<byte_channel> ucx_bytes(ucx_channel& ucx);

} // namespace af
