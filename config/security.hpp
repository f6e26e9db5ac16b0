#pragma once
/// `[security]` of a cluster config: the files that make every connection of a
/// node (CAF's port and the data plane's) mutual TLS with the cluster's CA.
///
///   [security]
///   ca = "certs/ca.pem"            # the cluster CA (PEM)
///   certificate = "certs/ps0.pem"  # this task's certificate, signed by the CA
///   key = "certs/ps0.key"          # its private key (PEM)
///   passphrase_file = "certs/ps0.pass"   # only where the key has a passphrase
///
/// or, to run plaintext on purpose on a non-loopback address:
///
///   [security]
///   insecure = true
///
/// Between hosts whose network nobody else can reach or read (a cluster's
/// own RDMA or Ethernet fabric), the data plane may move its frames by UCX
/// (RDMA where the NICs have it), which carries no TLS:
///
///   [security]
///   trusted_fabric = true   # default false
///
/// With certificates too, a connection's TLS handshake and the node's first
/// record still authenticate both ends; only the frames after them go by UCX
/// unencrypted (docs/security.md "Trusted fabric").
///
/// A node's /metrics and /healthz ([node] metrics_port) are plain HTTP
/// without authentication: they listen on loopback unless
///
///   [security]
///   metrics_public = true   # default false; insecure = true allows it too
///
/// lets [node] metrics_bind name another address (docs/watching.md).
///
/// Relative paths are relative to the config file's folder. `actorflow-certs`
/// makes a CA and one certificate per task of a config.

#include <string>

namespace af {

struct security_options {
  std::string ca_file;         ///< PEM file of the cluster CA
  std::string cert_file;       ///< this process's certificate (PEM), signed by the CA
  std::string key_file;        ///< its private key (PEM)
  std::string passphrase_file; ///< where the key's passphrase is (first line); may be empty
  std::string passphrase;      ///< read from passphrase_file when the config is loaded
  /// Plaintext ports allowed on a non-loopback address, said explicitly.
  bool insecure = false;
  /// The network between hosts is trusted: the data plane may leave TCP/TLS
  /// for UCX after a connection's first exchange (net/ucx_link.hpp).
  bool trusted_fabric = false;
  /// [node] metrics_bind may be an address other than loopback.
  bool metrics_public = false;

  /// True when connections are to be mutual TLS.
  bool enabled() const { return !cert_file.empty(); }
};

} // namespace af
