#pragma once
/// TLS for the tensor data plane (net/data_plane.hpp): one OpenSSL SSL_CTX
/// per process, used for both roles. A node's data-plane server and a
/// session's data channels make mutual TLS 1.3 connections (TLS 1.2 with
/// AES-GCM where a peer has no 1.3) with the cluster CA of `[security]`
/// (config/security.hpp): a peer must show a certificate signed by that CA,
/// or the handshake fails before it can send a request.
///
/// The connections stay blocking sockets: SSL_read/SSL_write on the same
/// file descriptor the plaintext path uses (docs/wire.md, "TLS").

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

/// Why a handshake's peer was refused: the verification result if it failed
/// there (for a certificate not for the host of tls_expect_host: the host
/// dialled and the names the certificate has), else the error queue's text;
/// empties the error queue.
std::string tls_handshake_failure(ssl_st* ssl, int ret);

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
/// why not, naming the task meant and the task the certificate names.
std::string tls_wrong_task(ssl_st* ssl, const std::string& task);

/// The task this process's certificate names (its CN, "/job:ps/task:0"), or
/// empty when its CN names no task (a `client` certificate).
std::string tls_own_task(const tls_context& ctx);

} // namespace af
