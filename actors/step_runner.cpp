#include "actors/step_runner.hpp"

#include "caf/all.hpp"

#include "messages/error.hpp"

namespace af {

namespace {

/// A CAF error of the request itself (timeout, dead receiver) as a sentence
/// naming what it waited for; actorflow's own errors pass through.
caf::error explain(caf::error err, const std::string& what, const prepared_partition& p,
                   std::chrono::milliseconds timeout) {
  if (err == caf::sec::request_timeout)
    return make_error(af_error::timeout, "timed out after " + std::to_string(timeout.count())
                                           + " ms waiting for " + what + " on " + p.device + " at "
                                           + p.node + "; is the node alive and reachable?");
  if (err.category() != error_category)
    return make_error(af_error::peer_down,
                      what + " on " + p.device + " at " + p.node + " failed: " + describe(err));
  return err;
}

} // namespace

step_runner::step_runner() : ids_(std::random_device{}()) {
  // nop
}

void step_runner::run(caf::event_based_actor* self, std::shared_ptr<prepared_step> step,
                      std::map<int32_t, tensor> feeds, bool want_trace, callback done) {
  // Watch every executor and every variable the step reads: a peer that
  // dies (or stops answering heartbeats) fails the step at once.
  for (const auto& p : step->partitions) {
    if (monitored_.insert(p.exec.address()).second)
      self->monitor(p.exec);
    for (const auto& peer : p.part.peers)
      if (peer && monitored_.insert(peer.address()).second)
        self->monitor(peer);
  }
  if (step->registered)
    dispatch(self, std::move(step), std::move(feeds), want_trace, std::move(done));
  else
    register_then_run(self, std::move(step), std::move(feeds), want_trace, std::move(done), 3);
}

void step_runner::register_then_run(caf::event_based_actor* self,
                                    std::shared_ptr<prepared_step> step,
                                    std::map<int32_t, tensor> feeds, bool want_trace,
                                    callback done, int attempts_left) {
  uint64_t id = 0;
  while (id == 0)
    id = ids_();
  step->graph = id;
  struct gather {
    size_t missing;
    caf::error err;
    bool collision = false;
    std::map<int32_t, tensor> feeds;
    callback done;
  };
  auto g = std::make_shared<gather>();
  g->missing = step->partitions.size();
  g->feeds = std::move(feeds);
  g->done = std::move(done);
  auto reply = [this, self, step, g, want_trace, attempts_left, id]() {
    if (--g->missing > 0)
      return;
    if (step->graph != id)
      return; // a newer registration attempt owns the step
    if (g->collision && !g->err && attempts_left > 1) {
      for (const auto& p : step->partitions)
        self->send(p.exec, forget_atom::value, id);
      register_then_run(self, step, std::move(g->feeds), want_trace, std::move(g->done),
                        attempts_left - 1);
      return;
    }
    if (g->err || g->collision) {
      for (const auto& p : step->partitions)
        self->send(p.exec, forget_atom::value, id);
      step->graph = 0;
      g->done(g->err ? g->err
                     : make_error(af_error::internal, "could not find a free graph id in 3 tries"));
      return;
    }
    step->registered = true;
    dispatch(self, step, std::move(g->feeds), want_trace, std::move(g->done));
  };
  for (auto& p : step->partitions) {
    auto part = p.part;
    part.graph = id;
    self->request(p.exec, step->timeout, register_atom::value, std::move(part))
      .then([reply](caf::ok_atom) { reply(); },
            [reply, g, &p, step](caf::error& err) {
              if (is(err, af_error::invalid_argument)
                  && describe(err).find("is taken") != std::string::npos)
                g->collision = true;
              else if (!g->err)
                g->err = explain(std::move(err), "registering a graph", p, step->timeout);
              reply();
            });
  }
}

void step_runner::dispatch(caf::event_based_actor* self, std::shared_ptr<prepared_step> step,
                           std::map<int32_t, tensor> feeds, bool want_trace, callback done) {
  auto id = next_step_++;
  // Every feed is checked before anything runs.
  std::vector<std::vector<feed>> per_partition(step->partitions.size());
  for (size_t i = 0; i < step->partitions.size(); ++i)
    for (auto ph : step->partitions[i].feeds) {
      auto it = feeds.find(ph);
      if (it == feeds.end()) {
        auto n = step->nodes.find(ph);
        done(make_error(af_error::invalid_argument,
                        "placeholder '" + (n == step->nodes.end() ? std::to_string(ph) : n->second.name)
                          + "' needs a value: pass it in run()'s feeds"));
        return;
      }
      per_partition[i].push_back(feed{ph, it->second});
    }
  auto& f = running_[id];
  f.step = step;
  f.id = id;
  f.missing = step->partitions.size();
  f.results.resize(step->partitions.size());
  f.want_trace = want_trace;
  f.done = std::move(done);
  for (size_t i = 0; i < step->partitions.size(); ++i) {
    const auto& p = step->partitions[i];
    self->request(p.exec, step->timeout, run_step_atom::value, step->graph, id,
                  std::move(per_partition[i]))
      .then(
        [this, id, i](step_result& r) {
          auto it = running_.find(id);
          if (it == running_.end())
            return; // already failed
          it->second.results[i] = std::move(r);
          if (--it->second.missing == 0)
            finish(id, std::move(it->second.aborted));
        },
        [this, self, id, i](caf::error& err) {
          auto it = running_.find(id);
          if (it == running_.end())
            return;
          auto& fl = it->second;
          const auto& p = fl.step->partitions[i];
          if (!is(err, af_error::aborted)) {
            // The cause: tell the others to stop waiting and answer now.
            for (const auto& q : fl.step->partitions)
              self->send(q.exec, abort_atom::value, fl.step->graph, id);
            finish(id, explain(std::move(err), "step " + std::to_string(id), p, fl.step->timeout));
            return;
          }
          if (!fl.aborted)
            fl.aborted = std::move(err);
          if (--fl.missing == 0)
            finish(id, std::move(fl.aborted));
        });
  }
}

void step_runner::finish(uint64_t id, caf::error err) {
  auto it = running_.find(id);
  if (it == running_.end())
    return;
  auto f = std::move(it->second);
  running_.erase(it);
  if (err) {
    f.done(std::move(err));
    return;
  }
  f.done(assemble(*f.step, f.results, f.want_trace));
}

void step_runner::on_down(caf::event_based_actor* self, const caf::down_msg& dm) {
  monitored_.erase(dm.source);
  std::vector<std::pair<uint64_t, caf::error>> failed;
  for (auto& [id, f] : running_) {
    std::string who;
    for (const auto& p : f.step->partitions) {
      if (p.exec.address() == dm.source)
        who = "the executor of " + p.device + " on " + p.task + " at " + p.node;
      for (size_t k = 0; who.empty() && k < p.part.peers.size(); ++k)
        if (p.part.peers[k].address() == dm.source)
          who = k < p.part.peer_devices.size() ? p.part.peer_devices[k] : "a peer";
      if (!who.empty())
        break;
    }
    if (who.empty())
      continue;
    failed.emplace_back(id, make_error(af_error::peer_down,
                                       "step " + std::to_string(id) + ": " + who + " died ("
                                         + caf::to_string(dm.reason)
                                         + "); did its node stop or lose its network?"));
    for (const auto& q : f.step->partitions)
      if (q.exec.address() != dm.source)
        self->send(q.exec, abort_atom::value, f.step->graph, id);
  }
  for (auto& [id, err] : failed)
    finish(id, std::move(err));
}

void step_runner::forget(const prepared_step& step) {
  if (!step.registered)
    return;
  for (const auto& p : step.partitions)
    caf::anon_send(p.exec, forget_atom::value, step.graph);
}

step_outputs step_runner::assemble(const prepared_step& step, std::vector<step_result>& results,
                                   bool want_trace) {
  step_outputs out;
  for (auto& r : results)
    for (auto& f : r.fetched)
      out.values[f.op] = std::move(f.value);
  if (!want_trace)
    return out;
  auto name_of = [&](int32_t id) -> const trace_node& {
    static const trace_node unknown{"?", "?", "", "", "", ""};
    auto it = step.nodes.find(id);
    return it == step.nodes.end() ? unknown : it->second;
  };
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& p = step.partitions[i];
    auto local = [&](int64_t t) { return t - p.clock_offset_ns; };
    for (const auto& t : results[i].timings) {
      const auto& n = name_of(t.op);
      auto note = p.note;
      if (!t.note.empty())
        note += (note.empty() ? "" : "; ") + t.note;
      out.trace.push_back(trace_entry{n.name, n.op, n.requested, p.device, p.node, note,
                                      local(t.start_ns), local(t.end_ns), t.bytes_in, t.bytes_out});
    }
    for (const auto& x : results[i].transfers) {
      if (x.kind == 1) { // a variable read by this partition
        const auto& v = name_of(x.op);
        bool remote = v.node != p.node;
        out.trace.push_back(trace_entry{
          v.name, remote ? "transfer" : "read", v.requested, v.device, v.node,
          remote ? "to " + p.device + " @ " + p.node + " by " + x.path
                 : (v.note.empty() ? x.path : v.note + "; " + x.path),
          local(x.start_ns), local(x.end_ns), x.bytes, 0});
      } else { // an edge from another partition
        auto from_it = step.partition_of.find(x.op);
        const auto* from = from_it == step.partition_of.end() ? nullptr
                                                              : &step.partitions[from_it->second];
        auto sent = from ? x.start_ns - from->clock_offset_ns : local(x.start_ns);
        out.trace.push_back(trace_entry{
          name_of(x.op).name + " -> " + name_of(x.consumer).name, "transfer", "", p.device, p.node,
          "from " + (from ? from->device + " @ " + from->node : std::string{"?"}), sent,
          local(x.end_ns), x.bytes, 0});
      }
    }
  }
  return out;
}

} // namespace af
