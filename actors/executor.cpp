#include "actors/executor.hpp"
#include "actors/executor_links.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

#include "caf/all.hpp"

#include "actors/edge_budget.hpp"
#include "actors/edge_token.hpp"
#include "actors/op_compute.hpp"
#include "core/log.hpp"
#include "kernels/sparse.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

using exec::drop_links_to;
using exec::link_key;
using exec::now_ns;
using exec::release_link;
using exec::self_ptr;
using exec::use_link;
using step_key = std::pair<uint64_t, uint64_t>;

constexpr size_t remembered_steps = 4096;

std::string step_name(step_key key) {
  return "step " + std::to_string(key.second) + " of graph " + std::to_string(key.first);
}

/// Runs one kernel op; a GPU backend that lacks it hands it to the CPU.
caf::expected<tensor> compute(executor_state& st, const partition_op& op,
                              const std::vector<tensor>& args, std::string& note) {
  return compute_op(*st.backend, st.fallback.get(), st.device, op, args, note);
}

/// Gives back the bytes of edges `s` held before its run_step came.
void release_early(executor_state& st, executor_state::step& s) {
  if (s.early_bytes > 0 && st.edge_bytes)
    release_edge_bytes(*st.edge_bytes, s.early_bytes);
  s.early_bytes = 0;
}

void remember_done(executor_state& st, step_key key) {
  if (auto it = st.steps.find(key); it != st.steps.end())
    release_early(st, it->second);
  st.steps.erase(key);
  if (st.done.insert(key).second) {
    st.done_order.push_back(key);
    if (st.done_order.size() > remembered_steps) {
      st.done.erase(st.done_order.front());
      st.done_order.pop_front();
    }
  }
}

void fail(self_ptr self, step_key key, caf::error err) {
  auto it = self->state.steps.find(key);
  if (it == self->state.steps.end())
    return;
  if (it->second.rp.pending())
    it->second.rp.deliver(std::move(err));
  remember_done(self->state, key);
}

/// Schedules a sweep while any step is open: no step outlives its deadline.
void schedule_sweep(self_ptr self) {
  auto& st = self->state;
  if (st.sweeping || st.steps.empty())
    return;
  uint32_t shortest = 60000;
  for (const auto& [id, g] : st.graphs)
    shortest = std::min(shortest, g.part.step_timeout_ms);
  auto interval = std::chrono::milliseconds{std::clamp<uint32_t>(shortest / 4, 10, 1000)};
  st.sweeping = true;
  self->delayed_send(self, interval, sweep_atom::value);
}

/// A step entry for `key`, created with the graph's deadline if new.
executor_state::step* open_step(self_ptr self, step_key key) {
  auto& st = self->state;
  auto g = st.graphs.find(key.first);
  if (g == st.graphs.end())
    return nullptr;
  auto [it, fresh] = st.steps.try_emplace(key);
  if (fresh) {
    it->second.deadline_ns = now_ns() + int64_t{g->second.part.step_timeout_ms} * 1000000;
    it->second.waiting_for = "its run_step message from the session";
    schedule_sweep(self);
  }
  return &it->second;
}

void advance(self_ptr self, step_key key);

/// Logs a dropped edge: the first, then a count every 10 s (a stranger's
/// flood of edges is not a flood of log lines).
void log_dropped_edge(executor_state& st, const std::string& why) {
  uint64_t skipped = 0;
  if (!st.edge_refusals.due(skipped))
    return;
  log::get()->warn("{} dropped an edge: {}{}", st.device, why,
                   skipped == 0 ? std::string{}
                                : " (and " + std::to_string(skipped)
                                    + " other edge(s) dropped since the last such line)");
}

/// Same dtype, shape and bytes.
bool same_value(const tensor& a, const tensor& b) {
  if (a.empty() || b.empty())
    return a.empty() == b.empty();
  return a.type() == b.type() && a.shape() == b.shape()
         && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

/// An edge came: op `op`'s value for step `key`. Taken only for an op the
/// partition consumes from another partition, once per step; a step not
/// started yet holds it (bounded: max_early_steps_per_graph per graph, and
/// its bytes count in the executor's edge budget until run_step comes).
void take_edge(self_ptr self, step_key key, int32_t op, tensor& value, int64_t sent_ns,
               std::string path, const std::string& token) {
  auto& st = self->state;
  auto bytes = static_cast<int64_t>(value.empty() ? 0 : value.nbytes());
  // The data-plane server reserved these bytes before it allocated them.
  bool reserved = path.rfind("data plane (", 0) == 0;
  bool keep = false; // the bytes stay counted (held by a step not started)
  auto done = [&] {
    if (reserved && !keep && st.edge_bytes)
      release_edge_bytes(*st.edge_bytes, bytes);
  };
  auto what = [&] {
    return "the value of op " + std::to_string(op) + " for " + step_name(key) + " (" + path + ")";
  };
  if (st.done.count(key)) {
    done();
    return; // the step failed or was aborted meanwhile
  }
  auto g = st.graphs.find(key.first);
  if (g == st.graphs.end()) {
    done();
    return; // a graph this executor no longer holds
  }
  auto& reg = g->second;
  // Before anything of the step is touched: a value without the graph's
  // secret is not from a partition of the graph, whoever knew its id.
  if (!edge_token_matches(reg.part.edge_token, token)) {
    done();
    log_dropped_edge(st, what() + ": its edge token is " + (token.empty() ? "missing" : "wrong")
                           + " (not from a partition of this graph: a stranger who learned the "
                             "graph id?)");
    return;
  }
  if (!reg.remote_inputs.count(op)) {
    done();
    log_dropped_edge(st, what() + ": no op of this partition takes op " + std::to_string(op)
                           + " from another partition (a stranger, or a sender of another graph)");
    return;
  }
  auto it = st.steps.find(key);
  if (it != st.steps.end() && it->second.values.count(op)) {
    done();
    // Never replaces the first; a different second value means one of them
    // did not come from its producer: the step must not compute with either.
    bool conflict = !same_value(it->second.values.at(op), value);
    if (!reg.warned_duplicate || conflict) {
      reg.warned_duplicate = true;
      log::get()->warn("{} refused a second value of op {} for {} ({}){}; the first is kept", 
                       st.device, op, step_name(key), path,
                       conflict ? ", which differs from the first: the step fails" : "");
    }
    if (conflict)
      fail(self, key,
           make_error(af_error::invalid_argument,
                      "op " + std::to_string(op) + " of " + step_name(key) + " came twice to "
                        + st.device + " with different values (the second " + path
                        + "): one is not from its producer; is a stranger sending edges to this "
                          "node's data plane?"));
    return;
  }
  if (it == st.steps.end()) {
    // An early edge: its run_step has not come. Steps of a graph run in
    // order per session: one at or below the newest run_step is stale.
    if (key.second <= reg.newest_step) {
      done();
      log_dropped_edge(st, what() + ": that step is not open here (its run_step "
                                    + std::to_string(reg.newest_step) + " came before)");
      return;
    }
    size_t early = 0;
    for (auto e = st.steps.lower_bound({key.first, 0});
         e != st.steps.end() && e->first.first == key.first; ++e)
      early += e->second.part == nullptr ? 1 : 0;
    if (early >= max_early_steps_per_graph) {
      done();
      log_dropped_edge(st, what() + ": " + std::to_string(early) + " steps of graph "
                             + std::to_string(key.first)
                             + " already hold values before their run_step (at most "
                             + std::to_string(max_early_steps_per_graph) + ")");
      return;
    }
  }
  auto s = open_step(self, key);
  if (s->part == nullptr) {
    keep = true;
    if (!reserved && st.edge_bytes)
      *st.edge_bytes += bytes; // counted too, so the data plane sees it
    s->early_bytes += bytes;
  }
  done();
  s->arrivals[op] = {sent_ns, now_ns(), std::move(path)};
  s->values[op] = std::move(value);
  advance(self, key);
}

/// "host:port" of a var_node ("/job:J/task:T at host:port").
std::string address_of(const std::string& var_node) {
  auto at = var_node.rfind(" at ");
  return at == std::string::npos ? var_node : var_node.substr(at + 4);
}

/// Sends `value` of `op` to consumer `i` on its node's data plane; the step
/// waits for the node to take it, and fails if it cannot.
void send_on_data_plane(self_ptr self, step_key key, executor_state::step& s,
                        const partition_op& op, size_t i, const tensor& value) {
  const auto& plane = op.consumer_data_planes[i];
  auto device = i < op.consumer_devices.size() ? op.consumer_devices[i] : std::string{};
  auto link = link_key(i < op.consumer_tasks.size() ? op.consumer_tasks[i] : std::string{}, plane);
  auto sender = use_link(self, true, link, plane);
  ++s.pending_sends;
  auto sending = "op '" + op.name + "' to " + device + " on the data plane at " + plane;
  s.sending.push_back(sending);
  auto ms = s.part->step_timeout_ms;
  self->request(sender, std::chrono::milliseconds{ms} + std::chrono::seconds{1}, edge_atom::value,
                device, key.first, key.second, op.id, value, now_ns(), ms, s.part->edge_token)
    .then(
      [self, key, link, sender, sending](caf::ok_atom) {
        release_link(self, true, link, sender, false);
        auto it = self->state.steps.find(key);
        if (it == self->state.steps.end())
          return;
        --it->second.pending_sends;
        auto& v = it->second.sending;
        if (auto at = std::find(v.begin(), v.end(), sending); at != v.end())
          v.erase(at);
        advance(self, key);
      },
      [self, key, device, plane, link, sender, name = op.name, id = op.id](caf::error& err) {
        release_link(self, true, link, sender, true);
        auto what = "sending the value of op '" + name + "' (" + std::to_string(id) + ") of "
                    + step_name(key) + " to " + device + " on the data plane at " + plane;
        if (err == caf::sec::request_timeout)
          err = make_error(af_error::timeout, what + " timed out");
        else if (err.category() != error_category)
          err = make_error(af_error::peer_down, what + " failed: " + describe(err));
        else
          err = make_error(static_cast<af_error>(err.code()), what + " failed: " + describe(err));
        fail(self, key, std::move(err));
      });
}

/// An op's value is known: hand it to the partitions that need it and to the client.
void finish_op(self_ptr self, step_key key, const partition_op& op, tensor value, int64_t start,
               std::string note, uint64_t bytes_in) {
  auto& s = self->state.steps.at(key);
  for (size_t i = 0; i < op.consumers.size(); ++i) {
    if (i < op.consumer_data_planes.size() && !op.consumer_data_planes[i].empty()) {
      send_on_data_plane(self, key, s, op, i, value);
      continue;
    }
    const auto& consumer = op.consumers[i];
    self->send(caf::actor_cast<executor_actor>(consumer), edge_atom::value, key.first, key.second,
               op.id, value, now_ns(),
               std::string{consumer->node() == self->node() ? "local buffer" : "CAF message"},
               s.part->edge_token);
  }
  if (op.fetch)
    s.result.fetched.push_back(feed{op.id, value});
  s.result.timings.push_back(
    op_timing{op.id, start, now_ns(), std::move(note), bytes_in, value.empty() ? 0 : value.nbytes()});
  s.values[op.id] = std::move(value);
  ++s.next;
}

/// Starts the read of variable input `in` of `op`; advance() resumes the step.
void read_variable(self_ptr self, step_key key, executor_state::step& s, const partition_op& op,
                   const op_input& in) {
  s.waiting = true;
  s.waiting_for = "variable '" + in.var_name + "'";
  auto name = in.var_name;
  auto started = now_ns();
  std::string path = !in.data_plane.empty()         ? "data plane from " + in.data_plane
                     : in.var->node() == self->node() ? std::string{"local buffer"}
                                                      : "CAF message from " + address_of(in.var_node);
  auto on_value = [self, key, name, started, var = in.op, consumer = op.id](tensor& value,
                                                                           const std::string& path) {
    auto it = self->state.steps.find(key);
    if (it == self->state.steps.end())
      return;
    auto& st = it->second;
    st.waiting = false;
    st.result.transfers.push_back(transfer_timing{1, var, consumer, started, now_ns(),
                                                  value.empty() ? 0 : value.nbytes(), path});
    st.var_reads[name] = std::move(value);
    advance(self, key);
  };
  auto on_error = [self, key, name, path, where = in.var_node](caf::error& err) {
    auto what = "reading variable '" + name + "' of " + where + " (" + path + ")";
    if (err == caf::sec::request_timeout)
      err = make_error(af_error::timeout, what + " on " + self->state.device + " timed out");
    else if (err.category() != error_category)
      err = make_error(af_error::peer_down, what + " failed: " + describe(err));
    else if (is(err, af_error::peer_down) || is(err, af_error::timeout))
      err = make_error(static_cast<af_error>(err.code()), what + ": " + describe(err));
    fail(self, key, std::move(err));
  };
  auto timeout = std::chrono::milliseconds{s.part->variable_timeout_ms};
  if (!in.data_plane.empty()) {
    // One reader (thread, connection) per node read from: a stopped node
    // holds up only the reads of its own variables.
    auto link = link_key(in.var_node, in.data_plane);
    auto reader = use_link(self, false, link, in.data_plane);
    self->request(reader, timeout, read_atom::value, name, s.part->variable_timeout_ms)
      .then(
        [self, on_value, link, reader](tensor& value, uint64_t, std::string& how) {
          release_link(self, false, link, reader, false);
          on_value(value, how);
        },
        [self, on_error, link, reader](caf::error& err) {
          release_link(self, false, link, reader, true);
          on_error(err);
        });
  } else {
    self->request(in.var, timeout, var_op_atom::value, var_op::read, tensor{}, false)
      .then([on_value, path](tensor& value, uint64_t) { on_value(value, path); }, on_error);
  }
}

/// Sends update `op` of the step to its variable's actor with its operands
/// `args` (assign*: the value; scatter_*: indices and updates) and resumes
/// the step when the answer comes.
void send_update(self_ptr self, step_key key, executor_state::step& s, const partition_op& op,
                 const std::vector<tensor>& args, int64_t start, uint64_t bytes_in) {
  var_op update = var_op::read;
  parse_var_op(op.op, update);
  auto scatter = kernels::parse_scatter_op(op.op);
  if (args.size() != (scatter ? 2u : 1u) || !op.inputs[0].var) {
    fail(self, key, make_error(af_error::invalid_argument, "op '" + op.name + "' updates no variable"));
    return;
  }
  s.waiting = true;
  s.waiting_for = "the update of variable '" + op.inputs[0].var_name + "'";
  auto on_value = [self, key, start, &op, bytes_in](tensor& value, uint64_t) {
    auto i2 = self->state.steps.find(key);
    if (i2 == self->state.steps.end())
      return;
    i2->second.waiting = false;
    i2->second.var_reads.erase(op.inputs[0].var_name); // it changed
    finish_op(self, key, op, std::move(value), start, {}, bytes_in);
    advance(self, key);
  };
  auto on_error = [self, key, name = op.inputs[0].var_name,
                   where = op.inputs[0].var_node](caf::error& err) {
    auto what = "updating variable '" + name + "' of " + where;
    if (err == caf::sec::request_timeout)
      err = make_error(af_error::timeout, what + " on " + self->state.device + " timed out");
    else if (err.category() != error_category)
      err = make_error(af_error::peer_down, what + " failed: " + describe(err));
    fail(self, key, std::move(err));
  };
  auto timeout = std::chrono::milliseconds{s.part->variable_timeout_ms};
  if (scatter)
    self->request(op.inputs[0].var, timeout, scatter_atom::value, op.op, args[0], args[1],
                  op.want_value, uint64_t{0})
      .then(on_value, on_error);
  else
    self->request(op.inputs[0].var, timeout, var_op_atom::value, update, args[0], op.want_value)
      .then(on_value, on_error);
}

void advance(self_ptr self, step_key key) {
  auto it = self->state.steps.find(key);
  if (it == self->state.steps.end())
    return;
  auto& s = it->second;
  if (s.part == nullptr || s.waiting)
    return; // not started yet (an early edge), or waiting on a variable
  const auto& ops = s.part->ops;
  while (s.next < ops.size()) {
    const auto& op = ops[s.next];
    var_op update = var_op::read;
    parse_var_op(op.op, update);
    bool is_update = update != var_op::read || kernels::parse_scatter_op(op.op);
    std::vector<tensor> args;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const auto& in = op.inputs[i];
      if (is_update && i == 0)
        continue; // the variable being updated
      switch (in.kind) {
        case op_input::constant:
          args.push_back(in.value);
          break;
        case op_input::variable: {
          auto cached = s.var_reads.find(in.var_name);
          if (cached != s.var_reads.end()) {
            args.push_back(cached->second);
            break;
          }
          if (!in.var) {
            fail(self, key, make_error(af_error::invalid_argument,
                                       "op '" + op.name + "' reads variable '" + in.var_name
                                         + "' without a handle to it"));
            return;
          }
          read_variable(self, key, s, op, in);
          return;
        }
        default: { // local, remote, feed
          auto v = s.values.find(in.op);
          if (v == s.values.end()) {
            if (in.kind == op_input::remote) {
              s.waiting_for = "the value of op " + std::to_string(in.op) + " for '" + op.name
                              + "' from another partition";
              return; // its edge has not arrived yet
            }
            fail(self, key,
                 make_error(af_error::invalid_argument,
                            in.kind == op_input::feed
                              ? "op '" + op.name + "' needs a placeholder that was not fed"
                              : "op '" + op.name + "': an input is missing (a bug)"));
            return;
          }
          if (in.kind == op_input::remote) {
            auto a = s.arrivals.find(in.op);
            if (a != s.arrivals.end()) {
              s.result.transfers.push_back(
                transfer_timing{0, in.op, op.id, a->second.sent_ns, a->second.received_ns,
                                v->second.empty() ? 0 : v->second.nbytes(),
                                std::move(a->second.path)});
              s.arrivals.erase(a);
            }
          }
          args.push_back(v->second);
        }
      }
    }
    auto start = now_ns();
    uint64_t bytes_in = 0;
    for (const auto& a : args)
      bytes_in += a.empty() ? 0 : a.nbytes();
    if (is_update) {
      send_update(self, key, s, op, args, start, bytes_in);
      return;
    }
    std::string note;
    auto out = compute(self->state, op, args, note);
    if (!out) {
      fail(self, key, std::move(out.error()));
      return;
    }
    finish_op(self, key, op, std::move(*out), start, std::move(note), bytes_in);
  }
  if (s.pending_sends > 0) {
    s.waiting_for = "the data plane of another node to take " + std::to_string(s.pending_sends)
                    + " value(s) of this step (";
    for (size_t i = 0; i < s.sending.size(); ++i)
      s.waiting_for += (i > 0 ? "; " : "") + s.sending[i];
    s.waiting_for += ")";
    return; // the last ack resumes it
  }
  // The step's values go before the answer does: a fetched value's buffer
  // is then the client's alone when it arrives (a Python fetch is writable
  // only then; dropped with the step after the answer, the client raced
  // this thread's erase and saw a second holder now and then).
  s.values.clear();
  s.result.device = self->state.device;
  if (self->state.step_latency && s.run_ns != 0)
    self->state.step_latency->observe(now_ns() - s.run_ns);
  s.rp.deliver(std::move(s.result));
  remember_done(self->state, key);
}

/// True if graph `id` is held here for the sender of the current message.
bool owned_by_sender(self_ptr self, uint64_t id) {
  auto g = self->state.graphs.find(id);
  return g != self->state.graphs.end() && g->second.owner == self->current_sender();
}

/// Drops graph `id` and every open step of it.
void forget_graph(self_ptr self, uint64_t id, const caf::error& why) {
  auto& st = self->state;
  for (auto it = st.steps.begin(); it != st.steps.end();) {
    if (it->first.first == id) {
      if (it->second.rp.pending())
        it->second.rp.deliver(why);
      release_early(st, it->second);
      it = st.steps.erase(it);
    } else {
      ++it;
    }
  }
  st.graphs.erase(id);
}

/// A peer died: an executor or variable a graph needs (its node stopped, or
/// restarts elsewhere), or the session that registered graphs.
void on_down(self_ptr self, caf::down_msg& dm) {
  auto& st = self->state;
  // A peer on another node died (its node stopped, or restarts elsewhere):
  // its helpers go, and any wait of theirs gives up.
  drop_links_to(self, dm.source);
  std::vector<uint64_t> orphaned;
  for (auto& [id, g] : st.graphs) {
    if (g.owner == dm.source) {
      orphaned.push_back(id);
      continue;
    }
    const auto& peers = g.part.peers;
    for (size_t i = 0; i < peers.size(); ++i) {
      if (peers[i].address() != dm.source)
        continue;
      auto why = make_error(af_error::peer_down,
                            (i < g.part.peer_devices.size() ? g.part.peer_devices[i]
                                                            : std::string{"a peer"})
                              + ", which this step needs, died (" + caf::to_string(dm.reason)
                              + "); did its node stop or lose its network?");
      std::vector<step_key> affected;
      for (auto& [key, s] : st.steps)
        if (key.first == id)
          affected.push_back(key);
      for (auto key : affected)
        fail(self, key, why);
    }
  }
  for (auto id : orphaned)
    forget_graph(self, id, make_error(af_error::peer_down, "the session that registered it died"));
}

/// Holds `part` for the session that sends it; refuses a taken graph id.
caf::result<caf::ok_atom> register_partition(self_ptr self, partition& part) {
  auto& st = self->state;
  auto owner = caf::actor_cast<caf::actor_addr>(self->current_sender());
  auto id = part.graph;
  // Whoever holds it: replacing a partition under open steps would make
  // them run another graph's ops.
  if (auto it = st.graphs.find(id); it != st.graphs.end())
    return make_error(af_error::already_exists,
                      "graph id " + std::to_string(id) + " is taken on " + st.device
                        + "; register under another id");
  if (part.edge_token.size() != edge_token_bytes)
    return make_error(af_error::invalid_argument,
                      "graph " + std::to_string(id) + " for " + st.device + " carries an edge "
                        "token of " + std::to_string(part.edge_token.size()) + " bytes, not "
                        + std::to_string(edge_token_bytes)
                        + " (a step runner draws one per graph); is the sender of another "
                          "actorflow version?");
  bool known_owner = false;
  for (const auto& [gid, g] : st.graphs)
    known_owner = known_owner || g.owner == owner;
  if (!known_owner && owner)
    self->monitor(owner);
  for (const auto& peer : part.peers)
    if (peer && peer != caf::actor_cast<caf::actor>(self))
      self->monitor(peer);
  executor_state::registered reg;
  reg.part = std::move(part);
  reg.owner = owner;
  for (const auto& op : reg.part.ops)
    for (const auto& in : op.inputs)
      if (in.kind == op_input::remote)
        reg.remote_inputs.insert(in.op);
  st.graphs[id] = std::move(reg);
  return caf::ok_atom::value;
}

/// Fails the steps past their deadline; schedules the next sweep.
void sweep(self_ptr self) {
  auto& st = self->state;
  st.sweeping = false;
  auto now = now_ns();
  std::vector<step_key> expired;
  for (const auto& [key, s] : st.steps)
    if (s.deadline_ns <= now)
      expired.push_back(key);
  for (auto key : expired) {
    auto& s = st.steps.at(key);
    auto g = st.graphs.find(key.first);
    auto ms = g == st.graphs.end() ? 0u : g->second.part.step_timeout_ms;
    fail(self, key,
         make_error(af_error::timeout, step_name(key) + " on " + st.device + " timed out after "
                                         + std::to_string(ms) + " ms waiting for "
                                         + s.waiting_for));
    remember_done(st, key);
  }
  schedule_sweep(self);
}

} // namespace

executor_actor::behavior_type executor_impl(self_ptr self, std::string device,
                                            std::shared_ptr<kernels::backend> backend,
                                            std::shared_ptr<kernels::backend> fallback) {
  self->state.device = std::move(device);
  self->state.backend = std::move(backend);
  self->state.fallback = std::move(fallback);
  // No helper stays blocked on a socket after the executor: a node's
  // shutdown does not wait out a send's timeout.
  auto cancels = std::make_shared<std::vector<std::shared_ptr<std::atomic<bool>>>>();
  self->state.link_cancels = cancels;
  self->state.edge_bytes = edge_bytes_of(self->address(), true);
  self->state.step_latency = step_latency_of(self->address(), true);
  self->attach_functor([cancels, addr = self->address()] {
    forget_edge_bytes(addr);
    forget_step_latency(addr);
    for (auto& c : *cancels)
      c->store(true);
  });
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  return {
    [self](register_atom, partition& part) -> caf::result<caf::ok_atom> {
      return register_partition(self, part);
    },
    [self](run_step_atom, uint64_t graph, uint64_t step,
           std::vector<feed>& feeds) -> caf::result<step_result> {
      auto& st = self->state;
      auto g = st.graphs.find(graph);
      if (g == st.graphs.end() || g->second.owner != self->current_sender())
        return make_error(af_error::not_found, "graph " + std::to_string(graph)
                                                 + " is not registered on " + st.device
                                                 + " by this session (never registered, or dropped)");
      step_key key{graph, step};
      if (st.done.count(key))
        return make_error(af_error::aborted, step_name(key) + " was already aborted on " + st.device);
      g->second.newest_step = std::max(g->second.newest_step, step);
      auto s = open_step(self, key);
      s->part = &g->second.part;
      s->run_ns = now_ns();
      release_early(st, *s); // its edges are now the running step's
      for (auto& f : feeds)
        s->values[f.op] = std::move(f.value);
      s->rp = self->make_response_promise<step_result>();
      auto rp = s->rp;
      advance(self, key);
      return rp;
    },
    [self](edge_atom, uint64_t graph, uint64_t step, int32_t op, tensor& value, int64_t sent_ns,
           std::string& path, const std::string& token) {
      take_edge(self, {graph, step}, op, value, sent_ns, std::move(path), token);
    },
    [self](abort_atom, uint64_t graph, uint64_t step) {
      if (!owned_by_sender(self, graph))
        return; // only the graph's owner may abort its steps
      fail(self, {graph, step}, make_error(af_error::aborted, "step aborted by the session"));
      remember_done(self->state, {graph, step});
    },
    [self](forget_atom, uint64_t graph) {
      if (!owned_by_sender(self, graph))
        return; // only the graph's owner may drop it
      forget_graph(self, graph, make_error(af_error::aborted, "the session dropped the graph"));
    },
    [self](info_atom) -> caf::result<uint64_t, uint64_t> {
      return {static_cast<uint64_t>(self->state.graphs.size()),
              static_cast<uint64_t>(self->state.steps.size())};
    },
    [self](sweep_atom) { sweep(self); },
  };
}

} // namespace af
