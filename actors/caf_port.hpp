#pragma once
/// A node's CAF port, published through a middleman actor of ours instead of
/// CAF's own (caf::io::middleman_actor_impl with its open() replaced), so that
/// what a stranger can do before BASP's handshake is bounded without patching
/// CAF 0.17.6:
///
/// - Until the client's handshake went through, an accepted connection may
///   announce at most `max_handshake_bytes` of payload per message. CAF's BASP
///   broker sizes its receive buffer to the 32-bit payload_len of any header
///   before it reads a byte of the payload (a zero-filled 4 GiB vector for one
///   32-byte header, kept by the allocator after the close). Our scribe sees
///   that size in configure_read() before the buffer is made, logs the peer,
///   shuts the socket down and asks for one byte instead: the broker then sees
///   the connection close as any other.
/// - With TLS (an openssl::manager loaded, see system_config), accepted
///   connections run CAF's own openssl::session, and one that fails before
///   its first byte of application data (no certificate, another CA's,
///   plaintext BASP, a port scan) is logged with the peer's address and
///   OpenSSL's reason.
///
/// Outgoing connections (sessions) still go through CAF's middleman or
/// openssl manager: they reach only the nodes the cluster config names.

#include <cstdint>
#include <set>
#include <string>

#include "caf/actor.hpp"
#include "caf/actor_control_block.hpp"
#include "caf/actor_system.hpp"
#include "caf/expected.hpp"

namespace af {

struct caf_port_options {
  /// Largest first message (BASP header payload) an accepted peer may announce.
  uint32_t max_handshake_bytes = 65536;
  /// Largest message after it ([node] max_message_bytes plus room for the
  /// message around a tensor); BASP itself allows 4 GiB - 1.
  uint64_t max_message_bytes = uint64_t{2} << 30;
  /// Mutual TLS with the system's openssl::manager (which must be loaded).
  bool tls = false;
  /// This process ("/job:ps/task:0"), for the log lines.
  std::string who;
};

/// The middleman actor that publishes with these guards; one per node.
/// Stop it (send_exit) when the node ends.
caf::actor spawn_guarded_middleman(caf::actor_system& sys, caf_port_options opts);

/// Publishes `whom` (with its message interface `sigs`) on `host`:`port`
/// ("" = every address, port 0 = any free one) through `mm`; the bound port.
caf::expected<uint16_t> publish_guarded(caf::actor_system& sys, const caf::actor& mm,
                                        caf::strong_actor_ptr whom, std::set<std::string> sigs,
                                        uint16_t port, const std::string& host);

} // namespace af
