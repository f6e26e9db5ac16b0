#include "actors/session.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <atomic>
#include <random>

#include <nlohmann/json.hpp>

#include "caf/all.hpp"
#include "caf/io/middleman.hpp"

#include "actors/data_plane.hpp"
#include "actors/node.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

std::string task_name(const std::string& job, int32_t task) {
  return "/job:" + job + "/task:" + std::to_string(task);
}

struct op_node {
  enum kind_t { variable, constant, compute, update, placeholder } kind = constant;
  std::string name;
  std::string op; ///< compute: a kernels::run_op name; update: assign/assign_add/assign_sub
  op_attrs attrs;
  std::vector<int32_t> inputs;
  device_name requested;
  // variables
  variable_spec spec;
  variable_actor var;
  initializer init;
  std::string node_key;     ///< /job:J/task:T of its node
  std::string node_address;
  std::string note;
  // constants
  tensor value;
};

struct node_conn {
  node_actor actor;
  node_info info;
  std::string address;
  std::map<std::string, executor_actor> executors;
  std::unique_ptr<data_channel> channel; ///< null: same process, or no data plane
};

struct placement {
  node_conn* conn = nullptr;
  std::string local;  ///< "CPU:0"
  std::string full;   ///< /job:J/replica:0/task:T/device:CPU:0
  std::string note;
};

} // namespace

struct session::impl {
  impl(caf::actor_system& sys, cluster_spec spec, session_options opts)
    : sys(sys), spec(std::move(spec)), opts(opts), self(sys, true) {
    // nop
  }

  caf::actor_system& sys;
  cluster_spec spec;
  session_options opts;
  std::string job;
  int32_t task = 0;
  caf::scoped_actor self;
  std::vector<device_name> scopes;
  std::vector<op_node> ops;
  std::map<std::string, int> name_counts;
  std::map<std::string, node_conn> conns;

  device_name current() const {
    device_name d;
    for (const auto& s : scopes)
      d = s.merged_into(d);
    return d;
  }

  std::string unique_name(const std::string& base) {
    auto n = name_counts[base]++;
    return n == 0 ? base : base + "_" + std::to_string(n);
  }

  /// Maps CAF's request errors to a sentence naming what we waited for.
  caf::error explain(caf::error err, const std::string& what, const node_conn* conn) {
    if (err == caf::sec::request_timeout)
      return make_error(af_error::timeout,
                        "timed out after " + std::to_string(opts.timeout.count()) + " ms waiting for "
                          + what + (conn ? " from " + task_name(conn->info.job, conn->info.task)
                                             + " at " + conn->address
                                         : std::string{})
                          + "; is the node alive and reachable?");
    if (err.category() == caf::atom("system"))
      return make_error(af_error::peer_down, what + " failed: " + describe(err));
    return err;
  }

  caf::expected<node_conn*> connect(const std::string& j, int32_t t) {
    auto key = task_name(j, t);
    if (auto it = conns.find(key); it != conns.end())
      return &it->second;
    auto addr = spec.address(j, t);
    if (!addr)
      return std::move(addr.error());
    node_conn conn;
    conn.address = addr->to_string();
    conn.actor = find_local_node(conn.address, &sys);
    if (!conn.actor) {
      // The middleman's own remote_actor waits without bound; ask it directly so
      // that an unreachable host fails within connect_timeout.
      caf::error err;
      self->request(sys.middleman().actor_handle(), opts.connect_timeout, caf::connect_atom::value,
                    addr->host, addr->port)
        .receive(
          [&](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>& ifs) {
            if (!ptr)
              err = make_error(af_error::unreachable, "nothing is published at " + conn.address
                                                        + " for " + key);
            else if (!sys.assignable<node_actor>(ifs))
              err = make_error(af_error::unreachable,
                               conn.address + " (" + key
                                 + ") answers but is not an actorflow node of this version");
            else
              conn.actor = caf::actor_cast<node_actor>(std::move(ptr));
          },
          [&](caf::error& e) {
            auto why = e == caf::sec::request_timeout
                         ? "no answer within " + std::to_string(opts.connect_timeout.count()) + " ms"
                         : describe(e);
            err = make_error(af_error::unreachable, "cannot reach " + key + " at " + conn.address
                                                      + ": " + why
                                                      + "; is actorflow-node running there?");
          });
      if (err)
        return err;
    }
    caf::error err;
    self->request(conn.actor, opts.timeout, caf::ping_atom::value)
      .receive([&](node_info& info) { conn.info = std::move(info); },
               [&](caf::error& e) { err = explain(std::move(e), "ping", &conn); });
    if (err)
      return err;
    bool local = find_local_node(conn.address, &sys) != nullptr;
    if (!local && opts.data_plane && conn.info.data_port != 0) {
      // Without a data plane (blocked port) the same ops go as CAF messages.
      auto ch = data_channel::connect(addr->host, conn.info.data_port, key + " at " + conn.address,
                                      opts.timeout, opts.reply_poll);
      if (ch)
        conn.channel = std::move(*ch);
    }
    return &conns.emplace(key, std::move(conn)).first->second;
  }

  /// One op on a variable: over the node's data plane when there is one, as a
  /// CAF message otherwise. Returns the value (empty unless read or wanted).
  caf::expected<tensor> variable_call(const op_node& var, wire::kind op, tensor operand,
                                      bool want_value) {
    auto it = conns.find(var.node_key);
    if (it != conns.end() && it->second.channel) {
      auto& ch = *it->second.channel;
      auto r = ch.call(static_cast<var_op>(op), var.spec.name, op == wire::kind::read ? nullptr : &operand, want_value);
      if (ch.broken())
        conns.erase(it); // reconnect on the next call (the node may come back)
      if (!r)
        return std::move(r.error());
      return std::move(r->first);
    }
    tensor result;
    caf::error err;
    auto on_value = [&](tensor& v, uint64_t) { result = std::move(v); };
    auto on_error = [&](caf::error& e) {
      auto what = std::string{op == wire::kind::read ? "read" : op == wire::kind::assign ? "assign"
                              : op == wire::kind::assign_add ? "assign_add" : "assign_sub"}
                  + " of variable '" + var.spec.name + "' on " + var.spec.device;
      err = explain(std::move(e), what, nullptr);
    };
    self->request(var.var, opts.timeout, var_op_atom::value, static_cast<var_op>(op),
                  std::move(operand), want_value)
      .receive(on_value, on_error);
    if (err)
      return err;
    return result;
  }

  caf::expected<placement> place(const device_name& requested, bool for_variable) {
    device_name base;
    base.job = job;
    base.replica = 0;
    base.task = for_variable ? 0 : task;
    base.type = "CPU";
    base.id = 0;
    device_name d = requested;
    if (d.job && !d.task)
      d.task = 0; // /job:ps means its task 0, as in TensorFlow
    d = d.merged_into(base);
    if (!d.id)
      d.id = 0;
    auto shown = requested.to_string().empty() ? std::string{"(no device)"} : requested.to_string();
    if (*d.replica != 0)
      return make_error(af_error::unknown_device,
                        "device " + shown + ": replica " + std::to_string(*d.replica)
                          + " does not exist (actorflow runs replica 0 of each task)");
    if (auto err = spec.check_task(*d.job, *d.task))
      return make_error(af_error::unknown_device, "device " + shown + ": " + describe(err));
    auto conn = connect(*d.job, *d.task);
    if (!conn)
      return std::move(conn.error());
    placement p;
    p.conn = *conn;
    p.local = d.local_device();
    auto& devs = p.conn->info.devices;
    if (std::find(devs.begin(), devs.end(), p.local) == devs.end()) {
      std::string list;
      for (const auto& x : devs)
        list += (list.empty() ? "" : ", ") + x;
      auto msg = d.to_string() + " is not available on " + task_name(*d.job, *d.task) + " (it has "
                 + list + ")";
      if (!opts.soft_placement)
        return make_error(af_error::unknown_device, msg + "; enable soft placement or pick one of those");
      p.note = "soft placement: " + msg + "; placed on CPU:0";
      p.local = "CPU:0";
    }
    p.full = "/job:" + *d.job + "/replica:0/task:" + std::to_string(*d.task) + "/device:" + p.local;
    return p;
  }

  caf::expected<executor_actor> executor(placement& p) {
    auto it = p.conn->executors.find(p.local);
    if (it != p.conn->executors.end())
      return it->second;
    caf::error err;
    executor_actor exec;
    self->request(p.conn->actor, opts.timeout, executor_atom::value, p.local)
      .receive([&](executor_actor& e) { exec = std::move(e); },
               [&](caf::error& e) { err = explain(std::move(e), "executor " + p.local, p.conn); });
    if (err)
      return err;
    p.conn->executors.emplace(p.local, exec);
    return exec;
  }

  const op_node* var_node(output o) const {
    if (o.id < 0 || static_cast<size_t>(o.id) >= ops.size())
      return nullptr;
    const auto& n = ops[static_cast<size_t>(o.id)];
    return n.kind == op_node::variable ? &n : nullptr;
  }

  caf::expected<std::vector<const op_node*>> variables_of(const std::vector<output>& vars) const {
    std::vector<const op_node*> out;
    if (vars.empty()) {
      for (const auto& n : ops)
        if (n.kind == op_node::variable)
          out.push_back(&n);
      return out;
    }
    for (auto v : vars) {
      auto n = var_node(v);
      if (n == nullptr)
        return make_error(af_error::invalid_argument,
                          "output " + std::to_string(v.id) + " is not a variable of this session");
      out.push_back(n);
    }
    return out;
  }

  /// Runs `outs` for one step; their values if `want_values`.
  caf::expected<std::vector<tensor>> execute(const std::vector<output>& outs, bool want_values,
                                             const std::vector<std::pair<output, tensor>>& feeds,
                                             run_trace* trace);

  /// A subgraph cut into partitions and registered with their executors.
  struct registered_graph {
    uint64_t id = 0;
    std::vector<executor_actor> executors; ///< one per partition
    std::vector<std::string> devices;      ///< each partition's full device
    std::vector<std::string> nodes;        ///< each partition's node address
    std::vector<std::string> notes;        ///< soft placement, per partition
    std::map<int32_t, size_t> partition_of;
    std::vector<std::vector<int32_t>> feeds; ///< placeholders each partition reads
  };
  std::map<std::string, registered_graph> graphs; ///< by signature
  uint64_t next_step = 1;

  caf::expected<registered_graph*> register_graph(const std::set<int32_t>& closure,
                                                  const std::vector<int32_t>& roots,
                                                  bool want_values);

  /// The value an update op writes, when the client already has it.
  caf::expected<tensor> direct_value(int32_t id, const std::map<int32_t, tensor>& fed);

  void forget_graphs() {
    for (auto& [sig, g] : graphs)
      for (auto& e : g.executors)
        caf::anon_send(e, forget_atom::value, g.id);
    graphs.clear();
  }
};

caf::expected<tensor> session::impl::direct_value(int32_t id, const std::map<int32_t, tensor>& fed) {
  const auto& n = ops[static_cast<size_t>(id)];
  switch (n.kind) {
    case op_node::constant:
      return n.value;
    case op_node::placeholder: {
      auto it = fed.find(id);
      if (it == fed.end())
        return make_error(af_error::invalid_argument,
                          "placeholder '" + n.name + "' needs a value: pass it in run()'s feeds");
      return it->second;
    }
    default: // a variable
      return variable_call(n, wire::kind::read, tensor{}, true);
  }
}

caf::expected<session::impl::registered_graph*>
session::impl::register_graph(const std::set<int32_t>& closure, const std::vector<int32_t>& roots,
                              bool want_values) {
  std::string signature = want_values ? "v" : "t";
  for (auto r : roots)
    signature += ":" + std::to_string(r);
  if (auto it = graphs.find(signature); it != graphs.end())
    return &it->second;
  static std::atomic<uint64_t> counter{0};
  registered_graph g;
  g.id = (std::random_device{}() * uint64_t{0x9E3779B97F4A7C15}) ^ ++counter;
  std::vector<partition> parts;
  std::map<std::string, size_t> index; // node address + device -> partition
  std::set<int32_t> root_set(roots.begin(), roots.end());
  for (auto id : closure) { // ascending ids: a topological order
    const auto& n = ops[static_cast<size_t>(id)];
    placement p;
    if (n.kind == op_node::update) {
      // An update runs where its variable lives.
      const auto& var = ops[static_cast<size_t>(n.inputs[0])];
      auto dev = device_name::parse(var.spec.device);
      auto conn = connect(*dev->job, *dev->task);
      if (!conn)
        return std::move(conn.error());
      p.conn = *conn;
      p.local = dev->local_device();
      p.full = var.spec.device;
    } else {
      auto placed = place(n.requested, false);
      if (!placed)
        return make_error(static_cast<af_error>(placed.error().code()),
                          "op '" + n.name + "': " + describe(placed.error()));
      p = *placed;
    }
    auto key = p.conn->address + p.full;
    auto [it, fresh] = index.emplace(key, parts.size());
    if (fresh) {
      auto exec = executor(p);
      if (!exec)
        return std::move(exec.error());
      parts.emplace_back();
      parts.back().graph = g.id;
      g.executors.push_back(*exec);
      g.devices.push_back(p.full);
      g.nodes.push_back(p.conn->address);
      g.notes.push_back(p.note);
      g.feeds.emplace_back();
    }
    auto part = it->second;
    g.partition_of[id] = part;
    partition_op op;
    op.id = id;
    op.op = n.op;
    op.name = n.name;
    op.attrs = n.attrs;
    op.fetch = want_values && root_set.count(id) > 0;
    op.want_value = n.kind != op_node::update || op.fetch || root_set.count(id) == 0;
    for (auto in : n.inputs) {
      const auto& src = ops[static_cast<size_t>(in)];
      op_input x;
      x.op = in;
      switch (src.kind) {
        case op_node::variable: {
          x.kind = op_input::variable;
          x.var = src.var;
          x.var_name = src.spec.name;
          // On another node: the executor reads it over that node's data plane.
          auto owner = conns.find(src.node_key);
          if (opts.data_plane && src.node_address != p.conn->address && owner != conns.end()
              && owner->second.info.data_port != 0)
            if (auto addr = parse_address(owner->second.address, "variable '" + src.spec.name + "'"))
              x.data_plane = task_address{addr->host, owner->second.info.data_port}.to_string();
          break;
        }
        case op_node::constant:
          x.kind = op_input::constant;
          x.value = src.value;
          break;
        case op_node::placeholder:
          x.kind = op_input::feed;
          g.feeds[part].push_back(in);
          break;
        default: {
          auto producer = g.partition_of.at(in);
          if (producer == part) {
            x.kind = op_input::local;
          } else {
            x.kind = op_input::remote;
            // The producer sends its value here, executor to executor.
            for (auto& pop : parts[producer].ops)
              if (pop.id == in) {
                auto consumer = caf::actor_cast<caf::actor>(g.executors[part]);
                if (std::find(pop.consumers.begin(), pop.consumers.end(), consumer)
                    == pop.consumers.end())
                  pop.consumers.push_back(consumer);
              }
          }
        }
      }
      op.inputs.push_back(std::move(x));
    }
    parts[part].ops.push_back(std::move(op));
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    caf::error err;
    self->request(g.executors[i], opts.timeout, register_atom::value, std::move(parts[i]))
      .receive([](caf::ok_atom) {},
               [&](caf::error& e) { err = explain(std::move(e), "registering a graph on " + g.devices[i], nullptr); });
    if (err)
      return err;
  }
  return &graphs.emplace(signature, std::move(g)).first->second;
}

caf::expected<std::vector<tensor>>
session::impl::execute(const std::vector<output>& outs, bool want_values,
                       const std::vector<std::pair<output, tensor>>& feeds, run_trace* trace) {
  std::map<int32_t, tensor> fed;
  for (const auto& [o, v] : feeds) {
    if (!o.valid() || static_cast<size_t>(o.id) >= ops.size()
        || ops[static_cast<size_t>(o.id)].kind != op_node::placeholder)
      return make_error(af_error::invalid_argument, "a feed is not a placeholder of this graph");
    fed[o.id] = v;
  }
  std::map<int32_t, tensor> results;
  std::vector<int32_t> roots;
  for (auto o : outs) {
    if (!o.valid() || static_cast<size_t>(o.id) >= ops.size())
      return make_error(af_error::invalid_argument,
                        "run() got an invalid output (an assign to something that is not a "
                        "variable of this session?)");
    const auto& n = ops[static_cast<size_t>(o.id)];
    if (results.count(o.id))
      continue;
    if (n.kind == op_node::constant || n.kind == op_node::placeholder
        || (n.kind == op_node::variable && want_values)) {
      trace_entry entry{n.name, "read", n.requested.to_string(), n.spec.device, n.node_address,
                        n.note, now_ns(), 0};
      auto v = direct_value(o.id, fed);
      entry.end_ns = now_ns();
      if (!v)
        return std::move(v.error());
      if (trace && n.kind == op_node::variable)
        trace->entries.push_back(std::move(entry));
      results[o.id] = std::move(*v);
      continue;
    }
    if (n.kind == op_node::variable)
      continue; // a variable as a target does nothing
    if (n.kind == op_node::update) {
      auto src = ops[static_cast<size_t>(n.inputs[1])].kind;
      if (src == op_node::constant || src == op_node::placeholder || src == op_node::variable) {
        // The client has the value: straight to the variable (data plane).
        auto value = direct_value(n.inputs[1], fed);
        if (!value)
          return std::move(value.error());
        const auto& var = ops[static_cast<size_t>(n.inputs[0])];
        auto kind = n.op == "assign" ? wire::kind::assign
                    : n.op == "assign_add" ? wire::kind::assign_add : wire::kind::assign_sub;
        trace_entry entry{n.name, n.op, var.requested.to_string(), var.spec.device,
                          var.node_address, var.note, now_ns(), 0};
        auto updated = variable_call(var, kind, std::move(*value), want_values);
        entry.end_ns = now_ns();
        if (!updated)
          return std::move(updated.error());
        if (trace)
          trace->entries.push_back(std::move(entry));
        results[o.id] = std::move(*updated);
        continue;
      }
    }
    roots.push_back(o.id);
  }
  if (!roots.empty()) {
    // Everything the roots need, up to variables, constants and placeholders.
    std::set<int32_t> closure;
    std::vector<int32_t> todo = roots;
    while (!todo.empty()) {
      auto id = todo.back();
      todo.pop_back();
      const auto& n = ops[static_cast<size_t>(id)];
      if ((n.kind != op_node::compute && n.kind != op_node::update) || !closure.insert(id).second)
        continue;
      for (auto in : n.inputs) {
        if (in < 0 || static_cast<size_t>(in) >= ops.size())
          return make_error(af_error::invalid_argument,
                            "op '" + n.name + "' has an invalid input (an assign to something that "
                            "is not a variable of this session?)");
        todo.push_back(in);
      }
    }
    auto g = register_graph(closure, roots, want_values);
    if (!g)
      return std::move(g.error());
    auto& graph = **g;
    auto step = next_step++;
    using handle = decltype(self->request(executor_actor{}, opts.timeout, run_step_atom::value,
                                          uint64_t{}, uint64_t{}, std::vector<feed>{}));
    std::vector<handle> pending;
    for (size_t i = 0; i < graph.executors.size(); ++i) {
      std::vector<feed> part_feeds;
      for (auto id : graph.feeds[i]) {
        auto it = fed.find(id);
        if (it == fed.end()) {
          for (auto& e : graph.executors)
            caf::anon_send(e, abort_atom::value, graph.id, step);
          return make_error(af_error::invalid_argument,
                            "placeholder '" + ops[static_cast<size_t>(id)].name
                              + "' needs a value: pass it in run()'s feeds");
        }
        part_feeds.push_back(feed{id, it->second});
      }
      pending.push_back(self->request(graph.executors[i], opts.timeout, run_step_atom::value,
                                      graph.id, step, std::move(part_feeds)));
    }
    std::vector<step_result> step_results(pending.size());
    caf::error first, aborted;
    for (size_t i = 0; i < pending.size(); ++i)
      pending[i].receive([&](step_result& r) { step_results[i] = std::move(r); },
                         [&](caf::error& e) {
                           if (!first && !aborted) // tell the others to stop waiting
                             for (auto& ex : graph.executors)
                               caf::anon_send(ex, abort_atom::value, graph.id, step);
                           auto& slot = is(e, af_error::aborted) ? aborted : first;
                           if (!slot)
                             slot = explain(std::move(e), "step " + std::to_string(step) + " on "
                                                            + graph.devices[i], nullptr);
                         });
    if (first || aborted)
      return first ? first : aborted;
    std::map<int32_t, uint64_t> bytes_out; // each op's result size, for edge spans
    for (const auto& r : step_results)
      for (const auto& t : r.timings)
        bytes_out[t.op] = t.bytes_out;
    for (size_t i = 0; i < step_results.size(); ++i) {
      for (auto& f : step_results[i].fetched)
        results[f.op] = std::move(f.value);
      if (!trace)
        continue;
      for (const auto& t : step_results[i].timings) {
        const auto& n = ops[static_cast<size_t>(t.op)];
        auto note = graph.notes[i];
        if (!t.note.empty())
          note += (note.empty() ? "" : "; ") + t.note;
        trace->entries.push_back(trace_entry{n.name, n.op, n.requested.to_string(), graph.devices[i],
                                             graph.nodes[i], note, t.start_ns, t.end_ns, t.bytes_in,
                                             t.bytes_out});
        for (auto in : n.inputs) {
          const auto& src = ops[static_cast<size_t>(in)];
          if (src.kind == op_node::variable && !(n.kind == op_node::update && in == n.inputs[0])) {
            // A variable on another node crossed the wire, node to node.
            bool remote = src.node_address != graph.nodes[i];
            auto var_bytes = static_cast<uint64_t>(num_elements(src.spec.shape))
                             * dtype_size(src.spec.type);
            auto how = opts.data_plane ? " over the data plane" : " as CAF messages";
            trace->entries.push_back(trace_entry{
              src.spec.name, remote ? "transfer" : "read", src.requested.to_string(),
              src.spec.device, src.node_address,
              remote ? "to " + graph.devices[i] + " @ " + graph.nodes[i] + how : src.note,
              t.start_ns, t.end_ns, var_bytes, 0});
          } else if ((src.kind == op_node::compute || src.kind == op_node::update)
                     && graph.partition_of.at(in) != i) {
            auto from = graph.partition_of.at(in);
            trace->entries.push_back(trace_entry{
              src.name + " -> " + n.name, "transfer", "", graph.devices[i], graph.nodes[i],
              "from " + graph.devices[from] + " @ " + graph.nodes[from], t.start_ns, t.start_ns,
              bytes_out[in], 0});
          }
        }
      }
    }
  }
  std::vector<tensor> out;
  if (want_values)
    for (auto o : outs)
      out.push_back(results[o.id]);
  return out;
}

// -- run_trace ---------------------------------------------------------------

std::string run_trace::by_device() const {
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::string>> ops;
  for (const auto& e : entries) {
    if (!ops.count(e.device))
      order.push_back(e.device);
    ops[e.device].push_back(e.op);
  }
  std::ostringstream out;
  for (const auto& dev : order) {
    out << dev << '\n';
    for (const auto& op : ops[dev])
      out << "   " << op << '\n';
  }
  return out.str();
}

std::string run_trace::to_string() const {
  std::ostringstream out;
  for (const auto& e : entries) {
    out << e.op << " (" << e.kind << "): requested " << (e.requested.empty() ? "(none)" : e.requested)
        << " -> " << e.device << " @ " << e.node;
    if (!e.note.empty())
      out << " [" << e.note << "]";
    out << '\n';
  }
  return out.str();
}

std::string run_trace::to_chrome_json() const {
  auto events = nlohmann::json::array();
  std::map<std::string, int> pids;
  std::map<std::pair<int, std::string>, int> tids;
  int64_t t0 = entries.empty() ? 0 : entries.front().start_ns;
  for (const auto& e : entries)
    t0 = std::min(t0, e.start_ns);
  for (const auto& e : entries) {
    auto [pit, new_pid] = pids.emplace(e.node, static_cast<int>(pids.size()) + 1);
    if (new_pid)
      events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pit->second},
                        {"args", {{"name", "node " + e.node}}}});
    auto [tit, new_tid] = tids.emplace(std::make_pair(pit->second, e.device),
                                       static_cast<int>(tids.size()) + 1);
    if (new_tid)
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pit->second},
                        {"tid", tit->second}, {"args", {{"name", e.device}}}});
    events.push_back({{"name", e.op},
                      {"cat", e.kind},
                      {"ph", "X"},
                      {"ts", static_cast<double>(e.start_ns - t0) / 1000.0},
                      {"dur", static_cast<double>(std::max<int64_t>(e.end_ns - e.start_ns, 0)) / 1000.0},
                      {"pid", pit->second},
                      {"tid", tit->second},
                      {"args", {{"requested", e.requested}, {"device", e.device}, {"note", e.note},
                                {"bytes_in", e.bytes_in}, {"bytes_out", e.bytes_out}}}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

const trace_entry* run_trace::find(const std::string& op) const {
  for (const auto& e : entries)
    if (e.op == op)
      return &e;
  return nullptr;
}

// -- device_scope ------------------------------------------------------------

void device_scope::reset() {
  if (owner_ != nullptr) {
    owner_->impl_->scopes.pop_back();
    owner_ = nullptr;
  }
}

// -- session -----------------------------------------------------------------

session::session(std::unique_ptr<impl> ptr) : impl_(std::move(ptr)) {
  // nop
}

session::session(session&&) noexcept = default;
session& session::operator=(session&& other) noexcept {
  if (this != &other) {
    if (impl_)
      impl_->forget_graphs();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
session::~session() {
  if (impl_)
    impl_->forget_graphs();
}

caf::expected<session> session::make(caf::actor_system& sys, cluster_spec spec,
                                     const std::string& target, session_options opts) {
  std::string why;
  auto d = device_name::parse(target, &why);
  if (!d)
    return make_error(af_error::invalid_device, "session target: " + why);
  if (!d->job)
    return make_error(af_error::invalid_device,
                      "session target '" + target + "' must name a job, e.g. /job:worker/task:0");
  if (auto err = spec.check_task(*d->job, d->task.value_or(0)))
    return make_error(static_cast<af_error>(err.code()), "session target '" + target + "': " + describe(err));
  auto ptr = std::make_unique<impl>(sys, std::move(spec), opts);
  ptr->job = *d->job;
  ptr->task = d->task.value_or(0);
  return session{std::move(ptr)};
}

const cluster_spec& session::cluster() const {
  return impl_->spec;
}

std::string session::target() const {
  return "/job:" + impl_->job + "/replica:0/task:" + std::to_string(impl_->task);
}

caf::expected<device_scope> session::device(const std::string& name) {
  std::string why;
  auto d = device_name::parse(name, &why);
  if (!d)
    return make_error(af_error::invalid_device, why);
  impl_->scopes.push_back(*d);
  return device_scope{this};
}

std::string session::current_device() const {
  return impl_->current().to_string();
}

caf::expected<output> session::variable(const std::string& name, shape_type shape,
                                        initializer init, dtype type) {
  auto& im = *impl_;
  if (name.empty())
    return make_error(af_error::invalid_argument, "a variable needs a non-empty name");
  if (num_elements(shape) < 0)
    return make_error(af_error::invalid_argument,
                      "variable '" + name + "': shape " + shape_string(shape) + " has a negative dimension");
  op_node n;
  n.kind = op_node::variable;
  n.name = name;
  n.requested = im.current();
  auto p = im.place(n.requested, true);
  if (!p)
    return make_error(static_cast<af_error>(p.error().code()),
                      "variable '" + name + "': " + describe(p.error()));
  n.spec = variable_spec{name, type, std::move(shape), p->full};
  n.init = std::move(init);
  n.node_address = p->conn->address;
  n.node_key = "/job:" + p->conn->info.job + "/task:" + std::to_string(p->conn->info.task);
  n.note = p->note;
  caf::error err;
  im.self->request(p->conn->actor, im.opts.timeout, get_var_atom::value, n.spec)
    .receive([&](variable_actor& v) { n.var = std::move(v); },
             [&](caf::error& e) { err = im.explain(std::move(e), "variable '" + name + "'", p->conn); });
  if (err)
    return err;
  im.ops.push_back(std::move(n));
  return output{static_cast<int32_t>(im.ops.size() - 1)};
}

output session::constant(tensor value, const std::string& name) {
  op_node n;
  n.kind = op_node::constant;
  n.name = impl_->unique_name(name);
  n.requested = impl_->current();
  n.value = std::move(value);
  impl_->ops.push_back(std::move(n));
  return output{static_cast<int32_t>(impl_->ops.size() - 1)};
}

namespace {

output add_node(std::vector<op_node>& ops, op_node n) {
  ops.push_back(std::move(n));
  return output{static_cast<int32_t>(ops.size() - 1)};
}

} // namespace

output session::op(const std::string& kind, std::vector<output> inputs, op_attrs attrs,
                   const std::string& name) {
  op_node n;
  n.kind = op_node::compute;
  n.op = kind;
  n.attrs = attrs;
  n.name = impl_->unique_name(name.empty() ? kind : name);
  n.requested = impl_->current();
  for (auto in : inputs)
    n.inputs.push_back(in.id);
  return add_node(impl_->ops, std::move(n));
}

output session::add(output a, output b, const std::string& name) {
  return op("add", {a, b}, {}, name);
}

output session::sub(output a, output b, const std::string& name) {
  return op("sub", {a, b}, {}, name);
}

output session::mul(output a, output b, const std::string& name) {
  return op("mul", {a, b}, {}, name);
}

output session::div(output a, output b, const std::string& name) {
  return op("div", {a, b}, {}, name);
}

output session::matmul(output a, output b, bool transpose_a, bool transpose_b,
                       const std::string& name) {
  op_attrs attrs;
  attrs.transpose_a = transpose_a;
  attrs.transpose_b = transpose_b;
  return op("matmul", {a, b}, attrs, name);
}

namespace {

op_attrs reduction(std::optional<int32_t> axis, bool keep_dims) {
  op_attrs attrs;
  attrs.all_axes = !axis.has_value();
  attrs.axis = axis.value_or(0);
  attrs.keep_dims = keep_dims;
  return attrs;
}

} // namespace

output session::reduce_sum(output x, std::optional<int32_t> axis, bool keep_dims) {
  return op("sum", {x}, reduction(axis, keep_dims));
}

output session::reduce_mean(output x, std::optional<int32_t> axis, bool keep_dims) {
  return op("mean", {x}, reduction(axis, keep_dims));
}

output session::reduce_max(output x, std::optional<int32_t> axis, bool keep_dims) {
  return op("max", {x}, reduction(axis, keep_dims));
}

output session::softmax_xent(output logits, output labels, const std::string& name) {
  return op("softmax_xent", {logits, labels}, {}, name);
}

caf::expected<std::vector<output>> session::gradients(output loss, const std::vector<output>& xs) {
  auto& ops = impl_->ops;
  if (!loss.valid() || static_cast<size_t>(loss.id) >= ops.size())
    return make_error(af_error::invalid_argument, "gradients(): the loss is not an op of this graph");
  // Backward ops go on the device their forward op asked for (saved scopes
  // are restored afterwards).
  auto saved_scopes = impl_->scopes;
  auto at = [&](const op_node& fwd) { impl_->scopes = {fwd.requested}; };
  std::map<int32_t, output> grads;
  auto accumulate = [&](int32_t id, output g) {
    auto it = grads.find(id);
    if (it == grads.end())
      grads.emplace(id, g);
    else
      it->second = add(it->second, g, "grad_acc");
  };
  {
    at(ops[static_cast<size_t>(loss.id)]);
    grads.emplace(loss.id, op("ones_like", {loss}, {}, "grad_seed"));
  }
  // Ops are appended after their inputs, so ids are a topological order.
  for (int32_t id = loss.id; id >= 0; --id) {
    auto it = grads.find(id);
    if (it == grads.end())
      continue;
    auto g = it->second;
    const op_node fwd = ops[static_cast<size_t>(id)]; // a copy: ops grows below
    if (fwd.kind != op_node::compute)
      continue; // variables and constants are leaves; updates stop gradients
    at(fwd);
    auto in = [&](size_t i) { return output{fwd.inputs[i]}; };
    output y{id};
    const auto& k = fwd.op;
    if (k == "add" || k == "sub") {
      accumulate(fwd.inputs[0], op("sum_to", {g, in(0)}));
      accumulate(fwd.inputs[1], op("sum_to", {k == "add" ? g : neg(g), in(1)}));
    } else if (k == "mul") {
      accumulate(fwd.inputs[0], op("sum_to", {mul(g, in(1)), in(0)}));
      accumulate(fwd.inputs[1], op("sum_to", {mul(g, in(0)), in(1)}));
    } else if (k == "div") {
      accumulate(fwd.inputs[0], op("sum_to", {div(g, in(1)), in(0)}));
      accumulate(fwd.inputs[1], op("sum_to", {neg(div(mul(g, y), in(1))), in(1)}));
    } else if (k == "neg") {
      accumulate(fwd.inputs[0], neg(g));
    } else if (k == "exp") {
      accumulate(fwd.inputs[0], mul(g, y));
    } else if (k == "log") {
      accumulate(fwd.inputs[0], div(g, in(0)));
    } else if (k == "relu") {
      accumulate(fwd.inputs[0], op("relu_grad", {g, in(0)}));
    } else if (k == "sigmoid" || k == "tanh") {
      accumulate(fwd.inputs[0], op(k + "_grad", {g, y}));
    } else if (k == "square") {
      accumulate(fwd.inputs[0], mul(g, add(in(0), in(0))));
    } else if (k == "sqrt") {
      accumulate(fwd.inputs[0], div(g, add(y, y)));
    } else if (k == "matmul") {
      bool ta = fwd.attrs.transpose_a, tb = fwd.attrs.transpose_b;
      auto a = in(0), b = in(1);
      if (!ta && !tb) {
        accumulate(a.id, matmul(g, b, false, true));
        accumulate(b.id, matmul(a, g, true, false));
      } else if (!ta && tb) {
        accumulate(a.id, matmul(g, b, false, false));
        accumulate(b.id, matmul(g, a, true, false));
      } else if (ta && !tb) {
        accumulate(a.id, matmul(b, g, false, true));
        accumulate(b.id, matmul(a, g, false, false));
      } else {
        accumulate(a.id, matmul(b, g, true, true));
        accumulate(b.id, matmul(g, a, true, true));
      }
    } else if (k == "sum" || k == "mean") {
      accumulate(fwd.inputs[0], op(k + "_grad", {g, in(0)}, fwd.attrs));
    } else if (k == "max") {
      accumulate(fwd.inputs[0], op("max_grad", {g, in(0), y}, fwd.attrs));
    } else if (k == "softmax" || k == "log_softmax") {
      accumulate(fwd.inputs[0], op(k + "_grad", {g, y}));
    } else if (k == "softmax_xent") {
      accumulate(fwd.inputs[0], op("softmax_xent_grad", {g, in(0), in(1)}));
    } else {
      impl_->scopes = saved_scopes;
      return make_error(af_error::unsupported,
                        "gradients(): op '" + fwd.name + "' (" + k + ") has no gradient");
    }
  }
  impl_->scopes = saved_scopes;
  std::vector<output> out;
  std::string missing;
  for (auto x : xs) {
    auto it = grads.find(x.id);
    if (it == grads.end() || x.id > loss.id)
      missing += (missing.empty() ? "" : ", ")
                 + (x.valid() && static_cast<size_t>(x.id) < ops.size()
                      ? "'" + ops[static_cast<size_t>(x.id)].name + "'"
                      : "output " + std::to_string(x.id));
    else
      out.push_back(it->second);
  }
  if (!missing.empty())
    return make_error(af_error::invalid_argument,
                      "gradients(): the loss does not depend on " + missing);
  return out;
}

#define AF_UPDATE_OP(fn)                                                         \
  output session::fn(output var, output value, const std::string& name) {        \
    auto v = impl_->var_node(var);                                               \
    if (v == nullptr)                                                            \
      return output{};                                                           \
    op_node n;                                                                   \
    n.kind = op_node::update;                                                    \
    n.op = #fn;                                                                  \
    n.name = impl_->unique_name(name.empty() ? v->name + "/" #fn : name);        \
    n.requested = v->requested;                                                  \
    n.inputs = {var.id, value.id};                                               \
    return add_node(impl_->ops, std::move(n));                                   \
  }

AF_UPDATE_OP(assign)
AF_UPDATE_OP(assign_add)
AF_UPDATE_OP(assign_sub)

std::vector<std::string> session::operations() const {
  std::vector<std::string> out;
  for (const auto& n : impl_->ops)
    out.push_back(n.name);
  return out;
}

caf::expected<std::vector<tensor>> session::run(const std::vector<output>& fetches,
                                                run_trace* trace) {
  return impl_->execute(fetches, true, {}, trace);
}

caf::expected<std::vector<tensor>>
session::run(const std::vector<output>& fetches,
             const std::vector<std::pair<output, tensor>>& feeds, run_trace* trace) {
  return impl_->execute(fetches, true, feeds, trace);
}

caf::expected<tensor> session::run(output fetch, run_trace* trace) {
  auto v = run(std::vector<output>{fetch}, trace);
  if (!v)
    return std::move(v.error());
  return std::move(v->front());
}

caf::error session::run_targets(const std::vector<output>& targets, run_trace* trace) {
  auto v = impl_->execute(targets, false, {}, trace);
  return v ? caf::none : std::move(v.error());
}

output session::placeholder(const std::string& name) {
  op_node n;
  n.kind = op_node::placeholder;
  n.name = impl_->unique_name(name);
  n.requested = impl_->current();
  impl_->ops.push_back(std::move(n));
  return output{static_cast<int32_t>(impl_->ops.size() - 1)};
}

caf::error session::initialize(const std::vector<output>& vars) {
  auto nodes = impl_->variables_of(vars);
  if (!nodes)
    return std::move(nodes.error());
  for (auto n : *nodes) {
    caf::error err;
    impl_->self->request(n->var, impl_->opts.timeout, init_atom::value, n->init, false,
                         std::string{})
      .receive([](uint64_t) {},
               [&](caf::error& e) {
                 err = impl_->explain(std::move(e), "initialization of '" + n->spec.name + "'", nullptr);
               });
    if (err)
      return err;
  }
  return caf::none;
}

caf::expected<std::vector<std::string>> session::uninitialized(const std::vector<output>& vars) {
  auto nodes = impl_->variables_of(vars);
  if (!nodes)
    return std::move(nodes.error());
  std::vector<std::string> out;
  for (auto n : *nodes) {
    caf::error err;
    impl_->self->request(n->var, impl_->opts.timeout, info_atom::value)
      .receive(
        [&](variable_info& info) {
          if (!info.initialized)
            out.push_back(n->spec.name);
        },
        [&](caf::error& e) {
          err = impl_->explain(std::move(e), "state of '" + n->spec.name + "'", nullptr);
        });
    if (err)
      return err;
  }
  return out;
}

caf::error session::wait_initialized(std::chrono::milliseconds timeout,
                                     const std::vector<output>& vars) {
  auto nodes = impl_->variables_of(vars);
  if (!nodes)
    return std::move(nodes.error());
  auto& self = impl_->self;
  // All requests are in flight at once and share one deadline.
  using handle = decltype(self->request(variable_actor{}, timeout, wait_init_atom::value,
                                       std::string{}, uint32_t{}));
  std::vector<handle> pending;
  for (auto n : *nodes)
    pending.push_back(self->request(n->var, timeout, wait_init_atom::value, std::string{},
                                    static_cast<uint32_t>(timeout.count())));
  std::vector<std::string> missing;
  caf::error other;
  for (size_t i = 0; i < pending.size(); ++i) {
    auto n = (*nodes)[i];
    pending[i].receive([](uint64_t) {},
                       [&](caf::error& e) {
                         if (e == caf::sec::request_timeout)
                           missing.push_back(n->spec.name + " (on " + n->spec.device + ")");
                         else if (!other)
                           other = impl_->explain(std::move(e), "initialization of '" + n->spec.name + "'", nullptr);
                       });
  }
  if (!missing.empty()) {
    std::string names;
    for (const auto& m : missing)
      names += (names.empty() ? "" : ", ") + m;
    return make_error(af_error::timeout,
                      "waited " + std::to_string(timeout.count()) + " ms for initialization of "
                        + std::to_string(missing.size()) + " variable(s): " + names
                        + "; is the chief running initialize()?");
  }
  return other;
}

caf::expected<node_info> session::ping(const std::string& job, int32_t task) {
  auto conn = impl_->connect(job, task);
  if (!conn)
    return std::move(conn.error());
  return (*conn)->info;
}

caf::error session::wait_for_node(const std::string& job, int32_t task,
                                  std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto info = ping(job, task);
    if (info)
      return caf::none;
    if (!is(info.error(), af_error::unreachable) || std::chrono::steady_clock::now() >= deadline)
      return std::move(info.error());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

caf::expected<std::vector<variable_info>> session::list_variables(const std::string& job,
                                                                  int32_t task) {
  auto conn = impl_->connect(job, task);
  if (!conn)
    return std::move(conn.error());
  caf::error err;
  std::vector<variable_info> out;
  impl_->self->request((*conn)->actor, impl_->opts.timeout, list_atom::value)
    .receive([&](std::vector<variable_info>& infos) { out = std::move(infos); },
             [&](caf::error& e) { err = impl_->explain(std::move(e), "variable list", *conn); });
  if (err)
    return err;
  std::sort(out.begin(), out.end(),
            [](const variable_info& a, const variable_info& b) { return a.spec.name < b.spec.name; });
  return out;
}

caf::error session::shutdown(const std::string& job, int32_t task) {
  auto conn = impl_->connect(job, task);
  if (!conn)
    return std::move(conn.error());
  caf::error err;
  impl_->self->request((*conn)->actor, impl_->opts.timeout, shutdown_atom::value)
    .receive([](caf::ok_atom) {},
             [&](caf::error& e) { err = impl_->explain(std::move(e), "shutdown", *conn); });
  impl_->conns.erase(task_name(job, task));
  return err;
}

std::string session::device_of(output var) const {
  auto n = impl_->var_node(var);
  return n ? n->spec.device : std::string{};
}

size_t session::registered_graphs() const {
  return impl_->graphs.size();
}

variable_actor session::handle_of(output var) const {
  auto n = impl_->var_node(var);
  return n ? n->var : variable_actor{};
}

} // namespace af
