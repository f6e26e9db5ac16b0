#include "actors/system.hpp"

#include <malloc.h>

#include <chrono>
#include <thread>

#include "caf/atom.hpp"
#include "caf/io/middleman.hpp"
#include "caf/timestamp.hpp"

#include "messages/types.hpp"

namespace af {

size_t default_threads() {
  auto n = std::thread::hardware_concurrency();
  return n == 0 ? 2 : n;
}

system_config::system_config(const node_options& opts) {
  register_types(*this);
  load<caf::io::middleman>();
  threads_ = opts.threads > 0 ? static_cast<size_t>(opts.threads) : default_threads();
  set("scheduler.policy", opts.scheduler == "stealing" ? caf::atom("stealing") : caf::atom("sharing"));
  set("scheduler.max-threads", threads_);
  // Read what a socket has before going back to epoll: tensors arrive in bursts.
  set("middleman.max-consecutive-reads", size_t{64});
  if (opts.heartbeat_ms > 0) {
    set("middleman.heartbeat-interval",
        caf::timespan{std::chrono::milliseconds{opts.heartbeat_ms}});
    set("middleman.connection-timeout",
        caf::timespan{std::chrono::milliseconds{opts.connection_timeout_ms}});
  }
  set("logger.console", caf::atom("none"));
}

void tune_malloc_for_tensors() {
  // One arena: buffers freed by one thread (a data-plane connection) are
  // reused by another (the session's caller) instead of growing a second heap.
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  mallopt(M_TOP_PAD, 64 << 20);
}

} // namespace af
