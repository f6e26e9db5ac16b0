#pragma once
/// Why a process that serves /metrics raises small thread stacks.
///
/// Debian's libcivetweb (the HTTP server of prometheus-cpp's Exposer) is built
/// with USE_STACK_SIZE = 100 KiB for its threads, and glibc puts every
/// module's static TLS inside a thread's stack: OpenBLAS's alone is 60 KiB,
/// so a civetweb thread of a node had some 40 KiB left, and its error path
/// (a 404, a POST, a malformed request: mg_send_http_error) overflowed it and
/// killed the node. This library defines pthread_attr_setstacksize for the
/// process (metrics/thread_stack.cpp): a size below
/// metrics_thread_stack_floor() becomes the floor (address space, touched
/// only as used); larger sizes, and threads made without a size, are as
/// they were.

#include <cstddef>

namespace af {

/// The least stack a thread made with an explicit size gets: 1 MiB.
size_t metrics_thread_stack_floor();

/// Whether the definition above is the one the process's libraries call:
/// true in an executable that links this library (the executable comes
/// first in symbol lookup, and exports it because libcivetweb uses it);
/// false where this library was linked into a module loaded later (a
/// Python extension: libc's definition comes first there) or the symbol
/// was not exported. start_node_metrics refuses to serve then, rather than
/// let the first 404 crash the process.
bool metrics_thread_stack_active();

} // namespace af
