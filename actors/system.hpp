#pragma once
/// Actor systems sized for actorflow: types registered, middleman loaded, the
/// scheduler and the network layer set from node_options.

#include <cstdint>

#include "caf/actor_system_config.hpp"

#include "config/cluster_spec.hpp"

namespace af {

class system_config : public caf::actor_system_config {
public:
  explicit system_config(const node_options& opts = {});

  /// Threads the scheduler actually got.
  size_t threads() const { return threads_; }

private:
  size_t threads_;
};

/// One scheduler thread per core (CAF's default starts max(4, cores)).
size_t default_threads();

/// Keeps glibc from returning large buffers to the OS after every message:
/// without it each buffer over 32 MiB is a fresh mmap that is page-faulted again
/// on every tensor (the same as GLIBC_TUNABLES mmap_max=0, trim_threshold=max).
/// Call once at program start, before threads exist.
void tune_malloc_for_tensors();

} // namespace af
