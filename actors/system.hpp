#pragma once
/// Actor systems sized for actorflow: types registered, middleman loaded, the
/// scheduler and the network layer set from node_options.

#include <cstdint>
#include <memory>
#include <string>

#include "caf/actor_system.hpp"
#include "caf/actor_system_config.hpp"
#include "caf/expected.hpp"

#include "config/cluster_spec.hpp"

namespace af {

class system_config : public caf::actor_system_config {
public:
  /// With `sec` enabled, loads libcaf-openssl's manager with its files: CAF's
  /// connections of this system (the node's port, a session's connections)
  /// are then mutual TLS with the cluster CA. Nothing is checked here: call
  /// check_security() (start_node and the session do), since CAF only
  /// reads the files at the first connection, where a bad key throws inside
  /// its middleman (docs/security.md).
  explicit system_config(const node_options& opts = {}, const security_options& sec = {});

  /// Threads the scheduler actually got.
  size_t threads() const { return threads_; }

private:
  size_t threads_;
};

class tls_context;

/// Checks `sec` before CAF reads it: loads the CA, certificate and key (with
/// its passphrase) with OpenSSL, so that a wrong passphrase or a key of
/// another certificate is an error naming the file at start-up instead of an
/// exception in CAF's middleman at the first connection (a hang on a client).
/// Also checks that `sys` was made with the same choice (system_config with
/// `sec`). The context for the data plane; null when `sec` is not enabled.
/// `who` names this process in errors.
caf::expected<std::shared_ptr<tls_context>>
check_security(caf::actor_system& sys, const security_options& sec, const std::string& who);

/// One scheduler thread per core (CAF's default starts max(4, cores)).
size_t default_threads();

/// Keeps glibc from returning large buffers to the OS after every message:
/// without it each buffer over 32 MiB is a fresh mmap that is page-faulted again
/// on every tensor (the same as GLIBC_TUNABLES mmap_max=0, trim_threshold=max).
/// Call once at program start, before threads exist.
void tune_malloc_for_tensors();

} // namespace af
