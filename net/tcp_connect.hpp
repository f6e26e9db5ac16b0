#pragma once
/// One way to open a TCP connection by a deadline, for the CAF port, the
/// data plane and the all-reduce ring: the name lookup bounded too (a thread
/// of its own, as getaddrinfo takes no timeout), each address tried with
/// what is left of the one budget, and a signal that interrupts the wait
/// (EINTR) waited through rather than reported as the peer's refusal.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "caf/expected.hpp"

namespace af {

/// A connected, non-blocking TCP socket (close-on-exec, TCP_NODELAY) to
/// `host`:`port` by `deadline`; `timeout` is that budget as the caller
/// counts it and `timeout_name` the setting that sets it, for the messages. `before`, when set, sees each socket before
/// its connect (socket buffers must be sized there to count in the window
/// scale). The error (af_error::unreachable) says why in words a user can
/// act on; callers put who and where in front.
caf::expected<int> tcp_connect(const std::string& host, uint16_t port,
                               std::chrono::steady_clock::time_point deadline,
                               std::chrono::milliseconds timeout,
                               const char* timeout_name = nullptr,
                               const std::function<void(int)>& before = {});

} // namespace af
