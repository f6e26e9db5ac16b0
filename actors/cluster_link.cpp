#include "actors/cluster_link.hpp"

#include <algorithm>
#include <chrono>
#include <set>

#include "caf/all.hpp"
#include "caf/io/middleman.hpp"
#include "caf/io/basp_broker.hpp"
#include "caf/io/scribe.hpp"

#include <mutex>

#include <fmt/format.h>

#include "net/caf_port.hpp"
#include "core/log.hpp"

#include "actors/node.hpp"
#include "actors/pending_reply.hpp"
#include "actors/system.hpp"
#include "net/tls.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

using watch_atom = caf::atom_constant<caf::atom("watch")>;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

} // namespace

std::string task_name(const std::string& job, int32_t task) {
  return "/job:" + job + "/task:" + std::to_string(task);
}

caf::error cluster_link::explain(caf::error err, const std::string& what, const node_conn* conn,
                                 std::chrono::milliseconds waited) {
  if (err == caf::sec::request_timeout) {
    if (waited.count() <= 0)
      waited = opts.timeout;
    auto to = conn ? " of " + conn->key + " at " + conn->address : std::string{};
    return make_error(af_error::timeout,
                      what + to + " got no answer within " + std::to_string(waited.count())
                        + " ms (the node may be stopped, overloaded or cut off: check that its "
                          "process runs and is not paused, or give the call more time)");
  }
  auto where = conn ? " from " + conn->key + " at " + conn->address : std::string{};
  if (err.category() != error_category)
    return make_error(af_error::peer_down, what + where + " failed: " + describe(err));
  return err;
}

namespace {
caf::error open_data_channel(node_conn& conn, const std::string& host,
                             const session_options& opts, const std::shared_ptr<tls_context>& tls,
                             std::chrono::milliseconds timeout);
} // namespace

caf::expected<node_conn> cluster_link::open(const std::string& j, int32_t t) {
  auto key = task_name(j, t);
  auto addr = spec.address(j, t);
  if (!addr)
    return std::move(addr.error());
  node_conn conn;
  conn.key = key;
  conn.address = addr->to_string();
  if (!security_checked) {
    // Before CAF reads the files: a bad key would throw in its middleman and
    // leave this request waiting (docs/security.md).
    auto checked = check_security(sys, opts.security, "this session");
    if (!checked)
      return std::move(checked.error());
    tls = std::move(*checked);
    security_checked = true;
  }
  conn.actor = find_local_node(conn.address, &sys);
  if (!conn.actor) {
    // The BASP broker gets a connection of ours (connect_scribe says why not
    // the middleman's). One deadline for the whole connect: the name lookup
    // and the TCP connection take what they need of connect_timeout, and
    // the handshakes (TLS, then BASP's) get what is left, not a budget of
    // their own (a slow TCP connect then a silent peer took twice as long).
    auto deadline = std::chrono::steady_clock::now() + opts.connect_timeout;
    auto budget = std::to_string(opts.connect_timeout.count()) + " ms";
    caf::error err;
    auto on_answer = [&](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>& ifs) {
      if (!ptr)
        err = make_error(af_error::unreachable,
                         "nothing is published at " + conn.address + " for " + key);
      else if (!sys.assignable<node_actor>(ifs))
        err = make_error(af_error::unreachable,
                         conn.address + " (" + key
                           + ") answers but is not an actorflow node of this version");
      else
        conn.actor = caf::actor_cast<node_actor>(std::move(ptr));
    };
    auto on_error = [&](caf::error& e, bool connected) {
      // After the TCP connection was made, what did not come is the
      // handshake. An af_error's reason goes in without its code: the
      // code is this error's own ("unreachable: ... unreachable: ...").
      auto why = connected && (e == caf::sec::request_timeout || e == caf::sec::connection_timeout)
                   ? "it accepted the connection but did not complete the handshake within "
                       + budget
                       + " (connect_timeout; a stopped or overloaded node, or not an actorflow "
                         "node?)"
                   : reason_of(e);
      if (e == caf::sec::disconnect_during_handshake)
        why += tls ? " (TLS: does the node have a certificate of this cluster's CA, and "
                     "is it running with [security]?)"
                   // Seen the same from here: a node that accepts and closes
                   // at once, out of descriptors, and one that drops our
                   // plaintext as not TLS.
                   : " (the node closed the connection before its handshake: it may be out of "
                     "file descriptors or at its connection limit, or run with [security], "
                     "which this client then needs too)";
      err = make_error(af_error::unreachable, "cannot reach " + key + " at " + conn.address + ": "
                                                + why + "; is actorflow-node running there?");
    };
    auto opened = connect_scribe(sys, addr->host, addr->port, opts.connect_timeout, tls, key);
    if (!opened) {
      on_error(opened.error(), false);
    } else {
      auto left = std::max(std::chrono::milliseconds{1},
                           std::chrono::ceil<std::chrono::milliseconds>(
                             deadline - std::chrono::steady_clock::now()));
      // From a helper actor, so that a cancel (Ctrl-C) ends the wait on a
      // stopped node within 20 ms instead of at connect_timeout.
      using handshake = std::tuple<caf::node_id, caf::strong_actor_ptr, std::set<std::string>>;
      auto got = ask_cancellable<handshake>(
        sys, cancel_flag(opts), "the connect", sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP")),
        left,
        [](caf::node_id& nid, caf::strong_actor_ptr& ptr, std::set<std::string>& ifs) {
          return handshake{std::move(nid), std::move(ptr), std::move(ifs)};
        },
        caf::connect_atom::value, std::move(opened->scribe), addr->port);
      bool answered = static_cast<bool>(got);
      caf::error failed;
      if (answered)
        on_answer(std::get<0>(*got), std::get<1>(*got), std::get<2>(*got));
      else if (is(got.error(), af_error::cancelled)) {
        opened->settle(false);
        return std::move(got.error());
      } else
        failed = std::move(got.error());
      // Our TLS check's reason, when it was that, instead of a guess.
      auto why = opened->settle(answered);
      if (!answered && why.empty())
        on_error(failed, true);
      else if (!answered)
        err = make_error(af_error::unreachable, "cannot reach " + key + " at " + conn.address
                                                  + ": TLS handshake failed: " + why);
    }
    if (err)
      return err;
  }
  caf::error err;
  // As NTP does: the node read its clock halfway through the round trip, so
  // the offset is off by at most half of it. Of a few pings, the one with the
  // shortest round trip bounds it best (the first also pays for warming up).
  conn.clock.rtt_ns = -1;
  for (int i = 0; i < 4 && !err; ++i) {
    auto t0 = now_ns();
    int64_t t1 = 0;
    caf::expected<node_info> info{caf::error{}};
    if (opts.cancel) {
      // Cancellable (Ctrl-C), as the handshake: a stopped node never
      // answers. The answer's time is taken in the helper, as it arrives.
      using timed = std::pair<node_info, int64_t>;
      auto got = ask_cancellable<timed>(sys, *opts.cancel, "the connect's ping", conn.actor,
                                        opts.timeout,
                                        [](node_info& i) { return timed{std::move(i), now_ns()}; },
                                        caf::ping_atom::value);
      if (got) {
        info = std::move(got->first);
        t1 = got->second;
      } else {
        info = std::move(got.error());
      }
    } else {
      self->request(conn.actor, opts.timeout, caf::ping_atom::value)
        .receive([&](node_info& i) { t1 = now_ns(); info = std::move(i); },
                 [&](caf::error& e) { info = std::move(e); });
    }
    if (!info) {
      err = is(info.error(), af_error::cancelled) ? std::move(info.error())
                                                  : explain(std::move(info.error()), "ping", &conn);
      break;
    }
    if (conn.clock.rtt_ns < 0 || t1 - t0 < conn.clock.rtt_ns) {
      conn.clock.rtt_ns = t1 - t0;
      conn.clock.offset_ns = info->clock_ns - (t0 + (t1 - t0) / 2);
    }
    conn.info = std::move(*info);
  }
  if (err)
    return err;
  bool local = find_local_node(conn.address, &sys) != nullptr;
  if (!local && opts.data_plane && conn.info.data_port != 0) {
    // Without a data plane (blocked port) the same ops go as CAF messages.
    if (auto err = open_data_channel(conn, addr->host, opts, tls, opts.timeout))
      return err;
  }
  self->send(watcher, watch_atom::value, caf::actor_cast<caf::actor>(conn.actor), key);
  return conn;
}

namespace {

/// Nodes whose data plane could not be opened, already warned of (by
/// "task at host:port"): one warning per node and process, not one per op.
std::mutex warned_mtx;
std::set<std::string> warned_data_planes;

/// Opens `conn`'s data channel. If it cannot be opened, the session goes on
/// through CAF messages (a warning, once per node), unless the node's data
/// port showed a wrong identity: that is an error.
caf::error open_data_channel(node_conn& conn, const std::string& host,
                             const session_options& opts, const std::shared_ptr<tls_context>& tls,
                             std::chrono::milliseconds timeout) {
  auto failure = connect_failure::none;
  auto where = fmt::format("{}:{}", host, conn.info.data_port);
  auto ch = data_channel::connect(host, conn.info.data_port, conn.key + " at " + conn.address,
                                  timeout.count() > 0 ? timeout : opts.timeout, opts.reply_poll,
                                  tls, &failure);
  if (ch) {
    (*ch)->set_cancel(opts.cancel);
    conn.channel = std::move(*ch);
    return {};
  }
  auto why = describe(ch.error());
  if (auto code = std::string{to_string(af_error::unreachable)} + ": "; why.rfind(code, 0) == 0)
    why = why.substr(code.size()); // the code is this error's own, or none in a log line
  if (failure == connect_failure::impostor) {
    // Its data port shows another identity: whoever answers there is not
    // the node meant, and its CAF port is not to be trusted either.
    return make_error(af_error::unreachable,
                      fmt::format("the data plane of {} at {} did not prove to be that node: {}; "
                                  "the session does not use this node (not even through CAF "
                                  "messages): check the cluster config's address for it and its "
                                  "certificate, or whether another machine answers there",
                                  conn.key, where, why));
  }
  std::lock_guard<std::mutex> guard{warned_mtx};
  if (warned_data_planes.insert(conn.key + " at " + where).second)
    log::get()->warn("data plane of {} at {}: {}; its tensors go through CAF messages, slower",
                     conn.key, where, why);
  return {};
}

} // namespace

bool cluster_link::link_broke(const node_conn& conn, const caf::error& err) {
  if (err != caf::sec::request_receiver_down)
    return false;
  health->mark(conn.key, "a request to it found its link broken", conn.actor.address());
  return true;
}

namespace {

/// Whether `node`'s handle went down: a remote node's proxy is killed when
/// its CAF link breaks (the node died, or was stopped past
/// connection_timeout_ms), a local node actor when it exits. The session's
/// watcher hears it by a down message, which may come after a call looks:
/// a request to a killed proxy is dropped, and would wait its whole timeout.
bool handle_down(const node_actor& node) {
  auto* a = caf::actor_cast<caf::abstract_actor*>(node);
  return a != nullptr && a->getf(caf::abstract_actor::is_cleaned_up_flag);
}

} // namespace

caf::expected<node_conn*> cluster_link::connect(const std::string& j, int32_t t) {
  return connect(task_name(j, t), j, t);
}

caf::expected<node_conn*> cluster_link::connect(const std::string& key, const std::string& j,
                                                int32_t t) {
  auto it = conns.find(key);
  std::string why;
  bool dead = health->is_dead(key, &why);
  if (!dead && it != conns.end() && handle_down(it->second.actor)) {
    why = "its handle went down";
    health->mark(key, why, it->second.actor.address());
    dead = true;
  }
  if (it != conns.end() && !dead) {
    if (it->second.channel_broken) {
      if (auto err = reopen_channel(it->second))
        return err;
    }
    return &it->second;
  }
  if (it == conns.end() && !dead) {
    auto fresh = open(j, t);
    if (!fresh)
      return std::move(fresh.error());
    health->revive(key, fresh->actor.address());
    return &conns.emplace(key, std::move(*fresh)).first->second;
  }
  // It died: try once to reach its successor.
  auto address = it != conns.end() ? it->second.address : std::string{};
  auto fresh = open(j, t);
  if (!fresh)
    return make_error(af_error::peer_down,
                      "node " + key + (address.empty() ? "" : " at " + address)
                        + " was lost (" + why
                        + ": its process died, or its connection broke) and does not answer yet ("
                        + describe(fresh.error())
                        + "); if it is not running, restart it: this session reconnects by "
                          "itself");
  health->revive(key, fresh->actor.address());
  bool restarted = it == conns.end() || it->second.info.incarnation != fresh->info.incarnation;
  if (it != conns.end())
    conns.erase(it);
  auto& conn = conns.emplace(key, std::move(*fresh)).first->second;
  if (on_reconnect)
    on_reconnect(conn, restarted);
  return &conn;
}

caf::error cluster_link::reopen_channel(node_conn& conn, std::chrono::milliseconds timeout) {
  conn.channel_broken = false;
  conn.channel.reset();
  auto addr = parse_address(conn.address, conn.key);
  if (!addr || !opts.data_plane || conn.info.data_port == 0)
    return {};
  return open_data_channel(conn, addr->host, opts, tls, timeout);
}

caf::expected<std::vector<std::string>> cluster_link::devices_of(const std::string& j, int32_t t) {
  if (auto err = spec.check_task(j, t))
    return err;
  auto conn = connect(j, t);
  if (!conn)
    return std::move(conn.error());
  return (*conn)->info.devices;
}

device_catalog cluster_link::catalog() {
  return [this](const std::string& j, int32_t t) -> outcome<std::vector<std::string>> {
    auto d = devices_of(j, t);
    if (d)
      return std::move(*d);
    auto code = d.error().category() == error_category ? static_cast<af_error>(d.error().code())
                                                        : af_error::unreachable;
    auto text = describe(d.error());
    auto prefix = std::string{to_string(code)} + ": ";
    if (text.rfind(prefix, 0) == 0)
      text = text.substr(prefix.size());
    return graph_error{code, text};
  };
}

caf::expected<executor_actor> cluster_link::executor(node_conn& conn, const std::string& local) {
  auto it = conn.executors.find(local);
  if (it != conn.executors.end())
    return it->second;
  // Cancellable (Ctrl-C): the first step on a stopped node waits here.
  auto exec = ask_cancellable<executor_actor>(
    sys, cancel_flag(opts), "asking for the node's executor", conn.actor, opts.timeout,
    [](executor_actor& e) { return std::move(e); }, executor_atom::value, local);
  if (!exec)
    return is(exec.error(), af_error::cancelled)
             ? std::move(exec.error())
             : explain(std::move(exec.error()), "executor " + local, &conn);
  conn.executors.emplace(local, *exec);
  return exec;
}

} // namespace af
