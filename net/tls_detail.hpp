#pragma once
/// Internal to the TLS code (net/tls.cpp: context, certificates, handshake;
/// net/tls_socket.cpp: our socket BIO; net/tls_records.cpp: the record
/// layer): what those files share and nobody else needs.

#include <cstddef>
#include <memory>

#include "net/tls.hpp"

namespace af::tls_detail {

/// How far our socket BIO reads ahead of OpenSSL (tls_set_socket_read_ahead),
/// and how far the record layer reads ahead of its caller.
constexpr size_t read_ahead_bytes = 64 * 1024;

/// Our socket BIO's state (net/tls_socket.cpp).
struct nosig_state {
  int fd = -1;
  bool read_ahead = false;
  std::unique_ptr<char[]> ahead; // allocated at the first read
  size_t pos = 0;                // ahead[pos, end): received, not yet read
  size_t end = 0;
};

/// Our BIO's state behind `ssl`, or null if its read BIO is not ours: the
/// record layer takes the bytes it read past the handshake from there.
nosig_state* state_of(ssl_st* ssl);

/// The kind of a socket error (errno) of the handshake or the first record.
tls_failure failure_of_errno(int err);

/// The kind of what OpenSSL's error queue holds, by its first error (left
/// in the queue, for tls_errors to say).
tls_failure failure_of_queue();

} // namespace af::tls_detail
