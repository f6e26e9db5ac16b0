#pragma once
/// TLS for the tensor data plane (net/data_plane.hpp) and the CAF port
/// (net/caf_port.hpp): one OpenSSL SSL_CTX per process, used for both roles.
/// Every connection is mutual TLS 1.3 only (make_tls_context sets 1.3 as the
/// least version: a 1.2 peer is refused, docs/wire.md "TLS") with the cluster
/// CA of `[security]` (config/security.hpp): a peer must show a certificate
/// signed by that CA, or the handshake fails before it can send a request.
///
/// After the handshake the data plane's bytes are records of its own, keyed
/// from the TLS session (secure_stream, net/tls_io.hpp), on the same blocking
/// socket the plaintext path uses; the CAF port's go through SSL_read and
/// SSL_write in CAF's event loop.

#include <chrono>
#include <memory>
#include <string>

#include "caf/expected.hpp"

#include "config/security.hpp"

struct ssl_ctx_st; // OpenSSL's SSL_CTX, kept out of the headers that include this
struct ssl_st;     // OpenSSL's SSL

namespace af {

class tls_context {
public:
  explicit tls_context(ssl_ctx_st* ctx, std::string who) : ctx_(ctx), who_(std::move(who)) {}
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;

  ssl_ctx_st* native() const { return ctx_; }

  /// Who this process is ("/job:ps/task:0"), for errors and logs.
  const std::string& who() const { return who_; }

private:
  ssl_ctx_st* ctx_;
  std::string who_;
};

/// Loads and checks the CA, certificate and key of `sec` (the key decrypted
/// with sec.passphrase). Errors (af_error::invalid_config) name the file and
/// what is wrong with it: missing, not PEM, key does not match the
/// certificate, wrong passphrase, certificate not signed by the CA, expired or
/// not yet valid. `who` names this process in them.
caf::expected<std::shared_ptr<tls_context>> make_tls_context(const security_options& sec,
                                                             const std::string& who);

/// Makes `ssl` read and write socket `fd` (not owned) without ever raising
/// SIGPIPE: a write to a closed peer fails with EPIPE, as the plaintext path's
/// do. false: out of memory.
bool tls_set_socket(ssl_st* ssl, int fd);

/// The text of OpenSSL's error queue (emptied), or `fallback` if it is empty.
std::string tls_errors(const std::string& fallback);

/// Why a TLS connection failed before it carried a byte of data (its
/// handshake, the name checks, the server's first record: net/tls_io.hpp),
/// as a type, set where the failure is found: callers decide what it means
/// (an impostor, a node without [security], a timeout) and which hint to
/// give from this, never from the words of the message that goes with it.
enum class tls_failure {
  none,          ///< no failure
  wrong_name,    ///< impostor: a certificate of the cluster CA, but for another host or task
                 ///< than the one dialled (tls_expect_host, tls_wrong_task)
  unknown_ca,    ///< impostor: a certificate that does not verify: not signed by the cluster
                 ///< CA, expired, not yet valid
  forged_record, ///< impostor: a record that fails its tag, declares more than the bound, or a
                 ///< first record that is not the empty one due: not sealed with this
                 ///< session's keys
  refused,       ///< the peer ended the handshake with an alert: it refused this process
                 ///< (most often its certificate: another CA?)
  protocol,      ///< the peer does not speak TLS here (wrong version number, record layer
                 ///< failure: a node without [security]) or sends TLS where our records are due
  handshake,     ///< the handshake failed otherwise (no common version or suite, ...)
  timeout,       ///< the handshake or the first record did not come within the limit
  closed,        ///< the peer closed the connection (during the handshake or right after)
  io,            ///< the socket failed (errno)
  internal       ///< this process's own failure: no memory, keys not derived
};

/// Whether `f` says the peer is not who was dialled (a certificate not of
/// the CA or not for the name; records not sealed with the session's keys).
constexpr bool is_impostor(tls_failure f) {
  return f == tls_failure::wrong_name || f == tls_failure::unknown_ca
         || f == tls_failure::forged_record;
}

/// The enumerator's name ("wrong_name"), for logs and tests.
const char* to_string(tls_failure f);

/// Why a handshake's peer was refused: the verification result if it failed
/// there (for a certificate not for the host of tls_expect_host: the host
/// dialled and the names the certificate has), else the error queue's text;
/// empties the error queue. `kind`, when given, gets its tls_failure.
std::string tls_handshake_failure(ssl_st* ssl, int ret, tls_failure* kind = nullptr);

/// Runs SSL_accept (`server`) or SSL_connect on `fd` until it is done or
/// `limit` has passed, the socket non-blocking meanwhile (restored after): a
/// peer that trickles its handshake cannot stretch it. Empty on success,
/// else why not, and its kind in `kind` when given (timeout when the limit
/// passed; else as tls_handshake_failure's).
std::string tls_handshake(ssl_st* ssl, int fd, bool server, std::chrono::milliseconds limit,
                          tls_failure* kind = nullptr);

// -- who answers: the name check of both planes' outbound connections --------
//
// A certificate of the cluster CA proves membership, not which member: on a
// connection this process opens, the peer must be who it dials. Before the
// handshake, tls_expect_host makes OpenSSL check the certificate's
// subjectAltName against the host dialled (an IP address as one, anything
// else as a DNS name); the handshake fails otherwise (tls_handshake_failure
// says which names were expected and shown). After it, tls_wrong_task checks
// that a CN naming a task (/job:J/task:T, as actorflow-certs writes) names
// the task meant. Used by the CAF port (caf_port.cpp) and the data plane
// (data_channel::connect).

/// Makes `ssl`'s handshake require a certificate for `host`. false: out of
/// memory.
bool tls_expect_host(ssl_st* ssl, const std::string& host);

/// Empty if the peer's certificate may be `task`'s (empty `task`: any), else
/// why not, naming the task meant and the task the certificate names (a
/// failure of kind tls_failure::wrong_name).
std::string tls_wrong_task(ssl_st* ssl, const std::string& task);

/// The task this process's certificate names (its CN, "/job:ps/task:0"), or
/// empty when its CN names no task (a `client` certificate).
std::string tls_own_task(const tls_context& ctx);

} // namespace af
