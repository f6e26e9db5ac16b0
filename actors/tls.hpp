#pragma once
/// TLS for the tensor data plane (actors/data_plane.hpp): one OpenSSL SSL_CTX
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
/// there, else the error queue's text; empties the error queue.
std::string tls_handshake_failure(ssl_st* ssl, int ret);

} // namespace af
