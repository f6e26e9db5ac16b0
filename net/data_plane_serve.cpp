/// The data plane's frames that reach the node's runtime: a variable op
/// (applied to the variable's cell right on the connection's thread), a push
/// or pull to an aggregator, and an edge value for an executor. Each checks
/// its frame before anything is allocated for the payload.
#include "net/data_plane.hpp"
#include "actors/edge_budget.hpp"
#include "net/data_link.hpp"
#include "net/served_connection.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "core/log.hpp"
#include "messages/error.hpp"

namespace af {

using namespace plane_io;

bool data_plane_server::serve_variable(served_connection& c, const wire::header& h,
                                       const std::string& name) {
  auto& io = c.io;
  const auto& peer = c.peer;
  auto frame_ms = c.frame_ms;
  // The variable and the operand's fit are checked before anything is
  // allocated for the operand: a frame for a variable that does not exist,
  // or of another shape, or over a limit, cannot make the node take its
  // memory.
  auto found = dir_->get(name);
  std::string refusal;
  af_error refusal_code = af_error::not_found;
  if (!found.cell) {
    refusal = "no variable '" + name + "' on " + node_name_;
  } else if (h.payload_bytes > static_cast<uint64_t>(timeouts_.max_message_bytes)) {
    refusal_code = af_error::resource_exhausted;
    refusal = fmt::format("{} of '{}': a payload of {} bytes is over {}'s limit of {} bytes per "
                          "message ([node] max_message_bytes)",
                          to_string(static_cast<var_op>(h.kind)), name, h.payload_bytes,
                          node_name_, timeouts_.max_message_bytes);
  } else if (h.has_tensor
             && h.payload_bytes > static_cast<uint64_t>(timeouts_.max_variable_bytes)) {
    refusal_code = af_error::resource_exhausted;
    refusal = fmt::format("{} of '{}': a value of {} bytes is over {}'s limit of {} bytes per "
                          "variable ([node] max_variable_bytes)",
                          to_string(static_cast<var_op>(h.kind)), name, h.payload_bytes,
                          node_name_, timeouts_.max_variable_bytes);
  } else if (h.has_tensor) {
    const auto& spec = found.cell->spec();
    auto shape = wire::shape_of(h);
    bool scalar = num_elements(shape) == 1 && shape.size() <= spec.shape.size();
    bool update = h.kind == static_cast<uint8_t>(var_op::assign_add)
                  || h.kind == static_cast<uint8_t>(var_op::assign_sub);
    if (static_cast<dtype>(h.dtype) != spec.type) {
      refusal_code = af_error::dtype_mismatch;
      refusal = fmt::format("{} to '{}': value has dtype {}, variable has {}",
                            to_string(static_cast<var_op>(h.kind)), name,
                            dtype_name(static_cast<dtype>(h.dtype)), dtype_name(spec.type));
    } else if (shape != spec.shape && !(scalar && update)) {
      refusal_code = af_error::shape_mismatch;
      refusal = fmt::format("{} to '{}': value has shape {}, variable has {}",
                            to_string(static_cast<var_op>(h.kind)), name, shape_string(shape),
                            shape_string(spec.shape));
    }
  }
  if (!refusal.empty()) {
    read_end how = read_end::done;
    if (!refuse_request(io, refusal_code, refusal, h.payload_bytes, frame_ms, how)) {
      c.ended(how, "payload");
      return false;
    }
    return true;
  }
  if (!h.has_tensor && h.payload_bytes > 0) {
    // Bytes that are no tensor (validate bounds them): skipped.
    read_end how = read_end::done;
    auto skip = skip_payload(io, h.payload_bytes, frame_ms, how);
    if (skip == skipped::lost) {
      c.ended(how, "payload");
      return false;
    }
    if (skip == skipped::too_large) {
      send_error(io, af_error::invalid_argument,
                 "a payload that is no tensor (the connection is closed: its payload was not "
                 "read)");
      return false;
    }
  }
  tensor operand;
  if (h.has_tensor) {
    try {
      operand.reset(static_cast<dtype>(h.dtype), wire::shape_of(h));
    } catch (const std::bad_alloc&) {
      log::get()->warn("{} data plane: no memory for {} bytes of '{}' from {}", node_name_,
                       h.payload_bytes, name, peer);
      // Answered; the connection goes on if its payload can be skipped.
      read_end how = read_end::done;
      if (!refuse_request(io, af_error::resource_exhausted,
                          fmt::format("{} cannot allocate {} bytes for the operand of '{}' "
                                      "(out of memory)",
                                      node_name_, h.payload_bytes, name),
                          h.payload_bytes, frame_ms, how)) {
        c.ended(how, "payload");
        return false;
      }
      return true;
    }
    if (h.payload_bytes > 0
        && c.ended(read_timed(io, operand.mutable_bytes(), h.payload_bytes, frame_ms, frame_ms, false),
                 "payload"))
      return false;
  }
  // Applied right here under the cell's lock: no actor hop.
  caf::expected<variable_cell::applied> r{caf::error{}};
  try {
    // A request's version field is its id (0: none): applied once per id.
    r = found.cell->apply(static_cast<var_op>(h.kind), operand, h.want_value != 0, h.version);
  } catch (const std::bad_alloc&) {
    // A copy for want_value, a slot: answered, the connection goes on.
    r = make_error(af_error::resource_exhausted,
                   fmt::format("{} ran out of memory applying {} to '{}' ({} bytes)", node_name_,
                               to_string(static_cast<var_op>(h.kind)), name,
                               num_elements(found.cell->spec().shape)
                                 * static_cast<int64_t>(dtype_size(found.cell->spec().type))));
  }
  if (!r) {
    if (!send_error(io, wire_code(r.error()), describe(r.error())))
      return false;
    return true;
  }
  if (r->first_value && found.actor)
    caf::anon_send(found.actor, released_atom::value); // its waiters: the actor's job
  wire::header reply;
  reply.kind = static_cast<uint8_t>(wire::kind::reply);
  reply.version = r->version;
  const auto& value = r->value;
  if (!value.empty() && !wire::describe_tensor(value, reply)) {
    if (!send_error(io, af_error::invalid_argument,
                    "variable '" + name + "' has rank " + std::to_string(value.shape().size())
                      + "; the data plane carries rank <= 8"))
      return false;
    return true;
  }
  // Straight from the variable's buffer: `value` shares it, no copy.
  if (!send_frame(io, reply, nullptr, value.empty() ? nullptr : value.bytes())) {
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      log::get()->warn("{} data plane: dropped {}: it took nothing of its reply for {} ms",
                       node_name_, peer, frame_ms);
    return false;
  }
  return true;
}

bool data_plane_server::serve_aggregator(const data_link& io, const std::string& peer,
                                         const wire::header& h, const std::string& frame_name) {
  auto frame_ms = static_cast<int>(timeouts_.frame.count());
  bool push = h.kind == static_cast<uint8_t>(wire::kind::push)
              || h.kind == static_cast<uint8_t>(wire::kind::push_params);
  // A push's name starts with who it speaks for (wire::push_prefix): the
  // aggregator checks the token, and names this peer if it is refused.
  push_credentials who;
  who.from = "data-plane peer " + peer;
  std::string name = frame_name;
  bool short_prefix = push && frame_name.size() < sizeof(wire::push_prefix);
  if (push && !short_prefix) {
    wire::push_prefix pre;
    std::memcpy(&pre, frame_name.data(), sizeof(pre));
    who.token.assign(reinterpret_cast<const char*>(pre.token), sizeof(pre.token));
    who.seq = pre.seq;
    name = frame_name.substr(sizeof(pre));
  }
  auto agg = dir_->get_aggregator(name);
  auto caller = dir_->aggregator_caller();
  // Checked before anything is allocated: a push for an aggregator that does
  // not exist, or of another size, cannot make the node take its memory.
  std::string refusal;
  af_error code = af_error::invalid_argument;
  if (short_prefix) {
    refusal = fmt::format("a push frame whose name of {} bytes is shorter than its {}-byte prefix "
                          "(the worker's token and push number); is the sender of another "
                          "actorflow version?",
                          frame_name.size(), sizeof(wire::push_prefix));
  } else if (!agg.actor || !caller) {
    code = af_error::not_found;
    refusal = fmt::format("no aggregator '{}' on {}; the chief creates it when the job starts",
                          name, node_name_);
  } else if (h.payload_bytes > static_cast<uint64_t>(timeouts_.max_message_bytes)) {
    code = af_error::resource_exhausted;
    refusal = fmt::format("{} to aggregator '{}': a payload of {} bytes is over {}'s limit of {} "
                          "bytes per message ([node] max_message_bytes)",
                          push ? "push" : "pull", name, h.payload_bytes, node_name_,
                          timeouts_.max_message_bytes);
  } else if (h.has_tensor && !push) {
    // A pull carries no values: saying "float32[650] values, expected
    // float32[650]" of one that did named the wrong fault.
    refusal = fmt::format("pull from aggregator '{}' carries {}{} values: a pull sends none (a "
                          "push sends values)",
                          name, dtype_name(static_cast<dtype>(h.dtype)),
                          shape_string(wire::shape_of(h)));
  } else if (h.has_tensor
             && (static_cast<dtype>(h.dtype) != dtype::float32 || h.rank != 1
                 || static_cast<uint64_t>(h.dims[0]) != agg.floats)) {
    code = af_error::shape_mismatch;
    refusal = fmt::format("push to aggregator '{}': {}{} values, expected float32[{}]",
                          name, dtype_name(static_cast<dtype>(h.dtype)),
                          shape_string(wire::shape_of(h)), agg.floats);
  } else if (!h.has_tensor && h.payload_bytes > 0) {
    refusal = "a push or pull with a payload that is no tensor";
  }
  read_end how = read_end::done;
  if (!refusal.empty())
    return refuse_request(io, code, refusal, h.payload_bytes, frame_ms, how);
  tensor values;
  if (h.has_tensor) {
    try {
      values.reset(dtype::float32, wire::shape_of(h));
    } catch (const std::bad_alloc&) {
      return refuse_request(io, af_error::resource_exhausted,
                            fmt::format("{} cannot allocate {} bytes for a push to '{}' (out of "
                                        "memory)",
                                        node_name_, h.payload_bytes, name),
                            h.payload_bytes, frame_ms, how);
    }
    if (h.payload_bytes > 0
        && read_timed(io, values.mutable_bytes(), h.payload_bytes, frame_ms, frame_ms, false)
             != read_end::done) {
      log::get()->warn("{} data plane: dropped {}: it stopped in the middle of a push to '{}'",
                       node_name_, peer, name);
      return false;
    }
  }
  auto r = caller(agg.actor, h.kind, h.reserved, h.version, std::move(who), std::move(values),
                  agg.wait);
  if (!r)
    return send_error(io, wire_code(r.error()), describe(r.error()));
  wire::header reply;
  reply.kind = static_cast<uint8_t>(wire::kind::reply);
  reply.version = r->first;
  const auto& params = r->second;
  if (!params.empty())
    wire::describe_tensor(params, reply); // rank 1
  return send_frame(io, reply, nullptr, params.empty() ? nullptr : params.bytes());
}

bool data_plane_server::serve_edge(const data_link& io, const std::string& peer,
                                   const wire::header& h, const std::string& name) {
  auto frame_ms = static_cast<int>(timeouts_.frame.count());
  // Checked before anything is allocated: a value for an executor this node
  // does not have, or over the limit, cannot make the node take its memory.
  std::string refusal;
  af_error code = af_error::invalid_argument;
  wire::edge_prefix pre;
  std::string device;
  executor_actor exec;
  if (name.size() < sizeof(pre)) {
    refusal = fmt::format("an edge frame whose name of {} bytes is shorter than its {}-byte prefix "
                          "(graph, sent time, op, token); is the sender of another actorflow "
                          "version?",
                          name.size(), sizeof(pre));
  } else {
    std::memcpy(&pre, name.data(), sizeof(pre));
    device = name.substr(sizeof(pre));
    exec = dir_->get_executor(device);
    if (!exec) {
      code = af_error::not_found;
      refusal = fmt::format("no executor '{}' on {}; a value for it was sent to the wrong node, or "
                            "the node restarted",
                            device, node_name_);
    } else if (h.payload_bytes > static_cast<uint64_t>(timeouts_.max_message_bytes)) {
      code = af_error::resource_exhausted;
      refusal = fmt::format("the value of op {} for '{}': a payload of {} bytes is over {}'s limit "
                            "of {} bytes per message ([node] max_message_bytes)",
                            pre.op, device, h.payload_bytes, node_name_,
                            timeouts_.max_message_bytes);
    } else if (!h.has_tensor) {
      refusal = fmt::format("the value of op {} for '{}': an edge frame without a tensor "
                            "(has_tensor = 0); an edge carries the producer's tensor",
                            pre.op, device);
    }
  }
  // Refusals are logged per connection: the first, then a count every 10 s
  // (one connection serves on one thread).
  thread_local std::string log_peer;
  thread_local refusal_log refusals;
  auto log_refusal = [&](const std::string& why) {
    if (log_peer != peer) {
      log_peer = peer;
      refusals = refusal_log{};
    }
    uint64_t skipped = 0;
    if (refusals.due(skipped))
      log::get()->warn("{} data plane: refused an edge from {}: {}{}", node_name_, peer, why,
                       skipped == 0 ? std::string{}
                                    : fmt::format(" (and {} other edge(s) of it since the last "
                                                  "such line)",
                                                  skipped));
  };
  read_end how = read_end::done;
  if (!refusal.empty()) {
    log_refusal(refusal);
    return refuse_request(io, code, refusal, h.payload_bytes, frame_ms, how);
  }
  // The executor's edge bytes not yet taken by a running step (values it
  // has not handled, values of steps whose run_step has not come) stay
  // within 2 x max_message_bytes: over it the edge waits up to a frame's
  // timeout for room (back-pressure on a busy executor), then is refused
  // before anything is allocated. The executor gives the bytes back.
  auto held = edge_bytes_of(caf::actor_cast<caf::actor_addr>(exec), false);
  auto need = static_cast<int64_t>(h.payload_bytes);
  if (held) {
    auto budget = 2 * timeouts_.max_message_bytes;
    auto until = std::chrono::steady_clock::now() + timeouts_.frame;
    auto pause = std::chrono::milliseconds{1};
    while (!reserve_edge_bytes(*held, need, budget)) {
      if (std::chrono::steady_clock::now() >= until) {
        refusal = fmt::format("the value of op {} for '{}': {} holds {} bytes of values for it "
                              "that no running step has taken, and {} more would pass its budget "
                              "of {} bytes (2 x [node] max_message_bytes); the executor is busy, "
                              "or a sender is ahead of its steps",
                              pre.op, device, node_name_, held->load(), need, budget);
        log_refusal(refusal);
        return refuse_request(io, af_error::resource_exhausted, refusal, h.payload_bytes,
                              frame_ms, how);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds{20});
    }
  }
  auto give_back = [&] {
    if (held)
      release_edge_bytes(*held, need);
  };
  tensor value;
  if (h.has_tensor) {
    try {
      value.reset(static_cast<dtype>(h.dtype), wire::shape_of(h));
    } catch (const std::bad_alloc&) {
      give_back();
      return refuse_request(io, af_error::resource_exhausted,
                            fmt::format("{} cannot allocate {} bytes for the value of op {} for "
                                        "'{}' (out of memory)",
                                        node_name_, h.payload_bytes, pre.op, device),
                            h.payload_bytes, frame_ms, how);
    }
    if (h.payload_bytes > 0
        && read_timed(io, value.mutable_bytes(), h.payload_bytes, frame_ms, frame_ms, false)
             != read_end::done) {
      give_back();
      log::get()->warn("{} data plane: dropped {}: it stopped in the middle of the value of op {} "
                       "for '{}'",
                       node_name_, peer, pre.op, device);
      return false;
    }
  }
  // The receiving executor learns the way the value came, for the trace.
  // (UCX first: after its offer the frames go over it, the TLS stream kept only for liveness.)
  std::string path = "data plane ("
                     + (io.ucx != nullptr ? io.ucx->transport()
                        : io.shm != nullptr ? std::string{"shared memory"}
                        : io.tls != nullptr ? std::string{"tls"}
                                            : std::string{"tcp"})
                     + ") from " + peer;
  // A local message: the executor shares the buffer just read, no copy.
  // The executor checks the graph's token (in constant time) before it
  // takes the value, and logs a wrong one with `path`; the ack below is the
  // same either way, so a sender learns nothing of the token from it.
  caf::anon_send(exec, edge_atom::value, pre.graph, h.version, pre.op, std::move(value),
                 pre.sent_ns, std::move(path),
                 std::string(reinterpret_cast<const char*>(pre.token), sizeof(pre.token)));
  wire::header reply;
  reply.kind = static_cast<uint8_t>(wire::kind::reply);
  return send_frame(io, reply, nullptr, nullptr);
}

} // namespace af
