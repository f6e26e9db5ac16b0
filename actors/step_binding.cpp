#include "actors/step_binding.hpp"

#include <algorithm>

#include "caf/all.hpp"

#include "messages/error.hpp"

namespace af {

caf::expected<std::shared_ptr<prepared_step>>
bind_step(const graph& g, const step_plan& plan_ref, cluster_link& link, const session_options& opts,
          const std::function<caf::expected<const var_binding*>(int32_t)>& binding_of) {
  const auto* plan = &plan_ref;
  auto step = std::make_shared<prepared_step>();
  step->timeout = opts.timeout;
  step->partition_of = plan->partition_of;
  // Bind each partition to its node and executor.
  for (const auto& pp : plan->partitions) {
    auto conn = link.connect(pp.device.job, pp.device.task);
    if (!conn)
      return std::move(conn.error());
    auto exec = link.executor(**conn, pp.device.local);
    if (!exec)
      return std::move(exec.error());
    prepared_partition p;
    p.exec = *exec;
    p.device = pp.device.full;
    p.node = (*conn)->address;
    p.task = (*conn)->key;
    p.note = pp.device.note;
    p.clock_offset_ns = (*conn)->clock.offset_ns;
    p.feeds = pp.feeds;
    // At least 1 ms, at most what a uint32 of milliseconds holds (49 days).
    auto ms = static_cast<uint32_t>(std::clamp<int64_t>(opts.timeout.count(), 1, UINT32_MAX));
    p.part.step_timeout_ms = ms;
    p.part.variable_timeout_ms = ms;
    step->tasks.insert(p.task);
    step->partitions.push_back(std::move(p));
  }
  auto describe_node = [&](int32_t id) {
    const auto& n = g.at(output{id});
    trace_node t{n.name, n.op, n.requested.to_string(), "", "", ""};
    if (n.kind == node_kind::variable) {
      t.op = "variable";
      t.device = n.spec.device;
      t.note = n.placement_note;
      if (auto b = binding_of(id))
        t.node = (*b)->address;
    }
    step->nodes[id] = std::move(t);
  };
  for (size_t i = 0; i < plan->partitions.size(); ++i) {
    auto& p = step->partitions[i];
    for (size_t k = 0; k < step->partitions.size(); ++k)
      if (k != i) {
        p.part.peers.push_back(caf::actor_cast<caf::actor>(step->partitions[k].exec));
        p.part.peer_devices.push_back("the executor of " + step->partitions[k].device + " on "
                                      + step->partitions[k].task + " at " + step->partitions[k].node);
      }
    for (const auto& po : plan->partitions[i].ops) {
      describe_node(po.id);
      partition_op op;
      op.id = po.id;
      op.op = po.op;
      op.name = po.name;
      op.attrs = po.attrs;
      op.fetch = po.fetch;
      op.want_value = po.want_value;
      for (auto c : po.consumers) {
        const auto& q = step->partitions[c];
        auto consumer = caf::actor_cast<caf::actor>(q.exec);
        if (std::find(op.consumers.begin(), op.consumers.end(), consumer) != op.consumers.end())
          continue;
        op.consumers.push_back(consumer);
        op.consumer_devices.push_back(q.device);
        op.consumer_tasks.push_back(q.task);
        // On another node: the value goes on that node's data plane.
        std::string plane;
        auto owner = link.conns.find(q.task);
        if (opts.data_plane && q.node != p.node && owner != link.conns.end()
            && owner->second.info.data_port != 0)
          if (auto addr = parse_address(owner->second.address, "the executor of " + q.device))
            plane = task_address{addr->host, owner->second.info.data_port}.to_string();
        op.consumer_data_planes.push_back(std::move(plane));
      }
      for (const auto& in : po.inputs) {
        describe_node(in.node);
        op_input x;
        x.op = in.node;
        switch (in.kind) {
          case planned_input::variable: {
            auto b = binding_of(in.node);
            if (!b)
              return std::move(b.error());
            const auto& var = g.at(output{in.node});
            x.kind = op_input::variable;
            x.var = (*b)->actor;
            x.var_name = var.spec.name;
            x.var_node = (*b)->task + " at " + (*b)->address;
            step->tasks.insert((*b)->task); // a restart of its node invalidates the step
            // The executor watches the variable too: a step reading it fails
            // when its node dies or stops answering heartbeats.
            auto var_actor = caf::actor_cast<caf::actor>((*b)->actor);
            if (std::find(p.part.peers.begin(), p.part.peers.end(), var_actor) == p.part.peers.end()) {
              p.part.peers.push_back(var_actor);
              p.part.peer_devices.push_back("variable '" + var.spec.name + "' on " + var.spec.device
                                            + " (" + x.var_node + ")");
            }
            // On another node: the executor reads it over that node's data plane.
            auto owner = link.conns.find((*b)->task);
            if (opts.data_plane && (*b)->address != p.node && owner != link.conns.end()
                && owner->second.info.data_port != 0)
              if (auto addr = parse_address(owner->second.address, "variable '" + var.spec.name + "'"))
                x.data_plane = task_address{addr->host, owner->second.info.data_port}.to_string();
            break;
          }
          case planned_input::constant:
            x.kind = op_input::constant;
            x.value = g.at(output{in.node}).value;
            break;
          case planned_input::feed:
            x.kind = op_input::feed;
            break;
          case planned_input::remote:
            x.kind = op_input::remote;
            break;
          default:
            x.kind = op_input::local;
        }
        op.inputs.push_back(std::move(x));
      }
      p.part.ops.push_back(std::move(op));
    }
  }
  return step;
}

} // namespace af
