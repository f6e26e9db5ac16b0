#pragma once
/// The socket helpers of the wire and of whoever moves bytes over its own
/// sockets (the data plane, TLS records, the all-reduce ring, the benches):
/// one copy of each loop that every one of them needs. Plain POSIX sockets,
/// no CAF, no OpenSSL.
///
/// Every helper here:
///   - never raises SIGPIPE (sends use MSG_NOSIGNAL: a closed peer is EPIPE);
///   - waits through a signal (EINTR), never reports it as the peer's doing;
///   - reports failure as false (or -1) with errno saying why, as the system
///     calls do, so that a caller keeps its own message and classification.
///
/// Blocking or not is the caller's choice of socket: on a blocking socket
/// the socket's SO_SNDTIMEO / SO_RCVTIMEO bound each wait (errno EAGAIN when
/// one passes); on a non-blocking one use transfer_by, which polls until a
/// deadline. Listening on 127.0.0.1 at a free port (tests, benches, embedded
/// clusters) is config/loopback.hpp's listen_on_loopback; tcp_connect
/// (net/tcp_connect.hpp) dials by a deadline.

#include <sys/types.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace af::sock {

// -- options ------------------------------------------------------------------

/// TCP_NODELAY on: a small message (a frame header, an ack) goes at once.
void set_nodelay(int fd);

/// SO_SNDBUF and SO_RCVBUF to `bytes` each (the kernel doubles the value and
/// caps it at net.core.[wr]mem_max). On a listening socket or before a
/// connect, so that the window scale counts it; accepted sockets inherit it.
void set_buffers(int fd, int bytes);

/// SO_RCVTIMEO or SO_SNDTIMEO (`option`) to `t`: the bound of each blocking
/// wait on `fd` (0: none). False: the socket refused it (errno says why).
bool set_timeout(int fd, int option, std::chrono::milliseconds t);

// -- time ---------------------------------------------------------------------

/// Milliseconds from now until `deadline`, clamped to [0, INT_MAX]: a
/// poll()'s timeout that is never negative (which would mean "forever").
int ms_until(std::chrono::steady_clock::time_point deadline);

/// poll() of one socket for `events`, at most `timeout_ms` (-1: no bound); a
/// signal is waited through with the time that is left. Returns poll's
/// result: > 0 ready (its revents in `revents` when given), 0 timed out,
/// < 0 an error (errno).
int poll_one(int fd, short events, int timeout_ms, short* revents = nullptr);

// -- blocking loops -----------------------------------------------------------

/// Sends all of [p, p + n) (send with MSG_NOSIGNAL | `flags`, e.g. MSG_MORE).
/// False: errno says why (EAGAIN: the socket's send timeout passed; EPIPE /
/// ECONNRESET: the peer left); some of the bytes may have gone.
bool send_all(int fd, const void* p, size_t n, int flags = 0);

/// Receives exactly `n` bytes into `p`. False: errno says why (ECONNRESET:
/// the peer closed before all came; EAGAIN: the receive timeout passed).
/// `got`, when given: how many came, also on failure. `until`, when given:
/// a receive that stopped part way is not begun again past it (EAGAIN), so a
/// peer that stalls mid-message costs at most one more wait.
bool recv_all(int fd, void* p, size_t n, size_t* got = nullptr,
              const std::chrono::steady_clock::time_point* until = nullptr);

/// One sendmsg of `iov`'s first buffers with MSG_NOSIGNAL | `flags`: at most
/// IOV_MAX of them (a frame of more parts goes in several calls, not
/// EMSGSIZE). sendmsg's result: the bytes sent, or -1 with errno.
ssize_t send_iov(int fd, const iovec* iov, int count, int flags = 0);

/// Moves `iov` and `count` past the `n` bytes a send took (the caller's
/// array: the first buffer left is shortened in place).
inline void skip_sent(iovec*& iov, int& count, size_t n) {
  while (count > 0 && n >= iov->iov_len) {
    n -= iov->iov_len;
    ++iov;
    --count;
  }
  if (count > 0) {
    iov->iov_base = static_cast<char*>(iov->iov_base) + n;
    iov->iov_len -= n;
  }
}

/// Sends all of `iov` (send_iov until done; the array is consumed as by
/// skip_sent). False: errno as send_all's.
bool send_iov_all(int fd, iovec* iov, int count, int flags = 0);

// -- bounded loops (non-blocking sockets) ---------------------------------------

/// How a transfer_by ended.
enum class io_end {
  done,      ///< all bytes moved
  closed,    ///< the peer closed (EOF on a receive; EPIPE/ECONNRESET)
  timed_out, ///< the deadline passed first
  failed     ///< another error (errno)
};

/// Moves exactly `n` bytes to (`sending`) or from `fd` by `deadline`:
/// non-blocking sends/receives, and a poll for room or data (until the
/// deadline) between them. For a socket of either mode.
io_end transfer_by(int fd, void* buf, size_t n, bool sending,
                   std::chrono::steady_clock::time_point deadline);

// -- listening ----------------------------------------------------------------

/// The port a bound socket has (an OS-picked one after binding port 0), or
/// 0 if it has none.
uint16_t local_port(int fd);

/// What listen_tcp made: a listening socket, or why not.
struct listener {
  int fd = -1;        ///< close-on-exec; -1 on failure
  uint16_t port = 0;  ///< the port it listens on (the OS's pick for port 0)
  bool resolved = true; ///< false: the host did not resolve (`why`: getaddrinfo's words)
  std::string why;    ///< on failure: what the last bind/listen said
};

/// A TCP socket listening on `host` (empty: every address) at `port` (0: one
/// the OS picks), the first of the host's addresses that binds. `before`,
/// when set, sees each socket before its bind (socket options such as
/// SO_REUSEADDR or the buffer sizes its accepted sockets inherit).
listener listen_tcp(const std::string& host, uint16_t port, int backlog,
                    const std::function<void(int)>& before = {});

} // namespace af::sock
