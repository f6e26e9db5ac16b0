#include "actors/executor.hpp"

#include <chrono>

#include "caf/all.hpp"

#include "actors/data_plane.hpp"
#include "config/cluster_spec.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

using self_ptr = executor_actor::stateful_pointer<executor_state>;
using step_key = std::pair<uint64_t, uint64_t>;

/// Requests from an executor to a variable actor.
constexpr auto variable_timeout = std::chrono::seconds(30);
constexpr size_t remembered_steps = 4096;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

bool is_update(const std::string& op) {
  return op == "assign" || op == "assign_add" || op == "assign_sub";
}

/// Runs one kernel op; a GPU backend that lacks it hands it to the CPU.
caf::expected<tensor> compute(executor_state& st, const partition_op& op,
                              const std::vector<tensor>& args, std::string& note) {
  if (!kernels::known_op(op.op))
    return make_error(af_error::invalid_argument, "op '" + op.name + "': unknown kind '" + op.op + "'");
  tensor out;
  auto status = kernels::run_op(*st.backend, op.op, op.attrs, args, out);
  using kind = kernels::status::kind;
  if (status.what == kind::unsupported && st.fallback) {
    note = status.error + "; ran on the node's CPU";
    status = kernels::run_op(*st.fallback, op.op, op.attrs, args, out);
  }
  if (!status.ok()) {
    auto code = status.what == kind::shape         ? af_error::shape_mismatch
                : status.what == kind::dtype       ? af_error::dtype_mismatch
                : status.what == kind::unsupported ? af_error::unsupported
                                                   : af_error::invalid_argument;
    return make_error(code, "op '" + op.name + "' (" + op.op + "): " + status.error);
  }
  return out;
}

struct remote_reader_state {
  std::map<std::string, std::unique_ptr<data_channel>> channels; ///< by "host:port"
};

/// Reads variables of other nodes over their data plane. Detached: its
/// blocking socket I/O never stalls the executor.
caf::behavior remote_reader_impl(caf::stateful_actor<remote_reader_state>* self) {
  return {
    [self](read_atom, const std::string& address, const std::string& var) -> caf::result<tensor, uint64_t> {
      auto& ch = self->state.channels[address];
      if (!ch || ch->broken()) {
        auto addr = parse_address(address, "data plane of variable '" + var + "'");
        if (!addr)
          return std::move(addr.error());
        auto fresh = data_channel::connect(addr->host, addr->port, "the data plane at " + address,
                                           std::chrono::duration_cast<std::chrono::milliseconds>(variable_timeout));
        if (!fresh)
          return std::move(fresh.error());
        ch = std::move(*fresh);
      }
      auto r = ch->call(var_op::read, var, nullptr, true);
      if (!r)
        return std::move(r.error());
      return {std::move(r->first), r->second};
    },
  };
}

void remember_done(executor_state& st, step_key key) {
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

void advance(self_ptr self, step_key key);

/// An op's value is known: hand it to the partitions that need it and to the client.
void finish_op(self_ptr self, step_key key, const partition_op& op, tensor value, int64_t start,
               std::string note, uint64_t bytes_in) {
  auto& s = self->state.steps.at(key);
  for (const auto& consumer : op.consumers)
    self->send(caf::actor_cast<executor_actor>(consumer), edge_atom::value, key.first, key.second,
               op.id, value);
  if (op.fetch)
    s.result.fetched.push_back(feed{op.id, value});
  s.result.timings.push_back(
    op_timing{op.id, start, now_ns(), std::move(note), bytes_in, value.empty() ? 0 : value.nbytes()});
  s.values[op.id] = std::move(value);
  ++s.next;
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
    bool update = is_update(op.op);
    std::vector<tensor> args;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const auto& in = op.inputs[i];
      if (update && i == 0)
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
          // Read it, then resume: a variable of this node hands over its
          // buffer; one on another node comes over that node's data plane.
          s.waiting = true;
          auto name = in.var_name;
          auto on_value = [self, key, name](tensor& value, uint64_t) {
            auto i2 = self->state.steps.find(key);
            if (i2 == self->state.steps.end())
              return;
            i2->second.waiting = false;
            i2->second.var_reads[name] = std::move(value);
            advance(self, key);
          };
          auto on_error = [self, key, name](caf::error& err) {
            if (err == caf::sec::request_timeout)
              err = make_error(af_error::timeout, "reading variable '" + name + "' timed out");
            fail(self, key, std::move(err));
          };
          if (!in.data_plane.empty()) {
            if (!self->state.remote_reader)
              self->state.remote_reader = self->spawn<caf::detached + caf::linked>(remote_reader_impl);
            self->request(self->state.remote_reader, variable_timeout, read_atom::value, in.data_plane,
                          name)
              .then(on_value, on_error);
          } else {
            self->request(in.var, variable_timeout, var_op_atom::value, var_op::read, tensor{}, false)
              .then(on_value, on_error);
          }
          return;
        }
        default: { // local, remote, feed
          auto v = s.values.find(in.op);
          if (v == s.values.end()) {
            if (in.kind == op_input::remote)
              return; // its edge has not arrived yet
            fail(self, key,
                 make_error(af_error::invalid_argument,
                            in.kind == op_input::feed
                              ? "op '" + op.name + "' needs a placeholder that was not fed"
                              : "op '" + op.name + "': an input is missing (a bug)"));
            return;
          }
          args.push_back(v->second);
        }
      }
    }
    auto start = now_ns();
    uint64_t bytes_in = 0;
    for (const auto& a : args)
      bytes_in += a.empty() ? 0 : a.nbytes();
    if (update) {
      if (args.size() != 1 || !op.inputs[0].var) {
        fail(self, key, make_error(af_error::invalid_argument, "op '" + op.name + "' updates no variable"));
        return;
      }
      s.waiting = true;
      auto on_value = [self, key, start, &op, bytes_in](tensor& value, uint64_t) {
        auto i2 = self->state.steps.find(key);
        if (i2 == self->state.steps.end())
          return;
        i2->second.waiting = false;
        i2->second.var_reads.erase(op.inputs[0].var_name); // it changed
        finish_op(self, key, op, std::move(value), start, {}, bytes_in);
        advance(self, key);
      };
      auto on_error = [self, key](caf::error& err) { fail(self, key, std::move(err)); };
      const auto& var = op.inputs[0].var;
      var_op vop = var_op::assign;
      parse_var_op(op.op, vop);
      self->request(var, variable_timeout, var_op_atom::value, vop, args[0], op.want_value)
        .then(on_value, on_error);
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
  s.result.device = self->state.device;
  s.rp.deliver(std::move(s.result));
  remember_done(self->state, key);
}

} // namespace

executor_actor::behavior_type executor_impl(self_ptr self, std::string device,
                                            std::shared_ptr<kernels::backend> backend,
                                            std::shared_ptr<kernels::backend> fallback) {
  self->state.device = std::move(device);
  self->state.backend = std::move(backend);
  self->state.fallback = std::move(fallback);
  return {
    [self](register_atom, partition& part) -> caf::ok_atom {
      auto id = part.graph;
      self->state.graphs[id] = std::move(part);
      return caf::ok_atom::value;
    },
    [self](run_step_atom, uint64_t graph, uint64_t step,
           std::vector<feed>& feeds) -> caf::result<step_result> {
      auto g = self->state.graphs.find(graph);
      if (g == self->state.graphs.end())
        return make_error(af_error::not_found, "graph " + std::to_string(graph)
                                                 + " was never registered on " + self->state.device);
      step_key key{graph, step};
      auto& s = self->state.steps[key];
      s.part = &g->second;
      for (auto& f : feeds)
        s.values[f.op] = std::move(f.value);
      s.rp = self->make_response_promise<step_result>();
      auto rp = s.rp;
      advance(self, key);
      return rp;
    },
    [self](edge_atom, uint64_t graph, uint64_t step, int32_t op, tensor& value) {
      step_key key{graph, step};
      if (self->state.done.count(key))
        return; // the step failed or was aborted meanwhile
      self->state.steps[key].values[op] = std::move(value);
      advance(self, key);
    },
    [self](abort_atom, uint64_t graph, uint64_t step) {
      fail(self, {graph, step}, make_error(af_error::aborted, "step aborted by the session"));
      remember_done(self->state, {graph, step});
    },
    [self](forget_atom, uint64_t graph) {
      for (auto it = self->state.steps.begin(); it != self->state.steps.end();)
        if (it->first.first == graph)
          it = self->state.steps.erase(it);
        else
          ++it;
      self->state.graphs.erase(graph);
    },
  };
}

} // namespace af
