#include "actors/step_runner.hpp"

#include "caf/all.hpp"

#include "actors/edge_token.hpp"
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
  next_graph_id = [this] {
    uint64_t id = 0;
    while (id == 0)
      id = ids_();
    return id;
  };
}

void step_runner::run(caf::event_based_actor* self, std::shared_ptr<prepared_step> step,
                      std::map<int32_t, tensor> feeds, bool want_trace, callback done) {
  if (step->partitions.empty()) {
    done(step_outputs{}); // nothing runs on an executor (a plan of no ops)
    return;
  }
  // Watch every executor and every variable the step reads: a peer that
  // dies (or stops answering heartbeats) fails the step at once.
  for (const auto& p : step->partitions) {
    if (monitored_.insert(p.exec.address()).second)
      self->monitor(p.exec);
    for (const auto& peer : p.part.peers)
      if (peer && monitored_.insert(peer.address()).second)
        self->monitor(peer);
  }
  start(self, std::move(step), pending_run{std::move(feeds), want_trace, std::move(done), 0});
}

void step_runner::start(caf::event_based_actor* self, std::shared_ptr<prepared_step> step,
                        pending_run run) {
  auto& reg = regs_[step.get()];
  if (reg.ready) {
    dispatch(self, std::move(step), reg.graph, std::move(run));
    return;
  }
  reg.waiting.push_back(std::move(run));
  if (reg.graph != 0)
    return; // a registration is under way: it dispatches this run too
  reg.step = step;
  register_step(self, step, 3);
}

bool step_runner::id_in_use(uint64_t id) const {
  for (const auto& [key, reg] : regs_)
    if (reg.graph == id)
      return true;
  return false;
}

void step_runner::register_step(caf::event_based_actor* self,
                                const std::shared_ptr<prepared_step>& step, int attempts_left) {
  auto id = next_graph_id();
  for (int tries = 0; tries < 8 && id_in_use(id); ++tries)
    id = next_graph_id(); // never reuse an id this runner holds
  regs_[step.get()].graph = id;
  struct gather {
    size_t missing;
    caf::error err;
    bool collision = false;
    std::vector<size_t> registered; ///< partitions that accepted the id
  };
  auto g = std::make_shared<gather>();
  g->missing = step->partitions.size();
  auto reply = [this, self, step, g, attempts_left, id]() {
    if (--g->missing > 0)
      return;
    auto it = regs_.find(step.get());
    // Taking the id back goes to every partition: one that timed out may
    // still register it later (a sender's messages arrive in order, so the
    // forget comes after), and where another owner holds the id the
    // executor ignores a forget that is not from its owner.
    auto take_back = [&] {
      for (const auto& p : step->partitions)
        self->send(p.exec, forget_atom::value, id);
    };
    if (it == regs_.end() || it->second.graph != id) {
      take_back(); // forgotten meanwhile
      return;
    }
    auto& reg = it->second;
    if (g->err || g->collision) {
      take_back();
      if (!g->err && attempts_left > 1) {
        register_step(self, step, attempts_left - 1);
        return;
      }
      auto err = g->err ? g->err
                        : make_error(af_error::internal,
                                     "could not find a free graph id in 3 tries");
      auto waiting = std::move(reg.waiting);
      regs_.erase(it);
      for (auto& r : waiting)
        r.done(err);
      return;
    }
    reg.ready = true;
    auto waiting = std::move(reg.waiting);
    for (auto& r : waiting) {
      // A callback of an earlier run may have forgotten the step meanwhile.
      auto still = regs_.find(step.get());
      if (still == regs_.end() || still->second.graph != id || !still->second.ready)
        r.done(make_error(af_error::aborted, "the step was dropped before it ran"));
      else
        dispatch(self, step, id, std::move(r));
    }
  };
  // The graph's secret, the same for all its partitions: each edge carries
  // it, and a value without it is refused (actors/edge_token.hpp). Drawn
  // anew with each id.
  auto token = make_edge_token();
  if (token.empty()) {
    auto err = make_error(af_error::internal,
                          "registering a graph: OpenSSL's RAND_bytes could not draw its edge "
                          "token");
    auto it = regs_.find(step.get());
    auto waiting = std::move(it->second.waiting);
    regs_.erase(it);
    for (auto& r : waiting)
      r.done(err);
    return;
  }
  for (size_t i = 0; i < step->partitions.size(); ++i) {
    const auto& p = step->partitions[i];
    auto part = p.part;
    part.graph = id;
    part.edge_token = token;
    self->request(p.exec, step->reply_timeout(), register_atom::value, std::move(part))
      .then([reply, g, i](caf::ok_atom) {
              g->registered.push_back(i);
              reply();
            },
            [reply, g, step, i](caf::error& err) {
              if (is(err, af_error::already_exists))
                g->collision = true;
              else if (!g->err)
                g->err = explain(std::move(err), "registering a graph", step->partitions[i],
                                 step->reply_timeout());
              reply();
            });
  }
}

void step_runner::dispatch(caf::event_based_actor* self, std::shared_ptr<prepared_step> step,
                           uint64_t graph, pending_run run) {
  auto id = next_step_++;
  // Every feed is checked before anything runs.
  std::vector<std::vector<feed>> per_partition(step->partitions.size());
  for (size_t i = 0; i < step->partitions.size(); ++i)
    for (auto ph : step->partitions[i].feeds) {
      auto it = run.feeds.find(ph);
      if (it == run.feeds.end()) {
        auto n = step->nodes.find(ph);
        run.done(make_error(af_error::invalid_argument,
                            "placeholder '"
                              + (n == step->nodes.end() ? std::to_string(ph) : n->second.name)
                              + "' needs a value: pass it in run()'s feeds"));
        return;
      }
      per_partition[i].push_back(feed{ph, it->second});
    }
  auto& f = running_[id];
  f.step = step;
  f.graph = graph;
  f.id = id;
  f.missing = step->partitions.size();
  f.results.resize(step->partitions.size());
  f.origin = std::move(run);
  for (size_t i = 0; i < step->partitions.size(); ++i) {
    const auto& p = step->partitions[i];
    // An executor in this process answers by its own deadline (its sweep
    // fails the step, naming what it waited for) and its death reaches
    // on_down: the request needs no timer of its own, which would cost a
    // wake-up of CAF's clock thread per step (a tenth of a small model's
    // step on 2 cores). A remote one also needs the timer: its answer can
    // be lost with the network.
    auto timeout = p.exec->node() == self->node() ? caf::duration{caf::infinite}
                                                  : caf::duration{step->reply_timeout()};
    self->request(p.exec, timeout, run_step_atom::value, graph, id,
                  std::move(per_partition[i]))
      .then(
        [this, self, id, i](step_result& r) {
          auto it = running_.find(id);
          if (it == running_.end())
            return; // already failed
          it->second.results[i] = std::move(r);
          if (--it->second.missing == 0)
            finish(self, id, std::move(it->second.aborted));
        },
        [this, self, id, i](caf::error& err) {
          auto it = running_.find(id);
          if (it == running_.end())
            return;
          auto& fl = it->second;
          const auto& p = fl.step->partitions[i];
          if (is(err, af_error::not_found) && fl.origin.attempt == 0) {
            // This executor lost the graph: nothing can finish; stop the
            // others. Run again only if every partition says so (then nothing
            // ran anywhere, and no update is applied twice).
            if (fl.lost == 0)
              for (const auto& q : fl.step->partitions)
                self->send(q.exec, abort_atom::value, fl.graph, id);
            if (++fl.lost == 1)
              fl.first_lost = explain(std::move(err), "step " + std::to_string(id), p,
                                      fl.step->reply_timeout());
          } else if (!is(err, af_error::aborted)) {
            // The cause: tell the others to stop waiting and answer now.
            for (const auto& q : fl.step->partitions)
              self->send(q.exec, abort_atom::value, fl.graph, id);
            fl.lost = 0;
            finish(self, id,
                   explain(std::move(err), "step " + std::to_string(id), p,
                           fl.step->reply_timeout()));
            return;
          } else if (!fl.aborted) {
            fl.aborted = std::move(err);
          }
          if (--fl.missing == 0)
            finish(self, id, fl.lost > 0 ? fl.first_lost : std::move(fl.aborted));
        });
  }
}

void step_runner::finish(caf::event_based_actor* self, uint64_t id, caf::error err) {
  auto it = running_.find(id);
  if (it == running_.end())
    return;
  auto f = std::move(it->second);
  running_.erase(it);
  if (f.lost > 0 && f.lost == f.step->partitions.size()) {
    // Every executor lost the graph (nothing ran): register anew, run once more.
    auto reg = regs_.find(f.step.get());
    if (reg == regs_.end() || reg->second.graph != f.graph || !reg->second.ready) {
      f.origin.done(make_error(af_error::aborted, "the step was dropped while it ran"));
      return;
    }
    for (const auto& p : f.step->partitions)
      self->send(p.exec, forget_atom::value, f.graph);
    regs_.erase(reg);
    f.origin.attempt = 1;
    start(self, f.step, std::move(f.origin));
    return;
  }
  if (err) {
    f.origin.done(std::move(err));
    return;
  }
  f.origin.done(assemble(*f.step, f.results, f.origin.want_trace));
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
        self->send(q.exec, abort_atom::value, f.graph, id);
  }
  for (auto& [id, err] : failed) {
    running_[id].lost = 0;
    finish(self, id, std::move(err));
  }
}

void step_runner::forget(caf::event_based_actor* self, const std::shared_ptr<prepared_step>& step) {
  auto it = regs_.find(step.get());
  if (it == regs_.end())
    return;
  if (it->second.ready)
    for (const auto& p : step->partitions)
      self->send(p.exec, forget_atom::value, it->second.graph);
  // A registration under way takes itself back when its replies come.
  auto waiting = std::move(it->second.waiting);
  regs_.erase(it);
  for (auto& r : waiting)
    r.done(make_error(af_error::aborted, "the step was dropped before it was registered"));
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
          "from " + (from ? from->device + " @ " + from->node : std::string{"?"})
            + (x.path.empty() ? std::string{} : " by " + x.path),
          sent,
          local(x.end_ns), x.bytes, 0});
      }
    }
  }
  return out;
}

} // namespace af
