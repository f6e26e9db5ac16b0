#pragma once
/// The inside of af::session, shared by its translation units:
/// session.cpp (graph building, preparing and running steps),
/// session_variables.cpp (initialization and waits) and
/// session_cluster.cpp (ping, lists, shutdown, clocks, executor load).
/// Not part of the public API.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "actors/cluster_link.hpp"
#include "core/log.hpp"
#include "actors/node.hpp"
#include "actors/session.hpp"
#include "actors/step_binding.hpp"
#include "actors/system.hpp"
#include "graph/partition.hpp"
#include "graph/placement.hpp"
#include "messages/error.hpp"

namespace af {

/// What the facade asks of its session actor: one step.
struct run_request {
  std::shared_ptr<prepared_step> step;
  std::map<int32_t, tensor> feeds;
  bool trace = false;
};

} // namespace af

// Both stay inside the client's process: the session actor is never remote.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(af::run_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<af::prepared_step>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(af::step_outputs)

namespace af::session_detail {

using run_atom = caf::atom_constant<caf::atom("run_step")>;
using watch_atom = caf::atom_constant<caf::atom("watch")>;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

inline caf::error to_error(const graph_error& e) {
  return make_error(e.code, e.what);
}

struct session_actor_state {
  step_runner runner;
  std::map<caf::actor_addr, std::string> nodes; ///< watched node actor -> task name
  std::shared_ptr<node_health> health;
};

/// Hosts the step runner and watches the nodes: the actor half of a session.
caf::behavior session_actor_impl(caf::stateful_actor<session_actor_state>* self,
                                 std::shared_ptr<node_health> health);

} // namespace af::session_detail

namespace af {

using namespace session_detail;

struct session::impl {
  impl(caf::actor_system& sys, cluster_spec spec, session_options opts)
    : sys(sys), opts(opts), self(sys, true), health(std::make_shared<node_health>()),
      actor(sys.spawn<caf::hidden>(session_actor_impl, health)),
      link(sys, std::move(spec), this->opts, self, actor, health) {
    link.on_reconnect = [this](node_conn& conn, bool restarted) { rebind(conn, restarted); };
  }

  ~impl() {
    // The executors watch the session actor: its exit drops every graph it registered.
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    // This thread spawned in `sys` (the session's calls did): it must not
    // keep the system from ending when another thread destroys it.
    release_thread_logger(sys);
  }

  /// Drops a cached step and its registration on the executors.
  void drop(std::map<std::string, std::shared_ptr<prepared_step>>::iterator it) {
    self->send(actor, forget_atom::value, it->second);
    prepared.erase(it);
  }

  caf::actor_system& sys;
  session_options opts;
  std::string job;
  int32_t task = 0;
  caf::scoped_actor self;
  std::shared_ptr<node_health> health;
  caf::actor actor; ///< hosts the step runner, watches the nodes
  cluster_link link;
  af::graph g;
  std::map<int32_t, var_binding> bindings;
  std::map<std::string, std::shared_ptr<prepared_step>> prepared; ///< by plan signature

  placement_policy policy() const { return placement_policy{job, task, opts.soft_placement}; }

  /// After a reconnect: drop the steps bound to the old executors and find the
  /// variables again by name.
  void rebind(node_conn& conn, bool restarted) {
    for (auto it = prepared.begin(); it != prepared.end();)
      if (it->second->tasks.count(conn.key))
        drop(it++);
      else
        ++it;
    size_t lost = 0;
    for (auto& kv : bindings) {
      const auto& id = kv.first; // not a structured binding: clang 14 (fuzz/) cannot capture one
      auto& b = kv.second;
      if (b.task != conn.key)
        continue;
      const auto& name = g.at(output{id}).spec.name;
      caf::error err;
      self->request(conn.actor, opts.timeout, lookup_atom::value, name)
        .receive([&](variable_actor& v) { b.actor = std::move(v); b.gone = false; },
                 [&](caf::error& e) { err = std::move(e); });
      if (err) {
        b.gone = true;
        ++lost;
      }
    }
    note("reconnected to " + conn.key + " at " + conn.address + " ("
         + (restarted ? "restarted" : "same process") + ")"
         + (lost > 0 ? "; " + std::to_string(lost) + " variable(s) are gone: " + opts.lost_hint
                     : std::string{}));
  }

  /// Logs one line of the session recovering by itself and hands it to
  /// opts.on_recovery.
  void note(const std::string& line) {
    af::log::get()->warn("session {}: {}", task_name(job, task), line);
    if (opts.on_recovery)
      opts.on_recovery(line);
  }

  caf::expected<const var_binding*> binding_of(output var) {
    auto it = bindings.find(var.id);
    if (it == bindings.end())
      return make_error(af_error::invalid_argument,
                        "output " + std::to_string(var.id) + " is not a variable of this session");
    {
      // A node seen dead is reconnected (or reported) first. (Its job and
      // task were parsed from the variable's device when it was bound.)
      auto conn = link.connect(it->second.task, it->second.job, it->second.task_index);
      if (!conn) {
        auto& e = conn.error();
        auto code = e.category() == error_category ? static_cast<af_error>(e.code())
                                                   : af_error::peer_down;
        auto text = describe(e);
        auto prefix = std::string{to_string(code)} + ": ";
        if (text.rfind(prefix, 0) == 0)
          text = text.substr(prefix.size());
        return make_error(code, "variable '" + g.at(var).spec.name + "': " + text);
      }
    }
    if (it->second.gone) {
      // Another client (the chief) may have created it again meanwhile.
      auto conn = link.conns.find(it->second.task);
      if (conn != link.conns.end()) {
        self->request(conn->second.actor, opts.timeout, lookup_atom::value, g.at(var).spec.name)
          .receive(
            [&](variable_actor& v) {
              it->second.actor = std::move(v);
              it->second.gone = false;
            },
            [](caf::error&) { /* still gone */ });
      }
    }
    if (it->second.gone)
      return make_error(af_error::gone,
                        "variable '" + g.at(var).spec.name + "': its node " + it->second.task
                          + " restarted and no longer holds it; initialize() it again or restore "
                            "it from a checkpoint");
    return &it->second;
  }

  /// Tries of one update within the op's timeout (session.hpp).
  static constexpr int update_tries = 3;
  /// An update with a larger operand is tried once with the whole timeout:
  /// sending it again after a third of the timeout would mostly double its
  /// traffic (its transfer alone may take that long).
  static constexpr size_t retried_bytes = size_t{64} << 20;

  /// One op on a variable: over the node's data plane when there is one, as a
  /// CAF message otherwise. `path` says which it took. An update carries a
  /// fresh request id and is sent again with it when no answer came: the
  /// variable applies it once.
  caf::expected<tensor> variable_call(output var, var_op op, tensor operand, bool want_value,
                                      std::string* path = nullptr) {
    auto b = binding_of(var);
    if (!b)
      return std::move(b.error());
    const auto& node = g.at(var);
    bool update = op != var_op::read;
    uint64_t id = update ? new_request_id() : 0;
    int tries = update && (operand.empty() || operand.nbytes() <= retried_bytes) ? update_tries : 1;
    // Said only in errors and notes: not formatted for every op.
    std::function<std::string()> what = [&op, &node] {
      return std::string{to_string(op)} + " of variable '" + node.spec.name + "' on "
             + node.spec.device;
    };
    auto deadline = std::chrono::steady_clock::now() + opts.timeout;
    for (int attempt = 0;; ++attempt) {
      auto wait = opts.timeout;
      if (tries > 1) {
        // Each try waits for its share of what is left: the last try, all of it.
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
        wait = std::max(std::chrono::milliseconds{1}, left / (tries - attempt));
      }
      bool over_channel = false;
      auto r = variable_try(**b, node.spec.name, what, op, operand, want_value, id, wait, path,
                            over_channel);
      if (r || !update)
        return r;
      bool lost_answer = is(r.error(), af_error::timeout)
                         || (over_channel && is(r.error(), af_error::peer_down));
      if (!lost_answer)
        return r;
      if (attempt + 1 >= tries || std::chrono::steady_clock::now() >= deadline) {
        if (attempt == 0)
          return r;
        return make_error(is(r.error(), af_error::timeout) ? af_error::timeout : af_error::peer_down,
                          "no answer to " + what() + " within " + std::to_string(opts.timeout.count())
                            + " ms after " + std::to_string(attempt + 1)
                            + " tries with one request id, so it was applied at most once (last: "
                            + describe(r.error()) + ")");
      }
      // Never across a restart: the node that may have applied it is gone,
      // and its successor may hold a checkpoint taken after it did.
      if (health->is_dead((*b)->task))
        return r;
      if (is(r.error(), af_error::peer_down) && !same_process((*b)->task, deadline))
        return r;
      // A broken data connection: the retry goes on a fresh one. If none
      // opens, the node is most likely gone: its error stands.
      auto it = link.conns.find((*b)->task);
      if (it != link.conns.end() && (it->second.channel_broken
                                     || (it->second.channel && it->second.channel->broken()))) {
        link.reopen_channel(it->second, std::max(std::chrono::milliseconds{1},
                                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                                   deadline - std::chrono::steady_clock::now())));
        if (!it->second.channel) {
          it->second.channel_broken = true; // tried again on the next call
          return r;
        }
      }
      note(fmt::format("retry: {} (try {} of {}, request id {:016x}): {}", what(), attempt + 2,
                       tries, id, describe(r.error())));
    }
  }

  /// True if the node process this session knows as `task` still answers (a
  /// data connection that broke may mean it died, and one to its successor
  /// may open before the session hears of the death).
  bool same_process(const std::string& task, std::chrono::steady_clock::time_point deadline) {
    auto it = link.conns.find(task);
    if (it == link.conns.end() || !it->second.actor)
      return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
    bool alive = false;
    self->request(it->second.actor, std::max(std::chrono::milliseconds{1}, left), caf::ping_atom::value)
      .receive([&](node_info& info) { alive = info.incarnation == it->second.info.incarnation; },
               [](caf::error&) {});
    return alive;
  }

  /// One try of variable_call, waiting `wait` for the answer.
  caf::expected<tensor> variable_try(const var_binding& b, const std::string& name,
                                     const std::function<std::string()>& what, var_op op,
                                     const tensor& operand,
                                     bool want_value, uint64_t id, std::chrono::milliseconds wait,
                                     std::string* path, bool& over_channel) {
    auto it = link.conns.find(b.task);
    if (it != link.conns.end() && it->second.channel) {
      over_channel = true;
      if (opts.variable_calls) // relaxed: one add per call, nothing waits on it
        opts.variable_calls->data_plane.fetch_add(1, std::memory_order_relaxed);
      auto& ch = *it->second.channel;
      if (path) // as the call starts; a call that moves the channel first goes the new way
        *path = "data plane (" + ch.transport() + ")";
      auto r = ch.call(op, name, op == var_op::read ? nullptr : &operand, want_value, id, wait);
      if (path && !ch.broken()) // "data plane (shared memory)"
        *path = "data plane (" + ch.transport() + ")";
      if (ch.broken())
        it->second.channel_broken = true; // reopened on the next call (the node may come back)
      if (!r)
        return std::move(r.error());
      return std::move(r->first);
    }
    if (opts.variable_calls)
      opts.variable_calls->actor_messages.fetch_add(1, std::memory_order_relaxed);
    if (path)
      *path = find_local_node(b.address, &sys) ? "local buffer" : "CAF message";
    if (opts.cancel) {
      auto r = var_op_cancellable(b.actor, op, operand, want_value, id, wait);
      if (r || is(r.error(), af_error::cancelled))
        return r;
      return link.explain(std::move(r.error()), what(), nullptr);
    }
    tensor result;
    caf::error err;
    auto on_error = [&](caf::error& e) {
      if (e == caf::sec::request_timeout)
        err = make_error(af_error::timeout, "timed out after " + std::to_string(wait.count())
                                              + " ms waiting for " + what()
                                              + "; is the node alive and reachable?");
      else
        err = link.explain(std::move(e), what(), nullptr);
    };
    if (id == 0)
      self->request(b.actor, wait, var_op_atom::value, op, operand, want_value)
        .receive([&](tensor& v, uint64_t) { result = std::move(v); }, on_error);
    else
      self->request(b.actor, wait, var_op_atom::value, op, operand, want_value, id)
        .receive([&](tensor& v, uint64_t) { result = std::move(v); }, on_error);
    if (err)
      return err;
    return result;
  }

  caf::expected<std::vector<output>> variables_of(const std::vector<output>& vars) const {
    if (vars.empty())
      return g.variables();
    for (auto v : vars)
      if (g.variable_node(v) == nullptr)
        return make_error(af_error::invalid_argument,
                          "output " + std::to_string(v.id) + " is not a variable of this session");
    return vars;
  }

  caf::expected<std::shared_ptr<prepared_step>> prepare(const std::vector<int32_t>& roots,
                                                        bool want_values);

  caf::expected<std::vector<tensor>> execute(const std::vector<output>& outs, bool want_values,
                                             const std::vector<std::pair<output, tensor>>& feeds,
                                             run_trace* trace);

  /// Sends `req` to the session actor from a helper actor and waits for the
  /// answer in slices, giving up with af_error::cancelled once *opts.cancel
  /// is set; the helper is then stopped and the late answer dropped.
  caf::expected<step_outputs> run_cancellable(run_request req, std::chrono::milliseconds timeout);

  /// The same for one op on a variable actor (variable_call without a data
  /// channel).
  caf::expected<tensor> var_op_cancellable(const variable_actor& var, var_op op, tensor operand,
                                           bool want_value, uint64_t request_id,
                                           std::chrono::milliseconds wait);

  /// Gets or creates the variable of node `id` on its node and binds it.
  caf::error create_variable(int32_t id);
};

} // namespace af
