#include "actors/session.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "caf/all.hpp"
#include "caf/io/middleman.hpp"

#include "actors/cluster_link.hpp"
#include "actors/step_binding.hpp"
#include "actors/data_plane.hpp"
#include "actors/log.hpp"
#include "actors/node.hpp"
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

namespace af {

namespace {

using run_atom = caf::atom_constant<caf::atom("run_step")>;
using watch_atom = caf::atom_constant<caf::atom("watch")>;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

caf::error to_error(const graph_error& e) {
  return make_error(e.code, e.what);
}

struct session_actor_state {
  step_runner runner;
  std::map<caf::actor_addr, std::string> nodes; ///< watched node actor -> task name
  std::shared_ptr<node_health> health;
};

/// Hosts the step runner and watches the nodes: the actor half of a session.
caf::behavior session_actor_impl(caf::stateful_actor<session_actor_state>* self,
                                 std::shared_ptr<node_health> health) {
  self->state.health = std::move(health);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto it = self->state.nodes.find(dm.source);
    if (it != self->state.nodes.end()) {
      self->state.health->mark(it->second, caf::to_string(dm.reason));
      self->state.nodes.erase(it);
    }
    self->state.runner.on_down(self, dm);
  });
  return {
    [self](run_atom, run_request& req) -> caf::result<step_outputs> {
      auto rp = self->make_response_promise<step_outputs>();
      self->state.runner.run(self, std::move(req.step), std::move(req.feeds), req.trace,
                             [rp](caf::expected<step_outputs> out) mutable {
                               if (out)
                                 rp.deliver(std::move(*out));
                               else
                                 rp.deliver(std::move(out.error()));
                             });
      return rp;
    },
    [self](forget_atom, std::shared_ptr<prepared_step>& step) {
      self->state.runner.forget(self, step);
    },
    [self](watch_atom, caf::actor& node, std::string& task) {
      self->state.nodes[node.address()] = task;
      self->monitor(node);
    },
  };
}

} // namespace

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
    for (auto& [id, b] : bindings) {
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
    af::log::get()->warn("session {}: reconnected to {} at {} ({}{})", task_name(job, task), conn.key,
                         conn.address, restarted ? "the node restarted" : "the same node",
                         lost > 0 ? "; " + std::to_string(lost)
                                      + " variable(s) are gone: initialize() or restore them"
                                  : std::string{});
  }

  caf::expected<const var_binding*> binding_of(output var) {
    auto it = bindings.find(var.id);
    if (it == bindings.end())
      return make_error(af_error::invalid_argument,
                        "output " + std::to_string(var.id) + " is not a variable of this session");
    auto dev = placed_from_full(g.at(var).spec.device);
    if (dev) {
      // A node seen dead is reconnected (or reported) first.
      auto conn = link.connect(dev->job, dev->task);
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

  /// One op on a variable: over the node's data plane when there is one, as a
  /// CAF message otherwise. `path` says which it took.
  caf::expected<tensor> variable_call(output var, var_op op, tensor operand, bool want_value,
                                      std::string* path = nullptr) {
    auto b = binding_of(var);
    if (!b)
      return std::move(b.error());
    const auto& node = g.at(var);
    auto it = link.conns.find((*b)->task);
    if (it != link.conns.end() && it->second.channel) {
      if (path)
        *path = "data plane";
      auto& ch = *it->second.channel;
      auto r = ch.call(op, node.spec.name, op == var_op::read ? nullptr : &operand, want_value);
      if (ch.broken())
        it->second.channel_broken = true; // reopened on the next call (the node may come back)
      if (!r)
        return std::move(r.error());
      return std::move(r->first);
    }
    if (path)
      *path = find_local_node((*b)->address, &sys) ? "local buffer" : "CAF message";
    tensor result;
    caf::error err;
    self->request((*b)->actor, opts.timeout, var_op_atom::value, op, std::move(operand), want_value)
      .receive([&](tensor& v, uint64_t) { result = std::move(v); },
               [&](caf::error& e) {
                 err = link.explain(std::move(e),
                               std::string{to_string(op)} + " of variable '" + node.spec.name
                                 + "' on " + node.spec.device,
                               nullptr);
               });
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

  /// Gets or creates the variable of node `id` on its node and binds it.
  caf::error create_variable(int32_t id);
};

caf::error session::impl::create_variable(int32_t id) {
  const auto& n = g.at(output{id});
  auto dev = placed_from_full(n.spec.device);
  if (!dev)
    return to_error(dev.error());
  auto conn = link.connect(dev->job, dev->task);
  if (!conn)
    return std::move(conn.error());
  caf::error err;
  variable_actor handle;
  self->request((*conn)->actor, opts.timeout, get_var_atom::value, n.spec)
    .receive([&](variable_actor& v) { handle = std::move(v); },
             [&](caf::error& e) { err = link.explain(std::move(e), "variable '" + n.spec.name + "'", *conn); });
  if (err)
    return err;
  bindings[id] = var_binding{handle, (*conn)->key, (*conn)->address, false};
  return caf::none;
}

caf::expected<std::shared_ptr<prepared_step>>
session::impl::prepare(const std::vector<int32_t>& roots, bool want_values) {
  auto sig = plan_signature(roots, want_values);
  if (auto it = prepared.find(sig); it != prepared.end()) {
    bool healthy = true;
    for (const auto& t : it->second->tasks)
      healthy = healthy && !health->is_dead(t);
    if (healthy)
      return it->second;
    drop(it); // bound to executors or variables of a node that died
  }
  auto pol = policy();
  auto cat = link.catalog();
  auto plan = partition(g, roots, want_values, [&](const graph_node& n) -> outcome<placed_device> {
    auto p = place(n.requested, false, pol, cat);
    if (!p)
      return graph_error{p.error().code, "op '" + n.name + "': " + p.error().what};
    return p;
  });
  if (!plan)
    return to_error(plan.error());
  auto step = bind_step(g, *plan, link, opts,
                        [this](int32_t id) { return binding_of(output{id}); });
  if (!step)
    return std::move(step.error());
  prepared[sig] = *step;
  return *step;
}

caf::expected<std::vector<tensor>>
session::impl::execute(const std::vector<output>& outs, bool want_values,
                       const std::vector<std::pair<output, tensor>>& feeds, run_trace* trace) {
  std::map<int32_t, tensor> fed;
  for (const auto& [o, v] : feeds) {
    if (!g.contains(o) || g.at(o).kind != node_kind::placeholder)
      return make_error(af_error::invalid_argument, "a feed is not a placeholder of this graph");
    fed[o.id] = v;
  }
  std::map<int32_t, tensor> results;
  std::vector<int32_t> roots;
  auto client_value = [&](output o) -> caf::expected<tensor> {
    const auto& n = g.at(o);
    if (n.kind == node_kind::constant)
      return n.value;
    if (n.kind == node_kind::placeholder) {
      auto it = fed.find(o.id);
      if (it == fed.end())
        return make_error(af_error::invalid_argument,
                          "placeholder '" + n.name + "' needs a value: pass it in run()'s feeds");
      return it->second;
    }
    return variable_call(o, var_op::read, tensor{}, true);
  };
  for (auto o : outs) {
    if (!g.contains(o))
      return make_error(af_error::invalid_argument,
                        "run() got an invalid output (an assign to something that is not a "
                        "variable of this session?)");
    const auto& n = g.at(o);
    if (results.count(o.id))
      continue;
    if (n.kind == node_kind::constant || n.kind == node_kind::placeholder
        || (n.kind == node_kind::variable && want_values)) {
      auto start = now_ns();
      std::string path;
      auto v = n.kind == node_kind::variable ? variable_call(o, var_op::read, tensor{}, true, &path)
                                             : client_value(o);
      if (!v)
        return std::move(v.error());
      if (trace && n.kind == node_kind::variable) {
        auto b = bindings.find(o.id);
        auto note = n.placement_note.empty() ? "read by the client over " + path
                                             : n.placement_note + "; read by the client over " + path;
        trace->entries.push_back(trace_entry{n.name, "read", n.requested.to_string(), n.spec.device,
                                             b == bindings.end() ? "" : b->second.address, note,
                                             start, now_ns(), v->empty() ? 0 : v->nbytes(), 0});
      }
      results[o.id] = std::move(*v);
      continue;
    }
    if (n.kind == node_kind::variable)
      continue; // a variable as a target does nothing
    if (n.kind == node_kind::update && n.inputs.size() == 2 && g.contains(output{n.inputs[1]})) {
      auto src = g.at(output{n.inputs[1]}).kind;
      if (src == node_kind::constant || src == node_kind::placeholder || src == node_kind::variable) {
        // The client has the value: straight to the variable (data plane).
        auto value = client_value(output{n.inputs[1]});
        if (!value)
          return std::move(value.error());
        output var{n.inputs[0]};
        var_op op = var_op::assign;
        parse_var_op(n.op, op);
        auto start = now_ns();
        auto bytes = value->empty() ? 0 : value->nbytes();
        std::string path;
        auto updated = variable_call(var, op, std::move(*value), want_values, &path);
        if (!updated)
          return std::move(updated.error());
        if (trace) {
          const auto& vn = g.at(var);
          auto b = bindings.find(var.id);
          trace->entries.push_back(trace_entry{n.name, n.op, vn.requested.to_string(), vn.spec.device,
                                               b == bindings.end() ? "" : b->second.address,
                                               "sent by the client over " + path, start, now_ns(),
                                               bytes, updated->empty() ? 0 : updated->nbytes()});
        }
        results[o.id] = std::move(*updated);
        continue;
      }
    }
    roots.push_back(o.id);
  }
  if (!roots.empty()) {
    auto step = prepare(roots, want_values);
    if (!step)
      return std::move(step.error());
    // A node of the step seen dead: reconnect (or fail at once) before running.
    for (const auto& t : (*step)->tasks) {
      if (!health->is_dead(t))
        continue;
      auto d = device_name::parse(t);
      auto conn = link.connect(*d->job, *d->task);
      if (!conn)
        return std::move(conn.error());
      step = prepare(roots, want_values);
      if (!step)
        return std::move(step.error());
      break;
    }
    caf::error err;
    step_outputs out;
    // The step's own deadline is opts.timeout on every executor; the margin
    // lets their timeout (which names what they waited for) arrive first.
    // The runner's own bound is (*step)->reply_timeout(); this one only
    // catches a session actor that stopped answering.
    self->request(actor, 2 * (*step)->reply_timeout(), run_atom::value,
                  run_request{*step, fed, trace != nullptr})
      .receive([&](step_outputs& o) { out = std::move(o); },
               [&](caf::error& e) { err = link.explain(std::move(e), "a step", nullptr); });
    if (err) {
      if (is(err, af_error::peer_down))
        if (auto it = prepared.find(plan_signature(roots, want_values)); it != prepared.end())
          drop(it);
      return err;
    }
    for (auto& [id, v] : out.values)
      results[id] = std::move(v);
    if (trace)
      for (auto& e : out.trace)
        trace->entries.push_back(std::move(e));
  }
  std::vector<tensor> values;
  if (want_values)
    for (auto o : outs)
      values.push_back(results[o.id]);
  return values;
}

// -- device_scope ------------------------------------------------------------

void device_scope::reset() {
  if (owner_ != nullptr) {
    owner_->impl_->g.pop_scope();
    owner_ = nullptr;
  }
}

// -- session -----------------------------------------------------------------

session::session(std::unique_ptr<impl> ptr) : impl_(std::move(ptr)) {
  // nop
}

session::session(session&&) noexcept = default;
session& session::operator=(session&& other) noexcept = default;
session::~session() = default;

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
    return make_error(err.category() == error_category ? static_cast<af_error>(err.code())
                                                       : af_error::invalid_argument,
                      "session target '" + target + "': " + describe(err));
  auto ptr = std::make_unique<impl>(sys, std::move(spec), opts);
  ptr->job = *d->job;
  ptr->task = d->task.value_or(0);
  return session{std::move(ptr)};
}

const cluster_spec& session::cluster() const {
  return impl_->link.spec;
}

std::string session::target() const {
  return "/job:" + impl_->job + "/replica:0/task:" + std::to_string(impl_->task);
}

caf::expected<device_scope> session::device(const std::string& name) {
  std::string why;
  auto d = device_name::parse(name, &why);
  if (!d)
    return make_error(af_error::invalid_device, why);
  impl_->g.push_scope(*d);
  return device_scope{this};
}

std::string session::current_device() const {
  return impl_->g.current_scope().to_string();
}

caf::expected<output> session::variable(const std::string& name, shape_type shape,
                                        initializer init, dtype type) {
  auto& im = *impl_;
  if (auto existing = im.g.find_variable(name); existing.valid() && im.bindings.count(existing.id)) {
    auto same = im.g.variable(name, std::move(shape), std::move(init), type);
    if (!same)
      return to_error(same.error());
    return *same;
  }
  auto requested = im.g.current_scope();
  auto p = place(requested, true, im.policy(), im.link.catalog());
  if (!p)
    return make_error(p.error().code, "variable '" + name + "': " + p.error().what);
  auto o = im.g.variable(name, std::move(shape), std::move(init), type);
  if (!o)
    return to_error(o.error());
  auto& n = im.g.at(*o);
  n.spec.device = p->full;
  n.placement_note = p->note;
  if (auto err = im.create_variable(o->id))
    return err;
  return *o;
}

graph& session::builder() {
  return impl_->g;
}

caf::expected<std::vector<output>> session::gradients(output loss, const std::vector<output>& xs) {
  auto r = af::gradients(impl_->g, loss, xs);
  if (!r)
    return to_error(r.error());
  return std::move(*r);
}

std::vector<std::string> session::operations() const {
  return impl_->g.operations();
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

caf::error session::initialize(const std::vector<output>& vars, const std::string& run_id) {
  auto& im = *impl_;
  auto list = im.variables_of(vars);
  if (!list)
    return std::move(list.error());
  for (auto v : *list) {
    auto b = im.binding_of(v);
    if (!b && is(b.error(), af_error::gone)) {
      if (auto err = im.create_variable(v.id))
        return err;
      b = im.binding_of(v);
    }
    if (!b)
      return std::move(b.error());
    const auto& n = im.g.at(v);
    caf::error err;
    im.self->request((*b)->actor, im.opts.timeout, init_atom::value, n.init, false, run_id)
      .receive([](uint64_t) {},
               [&](caf::error& e) {
                 err = im.link.explain(std::move(e), "initialization of '" + n.spec.name + "'", nullptr);
               });
    if (err)
      return err;
  }
  return caf::none;
}

caf::expected<std::vector<std::string>> session::uninitialized(const std::vector<output>& vars) {
  auto& im = *impl_;
  auto list = im.variables_of(vars);
  if (!list)
    return std::move(list.error());
  std::vector<std::string> out;
  for (auto v : *list) {
    const auto& n = im.g.at(v);
    auto b = im.binding_of(v);
    if (!b && is(b.error(), af_error::gone)) {
      out.push_back(n.spec.name);
      continue;
    }
    if (!b)
      return std::move(b.error());
    caf::error err;
    im.self->request((*b)->actor, im.opts.timeout, info_atom::value)
      .receive(
        [&](variable_info& info) {
          if (!info.initialized)
            out.push_back(n.spec.name);
        },
        [&](caf::error& e) { err = im.link.explain(std::move(e), "state of '" + n.spec.name + "'", nullptr); });
    if (err)
      return err;
  }
  return out;
}

caf::error session::wait_initialized(std::chrono::milliseconds timeout,
                                     const std::vector<output>& vars, const std::string& run_id) {
  auto& im = *impl_;
  auto list = im.variables_of(vars);
  if (!list)
    return std::move(list.error());
  auto& self = im.self;
  // All requests are in flight at once and share one deadline; each variable
  // drops its waiter at the same deadline, so nothing is left parked.
  using handle = decltype(self->request(variable_actor{}, timeout, wait_init_atom::value,
                                        std::string{}, uint32_t{}));
  std::vector<handle> pending;
  std::vector<output> asked;
  for (auto v : *list) {
    auto b = im.binding_of(v);
    if (!b)
      return std::move(b.error());
    pending.push_back(self->request((*b)->actor, timeout + std::chrono::milliseconds{200},
                                    wait_init_atom::value, run_id,
                                    static_cast<uint32_t>(timeout.count())));
    asked.push_back(v);
  }
  std::vector<std::string> missing;
  caf::error other;
  for (size_t i = 0; i < pending.size(); ++i) {
    const auto& n = im.g.at(asked[i]);
    pending[i].receive([](uint64_t) {},
                       [&](caf::error& e) {
                         if (e == caf::sec::request_timeout || is(e, af_error::timeout))
                           missing.push_back(n.spec.name + " (on " + n.spec.device + ")");
                         else if (!other)
                           other = im.link.explain(std::move(e), "initialization of '" + n.spec.name + "'",
                                              nullptr);
                       });
  }
  if (!missing.empty()) {
    std::string names;
    for (const auto& m : missing)
      names += (names.empty() ? "" : ", ") + m;
    return make_error(af_error::timeout,
                      "waited " + std::to_string(timeout.count()) + " ms for initialization of "
                        + std::to_string(missing.size()) + " variable(s)"
                        + (run_id.empty() ? "" : " by run '" + run_id + "'") + ": " + names
                        + "; is the chief running initialize()?");
  }
  return other;
}

caf::expected<node_info> session::ping(const std::string& job, int32_t task) {
  auto conn = impl_->link.connect(job, task);
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
    bool retry = is(info.error(), af_error::unreachable) || is(info.error(), af_error::peer_down);
    if (!retry || std::chrono::steady_clock::now() >= deadline)
      return std::move(info.error());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

caf::expected<std::vector<variable_info>> session::list_variables(const std::string& job,
                                                                  int32_t task) {
  auto& im = *impl_;
  auto conn = im.link.connect(job, task);
  if (!conn)
    return std::move(conn.error());
  caf::error err;
  std::vector<variable_info> out;
  im.self->request((*conn)->actor, im.opts.timeout, list_atom::value)
    .receive([&](std::vector<variable_info>& infos) { out = std::move(infos); },
             [&](caf::error& e) { err = im.link.explain(std::move(e), "variable list", *conn); });
  if (err)
    return err;
  std::sort(out.begin(), out.end(),
            [](const variable_info& a, const variable_info& b) { return a.spec.name < b.spec.name; });
  return out;
}

caf::error session::shutdown(const std::string& job, int32_t task) {
  auto& im = *impl_;
  auto conn = im.link.connect(job, task);
  if (!conn)
    return std::move(conn.error());
  caf::error err;
  im.self->request((*conn)->actor, im.opts.timeout, shutdown_atom::value)
    .receive([](caf::ok_atom) {},
             [&](caf::error& e) { err = im.link.explain(std::move(e), "shutdown", *conn); });
  im.link.conns.erase(task_name(job, task));
  return err;
}

std::string session::device_of(output var) const {
  auto n = impl_->g.variable_node(var);
  return n ? n->spec.device : std::string{};
}

size_t session::registered_graphs() const {
  return impl_->prepared.size();
}

variable_actor session::handle_of(output var) const {
  auto it = impl_->bindings.find(var.id);
  return it == impl_->bindings.end() ? variable_actor{} : it->second.actor;
}

const graph& session::graph_def() const {
  return impl_->g;
}

caf::expected<std::shared_ptr<prepared_step>> session::prepare(const std::vector<output>& fetches,
                                                               bool want_values) {
  std::vector<int32_t> roots;
  for (auto o : fetches) {
    if (!impl_->g.contains(o))
      return make_error(af_error::invalid_argument, "prepare() got an output of another graph");
    roots.push_back(o.id);
  }
  return impl_->prepare(roots, want_values);
}

caf::expected<clock_estimate> session::clock_of(const std::string& job, int32_t task) {
  auto conn = impl_->link.connect(job, task);
  if (!conn)
    return std::move(conn.error());
  return (*conn)->clock;
}

caf::expected<std::pair<uint64_t, uint64_t>>
session::executor_load(const std::string& job, int32_t task, const std::string& device) {
  auto& im = *impl_;
  auto conn = im.link.connect(job, task);
  if (!conn)
    return std::move(conn.error());
  auto exec = im.link.executor(**conn, device);
  if (!exec)
    return std::move(exec.error());
  caf::error err;
  std::pair<uint64_t, uint64_t> out;
  im.self->request(*exec, im.opts.timeout, info_atom::value)
    .receive([&](uint64_t graphs, uint64_t steps) { out = {graphs, steps}; },
             [&](caf::error& e) { err = im.link.explain(std::move(e), "executor " + device, *conn); });
  if (err)
    return err;
  return out;
}

} // namespace af
