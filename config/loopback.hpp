#pragma once
/// Loopback sockets for embedded clusters, tests and benchmarks.

#include <cstdint>

namespace af {

/// A TCP socket listening on 127.0.0.1 at a port the OS picked; -1 on failure.
int listen_on_loopback(uint16_t& port, int backlog = 16);

/// Connects socket `fd` (made by the caller) to 127.0.0.1:`port`; false if
/// refused (errno says why).
bool connect_to_loopback(int fd, uint16_t port);

/// A TCP connection to 127.0.0.1:`port`; -1 if there is no socket or the
/// connection is refused (errno says why).
int connect_loopback(uint16_t port);

/// A port on 127.0.0.1 that was free a moment ago, picked at random below
/// the kernel's ephemeral range (net.ipv4.ip_local_port_range) where that
/// leaves room, so that no port 0 bind or outgoing connection of any process
/// can be given it before you bind it. Another caller of this may still
/// pick it: retry on bind_failed.
uint16_t free_loopback_port();

namespace detail {
/// free_loopback_port on a host whose ephemeral range starts at `ephemeral_low`
/// (for a test of the hosts where the kernel must pick).
uint16_t free_loopback_port(int ephemeral_low);
} // namespace detail

} // namespace af
