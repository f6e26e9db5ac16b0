#include "net/tls.hpp"
#include "net/tls_detail.hpp"

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

} // namespace

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

namespace tls_detail {

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

} // namespace tls_detail

using tls_detail::failure_of_errno;
using tls_detail::failure_of_queue;

namespace {

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

} // namespace af
