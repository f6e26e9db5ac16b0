#pragma once
/// The data plane's byte stream and its frame I/O (net/data_link.cpp), shared
/// by the files of the data-plane server and channel (net/data_plane*.cpp,
/// net/data_channel*.cpp); not for other users.
///
/// A server's reads are bounded per wait (read_timed: idle between frames,
/// the frame timeout within one); a client's by its socket's timeouts and one
/// deadline per call (read_all, send_bound). Every helper takes the link,
/// whatever it runs on: the socket, its TLS record layer, shared-memory rings
/// or UCX.

#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "caf/error.hpp"

#include "core/error_code.hpp"
#include "core/tensor.hpp"
#include "core/wire_format.hpp"
#include "net/byte_channel.hpp"
#include "net/shm_ring.hpp"
#include "net/socket.hpp"
#include "net/tls.hpp"
#include "net/ucx_link.hpp"

namespace af {

class secure_stream; // net/tls_io.hpp

/// One connection's byte stream: its socket, and what carries its bytes
/// (net/byte_channel.hpp): the socket itself, its record layer
/// (net/tls_io.hpp) when the data plane runs with [security], its
/// shared-memory rings (net/shm_ring.hpp) once a client on this host has
/// moved to them, or UCX. One virtual call per transfer, none per byte.
struct data_link {
  int fd = -1;
  byte_channel* bytes = &tcp_bytes();
  // On shared memory (and UCX), what bounds a wait (the socket's timeouts do on TCP):
  int stall_ms = 0; ///< no byte moved for this long (the node's frame timeout)
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  const std::atomic<bool>* cancel = nullptr;
  /// Spin before sleeping: on the rings, and on a served TCP connection
  /// for its next frame (net/adaptive_spin.hpp).
  std::chrono::microseconds spin{0};
};

namespace plane_io {

using link = data_link;

/// Why the record layer failed last on this thread (errno is then EPROTO,
/// or ECONNRESET for a record cut short): the reason for the error message
/// or the log line.
extern thread_local std::string last_tls_error;

/// The kind of that failure (net/tls.hpp), kept with it.
extern thread_local tls_failure last_tls_failure;

/// After a failed read or write of `tls`: its reason kept for the message.
void note_failure(const secure_stream& tls);

using sock::set_timeout; // net/socket.hpp

/// A client call's bound on its sends: one deadline for the whole frame (not
/// a wait per send that each byte moved restarts), and a cancel flag (Ctrl-C)
/// looked at between slices. Past the deadline: EAGAIN; cancelled: ECANCELED.
struct send_bound {
  std::chrono::steady_clock::time_point deadline;
  const std::atomic<bool>* cancel = nullptr;
};

/// Milliseconds left before `b`'s deadline (0 if none).
long long ms_left(const send_bound& b);

/// Writes all of `iov` on `io` (partial writes continue where they stopped),
/// within `b` if given (a client's send), else blocking as the socket's
/// SO_SNDTIMEO lets it. False: errno says why.
bool write_all(const link& io, iovec* iov, int count, const send_bound* b = nullptr);

/// How a server-side read ended.
enum class read_end { done, closed, idle, stalled, failed };

/// Reads exactly `n` bytes on a server connection without ever blocking for
/// longer than a timeout: up to `first_wait_ms` for the first byte, then up to
/// `stall_ms` for each next one. idle: nothing came at all; stalled: the peer
/// stopped part way. At a frame's start (`poll_first`) the socket is polled
/// first: a client between ops usually has sent nothing yet.
read_end read_timed(const link& io, void* buf, size_t n, int first_wait_ms, int stall_ms,
                    bool poll_first);

/// "host:port" ("[v6]:port") of a connected peer.
std::string peer_address(const sockaddr_storage& addr, socklen_t len);

/// The af_error to put on the wire for `err`: its own code, or for an error
/// that is not actorflow's (CAF's, say) internal, with its text.
af_error wire_code(const caf::error& err);

/// Reads exactly `n` bytes (client side: the socket's SO_RCVTIMEO bounds each
/// wait); false on EOF, error or timeout (errno tells). `got`: how many came.
/// `until` (plaintext): a read that stopped part way is not begun again past
/// it (EAGAIN), so a node that stalls mid-reply costs at most one more wait.
bool read_all(const link& io, void* buf, size_t n, size_t* got = nullptr,
              const std::chrono::steady_clock::time_point* until = nullptr);

/// One frame: `h`, then `name` (if any), then `h.payload_bytes` of `payload`.
bool send_frame(const link& fd, wire::header& h, const std::string* name, const void* payload,
                const send_bound* b = nullptr);

/// An error reply: status `code`, the text as its payload.
bool send_error(const link& fd, af_error code, const std::string& text);

/// send_error for a connection that is closing anyway: nothing may throw.
void last_words(const link& fd, af_error code, const char* node, const char* text) noexcept;

/// The most payload a refused request is read past so that its connection
/// stays usable. A refusal of a larger one goes out at once and the
/// connection closes: a peer that declares terabytes (and sends nothing)
/// gets its answer now instead of holding a thread until the frame timeout
/// and getting none.
constexpr uint64_t drain_limit = uint64_t{1} << 30;

/// What became of a refused request's payload: skipped (the connection goes
/// on), too large to skip (answered, to be closed), or lost (the peer
/// stalled or left; `how` says which).
enum class skipped { past, too_large, lost };

skipped skip_payload(const link& fd, uint64_t bytes, int frame_ms, read_end& how);

/// Refuses a request before its payload is read (a peer that declares an
/// operand and never sends it still hears why), then skips the payload
/// through a small buffer, under the frame timeout, so that the connection
/// goes on; one too large to skip is answered and closed. True: the
/// connection goes on; else `how` says whether the peer stalled or left.
bool refuse_request(const link& io, af_error code, const std::string& text, uint64_t payload,
                    int frame_ms, read_end& how);

/// The first bytes of a frame header ("AFDP" in host byte order).
bool looks_like_frame(const unsigned char* p, size_t n);

/// Connections of one host that may be in their TLS handshake at once.
constexpr int max_handshakes_per_host = 8;

/// "h" of "h:port" or "[v6]:port".
std::string host_of(const std::string& peer);

/// The first bytes of a TLS record (handshake or alert, version 3.x).
bool looks_like_tls(const unsigned char* p, size_t n);

/// Why a push (`what`, for the message) to an aggregator whose name has
/// `name_size` bytes cannot carry its prefix (wire::push_prefix): a name
/// too long with it, a worker index over 16 bits, a token not of the
/// join's size. None: it can.
caf::error check_push_prefix(const std::string& what, size_t name_size, uint32_t worker,
                             const std::string& token);

/// Appends `values` to `iov` (one flat float32 tensor, sent from their own
/// buffers: no copy) and describes it in `h`. An error names a value that
/// is not float32.
caf::error append_float_values(const std::string& what, const std::vector<tensor>& values,
                               std::vector<iovec>& iov, wire::header& h);

/// Closes a connection refused before it was served: what it sent is read
/// (a little, without waiting) so that the close is a FIN, not a reset that
/// would take a reply already sent with it.
void close_refused(int fd);

} // namespace plane_io
} // namespace af
