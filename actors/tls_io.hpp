#pragma once
/// The TLS read path's read-ahead (actors/tls.cpp), for the data plane's own
/// blocking I/O loops (actors/data_plane.cpp). Kept out of tls.hpp, which
/// much of the project includes.

#include "actors/tls.hpp"

namespace af {

/// tls_set_socket, but reads take up to 64 KiB off the socket at once (one
/// recvmsg instead of two recv per 16 KiB record, docs/wire.md "TLS
/// figures"). The caller must then ask tls_has_pending, not the socket,
/// whether bytes are waiting: only for code that reads in its own loops (the
/// data plane), never for an event loop that waits for the socket to be
/// readable (CAF's, caf_port.cpp), which would not see the bytes held here.
bool tls_set_socket_read_ahead(ssl_st* ssl, int fd);

/// Whether `ssl` holds bytes not yet read by the application: records
/// OpenSSL has, or bytes its socket BIO read ahead (which SSL_has_pending
/// does not see). Before polling the socket for more, ask this: a poll would
/// wait for bytes already taken off the socket.
bool tls_has_pending(ssl_st* ssl);

} // namespace af
