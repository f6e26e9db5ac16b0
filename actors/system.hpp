#pragma once
/// Actor systems sized for actorflow: types registered, middleman loaded, the
/// scheduler and the network layer set from node_options.

#include <cstdint>
#include <memory>
#include <mutex>
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

  /// The [security] this system was made with (empty: plaintext). Sessions
  /// and data channels of the system that are given none use it.
  const security_options& security() const { return sec_; }

  /// The data plane's TLS context of security(), made at the first call and
  /// shared after (loading the files once per process, not per connection).
  caf::expected<std::shared_ptr<class tls_context>> tls(const std::string& who) const;

private:
  size_t threads_;
  security_options sec_;
  mutable std::mutex tls_mtx_;
  mutable std::shared_ptr<class tls_context> tls_;
};

/// Checks `sec` before CAF reads it: loads the CA, certificate and key (with
/// its passphrase) with OpenSSL, so that a wrong passphrase or a key of
/// another certificate is an error naming the file at start-up instead of an
/// exception in CAF's middleman at the first connection (a hang on a client).
/// Also checks that `sys` was made with the same choice (system_config with
/// `sec`). The context for the data plane; null when `sec` is not enabled.
/// `who` names this process in errors. `sec` not enabled on a system made
/// with [security] (an af::system_config) means the system's own: the
/// sessions a training task or a worker makes inside a secured process
/// inherit it. The context is made once per system and shared.
caf::expected<std::shared_ptr<tls_context>>
check_security(caf::actor_system& sys, const security_options& sec, const std::string& who);

/// The data-plane TLS context of `sys` (its [security]), null on a plaintext
/// system, for the data channels that actors open by themselves (an
/// executor's remote reads, a worker's pushes). On a system with [security]
/// whose files fail to load, null too: check_security() at start-up said why.
std::shared_ptr<tls_context> system_tls(caf::actor_system& sys);

/// Starts an actor system on `cfg`. CAF 0.17's actor_system cannot be
/// unwound once its scheduler runs: a thread that fails to start (EAGAIN,
/// ENOMEM under a memory cap) throws out of the constructor, whose cleanup
/// then waits forever for workers nobody stopped (a hang, not an error). So
/// the constructor runs on a thread of its own with no handler above it:
/// such a throw ends in std::terminate with nothing unwound, and the
/// programs' last_resort says "out of memory" and exits 1
/// (programs/last_resort.hpp). A failure before CAF starts (this thread
/// itself) throws here as usual.
std::unique_ptr<caf::actor_system> start_actor_system(caf::actor_system_config& cfg);

/// CAF 0.17 keeps, in each thread that makes a system or spawns an actor
/// in one (a scoped_actor included), a reference to that system's logger,
/// until the thread spawns in another system or ends; and ~actor_system
/// waits, without a bound, until its logger is gone. A client's thread that
/// lives on (Python's, a test's) and last spawned in a system that another
/// thread then destroys (an embedded cluster's node) kept that destructor
/// waiting for ever. Drops the calling thread's reference if it is `sys`'s
/// (CAF logs nothing through it at the QUIET level it is built with); code
/// that spawns in a system on a caller's thread calls it when done.
void release_thread_logger(caf::actor_system& sys);

/// release_thread_logger(sys) when it ends: declared before a client call's
/// scoped_actor, it lets go of the system after the actor is gone.
class thread_logger_release {
public:
  explicit thread_logger_release(caf::actor_system& sys) : sys_(sys) {}
  thread_logger_release(const thread_logger_release&) = delete;
  thread_logger_release& operator=(const thread_logger_release&) = delete;
  ~thread_logger_release() { release_thread_logger(sys_); }

private:
  caf::actor_system& sys_;
};

/// One scheduler thread per core (CAF's default starts max(4, cores)).
size_t default_threads();

/// The one warning line a node's program logs when it runs without
/// [security] (actorflow-node, actorflow-train's tasks).
const char* plaintext_warning();

/// Keeps glibc from returning large buffers to the OS after every message:
/// without it each buffer over 32 MiB is a fresh mmap that is page-faulted again
/// on every tensor (the same as GLIBC_TUNABLES mmap_max=0, trim_threshold=max).
/// Call once at program start, before threads exist.
void tune_malloc_for_tensors();

} // namespace af
