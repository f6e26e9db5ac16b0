#include "actors/executor_links.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "caf/all.hpp"

#include "actors/system.hpp"
#include "config/cluster_spec.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"

namespace af {

namespace {

using exec::self_ptr;

std::atomic<size_t> senders_alive{0};
std::atomic<size_t> readers_alive{0};

constexpr int64_t idle_link_ns = int64_t{60} * 1000000000; ///< an unused helper stops after

struct remote_reader_state {
  remote_reader_state() { ++readers_alive; }
  ~remote_reader_state() { --readers_alive; }
  std::unique_ptr<data_channel> channel; ///< to the one node this reader serves
};

/// Opens a channel to `address` ("host:port") for `peer` ("/job:J/task:T at
/// host:port": TLS then checks the node's certificate is that task's).
caf::expected<std::unique_ptr<data_channel>>
open_channel(caf::actor_system& sys, const std::string& address, const std::string& peer,
             const std::string& what, std::chrono::milliseconds timeout,
             const std::shared_ptr<std::atomic<bool>>& cancel) {
  auto addr = parse_address(address, what);
  if (!addr)
    return std::move(addr.error());
  auto fresh = data_channel::connect(addr->host, addr->port, peer, timeout, {}, system_tls(sys));
  if (!fresh)
    return std::move(fresh.error());
  (*fresh)->set_cancel(cancel);
  return fresh;
}

/// Reads variables of one other node over its data plane. Detached: its
/// blocking socket I/O never stalls the executor.
caf::behavior remote_reader_impl(caf::stateful_actor<remote_reader_state>* self,
                                 std::string address, std::string peer,
                                 std::shared_ptr<std::atomic<bool>> cancel) {
  return {
    [self, address, peer, cancel](read_atom, const std::string& var,
                                  uint32_t timeout_ms) -> caf::result<tensor, uint64_t, std::string> {
      auto& ch = self->state.channel;
      if (!ch || ch->broken()) {
        auto fresh = open_channel(self->system(), address, peer,
                                  "data plane of variable '" + var + "'",
                                  std::chrono::milliseconds{timeout_ms}, cancel);
        if (!fresh)
          return std::move(fresh.error());
        ch = std::move(*fresh);
      }
      auto r = ch->call(var_op::read, var, nullptr, true);
      if (!r)
        return std::move(r.error());
      // With the way it travelled, for the trace.
      return {std::move(r->first), r->second,
              "data plane (" + ch->transport() + ") from " + address};
    },
  };
}

struct edge_sender_state {
  edge_sender_state() { ++senders_alive; }
  ~edge_sender_state() { --senders_alive; }
  std::unique_ptr<data_channel> channel; ///< to the one node this sender serves
};

/// Sends values of steps to the executors of one other node over its data
/// plane. Detached: its blocking socket I/O never stalls the executor. A
/// broken connection is opened again for the next value.
caf::behavior edge_sender_impl(caf::stateful_actor<edge_sender_state>* self, std::string address,
                               std::string peer, std::shared_ptr<std::atomic<bool>> cancel) {
  return {
    [self, address, peer, cancel](edge_atom, const std::string& device, uint64_t graph,
                                  uint64_t step, int32_t op, const tensor& value, int64_t sent_ns,
                                  uint32_t timeout_ms,
                                  const std::string& token) -> caf::result<caf::ok_atom> {
      auto& ch = self->state.channel;
      auto timeout = std::chrono::milliseconds{timeout_ms};
      if (!ch || ch->broken()) {
        auto fresh = open_channel(self->system(), address, peer, "data plane of " + device,
                                  std::min(timeout, std::chrono::milliseconds{10000}), cancel);
        if (!fresh)
          return std::move(fresh.error());
        ch = std::move(*fresh);
      }
      if (auto err = ch->send_edge(device, graph, token, step, op, sent_ns, value, timeout))
        return err;
      return caf::ok_atom::value;
    },
  };
}

/// The helpers map of an executor: edge senders or remote readers.
std::map<std::string, executor_state::data_link>& links_of(self_ptr self, bool edges) {
  return edges ? self->state.edge_senders : self->state.remote_readers;
}

} // namespace

size_t live_edge_senders() {
  return senders_alive.load();
}

size_t live_remote_readers() {
  return readers_alive.load();
}

namespace exec {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

/// Stops helper `key` (its wait, if any, gives up at once) and forgets it.
void drop_link(self_ptr self, bool edges, const std::string& key) {
  auto& links = links_of(self, edges);
  auto it = links.find(key);
  if (it == links.end())
    return;
  it->second.cancel->store(true);
  auto& flags = *self->state.link_cancels;
  flags.erase(std::remove(flags.begin(), flags.end(), it->second.cancel), flags.end());
  self->unlink_from(it->second.actor);
  self->send_exit(it->second.actor, caf::exit_reason::user_shutdown);
  links.erase(it);
}

/// The helper for `key` ("/job:J/task:T at host:port"; `address`: its data
/// plane), made if there is none; counts the request about to go to it.
caf::actor use_link(self_ptr self, bool edges, const std::string& key, const std::string& address) {
  auto& links = links_of(self, edges);
  auto now = now_ns();
  auto it = links.find(key);
  if (it == links.end()) {
    // Nodes restart on other (ephemeral) ports: helpers for old addresses
    // would pile up. Those idle for a while go as a new one comes.
    std::vector<std::string> idle;
    for (const auto& [k, l] : links)
      if (l.in_flight == 0 && now - l.last_used_ns > idle_link_ns)
        idle.push_back(k);
    for (const auto& k : idle)
      drop_link(self, edges, k);
    executor_state::data_link l;
    l.cancel = std::make_shared<std::atomic<bool>>(false);
    self->state.link_cancels->push_back(l.cancel);
    l.actor = edges ? self->spawn<caf::detached + caf::linked>(edge_sender_impl, address, key, l.cancel)
                    : self->spawn<caf::detached + caf::linked>(remote_reader_impl, address, key,
                                                               l.cancel);
    it = links.emplace(key, std::move(l)).first;
  }
  ++it->second.in_flight;
  it->second.last_used_ns = now;
  return it->second.actor;
}

/// A request to helper `a` for `key` was answered (or failed: then, with
/// no other request in flight, the helper is stopped; the next request
/// makes a fresh one, on a fresh connection).
void release_link(self_ptr self, bool edges, const std::string& key, const caf::actor& a,
                  bool failed) {
  auto& links = links_of(self, edges);
  auto it = links.find(key);
  if (it == links.end() || it->second.actor != a)
    return; // dropped meanwhile
  --it->second.in_flight;
  it->second.last_used_ns = now_ns();
  if (failed && it->second.in_flight == 0)
    drop_link(self, edges, key);
}

/// "/job:J/task:T at `address`" for the data plane of the node of `task`
/// ("/job:J/task:T", or "/job:J/task:T at host:port"): TLS then checks the
/// node's certificate is that task's.
std::string link_key(const std::string& task, const std::string& address) {
  auto name = task.substr(0, task.find(" at "));
  if (name.rfind("/job:", 0) != 0)
    return "the data plane at " + address;
  return name + " at " + address;
}

void drop_links_to(self_ptr self, const caf::actor_addr& peer) {
  auto& st = self->state;
  std::vector<std::pair<bool, std::string>> dead_links;
  for (const auto& [id, g] : st.graphs)
    for (const auto& op : g.part.ops) {
      for (size_t i = 0; i < op.consumers.size() && i < op.consumer_data_planes.size(); ++i)
        if (op.consumers[i].address() == peer && !op.consumer_data_planes[i].empty())
          dead_links.emplace_back(
            true, link_key(i < op.consumer_tasks.size() ? op.consumer_tasks[i] : std::string{},
                           op.consumer_data_planes[i]));
      for (const auto& in : op.inputs)
        if (in.kind == op_input::variable && !in.data_plane.empty() && in.var
            && in.var.address() == peer)
          dead_links.emplace_back(false, link_key(in.var_node, in.data_plane));
    }
  for (const auto& [edges, key] : dead_links)
    drop_link(self, edges, key);
}

} // namespace exec

} // namespace af
