#pragma once
/// The tensor data plane: variable ops between a session and a remote node
/// over plain TCP, beside CAF's control plane.
///
/// Why: through BASP a small remote op costs ~10x a raw socket round trip and
/// a 64 MiB tensor reaches a fraction of the socket's speed (docs/wire.md).
/// Here a session's thread writes one frame (messages/wire.hpp) straight from
/// the tensor's buffer and blocks on the reply; on the node, one thread per
/// connection reads the payload straight into a fresh tensor, hands it to the
/// variable actor (no copy: same process) and writes the reply straight from
/// the variable's buffer. CAF still places variables, keeps the registry and
/// watches nodes; the data plane finds a variable by name in the node's
/// directory. A peer that dies closes its socket: the waiting side sees it at
/// once instead of at a timeout.

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "caf/actor_system.hpp"
#include "caf/expected.hpp"

#include "messages/variable.hpp"
#include "messages/wire.hpp"

namespace af {

class guarded_variable;

/// Name -> variable of one node: the node actor writes, the data-plane
/// threads read.
class variable_directory {
public:
  struct entry {
    variable_actor actor;
    std::shared_ptr<guarded_variable> state;
  };
  void put(const std::string& name, entry e);
  entry get(const std::string& name) const;

private:
  mutable std::mutex mtx_;
  std::unordered_map<std::string, entry> vars_;
};

/// The node's side: a listening socket and one thread per connection.
class data_plane_server {
public:
  /// Listens on `bind_host` (empty: all interfaces) at `port` (0: the OS picks).
  static caf::expected<std::unique_ptr<data_plane_server>>
  start(caf::actor_system& sys, std::shared_ptr<variable_directory> dir,
        const std::string& bind_host, uint16_t port, std::string node_name);

  ~data_plane_server();

  uint16_t port() const { return port_; }

  /// Closes every connection and joins the threads; idempotent. Call before
  /// the actor system goes away.
  void stop();

private:
  data_plane_server(caf::actor_system& sys, std::shared_ptr<variable_directory> dir,
                    std::string node_name)
    : sys_(sys), dir_(std::move(dir)), node_name_(std::move(node_name)) {}
  void accept_loop();
  void serve(int fd);

  caf::actor_system& sys_;
  std::shared_ptr<variable_directory> dir_;
  std::string node_name_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mtx_;
  std::vector<std::thread> workers_;
  std::vector<int> conns_;
  std::vector<std::thread::id> finished_; ///< workers that returned, to be joined
};

/// The session's side: one connection to one node's data plane.
class data_channel {
public:
  /// `peer` names the node in errors ("/job:ps/task:0 at h:p").
  /// `poll`: how long to poll for a reply before sleeping in recv (0: never).
  static caf::expected<std::unique_ptr<data_channel>>
  connect(const std::string& host, uint16_t port, std::string peer,
          std::chrono::milliseconds timeout,
          std::chrono::microseconds poll = std::chrono::microseconds{0});

  ~data_channel();

  /// One variable op: the value (empty unless asked for or read) and version.
  /// Any I/O failure breaks the channel (broken() turns true).
  caf::expected<std::pair<tensor, uint64_t>> call(wire::kind op, const std::string& var,
                                                  const tensor* operand, bool want_value);

  bool broken() const { return fd_ < 0; }

private:
  data_channel(int fd, std::string peer, std::chrono::milliseconds timeout,
               std::chrono::microseconds poll)
    : fd_(fd), peer_(std::move(peer)), timeout_(timeout), poll_(poll) {}
  caf::error fail(const std::string& what, int err);
  void poll_for_reply();

  int fd_;
  std::string peer_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds poll_;
};

} // namespace af
