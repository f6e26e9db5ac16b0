#include "net/tls.hpp"
#include "net/tls_io.hpp"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <openssl/x509_vfy.h>

#include <fcntl.h>
#include <poll.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "core/read_file.hpp"
#include "net/socket.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

struct bio_deleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct x509_deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct pkey_deleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct store_deleter {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct store_ctx_deleter {
  void operator()(X509_STORE_CTX* s) const { X509_STORE_CTX_free(s); }
};
struct ctx_deleter {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using x509_ptr = std::unique_ptr<X509, x509_deleter>;

/// The whole file, or an error naming it and the [security] key it came from.
caf::expected<std::string> slurp(const std::string& path, const char* key, const std::string& who) {
  if (path.empty())
    return make_error(af_error::invalid_config,
                      fmt::format("{}: [security] has a certificate but no {}; set {} = \"<file>\"",
                                  who, key, key));
  // A regular file of at most a few MiB: a FIFO would block the node before
  // it said anything, /dev/zero would grow until it aborted.
  std::string out;
  if (auto why = read_regular_file(path, max_pem_file_bytes, out); !why.empty())
    return make_error(af_error::invalid_config,
                      fmt::format("{}: cannot read {} file '{}' ([security] {}): {}", who, key, path,
                                  key, why));
  return out;
}

/// The passphrase for an encrypted key, from security_options: never a
/// prompt on the terminal (OpenSSL's default would block a node started by
/// a supervisor).
int passphrase_cb(char* buf, int size, int, void* userdata) {
  const auto* pass = static_cast<const std::string*>(userdata);
  if (pass == nullptr || pass->empty() || static_cast<int>(pass->size()) > size)
    return 0;
  std::memcpy(buf, pass->data(), pass->size());
  return static_cast<int>(pass->size());
}

/// Expired or not yet valid: what is wrong with `cert`'s dates, or empty.
std::string check_dates(X509* cert) {
  auto print = [](const ASN1_TIME* t) {
    std::unique_ptr<BIO, bio_deleter> bio{BIO_new(BIO_s_mem())};
    ASN1_TIME_print(bio.get(), t);
    char* data = nullptr;
    auto n = BIO_get_mem_data(bio.get(), &data);
    return std::string(data, static_cast<size_t>(n));
  };
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0)
    return "expired on " + print(X509_get0_notAfter(cert));
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0)
    return "not valid before " + print(X509_get0_notBefore(cert));
  return {};
}

caf::expected<x509_ptr> read_cert(const std::string& pem, const std::string& path, const char* key,
                                  const std::string& who) {
  std::unique_ptr<BIO, bio_deleter> bio{BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))};
  x509_ptr cert{PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)};
  if (!cert) {
    ERR_clear_error();
    return make_error(af_error::invalid_config,
                      fmt::format("{}: {} file '{}' ([security] {}) is not a PEM certificate "
                                  "(-----BEGIN CERTIFICATE-----)",
                                  who, key, path, key));
  }
  auto dates = check_dates(cert.get());
  if (!dates.empty())
    return make_error(af_error::invalid_config,
                      fmt::format("{}: the certificate in '{}' ([security] {}) {}; make a new one "
                                  "(actorflow-certs)",
                                  who, path, key, dates));
  return cert;
}

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

constexpr size_t read_ahead_bytes = 64 * 1024;

struct nosig_state {
  int fd = -1;
  bool read_ahead = false;
  std::unique_ptr<char[]> ahead; // allocated at the first read
  size_t pos = 0;                // ahead[pos, end): received, not yet read
  size_t end = 0;
};

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

/// Our BIO's state behind `ssl`, or null if its read BIO is not ours.
nosig_state* state_of(SSL* ssl) {
  BIO* b = SSL_get_rbio(ssl);
  if (b == nullptr || BIO_method_type(b) != nosig_type())
    return nullptr;
  return nosig_of(b);
}

} // namespace

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

tls_context::~tls_context() {
  SSL_CTX_free(ctx_);
}

std::string tls_errors(const std::string& fallback) {
  std::string out;
  while (auto e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    // "error:0A000086:SSL routines::certificate verify failed": the reason.
    const char* reason = ERR_reason_error_string(e);
    if (!out.empty())
      out += "; ";
    out += reason != nullptr ? reason : buf;
  }
  return out.empty() ? fallback : out;
}

const char* to_string(tls_failure f) {
  switch (f) {
    case tls_failure::none:
      return "none";
    case tls_failure::wrong_name:
      return "wrong_name";
    case tls_failure::unknown_ca:
      return "unknown_ca";
    case tls_failure::forged_record:
      return "forged_record";
    case tls_failure::refused:
      return "refused";
    case tls_failure::protocol:
      return "protocol";
    case tls_failure::handshake:
      return "handshake";
    case tls_failure::timeout:
      return "timeout";
    case tls_failure::closed:
      return "closed";
    case tls_failure::io:
      return "io";
    case tls_failure::internal:
      return "internal";
  }
  return "?";
}

bool tls_expect_host(ssl_st* ssl, const std::string& host) {
  auto* param = SSL_get0_param(ssl);
  // An IP address is checked as one; anything else as a DNS name.
  return X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) == 1
         || SSL_set1_host(ssl, host.c_str()) == 1;
}

std::string tls_own_task(const tls_context& ctx) {
  auto* cert = SSL_CTX_get0_certificate(ctx.native());
  char cn[256] = {};
  if (cert == nullptr
      || X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn)) < 0)
    return {};
  std::string name{cn};
  return name.rfind("/job:", 0) == 0 ? name : std::string{};
}

std::string tls_wrong_task(ssl_st* ssl, const std::string& task) {
  if (task.empty())
    return {};
  auto* cert = SSL_get0_peer_certificate(ssl);
  if (cert == nullptr)
    return "it showed no certificate";
  char cn[256] = {};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn)) < 0)
    return {};
  std::string name{cn};
  if (name.rfind("/job:", 0) != 0 || name == task)
    return {};
  return "its certificate is " + name + "'s, not " + task
         + "'s: another member answers at this address (is the cluster config current?)";
}

namespace {

/// The kind of a socket error of the handshake or the first record.
tls_failure failure_of_errno(int err) {
  switch (err) {
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
    case ETIMEDOUT:
      return tls_failure::timeout;
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN:
      return tls_failure::closed;
    case ENOMEM:
    case ENOBUFS:
      return tls_failure::internal;
    default:
      return tls_failure::io;
  }
}

/// The kind of what OpenSSL's error queue holds, by its first error (left
/// in the queue, for tls_errors to say).
tls_failure failure_of_queue() {
  unsigned long e = ERR_peek_error();
  if (e != 0 && ERR_GET_REASON(e) == ERR_GET_REASON(ERR_R_MALLOC_FAILURE))
    return tls_failure::internal;
  if (e == 0 || ERR_GET_LIB(e) != ERR_LIB_SSL)
    return tls_failure::handshake;
  auto reason = ERR_GET_REASON(e);
  if (reason >= SSL_AD_REASON_OFFSET)
    return tls_failure::refused; // an alert the peer sent
  switch (reason) {
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
    case SSL_R_HTTP_REQUEST:
    case SSL_R_HTTPS_PROXY_REQUEST:
#ifdef SSL_R_RECORD_LAYER_FAILURE
    case SSL_R_RECORD_LAYER_FAILURE:
#endif
      return tls_failure::protocol;
    case SSL_R_UNEXPECTED_EOF_WHILE_READING:
      return tls_failure::closed;
    default:
      return tls_failure::handshake;
  }
}

/// The names in `cert`'s subjectAltName ("IP:10.0.0.1, DNS:ps0"), or
/// "none" if it has none.
std::string alt_names(X509* cert) {
  std::string out;
  auto* names = static_cast<GENERAL_NAMES*>(
    X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    auto* n = sk_GENERAL_NAME_value(names, i);
    std::string one;
    if (n->type == GEN_DNS) {
      auto* d = n->d.dNSName;
      one = "DNS:" + std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(d)),
                                 static_cast<size_t>(ASN1_STRING_length(d)));
    } else if (n->type == GEN_IPADD) {
      auto* ip = n->d.iPAddress;
      char text[64] = "?";
      int len = ASN1_STRING_length(ip);
      const unsigned char* b = ASN1_STRING_get0_data(ip);
      if (len == 4)
        std::snprintf(text, sizeof(text), "%u.%u.%u.%u", b[0], b[1], b[2], b[3]);
      else if (len == 16)
        inet_ntop(AF_INET6, b, text, sizeof(text));
      one = std::string{"IP:"} + text;
    }
    if (one.empty())
      continue;
    if (!out.empty())
      out += ", ";
    out += one;
  }
  GENERAL_NAMES_free(names);
  return out.empty() ? "none" : out;
}

} // namespace

std::string tls_handshake_failure(ssl_st* ssl, int ret, tls_failure* kind) {
  auto set = [kind](tls_failure f) {
    if (kind != nullptr)
      *kind = f;
  };
  auto verify = SSL_get_verify_result(ssl);
  if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH) {
    set(tls_failure::wrong_name);
    ERR_clear_error();
    auto* param = SSL_get0_param(ssl);
    std::string host;
    if (char* ip = X509_VERIFY_PARAM_get1_ip_asc(param)) {
      host = ip;
      OPENSSL_free(ip);
    } else if (const char* dns = X509_VERIFY_PARAM_get0_host(param, 0)) {
      host = dns;
    }
    // The verification failed before OpenSSL kept the peer's certificate:
    // the leaf of the chain it showed.
    X509* leaf = nullptr;
    if (auto* chain = SSL_get_peer_cert_chain(ssl); chain != nullptr && sk_X509_num(chain) > 0)
      leaf = sk_X509_value(chain, 0);
    std::string shown = "?", cn;
    if (leaf != nullptr) {
      shown = alt_names(leaf);
      char buf[256] = {};
      if (X509_NAME_get_text_by_NID(X509_get_subject_name(leaf), NID_commonName, buf, sizeof(buf))
          >= 0)
        cn = buf;
    }
    return fmt::format("its certificate{} is not for {}: it names {} (subjectAltName); another "
                       "machine answers at this address, or the certificate was made for another "
                       "host (actorflow-certs writes each task's host)",
                       cn.empty() ? std::string{} : " (" + cn + ")", host, shown);
  }
  if (verify != X509_V_OK) {
    set(tls_failure::unknown_ca);
    ERR_clear_error();
    return fmt::format("its certificate was refused ({}): is it signed by this cluster's CA "
                       "([security] ca)?",
                       X509_verify_cert_error_string(verify));
  }
  auto err = SSL_get_error(ssl, ret);
  int saved = errno;
  if (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
    set(saved == 0 ? tls_failure::closed : failure_of_errno(saved));
    if (saved == EAGAIN || saved == EWOULDBLOCK)
      return "the TLS handshake timed out";
    return saved == 0 ? std::string{"the peer closed the connection during the TLS handshake"}
                      : std::string{"TLS handshake: "} + std::strerror(saved);
  }
  set(err == SSL_ERROR_ZERO_RETURN ? tls_failure::closed : failure_of_queue());
  return "TLS handshake failed: " + tls_errors("no reason given");
}

std::string tls_handshake(ssl_st* ssl, int fd, bool server, std::chrono::milliseconds limit,
                          tls_failure* kind) {
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  auto deadline = std::chrono::steady_clock::now() + limit;
  std::string why;
  for (;;) {
    ERR_clear_error();
    errno = 0;
    int ret = server ? SSL_accept(ssl) : SSL_connect(ssl);
    if (ret == 1)
      break;
    int err = SSL_get_error(ssl, ret);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      auto left = sock::ms_until(deadline);
      if (left <= 0) {
        why = fmt::format("the TLS handshake did not finish within {} ms", limit.count());
        if (kind != nullptr)
          *kind = tls_failure::timeout;
        break;
      }
      sock::poll_one(fd, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, std::min(left, 1000));
      continue;
    }
    why = tls_handshake_failure(ssl, ret, kind);
    break;
  }
  fcntl(fd, F_SETFL, flags);
  return why;
}

caf::expected<std::shared_ptr<tls_context>> make_tls_context(const security_options& sec,
                                                             const std::string& who) {
  auto ca_pem = slurp(sec.ca_file, "ca", who);
  if (!ca_pem)
    return std::move(ca_pem.error());
  auto cert_pem = slurp(sec.cert_file, "certificate", who);
  if (!cert_pem)
    return std::move(cert_pem.error());
  auto key_pem = slurp(sec.key_file, "key", who);
  if (!key_pem)
    return std::move(key_pem.error());
  // The CA file may hold several (a CA being replaced): all are trusted.
  std::vector<x509_ptr> cas;
  {
    auto first = read_cert(*ca_pem, sec.ca_file, "ca", who);
    if (!first)
      return std::move(first.error());
    std::unique_ptr<BIO, bio_deleter> bio{
      BIO_new_mem_buf(ca_pem->data(), static_cast<int>(ca_pem->size()))};
    while (auto* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr))
      cas.emplace_back(x);
    ERR_clear_error(); // the end of the file
  }
  auto cert = read_cert(*cert_pem, sec.cert_file, "certificate", who);
  if (!cert)
    return std::move(cert.error());

  // The key: with the passphrase of passphrase_file, never a prompt.
  std::unique_ptr<BIO, bio_deleter> kbio{
    BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size()))};
  std::string pass = sec.passphrase;
  std::unique_ptr<EVP_PKEY, pkey_deleter> key{
    PEM_read_bio_PrivateKey(kbio.get(), nullptr, passphrase_cb, &pass)};
  if (!key) {
    ERR_clear_error();
    bool encrypted = key_pem->find("ENCRYPTED") != std::string::npos;
    bool pem = key_pem->find("-----BEGIN") != std::string::npos
               && key_pem->find("PRIVATE KEY-----") != std::string::npos;
    std::string why;
    if (!pem)
      why = "is not a PEM private key (-----BEGIN PRIVATE KEY-----)";
    else if (encrypted && sec.passphrase.empty())
      why = "is encrypted and no passphrase was given; set [security] passphrase_file";
    else if (encrypted)
      why = "cannot be decrypted with the passphrase of '" + sec.passphrase_file
            + "' (wrong passphrase?)";
    else
      why = "cannot be read (a damaged PEM key?)";
    return make_error(af_error::invalid_config,
                      fmt::format("{}: the key file '{}' ([security] key) {}", who, sec.key_file, why));
  }
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    ERR_clear_error();
    return make_error(af_error::invalid_config,
                      fmt::format("{}: the key in '{}' does not match the certificate in '{}'; use "
                                  "the key made with that certificate",
                                  who, sec.key_file, sec.cert_file));
  }

  // The certificate must be one the cluster CA signed: a peer would refuse
  // it anyway, say so at start instead of at the first connection.
  {
    std::unique_ptr<X509_STORE, store_deleter> store{X509_STORE_new()};
    for (auto& ca : cas)
      X509_STORE_add_cert(store.get(), ca.get());
    std::unique_ptr<X509_STORE_CTX, store_ctx_deleter> vctx{X509_STORE_CTX_new()};
    X509_STORE_CTX_init(vctx.get(), store.get(), cert->get(), nullptr);
    if (X509_verify_cert(vctx.get()) != 1) {
      auto code = X509_STORE_CTX_get_error(vctx.get());
      ERR_clear_error();
      return make_error(af_error::invalid_config,
                        fmt::format("{}: the certificate in '{}' is not signed by the CA in '{}' "
                                    "([security] ca): {}",
                                    who, sec.cert_file, sec.ca_file,
                                    X509_verify_cert_error_string(code)));
    }
  }

  std::unique_ptr<SSL_CTX, ctx_deleter> ctx{SSL_CTX_new(TLS_method())};
  if (!ctx)
    return make_error(af_error::internal, who + ": " + tls_errors("cannot make an SSL_CTX"));
  auto* c = ctx.get();
  // TLS 1.3 only: every actorflow process speaks it, its key schedule is
  // what the data plane's exported keys rely on (docs/wire.md "TLS"), and a
  // 1.2 peer could leave out the extended master secret.
  SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION);
  // AES-128-GCM first: AES-NI makes it the fastest on x86 (docs/wire.md).
  SSL_CTX_set_ciphersuites(c, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                              "TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_cipher_list(c, "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                             "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384");
  // No session tickets: the server would send them after the handshake, and
  // a client that never reads them would take them for data when it checks
  // whether an idle connection was closed. Each connection is long-lived.
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  // A peer that closes without close_notify (a killed process, a server
  // dropping an idle connection) is a closed connection, as in plaintext
  // (ECONNRESET: peer_down, which a session's retry knows), not a TLS error.
  SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE
                           | SSL_OP_IGNORE_UNEXPECTED_EOF);
  // Whole writes only (SSL_MODE_ENABLE_PARTIAL_WRITE stays off).
  SSL_CTX_clear_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE);
  // Measured and left out (docs/wire.md): OpenSSL's read_ahead (it memmoves
  // its buffer's rest after each record; our BIO reads ahead instead), kernel
  // TLS (this kernel has no "tls" ULP).
  if (SSL_CTX_use_certificate(c, cert->get()) != 1 || SSL_CTX_use_PrivateKey(c, key.get()) != 1)
    return make_error(af_error::invalid_config,
                      fmt::format("{}: OpenSSL refused the certificate '{}' or key '{}': {}", who,
                                  sec.cert_file, sec.key_file, tls_errors("no reason given")));
  for (auto& ca : cas)
    if (X509_STORE_add_cert(SSL_CTX_get_cert_store(c), ca.get()) != 1)
      return make_error(af_error::invalid_config,
                        fmt::format("{}: OpenSSL refused the CA '{}': {}", who, sec.ca_file,
                                    tls_errors("no reason given")));
  // Both sides show a certificate of the cluster CA, or no connection.
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_verify_depth(c, 4);
  return std::make_shared<tls_context>(ctx.release(), who);
}

// -- the data plane's record layer (tls_io.hpp) ---------------------------------

const char* const tls_label_client_to_server = "EXPORTER-actorflow-data client->server";
const char* const tls_label_server_to_client = "EXPORTER-actorflow-data server->client";

namespace {

/// Ciphertext read ahead of the caller: as the BIO's, one recvmsg takes a
/// record's rest and what follows it.
constexpr size_t raw_bytes = read_ahead_bytes;

/// A record is encrypted and sent in pieces of this size: each is still in
/// cache when the kernel copies it, and the sender's buffer stays small.
constexpr size_t send_chunk_bytes = 64 * 1024;

/// The nonce of record `seq`: the direction's secret IV XOR (4 zero bytes,
/// then seq big-endian), as TLS 1.3 (RFC 8446 5.3) and QUIC make theirs.
void nonce_of(const unsigned char base[12], uint64_t seq, unsigned char iv[12]) {
  std::memcpy(iv, base, 12);
  for (int i = 0; i < 8; ++i)
    iv[4 + i] ^= static_cast<unsigned char>(seq >> (56 - 8 * i));
}

void put_be32(uint32_t v, unsigned char* p) {
  p[0] = static_cast<unsigned char>(v >> 24);
  p[1] = static_cast<unsigned char>(v >> 16);
  p[2] = static_cast<unsigned char>(v >> 8);
  p[3] = static_cast<unsigned char>(v);
}

uint32_t get_be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

} // namespace

std::unique_ptr<secure_stream> secure_stream::make(ssl_st* ssl, int fd, bool server,
                                                   std::string& why) {
  if (SSL_has_pending(ssl) != 0) {
    why = "the peer sent TLS data right after the handshake (a session ticket or a request "
          "sent too early), where the data plane's records were expected";
    return nullptr;
  }
  // Per direction: a 16-byte key, then a 12-byte IV (record_secret_bytes).
  unsigned char c2s[record_secret_bytes], s2c[record_secret_bytes];
  auto derive = [&](unsigned char* out, const char* label) {
    return SSL_export_keying_material(ssl, out, record_secret_bytes, label, std::strlen(label),
                                      nullptr, 0, 0)
           == 1;
  };
  if (!derive(c2s, tls_label_client_to_server) || !derive(s2c, tls_label_server_to_client)) {
    why = tls_errors("cannot derive the data plane's keys from the TLS session");
    return nullptr;
  }
  std::unique_ptr<secure_stream> out{new (std::nothrow) secure_stream};
  if (out) {
    out->enc_ = aes_gcm::make(true, server ? s2c : c2s);
    out->dec_ = aes_gcm::make(false, server ? c2s : s2c);
    out->raw_.reset(new (std::nothrow) char[raw_bytes]);
  }
  bool ok = out && out->enc_ && out->dec_ && out->raw_;
  if (ok) {
    std::memcpy(out->send_iv_, (server ? s2c : c2s) + 16, 12);
    std::memcpy(out->recv_iv_, (server ? c2s : s2c) + 16, 12);
  }
  OPENSSL_cleanse(c2s, sizeof(c2s));
  OPENSSL_cleanse(s2c, sizeof(s2c));
  if (!ok) {
    why = tls_errors("no memory for the data plane's record layer");
    return nullptr; // out's destructor must not free the caller's ssl
  }
  // What the BIO read past the handshake is the peer's first record(s).
  if (auto* st = state_of(ssl); st != nullptr && st->pos < st->end) {
    auto n = st->end - st->pos; // <= read_ahead_bytes == raw_bytes
    std::memcpy(out->raw_.get(), st->ahead.get() + st->pos, n);
    out->raw_end_ = n;
    st->pos = st->end = 0;
  }
  out->ssl_ = ssl;
  out->fd_ = fd;
  out->server_ = server;
  return out;
}

bool secure_stream::rekey(uint64_t epoch, bool sending) {
  const char* label = server_ == sending ? tls_label_server_to_client : tls_label_client_to_server;
  unsigned char context[8], key[record_secret_bytes];
  for (int i = 0; i < 8; ++i)
    context[i] = static_cast<unsigned char>(epoch >> (56 - 8 * i));
  bool ok = SSL_export_keying_material(ssl_, key, sizeof(key), label, std::strlen(label), context,
                                       sizeof(context), 1)
              == 1
            && (sending ? enc_ : dec_)->set_key(key);
  if (ok)
    std::memcpy(sending ? send_iv_ : recv_iv_, key + 16, 12);
  OPENSSL_cleanse(key, sizeof(key));
  return ok;
}

secure_stream::~secure_stream() {
  SSL_free(ssl_);
}

bool secure_stream::fail(tls_failure kind, const std::string& why) {
  failed_ = true;
  failure_ = kind;
  reason_ = why;
  errno = EPROTO;
  return false;
}

bool secure_stream::send_record(const iovec* parts, int, size_t len) {
  if (send_seq_ == UINT64_MAX)
    return fail(tls_failure::internal,
                "the connection has sent 2^64-1 records; it must be opened again");
  auto need = std::min(len, send_chunk_bytes) + header_bytes + tag_bytes;
  if (out_cap_ < need) {
    out_.reset(new (std::nothrow) char[need]);
    out_cap_ = out_ ? need : 0;
    if (!out_)
      return fail(tls_failure::internal, "no memory for a record's buffer");
  }
  auto* buf = reinterpret_cast<unsigned char*>(out_.get());
  if (send_seq_ > 0 && send_seq_ % rekey_records == 0
      && !rekey(send_seq_ / rekey_records, true))
    return fail(tls_failure::internal, tls_errors("cannot derive the next key"));
  unsigned char iv[12];
  nonce_of(send_iv_, send_seq_, iv);
  put_be32(static_cast<uint32_t>(len), buf);
  if (!enc_->start(iv, buf, header_bytes))
    return fail(tls_failure::internal, tls_errors("AES-GCM refused a record"));
  ++send_seq_; // the nonce is spent, whatever happens to the record
  // The header goes with the first piece, the tag with the last: pieces
  // of at most send_chunk_bytes, each encrypted into out_ and sent.
  size_t used = header_bytes;
  size_t left = len;
  int part = 0;
  size_t offset = 0; // within parts[part]
  for (;;) {
    while (left > 0 && used < header_bytes + send_chunk_bytes) {
      while (parts[part].iov_len == offset) {
        ++part;
        offset = 0;
      }
      auto n = std::min({parts[part].iov_len - offset, header_bytes + send_chunk_bytes - used, left});
      if (!enc_->update(buf + used, static_cast<const unsigned char*>(parts[part].iov_base) + offset,
                        n))
        return fail(tls_failure::internal, tls_errors("AES-GCM refused a record"));
      used += n;
      offset += n;
      left -= n;
    }
    if (left == 0) {
      if (!enc_->seal(buf + used))
        return fail(tls_failure::internal, tls_errors("AES-GCM refused a record"));
      used += tag_bytes;
      return sock::send_all(fd_, out_.get(), used, 0);
    }
    if (!sock::send_all(fd_, out_.get(), used, MSG_MORE))
      return false;
    used = 0;
  }
}

bool secure_stream::send_hello() {
  return send_record(nullptr, 0, 0);
}

bool secure_stream::write(const iovec* iov, int count) {
  if (failed_) {
    errno = EPROTO;
    return false;
  }
  // A part this large starts a record of its own: a frame's header and name
  // are one small record, and its payload's records are whole, so that the
  // reader takes them straight into the tensor.
  constexpr size_t large = 16 * 1024;
  constexpr int max_parts = 64;
  iovec parts[max_parts];
  int np = 0;
  size_t len = 0;
  auto flush = [&] {
    bool ok = len == 0 || send_record(parts, np, len);
    np = 0;
    len = 0;
    return ok;
  };
  for (int i = 0; i < count; ++i) {
    auto* p = static_cast<const char*>(iov[i].iov_base);
    size_t left = iov[i].iov_len;
    if (left >= large && len > 0 && !flush())
      return false;
    while (left > 0) {
      if ((np == max_parts || len == max_record_bytes) && !flush())
        return false;
      auto take = std::min(left, max_record_bytes - len);
      parts[np++] = {const_cast<char*>(p), take};
      len += take;
      p += take;
      left -= take;
    }
  }
  return flush();
}

bool secure_stream::fill_raw(size_t n, bool within_record) {
  if (raw_end_ - raw_pos_ >= n)
    return true;
  if (raw_pos_ > 0) {
    std::memmove(raw_.get(), raw_.get() + raw_pos_, raw_end_ - raw_pos_);
    raw_end_ -= raw_pos_;
    raw_pos_ = 0;
  }
  while (raw_end_ < n) {
    auto r = ::recv(fd_, raw_.get() + raw_end_, raw_bytes - raw_end_, 0);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    if (r == 0) {
      if (raw_end_ > 0 || within_record)
        reason_ = fmt::format("the peer closed the connection within a record's header ({} of {} "
                              "bytes came): a truncated record",
                              raw_end_, n);
      failed_ = true;
      failure_ = tls_failure::closed;
      errno = ECONNRESET;
      return false;
    }
    raw_end_ += static_cast<size_t>(r);
  }
  return true;
}

bool secure_stream::next_record(char* dst, size_t room, size_t& delivered) {
  delivered = 0;
  if (!fill_raw(header_bytes, false))
    return false;
  unsigned char hdr[header_bytes];
  std::memcpy(hdr, raw_.get() + raw_pos_, header_bytes);
  raw_pos_ += header_bytes;
  size_t len = get_be32(hdr);
  // A TLS record's header (content type 20-23, version 3.x) where ours was
  // due: a peer that goes on with OpenSSL's records (an older actorflow), a
  // KeyUpdate, a renegotiation or an alert. Said as such, not as a length.
  if (hdr[0] >= 20 && hdr[0] <= 23 && hdr[1] == 3)
    return fail(tls_failure::protocol,
                fmt::format("a TLS record (content type {}) where the data plane's own records "
                            "were due: a peer of an older actorflow, or a TLS KeyUpdate, "
                            "renegotiation or alert after the handshake (not supported)",
                            hdr[0]));
  if (len > max_record_bytes)
    return fail(tls_failure::forged_record,
                fmt::format("a record of {} bytes, over the bound of {} bytes: not a data-plane "
                            "record of this version, or a corrupted stream",
                            len, max_record_bytes));
  // An empty record carries nothing: the hello is one, and nothing else of
  // ours sends them. A run of them is a peer holding the connection (each
  // comes within the receive timeout, and the read waits on for data).
  empty_run_ = len == 0 ? empty_run_ + 1 : 0;
  if (empty_run_ > max_empty_run)
    return fail(tls_failure::protocol,
                fmt::format("{} empty records in a row: a peer that holds the connection without "
                            "sending data",
                            empty_run_));
  if (recv_seq_ == UINT64_MAX)
    return fail(tls_failure::internal,
                "the connection has read 2^64-1 records; it must be opened again");
  if (recv_seq_ > 0 && recv_seq_ % rekey_records == 0
      && !rekey(recv_seq_ / rekey_records, false))
    return fail(tls_failure::internal, tls_errors("cannot derive the next key"));
  unsigned char iv[12];
  nonce_of(recv_iv_, recv_seq_, iv);
  if (!dec_->start(iv, hdr, header_bytes))
    return fail(tls_failure::internal, tls_errors("AES-GCM refused a record"));
  bool direct = dst != nullptr && len > 0 && len <= room;
  char* target = dst;
  if (!direct) {
    if (plain_cap_ < len) {
      auto cap = std::max(len, std::min(max_record_bytes, size_t{16} << 10));
      plain_.reset(new (std::nothrow) char[cap]);
      plain_cap_ = plain_ ? cap : 0;
      if (!plain_)
        return fail(tls_failure::internal, fmt::format("no memory for a record of {} bytes", len));
    }
    target = plain_.get();
    plain_pos_ = plain_end_ = 0;
  }
  auto decrypt = [&](unsigned char* out, const char* in, size_t n) {
    return dec_->update(out, reinterpret_cast<const unsigned char*>(in), n);
  };
  auto* t = reinterpret_cast<unsigned char*>(target);
  unsigned char tag[tag_bytes];
  size_t have = 0, tag_have = 0;
  // What was read ahead first (decrypted from there: no copy).
  auto k = std::min(raw_end_ - raw_pos_, len);
  if (k > 0 && !decrypt(t, raw_.get() + raw_pos_, k))
    return fail(tls_failure::internal, tls_errors("AES-GCM refused a record"));
  raw_pos_ += k;
  have = k;
  k = std::min(raw_end_ - raw_pos_, tag_bytes);
  std::memcpy(tag, raw_.get() + raw_pos_, k);
  raw_pos_ += k;
  tag_have = k;
  if (raw_pos_ == raw_end_)
    raw_pos_ = raw_end_ = 0;
  // The rest straight off the socket: the body into its place (decrypted
  // there as it comes, while in cache), the tag, and what follows ahead.
  while (have < len || tag_have < tag_bytes) {
    iovec iov[3];
    int c = 0;
    if (have < len)
      iov[c++] = {target + have, len - have};
    iov[c++] = {tag + tag_have, tag_bytes - tag_have};
    iov[c++] = {raw_.get(), raw_bytes};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(c);
    auto r = ::recvmsg(fd_, &msg, 0);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      failed_ = true; // within a record: the stream cannot go on
      failure_ = failure_of_errno(errno);
      return false;
    }
    if (r == 0) {
      reason_ = fmt::format("the peer closed the connection within a record ({} of {} bytes "
                            "came): a truncated record",
                            header_bytes + have + tag_have, header_bytes + len + tag_bytes);
      failed_ = true;
      failure_ = tls_failure::closed;
      errno = ECONNRESET;
      return false;
    }
    auto got = static_cast<size_t>(r);
    auto body = std::min(got, len - have);
    if (body > 0 && !decrypt(t + have, target + have, body))
      return fail(tls_failure::internal, tls_errors("AES-GCM refused a record"));
    have += body;
    got -= body;
    auto tg = std::min(got, tag_bytes - tag_have);
    tag_have += tg;
    got -= tg;
    raw_pos_ = 0;
    raw_end_ = got;
  }
  if (!dec_->open(tag)) {
    ERR_clear_error();
    return fail(tls_failure::forged_record,
                fmt::format("record {} ({} bytes) failed authentication: its tag does not match "
                            "(tampered with, replayed, reordered or cut)",
                            recv_seq_, len));
  }
  ++recv_seq_;
  if (direct)
    delivered = len;
  else
    plain_end_ = len;
  return true;
}

bool secure_stream::read(void* buf, size_t n, size_t* got) {
  auto* p = static_cast<char*>(buf);
  if (got != nullptr)
    *got = 0;
  if (failed_) {
    errno = reason_.empty() ? ECONNRESET : EPROTO;
    return false;
  }
  while (n > 0) {
    if (plain_pos_ < plain_end_) {
      auto k = std::min(n, plain_end_ - plain_pos_);
      std::memcpy(p, plain_.get() + plain_pos_, k);
      plain_pos_ += k;
      p += k;
      n -= k;
      if (got != nullptr)
        *got += k;
      continue;
    }
    size_t delivered = 0;
    if (!next_record(p, n, delivered))
      return false;
    p += delivered;
    n -= delivered;
    if (got != nullptr)
      *got += delivered;
  }
  return true;
}

std::string secure_stream::wait_hello(int wait_ms) {
  auto refuse = [this](tls_failure kind, std::string why) {
    failure_ = kind;
    return why;
  };
  if (raw_pos_ == raw_end_) {
    int rc = sock::poll_one(fd_, POLLIN, wait_ms);
    if (rc == 0)
      return refuse(tls_failure::timeout,
                    fmt::format("no first record within {} ms after the TLS handshake", wait_ms));
    if (rc < 0)
      return refuse(failure_of_errno(errno), std::string{"poll: "} + std::strerror(errno));
    auto r = ::recv(fd_, raw_.get(), raw_bytes, MSG_DONTWAIT);
    if (r == 0)
      return refuse(tls_failure::closed,
                    "the node closed the connection right after the TLS handshake (it refused "
                    "this process, or is stopping)");
    if (r < 0)
      return refuse(failure_of_errno(errno),
                    std::string{"right after the TLS handshake: "} + std::strerror(errno));
    raw_pos_ = 0;
    raw_end_ = static_cast<size_t>(r);
  }
  auto first = static_cast<unsigned char>(raw_[raw_pos_]);
  if (first == 0x15 || first == 0x16 || first == 0x17) {
    // A TLS record (alert, handshake, application data), never one of ours
    // (whose first byte, of a length <= max_record_bytes, is 0): OpenSSL
    // reads it, from what was read ahead and then the socket.
    failed_ = true;
    if (auto* st = state_of(ssl_)) {
      if (!st->ahead)
        st->ahead.reset(new (std::nothrow) char[read_ahead_bytes]);
      if (st->ahead) {
        std::memcpy(st->ahead.get(), raw_.get() + raw_pos_, raw_end_ - raw_pos_);
        st->pos = 0;
        st->end = raw_end_ - raw_pos_;
      }
    }
    raw_pos_ = raw_end_ = 0;
    ERR_clear_error();
    char byte;
    size_t n = 0;
    int ret = SSL_read_ex(ssl_, &byte, 1, &n);
    if (ret == 1)
      return refuse(tls_failure::protocol,
                    "the node sent TLS data where the data plane's first record was expected (a "
                    "node of another version?)");
    if (SSL_get_error(ssl_, ret) == SSL_ERROR_ZERO_RETURN)
      return refuse(tls_failure::closed, "the node closed the TLS session right after the handshake");
    // Most often its alert: it refused this process's certificate after our
    // side of the handshake had finished (TLS 1.3).
    auto kind = failure_of_queue();
    return refuse(kind == tls_failure::handshake ? tls_failure::refused : kind,
                  tls_errors("the node ended the TLS session right after the handshake"));
  }
  size_t delivered = 0;
  if (!next_record(nullptr, 0, delivered)) {
    auto kind = failure_ != tls_failure::none ? failure_ : failure_of_errno(errno);
    if (!reason_.empty())
      return refuse(kind, reason_);
    return refuse(kind, std::string{"reading the node's first record: "} + std::strerror(errno));
  }
  if (plain_end_ != 0)
    return refuse(tls_failure::forged_record,
                  "the node's first record was not the empty one expected (a node of another "
                  "version?)");
  return {};
}

} // namespace af
