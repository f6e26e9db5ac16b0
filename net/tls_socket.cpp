#include "net/tls.hpp"
#include "net/tls_detail.hpp"
#include "net/tls_io.hpp"

#include <openssl/bio.h>
#include <openssl/ssl.h>

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

namespace af {

namespace tls_detail {

// -- a socket BIO that never raises SIGPIPE, and reads ahead -----------------
//
// OpenSSL's socket BIO writes with write(2): a peer that closed makes that a
// SIGPIPE, which ends the process unless it is ignored. Ours sends with
// MSG_NOSIGNAL (EPIPE instead, as the plaintext path does), reads with
// recvmsg(2), and flags EAGAIN (a timeout or a non-blocking socket) for retry.
//
// Reads go ahead by up to read_ahead_bytes: without it OpenSSL makes two
// recv calls per 16 KiB record (its 5-byte header, then the body), and on
// loopback those calls, each with its ACK, cost the receiver more than the
// copy of the bytes (perf, docs/wire.md "TLS figures"). One recvmsg fills
// what OpenSSL asked for and the rest of ours; OpenSSL's own read_ahead is
// no substitute: it memmoves what is left in its buffer after each record.
// What this buffer holds is invisible to SSL_has_pending: tls_has_pending
// counts both. Only where asked (the data plane's blocking sockets): an
// event loop that waits for the socket to be readable (CAF's, caf_port.cpp)
// would not see the bytes in it.

namespace {

nosig_state* nosig_of(BIO* b) {
  return static_cast<nosig_state*>(BIO_get_data(b));
}

int nosig_write(BIO* b, const char* data, int len) {
  BIO_clear_retry_flags(b);
  auto n = ::send(nosig_of(b)->fd, data, static_cast<size_t>(len), MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    BIO_set_retry_write(b);
  return static_cast<int>(n);
}

int nosig_read(BIO* b, char* data, int len) {
  BIO_clear_retry_flags(b);
  auto* s = nosig_of(b);
  if (len <= 0)
    return 0;
  auto want = static_cast<size_t>(len);
  if (s->pos < s->end) {
    auto n = std::min(want, s->end - s->pos);
    std::memcpy(data, s->ahead.get() + s->pos, n);
    s->pos += n;
    return static_cast<int>(n);
  }
  if (s->read_ahead && !s->ahead)
    s->ahead.reset(new (std::nothrow) char[read_ahead_bytes]);
  iovec iov[2] = {{data, want}, {s->ahead.get(), read_ahead_bytes}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = s->ahead ? 2 : 1; // no memory for ours: what was asked, no more
  auto n = ::recvmsg(s->fd, &msg, 0);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
      BIO_set_retry_read(b);
    return -1;
  }
  auto got = static_cast<size_t>(n);
  if (got > want) {
    s->pos = 0;
    s->end = got - want;
    got = want;
  }
  return static_cast<int>(got);
}

int nosig_puts(BIO* b, const char* str) {
  return nosig_write(b, str, static_cast<int>(std::strlen(str)));
}

long nosig_ctrl(BIO* b, int cmd, long, void*) {
  switch (cmd) {
    case BIO_CTRL_FLUSH:
      return 1;
    case BIO_CTRL_PENDING: {
      auto* s = nosig_of(b);
      return s == nullptr ? 0 : static_cast<long>(s->end - s->pos);
    }
    default:
      return 0;
  }
}

int nosig_create(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

int nosig_destroy(BIO* b) {
  delete nosig_of(b);
  BIO_set_data(b, nullptr);
  return 1;
}

/// Our BIO's type (BIO_method_type), one per process.
int nosig_type() {
  static const int type = BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR;
  return type;
}

const BIO_METHOD* nosig_method() {
  static BIO_METHOD* method = [] {
    auto* m = BIO_meth_new(nosig_type(), "actorflow socket");
    BIO_meth_set_write(m, nosig_write);
    BIO_meth_set_read(m, nosig_read);
    BIO_meth_set_puts(m, nosig_puts);
    BIO_meth_set_ctrl(m, nosig_ctrl);
    BIO_meth_set_create(m, nosig_create);
    BIO_meth_set_destroy(m, nosig_destroy);
    return m;
  }();
  return method;
}

bool set_socket(ssl_st* ssl, int fd, bool read_ahead) {
  auto* state = new (std::nothrow) nosig_state;
  if (state == nullptr)
    return false;
  state->fd = fd;
  state->read_ahead = read_ahead;
  BIO* bio = BIO_new(nosig_method());
  if (bio == nullptr) {
    delete state;
    return false;
  }
  BIO_set_data(bio, state); // nosig_destroy deletes it with the BIO
  SSL_set_bio(ssl, bio, bio); // one BIO for both directions: SSL owns it
  return true;
}

} // namespace

nosig_state* state_of(ssl_st* ssl) {
  BIO* b = SSL_get_rbio(ssl);
  if (b == nullptr || BIO_method_type(b) != nosig_type())
    return nullptr;
  return nosig_of(b);
}

} // namespace tls_detail

using tls_detail::set_socket;

bool tls_set_socket(ssl_st* ssl, int fd) {
  return set_socket(ssl, fd, false);
}

bool tls_set_socket_read_ahead(ssl_st* ssl, int fd) {
  return set_socket(ssl, fd, true);
}

bool tls_has_pending(ssl_st* ssl) {
  if (SSL_has_pending(ssl) != 0)
    return true;
  BIO* rbio = SSL_get_rbio(ssl);
  return rbio != nullptr && BIO_ctrl_pending(rbio) > 0;
}

} // namespace af
