#pragma once
/// A session's connections to the nodes of its cluster: each node actor, its
/// info and clock offset, its executors and its data plane, with what the
/// session learned of the node's health. Blocking (it serves the blocking
/// session facade); the step runner never waits on it.
///
/// Opening a connection has one deadline, connect_timeout, for all of it:
/// the name lookup (none for a numeric address; getaddrinfo has no timeout
/// of its own, so a name is looked up by a thread that the caller leaves at
/// the deadline), the TCP connection (each address of a name gets what is
/// left), then the TLS and BASP handshakes (what is left after that).
///
/// After a node died (the session's watcher said so, or its handle is
/// down), connect() tries once to reach its successor: it fails at once with
/// peer_down saying the node died when nothing answers, and calls
/// `on_reconnect` (restarted: the node has a new incarnation) when something
/// does.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "caf/actor.hpp"
#include "caf/actor_addr.hpp"
#include "caf/actor_system.hpp"
#include "caf/expected.hpp"
#include "caf/scoped_actor.hpp"

#include "net/data_plane.hpp"
#include "actors/answer_if_down.hpp"
#include "actors/session.hpp"
#include "config/cluster_spec.hpp"
#include "graph/placement.hpp"
#include "messages/node.hpp"

namespace af {

/// Nodes seen dead: task name -> why. Written by the session actor's down
/// handler and by the link itself (a handle found down before that handler
/// ran), read by the facade before each call.
///
/// A mark names the handle that went down. One for a handle the node's
/// connection no longer holds is dropped: the link may reconnect (to the
/// same process, whose new proxy has the same actor_addr) before the
/// watcher hears the old proxy's down, which would otherwise mark the node
/// dead again and make the next call reconnect a second time.
struct node_health {
  std::mutex mtx;
  std::map<std::string, std::string> dead;
  /// Each task's handle now (weak: its control block, the pointer compared,
  /// is not reused while held).
  std::map<std::string, caf::actor_addr> current;

  /// `handle`: the one that went down (none: the node, whatever its handle).
  void mark(const std::string& task, std::string why, const caf::actor_addr& handle = {}) {
    std::lock_guard<std::mutex> guard{mtx};
    if (handle) {
      auto c = current.find(task);
      if (c != current.end() && c->second.get() != handle.get())
        return; // a superseded handle's
    }
    dead[task] = std::move(why);
  }
  bool is_dead(const std::string& task, std::string* why = nullptr) {
    std::lock_guard<std::mutex> guard{mtx};
    auto it = dead.find(task);
    if (it == dead.end())
      return false;
    if (why)
      *why = it->second;
    return true;
  }
  /// The task's connection holds `handle` now, alive.
  void revive(const std::string& task, const caf::actor_addr& handle) {
    std::lock_guard<std::mutex> guard{mtx};
    dead.erase(task);
    current[task] = handle;
  }
};

struct node_conn {
  node_actor actor;
  node_info info;
  std::string key;     ///< /job:J/task:T
  std::string address; ///< host:port
  std::map<std::string, executor_actor> executors;
  std::unique_ptr<data_channel> channel; ///< null: same process, or no data plane
  bool channel_broken = false;           ///< reopen the channel on the next call
  clock_estimate clock;
};

class cluster_link {
public:
  /// `watcher` is told (watch, node actor, task name) for each node opened;
  /// it monitors them and marks deaths in `health`.
  cluster_link(caf::actor_system& sys, cluster_spec spec, const session_options& opts,
               caf::scoped_actor& self, caf::actor watcher, std::shared_ptr<node_health> health)
    : sys(sys), spec(std::move(spec)), opts(opts), self(self), watcher(std::move(watcher)),
      health(std::move(health)) {
    // nop
  }

  /// Called after a reconnect, before connect() returns it.
  std::function<void(node_conn&, bool restarted)> on_reconnect;

  caf::actor_system& sys;
  cluster_spec spec;
  const session_options& opts;
  caf::scoped_actor& self;
  caf::actor watcher;
  std::shared_ptr<node_health> health;
  std::map<std::string, node_conn> conns; ///< by /job:J/task:T
  /// opts.security's TLS context for data channels (null: plaintext), made
  /// at the first open().
  std::shared_ptr<tls_context> tls;
  bool security_checked = false;

  /// Maps CAF's request errors to a sentence naming what we waited for and,
  /// for a timeout, how long: `waited` (zero: the request timeout,
  /// opts.timeout), the wait the request was actually given.
  caf::error explain(caf::error err, const std::string& what, const node_conn* conn,
                     std::chrono::milliseconds waited = std::chrono::milliseconds{0});

  /// Opens a connection to /job:J/task:T: the node actor, its info and clock,
  /// its data plane. Does not touch `conns`.
  caf::expected<node_conn> open(const std::string& j, int32_t t);

  /// The connection to /job:J/task:T; after the node died, one attempt to
  /// reconnect, and an error saying it died when that fails.
  caf::expected<node_conn*> connect(const std::string& j, int32_t t);
  /// The same, for a caller that holds the task's name (`key`: task_name(j, t))
  /// already: an op's hot path formats nothing.
  caf::expected<node_conn*> connect(const std::string& key, const std::string& j, int32_t t);

  /// Asks /job:J/task:T's node actor `xs...` within `timeout`, gives the
  /// answer to `take` and returns the connection that answered; `what`
  /// names the request in an error. A request out while the node's CAF
  /// link breaks (the node died, or was stopped past connection_timeout_ms)
  /// is answered request_receiver_down (answer_if_down, or CAF itself when
  /// it finds no route): the node is marked lost, and the request goes once
  /// more through connect()'s reconnect, to the same process only (one that
  /// restarted meanwhile gives the first try's error). A lookup right after
  /// the break (a worker that wakes and joins its aggregator again) would
  /// otherwise fail although the node runs.
  template <class Take, class... Ts>
  caf::expected<node_conn*> ask_node(const std::string& j, int32_t t, const std::string& what,
                                     std::chrono::milliseconds timeout, Take take,
                                     const Ts&... xs) {
    caf::error first; // the first try's, said of a node that restarted meanwhile
    uint64_t incarnation = 0;
    for (bool again = false;; again = true) {
      auto conn = connect(j, t);
      if (!conn)
        return conn;
      // Not to another process: the one asked is gone (a lookup would find
      // nothing there yet).
      if (again && (*conn)->info.incarnation != incarnation)
        return first;
      caf::error err;
      auto request = self->request((*conn)->actor, timeout, xs...);
      {
        answer_if_down guard{caf::actor_cast<caf::strong_actor_ptr>((*conn)->actor),
                             caf::strong_actor_ptr{self->ctrl()}, request.id()};
        request.receive(take, [&](caf::error& e) { err = std::move(e); });
      }
      if (!err)
        return conn;
      if (again || !link_broke(**conn, err))
        return explain(std::move(err), what, *conn, timeout);
      incarnation = (*conn)->info.incarnation;
      first = explain(std::move(err), what, *conn, timeout);
    }
  }

  /// Whether `err`, a request's to `conn`'s node actor, says the CAF link
  /// to the node broke (request_receiver_down); if so, marks the node lost
  /// (connect() then reconnects).
  bool link_broke(const node_conn& conn, const caf::error& err);

  /// A fresh data channel for `conn` (none: its ops go as CAF messages); an
  /// error if the node's data port showed a wrong identity. `timeout` (0:
  /// opts.timeout) bounds the connect: a retry passes what is left of its op's.
  caf::error reopen_channel(node_conn& conn,
                            std::chrono::milliseconds timeout = std::chrono::milliseconds{0});

  caf::expected<std::vector<std::string>> devices_of(const std::string& j, int32_t t);

  device_catalog catalog();

  caf::expected<executor_actor> executor(node_conn& conn, const std::string& local);

};

/// "/job:J/task:T"
std::string task_name(const std::string& job, int32_t task);

} // namespace af
