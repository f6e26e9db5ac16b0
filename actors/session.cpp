#include "actors/session_impl.hpp"
#include "actors/pending_reply.hpp"

#include <algorithm>
#include <condition_variable>

namespace af {

namespace session_detail {

caf::behavior session_actor_impl(caf::stateful_actor<session_actor_state>* self,
                                 std::shared_ptr<node_health> health) {
  self->state.health = std::move(health);
  self->set_down_handler([self](caf::down_msg& dm) {
    // The entry is the handle watched last for its address: a down of an
    // older one (a proxy of the same process before a reconnect) leaves it.
    auto it = self->state.nodes.find(dm.source);
    if (it != self->state.nodes.end() && it->first.get() == dm.source.get()) {
      self->state.health->mark(it->second, caf::to_string(dm.reason), dm.source);
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
      // Keyed by this handle itself (an equal address of an older proxy of
      // the same process is replaced, not kept as the key).
      self->state.nodes.erase(node.address());
      self->state.nodes.emplace(node.address(), task);
      self->monitor(node);
    },
  };
}

} // namespace session_detail

caf::error session::impl::create_variable(int32_t id) {
  const auto& n = g.at(output{id});
  auto dev = placed_from_full(n.spec.device);
  if (!dev)
    return to_error(dev.error());
  auto conn = link.connect(dev->job, dev->task);
  if (!conn)
    return std::move(conn.error());
  // Through a helper actor, so that a cancel (Ctrl-C) ends the wait on a
  // stopped node within 20 ms instead of at the timeout.
  auto handle = ask_cancellable<variable_actor>(
    sys, cancel_flag(opts), "making the variable", (*conn)->actor, opts.timeout,
    [](variable_actor& v) { return std::move(v); }, get_var_atom::value, n.spec);
  if (!handle) {
    if (is(handle.error(), af_error::cancelled))
      return std::move(handle.error());
    return link.explain(std::move(handle.error()), "variable '" + n.spec.name + "'", *conn);
  }
  bindings[id] = var_binding{std::move(*handle), (*conn)->key, (*conn)->address, false, dev->job,
                             dev->task};
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
      // (The path is said only in a trace: not formatted for every op.)
      auto v = n.kind == node_kind::variable
                 ? variable_call(o, var_op::read, tensor{}, true, trace ? &path : nullptr)
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
        auto updated = variable_call(var, op, std::move(*value), want_values, trace ? &path : nullptr);
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
    run_request req{*step, fed, trace != nullptr};
    if (opts.cancel) {
      auto got = run_cancellable(std::move(req), 2 * (*step)->reply_timeout());
      if (got)
        out = std::move(*got);
      else if (is(got.error(), af_error::cancelled))
        return std::move(got.error());
      else
        err = link.explain(std::move(got.error()), "a step", nullptr);
    } else {
      self->request(actor, 2 * (*step)->reply_timeout(), run_atom::value, std::move(req))
        .receive([&](step_outputs& o) { out = std::move(o); },
                 [&](caf::error& e) { err = link.explain(std::move(e), "a step", nullptr); });
    }
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


caf::expected<step_outputs> session::impl::run_cancellable(run_request req,
                                                          std::chrono::milliseconds timeout) {
  if (opts.cancel->load())
    return make_error(af_error::cancelled, "the step was abandoned before it started");
  auto r = std::make_shared<pending_reply<step_outputs>>();
  auto helper = sys.spawn([r, dest = actor, timeout, req = std::move(req)](
                            caf::event_based_actor* a) mutable {
    // Alive while its request is pending (CAF keeps an actor that awaits a
    // response), gone once the answer or the timeout came.
    a->request(dest, timeout, run_atom::value, std::move(req))
      .then([r](step_outputs& o) { r->settle(std::move(o)); },
            [r](caf::error& e) { r->settle(std::move(e)); });
  });
  return r->wait(*opts.cancel, helper,
                 "the step (its executors drop it within the step's timeout)");
}

caf::expected<tensor> session::impl::var_op_cancellable(const variable_actor& var, var_op op,
                                                       tensor operand, bool want_value,
                                                       uint64_t request_id,
                                                       std::chrono::milliseconds wait) {
  if (opts.cancel->load())
    return make_error(af_error::cancelled, "the variable op was abandoned before it started");
  auto r = std::make_shared<pending_reply<tensor>>();
  auto helper = sys.spawn([r, var, op, wait, want_value, request_id,
                           operand = std::move(operand)](caf::event_based_actor* a) mutable {
    a->request(var, wait, var_op_atom::value, op, std::move(operand), want_value, request_id)
      .then([r](tensor& v, uint64_t) { r->settle(std::move(v)); },
            [r](caf::error& e) { r->settle(std::move(e)); });
  });
  return r->wait(*opts.cancel, helper, "the variable op");
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
  // The session may be used and destroyed on another thread than this one.
  release_thread_logger(sys);
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
  if (auto err = im.create_variable(o->id)) {
    // The node stays in the graph (nodes are never removed) but no longer as
    // a variable: initialize(), uninitialized() and a later variable() of
    // the same name must not find one that was never created.
    auto& failed = im.g.at(*o);
    failed.kind = node_kind::placeholder;
    failed.name += "/failed_" + std::to_string(o->id);
    return err;
  }
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

caf::error session::run_targets(const std::vector<output>& targets,
                                const std::vector<std::pair<output, tensor>>& feeds,
                                run_trace* trace) {
  auto v = impl_->execute(targets, false, feeds, trace);
  return v ? caf::none : std::move(v.error());
}


} // namespace af
