#include "actors/system.hpp"
#include "net/ucx_link.hpp"

#include <malloc.h>

#include <chrono>
#include <thread>

#include "caf/atom.hpp"
#include "caf/io/middleman.hpp"
#include "caf/logger.hpp"
#include "caf/openssl/manager.hpp"
#include "caf/timestamp.hpp"

#include "net/tls.hpp"
#include "messages/error.hpp"
#include "messages/types.hpp"

namespace af {

std::unique_ptr<caf::actor_system> start_actor_system(caf::actor_system_config& cfg) {
  std::unique_ptr<caf::actor_system> sys;
  // No try in this lambda, on purpose (see the header): an exception must
  // find no handler, so that nothing inside CAF is unwound.
  std::thread starter{[&] { sys = std::make_unique<caf::actor_system>(cfg); }};
  starter.join();
  return sys;
}

void release_thread_logger(caf::actor_system& sys) {
  if (caf::logger::current_logger() == &sys.logger())
    caf::logger::set_current_actor_system(nullptr);
}

size_t default_threads() {
  auto n = std::thread::hardware_concurrency();
  return n == 0 ? 2 : n;
}

system_config::system_config(const node_options& opts, const security_options& sec) {
  register_types(*this);
  load<caf::io::middleman>();
  sec_ = sec;
  if (sec.enabled()) {
    // All four, always: without a certificate and key CAF falls back to
    // anonymous TLS, which authenticates nobody.
    load<caf::openssl::manager>();
    openssl_certificate = sec.cert_file;
    openssl_key = sec.key_file;
    openssl_passphrase = sec.passphrase;
    openssl_cafile = sec.ca_file;
  }
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

namespace {

const system_config* own_config(caf::actor_system& sys) {
  auto* own = dynamic_cast<const system_config*>(&sys.config());
  return own != nullptr && own->security().enabled() ? own : nullptr;
}

} // namespace

caf::expected<std::shared_ptr<tls_context>> system_config::tls(const std::string& who) const {
  std::lock_guard<std::mutex> guard{tls_mtx_};
  if (!tls_) {
    auto made = make_tls_context(sec_, who);
    if (!made)
      return std::move(made.error());
    tls_ = std::move(*made);
  }
  return tls_;
}

caf::expected<std::shared_ptr<tls_context>>
check_security(caf::actor_system& sys, const security_options& given, const std::string& who) {
  const auto* own = own_config(sys);
  const auto& sec = !given.enabled() && own != nullptr ? own->security() : given;
  // [security] trusted_fabric (given, or the system's): this process's data
  // channels offer UCX to nodes of other hosts (net/ucx_link.hpp).
  // (The system's [security] counts for trust even without certificates:
  // own_config() only returns a config whose TLS is on.)
  const auto* any = dynamic_cast<const system_config*>(&sys.config());
  if (given.trusted_fabric || (any != nullptr && any->security().trusted_fabric))
    process_trusted_fabric() = true;
  if (!sec.enabled()) {
    if (sys.has_openssl_manager())
      return make_error(af_error::invalid_config,
                        who + ": the actor system was made with [security] but these options "
                              "have none; pass the same security_options to both");
    return std::shared_ptr<tls_context>{};
  }
  if (sec.ca_file.empty() || sec.key_file.empty())
    return make_error(af_error::invalid_config,
                      who + ": [security] needs ca, certificate and key together (without them "
                            "CAF would fall back to anonymous TLS)");
  if (!sys.has_openssl_manager())
    return make_error(af_error::invalid_config,
                      who + ": [security] is set but the actor system was made without it; "
                            "build its system_config with the same security_options");
  if (own != nullptr && own->security().ca_file == sec.ca_file
      && own->security().cert_file == sec.cert_file && own->security().key_file == sec.key_file
      && own->security().passphrase == sec.passphrase)
    return own->tls(who);
  return make_tls_context(sec, who);
}

std::shared_ptr<tls_context> system_tls(caf::actor_system& sys) {
  if (own_config(sys) == nullptr)
    return nullptr;
  auto ctx = check_security(sys, security_options{}, "this process");
  return ctx ? *ctx : nullptr;
}

void tune_malloc_for_tensors() {
  // One arena: buffers freed by one thread (a data-plane connection) are
  // reused by another (the session's caller) instead of growing a second heap.
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  mallopt(M_TOP_PAD, 64 << 20);
}

const char* plaintext_warning() {
  // "no TLS", not "no [security]": a [security] table may hold only
  // metrics_public, and still leave both ports plaintext.
  return "no TLS ([security] names no certificate): both ports are unauthenticated and "
         "unencrypted; anyone who reaches them can read, overwrite or stop any variable "
         "(docs/security.md)";
}

} // namespace af
