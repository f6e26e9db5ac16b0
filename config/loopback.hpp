#pragma once
/// Loopback sockets for embedded clusters, tests and benchmarks.

#include <cstdint>

namespace af {

/// A TCP socket listening on 127.0.0.1 at a port the OS picked; -1 on failure.
int listen_on_loopback(uint16_t& port, int backlog = 16);

/// A port on 127.0.0.1 that was free a moment ago (another process may take
/// it before you bind it: retry on bind_failed).
uint16_t free_loopback_port();

} // namespace af
