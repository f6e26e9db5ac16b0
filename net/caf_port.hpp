#pragma once
/// A node's CAF port, published through a middleman actor of ours instead of
/// CAF's own (caf::io::middleman_actor_impl with its open() replaced), so that
/// what a stranger can do before BASP's handshake is bounded without patching
/// CAF 0.17.6:
///
/// - An accepted connection whose handshake (TLS, then BASP's) did not go
///   through within `handshake_timeout` ([node] handshake_timeout_ms) is
///   closed: an idle stranger holds a descriptor for that long only.
/// - Until the client's handshake went through, an accepted connection may
///   announce at most `max_handshake_bytes` of payload per message. CAF's BASP
///   broker sizes its receive buffer to the 32-bit payload_len of any header
///   before it reads a byte of the payload (a zero-filled 4 GiB vector for one
///   32-byte header, kept by the allocator after the close). Our scribe sees
///   that size in configure_read() before the buffer is made, logs the peer,
///   shuts the socket down and asks for one byte instead: the broker then sees
///   the connection close as any other.
/// - With TLS (`tls` set: the process's context, the data plane's), every
///   connection runs OpenSSL through a session of ours in CAF's non-blocking
///   states (caf_port.cpp says why not libcaf-openssl's), and an accepted one
///   that fails before its first byte of application data (no certificate,
///   another CA's, plaintext BASP, a port scan) is logged with the peer's
///   address and OpenSSL's reason.
///
/// Outgoing connections of sessions are opened by connect_scribe, with the
/// same scribes (the cap applies to the node's server handshake).

#include <chrono>
#include <cstdint>
#include <set>
#include <string>

#include "caf/actor.hpp"
#include "caf/actor_control_block.hpp"
#include "caf/actor_system.hpp"
#include "caf/expected.hpp"
#include "caf/io/fwd.hpp"

#include "net/tls.hpp"

namespace af {

struct caf_port_options {
  /// Largest first message (BASP header payload) an accepted peer may announce.
  uint32_t max_handshake_bytes = 65536;
  /// Largest message after it ([node] max_message_bytes plus room for the
  /// message around a tensor); BASP itself allows 4 GiB - 1.
  uint64_t max_message_bytes = uint64_t{2} << 30;
  /// How long an accepted connection may take to its BASP handshake (its
  /// TLS handshake first, with TLS) before it is closed.
  std::chrono::milliseconds handshake_timeout{10000};
  /// Mutual TLS with this context (the process's: system_tls); null: none.
  std::shared_ptr<tls_context> tls;
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

struct pending_handshake;

/// A connection connect_scribe opened: the scribe to hand to the BASP
/// broker, and this process's hold on it until the connect request ended.
struct opened_connection {
  caf::io::scribe_ptr scribe;
  std::shared_ptr<pending_handshake> pending;

  /// Says how the connect request ended, once. When it failed (a timeout
  /// included) and the broker still waits for the peer's handshake, the
  /// socket is shut down, so the broker lets it go instead of holding it
  /// (and the process's exit) for ever. Returns why the TLS handshake
  /// failed: OpenSSL's verification result, or that the certificate names
  /// another task; empty if it did not fail there.
  std::string settle(bool succeeded);
};

/// A connection to the CAF port at `host`:`port` (connected within
/// `timeout`; mutual TLS when the system has an openssl manager), as a
/// scribe for the BASP broker: request its connect_atom with it and the
/// port, and it answers with the node, the published actor and its interface
/// once BASP's handshake is done. Instead of the middleman actor's connect
/// (CAF's or the openssl manager's):
/// - CAF's TLS scribe judges each OpenSSL call by an error queue that another
///   connection's failure may have filled (caf_port.cpp); this one empties it.
/// - The middleman actor connects with a blocking connect() in its one
///   thread (by its code: a host that drops SYNs would hold every other
///   connect of the process until the kernel gives up), and answers from a
///   cache of host:port: a node that just died is handed out as its dead
///   proxy until CAF saw the close, and a request to it is never answered.
caf::expected<opened_connection> connect_scribe(caf::actor_system& sys, const std::string& host,
                                                uint16_t port, std::chrono::milliseconds timeout,
                                                const std::shared_ptr<tls_context>& tls,
                                                const std::string& task);

} // namespace af
