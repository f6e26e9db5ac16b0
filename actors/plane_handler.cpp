/// The node's side of the data plane's requests (net/plane_handler.hpp):
/// variable_directory's plane_handler. A variable op is applied to the
/// variable's cell right on the connection's thread (no actor hop), a push
/// or pull goes to its aggregator through the directory's aggregator_call
/// (a sparse push, in the common case, is taken right here by the
/// aggregator's own path, plane_push_paths::sparse), an edge value to its
/// executor as a local message. Each checks its frame
/// before anything is allocated for the payload, and reads the payload
/// straight into the tensor it hands on.
#include "actors/variable_directory.hpp"
#include "actors/edge_budget.hpp"
#include "actors/plane_bf16.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include <sys/uio.h>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "core/log.hpp"
#include "messages/error.hpp"
#include "train/optimizer.hpp"

namespace af {

namespace {

/// Lets go of the variables' buffers that `parts` shares (their next update
/// then writes in place), keeping the tensors' shapes' storage (a
/// copy-assignment of an empty tensor): no allocation when they are filled
/// again.
void release_parts(answer_parts& parts) {
  static const tensor none;
  for (auto& t : parts.values)
    t = none;
}

/// The reply header of a push: the global step after it, whether a sync
/// push was dropped as late, and the aggregator's own bits (`flags`:
/// whole_pushes).
wire::header push_reply(uint64_t global_step, bool dropped_late, uint16_t flags = 0) {
  wire::header reply;
  reply.version = global_step;
  reply.reserved = flags;
  if (dropped_late)
    reply.reserved |= wire::reply_flags::dropped_late;
  return reply;
}

/// The bits `agg` asks its push replies to carry (plane_push_paths::reply_flags).
uint16_t push_flags(const variable_directory::aggregator_entry& agg) {
  return agg.paths && agg.paths->reply_flags
           ? agg.paths->reply_flags->load(std::memory_order_relaxed)
           : uint16_t{0};
}

/// A push's reply whose parameters are the variables' own tensors
/// (answer_parts, filled by the aggregator): written one after the other
/// into the answer slot or the socket, the same bytes as the flat tensor
/// (rank 1, the variables in the spec's order), with no copy of its own.
/// Parts that hold nothing (an aggregator with tables answers no
/// parameters) make a reply without a payload.
///
/// Why the bytes cannot change while they are written: each part shares
/// its variable's buffer, and a variable's update writes in place only when
/// no one else holds that buffer (variable_cell::apply_gradient_by: copy on
/// write). The parts are let go only after their last byte went into the
/// slot or the socket, so an update meanwhile (async: another worker's
/// push; a sync round released without this worker) writes a new buffer.
/// In a sync round the next update needs this worker's next push, which
/// comes after its answer: on shared memory the parts are let go before the
/// header that tells the worker its answer is in the slot, so that update
/// always finds the buffer free and writes in place, as before (over TCP,
/// almost always: the thread lets go as its last send returns).
bool reply_parts(plane_request& req, wire::header& reply, answer_parts& parts) {
  thread_local std::vector<iovec> pieces; // one per variable, reused: no allocation per reply
  pieces.clear();
  uint64_t floats = 0;
  for (const auto& t : parts.values)
    if (!t.empty() && t.nbytes() > 0) {
      pieces.push_back({const_cast<std::byte*>(t.bytes()), t.nbytes()});
      floats += t.num_elements();
    }
  bool ok;
  if (floats == 0) {
    ok = req.reply(reply, nullptr);
  } else if (plane_bf16::asked(req)) { // narrowed into a buffer of its own first
    ok = plane_bf16::reply(req, reply, pieces.data(), pieces.size(), floats,
                           [](void* p) { release_parts(*static_cast<answer_parts*>(p)); }, &parts);
  } else {
    reply.has_tensor = 1;
    reply.dtype = static_cast<uint8_t>(dtype::float32);
    reply.rank = 1;
    reply.dims[0] = static_cast<int64_t>(floats);
    reply.payload_bytes = floats * sizeof(float);
    // On shared memory the parts are let go once they are in the slot,
    // before the worker is told of its answer (plane_request::reply).
    ok = req.reply(reply, pieces.data(), pieces.size(),
                   [](void* p) { release_parts(*static_cast<answer_parts*>(p)); }, &parts);
  }
  release_parts(parts);
  return ok;
}

/// The answer to a push or pull (a streamed push's too: header and
/// parameters, then the trailer that says it committed).
bool answer_push(plane_request& req, variable_directory::aggregator_answer& r, bool streamed,
                 uint16_t flags) {
  auto reply = push_reply(r.global_step, r.dropped_late, flags);
  const auto& params = r.params;
  bool ok;
  if (params.empty() && r.parts) {
    ok = reply_parts(req, reply, *r.parts);
  } else {
    if (r.parts)
      release_parts(*r.parts); // a flat answer: any parts shared are let go
    if (!params.empty() && plane_bf16::asked(req)) {
      iovec flat{const_cast<std::byte*>(params.bytes()), params.nbytes()};
      ok = plane_bf16::reply(req, reply, &flat, 1, params.num_elements());
    } else if (!params.empty() && wire::describe_tensor(params, reply)) { // rank 1
      ok = req.reply(reply, params.bytes());
    } else {
      ok = req.reply(reply, nullptr);
    }
  }
  if (!ok || !streamed)
    return ok;
  wire::header trailer;
  trailer.version = r.global_step;
  trailer.reserved = reply.reserved;
  return req.reply(trailer, nullptr);
}

/// A dense push (wire::kind::push) taken on this thread, under the
/// aggregator's lock (plane_push_paths::dense), and answered: whether the
/// connection goes on. Nothing, and `values` untouched, where the push is
/// the actor's.
std::optional<bool> dense_on_plane(plane_request& req,
                                   const variable_directory::aggregator_entry& agg,
                                   push_credentials& who, tensor& values) {
  const auto& h = req.header();
  if (h.kind != static_cast<uint8_t>(wire::kind::push) || !agg.paths || !agg.paths->dense)
    return std::nullopt;
  auto sink = thread_answer_parts();
  who.parts = sink;
  auto direct = agg.paths->dense(h.reserved, h.version, who, values, agg.wait);
  who.parts = nullptr; // the sink is this thread's again (the actor's caller lends its own)
  if (!direct)
    return std::nullopt;
  if (!*direct)
    return req.reply_error(direct->error());
  auto& d = **direct;
  bool in_parts = d.params.empty(); // else flat: the parts could not take them
  variable_directory::aggregator_answer a{d.global_step, std::move(d.params), d.dropped_late,
                                          in_parts ? sink : nullptr};
  if (!in_parts)
    release_parts(*sink);
  return answer_push(req, a, false, push_flags(agg));
}

/// Why a variable op's operand does not fit `found` under `limits` (empty:
/// it fits), and the code to refuse it with.
std::string variable_refusal(const plane_request& req, const variable_directory::entry& found,
                             af_error& refusal_code) {
  const auto& h = req.header();
  const auto& name = req.name();
  const auto& limits = req.limits();
  const auto& node_name = req.node_name();
  std::string refusal;
  refusal_code = af_error::not_found;
  if (!found.cell) {
    refusal = "no variable '" + name + "' on " + node_name;
  } else if (h.payload_bytes > static_cast<uint64_t>(limits.max_message_bytes)) {
    refusal_code = af_error::resource_exhausted;
    refusal = fmt::format("{} of '{}': a payload of {} bytes is over {}'s limit of {} bytes per "
                          "message ([node] max_message_bytes)",
                          to_string(static_cast<var_op>(h.kind)), name, h.payload_bytes,
                          node_name, limits.max_message_bytes);
  } else if (h.has_tensor
             && h.payload_bytes > static_cast<uint64_t>(limits.max_variable_bytes)) {
    refusal_code = af_error::resource_exhausted;
    refusal = fmt::format("{} of '{}': a value of {} bytes is over {}'s limit of {} bytes per "
                          "variable ([node] max_variable_bytes)",
                          to_string(static_cast<var_op>(h.kind)), name, h.payload_bytes,
                          node_name, limits.max_variable_bytes);
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
  return refusal;
}

/// Why a push whose token is not its worker's is refused before its payload
/// is read (empty: the token is its worker's, or the aggregator has no
/// gate); logged at the 1st, 2nd, 4th, ... refusal.
std::string gate_refusal(const plane_request& req, const variable_directory::aggregator_entry& agg,
                         const std::string& name, uint32_t worker, const std::string& token) {
  if (!agg.gate || agg.gate->holds(worker, token))
    return {};
  auto msg =
    agg.gate->replaced(worker, token)
      ? fmt::format("aggregator '{}' refused a push for worker {} from data-plane peer {} "
                    "before reading its values: it carries the token worker {} had before its "
                    "index was joined again, by another process (a process taken as left while "
                    "it was stopped or cut off past connection_timeout_ms, whose --task another "
                    "one then took: this one no longer speaks for the index; check that one "
                    "process runs per --task) or by this one on another connection",
                    name, worker, req.peer(), worker)
      : fmt::format("aggregator '{}' refused a push for worker {} from data-plane peer {} "
                    "before reading its values: it does not carry the token that worker "
                    "joined with (a worker joins, and is given its token, before it pushes; "
                    "only the member that joined under an index speaks for it)",
                    name, worker, req.peer());
  uint64_t count = 0;
  if (agg.gate->count_refusal(count))
    log::get()->warn("{} data plane: {} ({} refused so far)", req.node_name(), msg, count);
  return msg;
}

} // namespace

bool variable_directory::variable_op(plane_request& req) {
  const auto& h = req.header();
  const auto& name = req.name();
  const auto& node_name = req.node_name();
  // The variable and the operand's fit are checked before anything is
  // allocated for the operand: a frame for a variable that does not exist,
  // or of another shape, or over a limit, cannot make the node take its
  // memory.
  auto found = get(name);
  af_error refusal_code = af_error::not_found;
  auto refusal = variable_refusal(req, found, refusal_code);
  if (!refusal.empty())
    return req.refuse(refusal_code, refusal);
  // Bytes that are no tensor (validate bounds them): skipped.
  if (!h.has_tensor && h.payload_bytes > 0 && !req.skip_payload())
    return false;
  tensor operand;
  if (h.has_tensor) {
    try {
      operand.reset(static_cast<dtype>(h.dtype), wire::shape_of(h));
    } catch (const std::bad_alloc&) {
      log::get()->warn("{} data plane: no memory for {} bytes of '{}' from {}", node_name,
                       h.payload_bytes, name, req.peer());
      // Answered; the connection goes on if its payload can be skipped.
      return req.refuse(af_error::resource_exhausted,
                        fmt::format("{} cannot allocate {} bytes for the operand of '{}' "
                                    "(out of memory)",
                                    node_name, h.payload_bytes, name));
    }
    // Straight from the connection into the operand's buffer.
    if (!req.read_payload(operand.mutable_bytes()))
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
                   fmt::format("{} ran out of memory applying {} to '{}' ({} bytes)", node_name,
                               to_string(static_cast<var_op>(h.kind)), name,
                               num_elements(found.cell->spec().shape)
                                 * static_cast<int64_t>(dtype_size(found.cell->spec().type))));
  }
  if (!r)
    return req.reply_error(r.error());
  if (r->first_value && found.actor)
    caf::anon_send(found.actor, released_atom::value); // its waiters: the actor's job
  wire::header reply;
  reply.version = r->version;
  const auto& value = r->value;
  if (!value.empty() && !wire::describe_tensor(value, reply))
    return req.reply_error(af_error::invalid_argument,
                           "variable '" + name + "' has rank "
                             + std::to_string(value.shape().size())
                             + "; the data plane carries rank <= 8");
  // Straight from the variable's buffer: `value` shares it, no copy.
  return req.reply(reply, value.empty() ? nullptr : value.bytes());
}

bool variable_directory::gather_rows(plane_request& req) {
  const auto& h = req.header();
  const auto& name = req.name();
  const auto& node_name = req.node_name();
  // Checked before anything is allocated for the ids.
  auto found = get(name);
  if (!found.cell)
    return req.refuse(af_error::not_found, "no variable '" + name + "' on " + node_name);
  auto type = static_cast<dtype>(h.dtype);
  if (!h.has_tensor || h.rank != 1 || (type != dtype::int32 && type != dtype::int64))
    return req.refuse(af_error::invalid_argument,
                      fmt::format("gather_rows of '{}': the ids are {}, expected a 1-D int32 or "
                                  "int64 tensor",
                                  name,
                                  h.has_tensor ? dtype_name(type) + shape_string(wire::shape_of(h))
                                               : std::string{"no tensor"}));
  if (h.payload_bytes > static_cast<uint64_t>(req.limits().max_message_bytes))
    return req.refuse(af_error::resource_exhausted,
                      fmt::format("gather_rows of '{}': {} bytes of ids are over {}'s limit of {} "
                                  "bytes per message ([node] max_message_bytes)",
                                  name, h.payload_bytes, node_name,
                                  req.limits().max_message_bytes));
  // The reply is n rows: a few bytes of ids must not make the node allocate
  // (and fill) rows over the limit a frame may carry (8 bytes of id name a
  // row of kilobytes), nor a reply no peer would accept.
  const auto& spec = found.cell->spec();
  unsigned __int128 row_bytes = dtype_size(spec.type);
  for (size_t d = 1; d < spec.shape.size(); ++d)
    row_bytes *= static_cast<uint64_t>(std::max<int64_t>(spec.shape[d], 0));
  const auto reply_bytes = static_cast<unsigned __int128>(h.dims[0]) * row_bytes;
  if (reply_bytes > static_cast<uint64_t>(req.limits().max_message_bytes))
    return req.refuse(af_error::resource_exhausted,
                      fmt::format("gather_rows of '{}': {} rows of {} bytes are over {}'s limit "
                                  "of {} bytes per message ([node] max_message_bytes); read "
                                  "them in smaller batches",
                                  name, h.dims[0], static_cast<uint64_t>(row_bytes), node_name,
                                  req.limits().max_message_bytes));
  tensor ids;
  try {
    ids.reset(type, wire::shape_of(h));
  } catch (const std::bad_alloc&) {
    return req.refuse(af_error::resource_exhausted,
                      fmt::format("{} cannot allocate {} bytes for the ids of '{}' (out of memory)",
                                  node_name, h.payload_bytes, name));
  }
  if (!req.read_payload(ids.mutable_bytes()))
    return false;
  // Every id checked, then only the rows named copied, under the cell's lock.
  auto r = found.cell->gather_rows(ids);
  if (!r)
    return req.reply_error(r.error());
  wire::header reply;
  reply.version = r->second;
  const auto& rows = r->first;
  if (!wire::describe_tensor(rows, reply))
    return req.reply_error(af_error::invalid_argument,
                           "the rows of '" + name + "' have rank "
                             + std::to_string(rows.shape().size())
                             + "; the data plane carries rank <= 8");
  return req.reply(reply, rows.bytes());
}

bool variable_directory::aggregate(plane_request& req) {
  const auto& h = req.header();
  const auto& frame_name = req.name();
  const auto& node_name = req.node_name();
  const auto& limits = req.limits();
  bool sparse = h.kind == static_cast<uint8_t>(wire::kind::push_sparse);
  bool streamed = h.kind == static_cast<uint8_t>(wire::kind::push_streamed);
  bool push = h.kind == static_cast<uint8_t>(wire::kind::push)
              || h.kind == static_cast<uint8_t>(wire::kind::push_params) || sparse || streamed;
  // A push's name starts with who it speaks for (wire::push_prefix): the
  // aggregator checks the token, and names this peer if it is refused.
  push_credentials who;
  bool short_prefix = push && frame_name.size() < sizeof(wire::push_prefix);
  bool prefixed = push && !short_prefix;
  std::string name = prefixed ? frame_name.substr(sizeof(wire::push_prefix)) : frame_name;
  if (prefixed) {
    wire::push_prefix pre;
    std::memcpy(&pre, frame_name.data(), sizeof(pre));
    who.token.assign(reinterpret_cast<const char*>(pre.token), sizeof(pre.token));
    who.seq = pre.seq;
  }
  // A sparse push names its peer only if it goes to the actor (push_sparse).
  if (sparse && !short_prefix)
    return push_sparse(req, name, std::move(who));
  who.from = "data-plane peer " + req.peer();
  static const aggregator_entry none; // no aggregator of that name: a null actor
  auto found = get_aggregator(name);
  const auto& agg = found ? *found : none;
  auto caller = aggregator_caller();
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
                          name, node_name);
  } else if (streamed && !req.plain_tcp()) {
    refusal = fmt::format("a streamed push (kind 15, [train] pipeline_sync or pipeline_async) "
                          "to aggregator '{}' over {}: it is served on a plaintext TCP data "
                          "plane only; push store-and-forward (kind 5) on this connection",
                          name, req.transport());
  } else if (h.payload_bytes > static_cast<uint64_t>(limits.max_message_bytes)) {
    code = af_error::resource_exhausted;
    refusal = fmt::format("{} to aggregator '{}': a payload of {} bytes is over {}'s limit of {} "
                          "bytes per message ([node] max_message_bytes)",
                          push ? "push" : "pull", name, h.payload_bytes, node_name,
                          limits.max_message_bytes);
  } else if (h.has_tensor && !push) {
    // A pull carries no values: saying "float32[650] values, expected
    // float32[650]" of one that did named the wrong fault.
    refusal = fmt::format("pull from aggregator '{}' carries {}{} values: a pull sends none (a "
                          "push sends values)",
                          name, dtype_name(static_cast<dtype>(h.dtype)),
                          shape_string(wire::shape_of(h)));
  } else if (push && !agg.table_rows.empty()) {
    // Its flat size counts the tables whole: "expected float32[N]" would
    // ask for the push it refuses.
    refusal = fmt::format("a dense {} to aggregator '{}', whose {} table(s) take sparse "
                          "gradients: send push_sparse (kind 12)",
                          h.kind == static_cast<uint8_t>(wire::kind::push) ? "push" : "push of "
                                                                                  "parameters",
                          name, agg.table_rows.size());
  } else if (h.has_tensor
             && ((static_cast<dtype>(h.dtype) != dtype::float32 && !plane_bf16::asked(req))
                 || h.rank != 1 || static_cast<uint64_t>(h.dims[0]) != agg.floats)) {
    code = af_error::shape_mismatch;
    refusal = fmt::format("push to aggregator '{}': {}{} values, expected float32[{}]{}", name,
                          plane_bf16::dtype_text(h.dtype), shape_string(wire::shape_of(h)),
                          agg.floats, plane_bf16::or_bf16(h.dtype));
  } else if (!h.has_tensor && h.payload_bytes > 0) {
    refusal = "a push or pull with a payload that is no tensor";
  } else if (push) {
    // A stranger's push is refused before the node allocates for it.
    refusal = gate_refusal(req, agg, name, h.reserved, who.token);
  }
  if (!refusal.empty())
    return req.refuse(code, refusal);
  // A streamed push in the common case joins the pipelined round; any other
  // is read whole and answered in the streamed reply's form below.
  if (streamed && h.has_tensor && agg.paths && agg.paths->streamed) {
    if (auto taken = agg.paths->streamed(h.reserved, h.version, who))
      return *taken ? stream_push(req, ***taken, name, agg) : req.refuse(taken->error());
  }
  tensor values;
  bool finite = true; // every float read so far
  auto stopped = [&] { // the peer stopped mid-push: the connection is dropped
    log::get()->warn("{} data plane: dropped {}: it stopped in the middle of a push to '{}'",
                     node_name, req.peer(), name);
    return false;
  };
  if (h.has_tensor && !plane_bf16::asked(req)) { // bf16 is widened as read: never in place
    // On shared memory the push is read in place, without a copy: each
    // piece checked as it arrives, then the aggregator reads the ring's
    // bytes (the connection takes its next frame once the push is dropped).
    bool ok = true;
    auto in_place = req.payload_in_place(true, sizeof(float), 256 << 10,
                                         [&](const std::byte* piece, size_t n) {
                                           if (finite) {
                                             size_t count = n / sizeof(float);
                                             const auto* f = reinterpret_cast<const float*>(piece);
                                             finite = train::first_non_finite(f, count) == count;
                                           }
                                         },
                                         ok);
    if (!ok)
      return stopped();
    if (in_place)
      values = tensor::over(dtype::float32, wire::shape_of(h), std::move(in_place));
  }
  if (h.has_tensor && values.empty()) {
    try {
      values.reset(dtype::float32, wire::shape_of(h));
    } catch (const std::bad_alloc&) {
      return req.refuse(af_error::resource_exhausted,
                        fmt::format("{} cannot allocate {} bytes for a push to '{}' (out of "
                                    "memory)",
                                    node_name, h.payload_bytes, name));
    }
    // Each piece is checked for non-finite floats as it arrives, in cache:
    // the aggregator then need not read the whole push once more for it.
    // The buffer read into: the check reads what arrived there (taken once:
    // a shared buffer would be copied by mutable_bytes()).
    auto* dst = values.mutable_bytes();
    const auto* floats = reinterpret_cast<const float*>(dst);
    auto check = [&](size_t offset, size_t n) {
      if (finite) {
        size_t count = n / sizeof(float);
        finite = train::first_non_finite(floats + offset / sizeof(float), count) == count;
      }
    };
    if (!(plane_bf16::asked(req) ? plane_bf16::read_push(req, values, finite)
               : req.read_payload(dst, true, 256 << 10, check)))
      return stopped();
  }
  who.finite_checked = h.has_tensor && finite;
  if (auto answered = dense_on_plane(req, agg, who, values)) // else the actor's
    return *answered;
  auto kind = streamed ? static_cast<uint8_t>(wire::kind::push) : h.kind;
  auto r = caller(agg.actor, kind, h.reserved, h.version, std::move(who), std::move(values),
                  agg.wait);
  if (!r)
    return req.reply_error(r.error());
  return answer_push(req, *r, streamed, push ? push_flags(agg) : uint16_t{0});
}

bool variable_directory::push_sparse(plane_request& req, const std::string& name,
                                     push_credentials who) {
  const auto& h = req.header();
  const auto& node_name = req.node_name();
  static const aggregator_entry none; // no aggregator of that name: a null actor
  auto found = get_aggregator(name);
  const auto& agg = found ? *found : none;
  auto caller = sparse_aggregator_caller();
  if (!agg.actor || !caller)
    return req.refuse(af_error::not_found,
                      fmt::format("no aggregator '{}' on {}; the chief creates it when the job "
                                  "starts",
                                  name, node_name));
  // A stranger's push is refused before the node allocates for it.
  if (auto refusal = gate_refusal(req, agg, name, h.reserved, who.token); !refusal.empty())
    return req.refuse(af_error::invalid_argument, refusal);
  if (h.payload_bytes > static_cast<uint64_t>(req.limits().max_message_bytes))
    return req.refuse(af_error::resource_exhausted,
                      fmt::format("sparse push to aggregator '{}': a payload of {} bytes is over "
                                  "{}'s limit of {} bytes per message ([node] max_message_bytes)",
                                  name, h.payload_bytes, node_name,
                                  req.limits().max_message_bytes));
  if (!h.has_tensor && h.payload_bytes > 0)
    return req.refuse(af_error::invalid_argument,
                      fmt::format("sparse push to aggregator '{}': a payload of {} bytes that is "
                                  "no tensor (has_tensor 0); a push's values are described as "
                                  "int32 words, an abstention carries none",
                                  name, h.payload_bytes));
  const size_t tables = agg.table_rows.size();
  if (tables == 0)
    return req.refuse(af_error::invalid_argument,
                      fmt::format("sparse push to aggregator '{}', which has no tables: push its "
                                  "gradients dense",
                                  name));
  sparse_push_values values;
  if (h.payload_bytes > 0) {
    // The counts first: with them the payload's size is known exactly, and
    // checked, before anything is allocated for the rows.
    // On the stack for the usual few tables: no allocation per push.
    std::array<uint64_t, 8> few{};
    std::vector<uint64_t> many(tables > few.size() ? tables : 0);
    uint64_t* counts = tables > few.size() ? many.data() : few.data();
    const uint64_t head = tables * sizeof(uint64_t);
    if (h.payload_bytes < head)
      return req.refuse(af_error::invalid_argument,
                        fmt::format("sparse push to aggregator '{}': a payload of {} bytes is "
                                    "shorter than its {} tables' counts",
                                    name, h.payload_bytes, tables));
    if (!req.read_part(counts, head))
      return false;
    // A push carries each row of a table once at most (a worker sums a
    // repeated id's gradients first): what a member's push may make this
    // node allocate is bounded by the tables it already holds (a stranger's
    // was refused above, at the gate).
    for (size_t t = 0; t < tables && t < agg.table_sizes.size(); ++t)
      if (counts[t] > static_cast<uint64_t>(agg.table_sizes[t]))
        return req.refuse(af_error::invalid_argument,
                          fmt::format("sparse push to aggregator '{}': {} rows of its table {}, "
                                      "which has {}: a push carries each row once at most "
                                      "(sum a repeated id's gradients first)",
                                      name, counts[t], t, agg.table_sizes[t]));
    unsigned __int128 want = head + agg.dense_floats * sizeof(float);
    for (size_t t = 0; t < tables; ++t)
      want += static_cast<unsigned __int128>(counts[t])
              * (sizeof(int64_t) + sizeof(float) * static_cast<uint64_t>(num_elements(agg.table_rows[t])));
    if (want != h.payload_bytes)
      return req.refuse(af_error::shape_mismatch,
                        fmt::format("sparse push to aggregator '{}': {} payload bytes, but {} "
                                    "dense floats and the rows its counts [{}] announce take {}",
                                    name, h.payload_bytes, agg.dense_floats,
                                    fmt::join(counts, counts + tables, ", "),
                                    static_cast<uint64_t>(want)));
    try {
      if (agg.dense_floats > 0)
        values.dense.emplace_back(dtype::float32,
                                  shape_type{static_cast<int64_t>(agg.dense_floats)});
      for (size_t t = 0; t < tables; ++t) {
        auto n = static_cast<int64_t>(counts[t]);
        shape_type row_shape{n};
        row_shape.insert(row_shape.end(), agg.table_rows[t].begin(), agg.table_rows[t].end());
        values.ids.emplace_back(dtype::int64, shape_type{n});
        values.rows.emplace_back(dtype::float32, std::move(row_shape));
      }
    } catch (const std::bad_alloc&) {
      return req.refuse(af_error::resource_exhausted,
                        fmt::format("{} cannot allocate {} bytes for a sparse push to '{}' (out "
                                    "of memory)",
                                    node_name, h.payload_bytes, name));
    }
    // Straight from the connection into each tensor's buffer.
    bool read = values.dense.empty() || req.read_part(values.dense[0].mutable_bytes(),
                                                      values.dense[0].nbytes(), true);
    for (size_t t = 0; read && t < tables; ++t)
      read = req.read_part(values.ids[t].mutable_bytes(), values.ids[t].nbytes(), true)
             && req.read_part(values.rows[t].mutable_bytes(), values.rows[t].nbytes(), true);
    if (!read) {
      log::get()->warn("{} data plane: dropped {}: it stopped in the middle of a sparse push to "
                       "'{}'",
                       node_name, req.peer(), name);
      return false;
    }
  }
  // The aggregator checks every id and every float before anything changes:
  // the common push right here, under its lock (plane_push_paths::sparse),
  // any other in its actor.
  if (agg.paths && agg.paths->sparse) {
    if (auto direct = agg.paths->sparse(h.reserved, h.version, who, values, agg.wait)) {
      if (!*direct)
        return req.reply_error(direct->error());
      auto reply = push_reply((*direct)->global_step, (*direct)->dropped_late);
      return req.reply(reply, nullptr);
    }
  }
  who.from = "data-plane peer " + req.peer();
  auto r = caller(agg.actor, h.reserved, h.version, std::move(who), std::move(values), agg.wait);
  if (!r)
    return req.reply_error(r.error());
  auto reply = push_reply(r->global_step, r->dropped_late);
  return req.reply(reply, nullptr);
}

namespace {

/// Refusals of edges are logged per connection: the first, then a count
/// every 10 s (one connection serves on one thread).
void log_edge_refusal(const plane_request& req, const std::string& why) {
  thread_local std::string log_peer;
  thread_local refusal_log refusals;
  if (log_peer != req.peer()) {
    log_peer = req.peer();
    refusals = refusal_log{};
  }
  uint64_t skipped = 0;
  if (refusals.due(skipped))
    log::get()->warn("{} data plane: refused an edge from {}: {}{}", req.node_name(), req.peer(),
                     why,
                     skipped == 0 ? std::string{}
                                  : fmt::format(" (and {} other edge(s) of it since the last "
                                                "such line)",
                                                skipped));
}

/// Why an edge frame is refused before its executor is asked for room
/// (empty: it is not); `pre`, `device` and `exec` are set as far as the
/// frame names them.
std::string edge_refusal(const variable_directory& dir, const plane_request& req,
                         wire::edge_prefix& pre, std::string& device, executor_actor& exec,
                         af_error& code) {
  const auto& h = req.header();
  const auto& name = req.name();
  code = af_error::invalid_argument;
  if (name.size() < sizeof(pre))
    return fmt::format("an edge frame whose name of {} bytes is shorter than its {}-byte prefix "
                       "(graph, sent time, op, token); is the sender of another actorflow "
                       "version?",
                       name.size(), sizeof(pre));
  std::memcpy(&pre, name.data(), sizeof(pre));
  device = name.substr(sizeof(pre));
  exec = dir.get_executor(device);
  if (!exec) {
    code = af_error::not_found;
    return fmt::format("no executor '{}' on {}; a value for it was sent to the wrong node, or "
                       "the node restarted",
                       device, req.node_name());
  }
  if (h.payload_bytes > static_cast<uint64_t>(req.limits().max_message_bytes)) {
    code = af_error::resource_exhausted;
    return fmt::format("the value of op {} for '{}': a payload of {} bytes is over {}'s limit "
                       "of {} bytes per message ([node] max_message_bytes)",
                       pre.op, device, h.payload_bytes, req.node_name(),
                       req.limits().max_message_bytes);
  }
  if (!h.has_tensor)
    return fmt::format("the value of op {} for '{}': an edge frame without a tensor "
                       "(has_tensor = 0); an edge carries the producer's tensor",
                       pre.op, device);
  return {};
}

} // namespace

bool variable_directory::edge(plane_request& req) {
  const auto& h = req.header();
  const auto& node_name = req.node_name();
  const auto& limits = req.limits();
  // Checked before anything is allocated: a value for an executor this node
  // does not have, or over the limit, cannot make the node take its memory.
  af_error code = af_error::invalid_argument;
  wire::edge_prefix pre;
  std::string device;
  executor_actor exec;
  auto refusal = edge_refusal(*this, req, pre, device, exec, code);
  if (!refusal.empty()) {
    log_edge_refusal(req, refusal);
    return req.refuse(code, refusal);
  }
  // The executor's edge bytes not yet taken by a running step (values it
  // has not handled, values of steps whose run_step has not come) stay
  // within 2 x max_message_bytes: over it the edge waits up to a frame's
  // timeout for room (back-pressure on a busy executor), then is refused
  // before anything is allocated. The executor gives the bytes back.
  auto held = edge_bytes_of(caf::actor_cast<caf::actor_addr>(exec), false);
  auto need = static_cast<int64_t>(h.payload_bytes);
  if (held) {
    auto budget = 2 * limits.max_message_bytes;
    auto until = std::chrono::steady_clock::now() + limits.frame;
    auto pause = std::chrono::milliseconds{1};
    while (!reserve_edge_bytes(*held, need, budget)) {
      if (std::chrono::steady_clock::now() >= until) {
        refusal = fmt::format("the value of op {} for '{}': {} holds {} bytes of values for it "
                              "that no running step has taken, and {} more would pass its budget "
                              "of {} bytes (2 x [node] max_message_bytes); the executor is busy, "
                              "or a sender is ahead of its steps",
                              pre.op, device, node_name, held->load(), need, budget);
        log_edge_refusal(req, refusal);
        return req.refuse(af_error::resource_exhausted, refusal);
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
  try {
    value.reset(static_cast<dtype>(h.dtype), wire::shape_of(h));
  } catch (const std::bad_alloc&) {
    give_back();
    return req.refuse(af_error::resource_exhausted,
                      fmt::format("{} cannot allocate {} bytes for the value of op {} for "
                                  "'{}' (out of memory)",
                                  node_name, h.payload_bytes, pre.op, device));
  }
  if (!req.read_payload(value.mutable_bytes(), true)) {
    give_back();
    log::get()->warn("{} data plane: dropped {}: it stopped in the middle of the value of op {} "
                     "for '{}'",
                     node_name, req.peer(), pre.op, device);
    return false;
  }
  // The receiving executor learns the way the value came, for the trace.
  std::string path = "data plane (" + req.transport() + ") from " + req.peer();
  // A local message: the executor shares the buffer just read, no copy.
  // The executor checks the graph's token (in constant time) before it
  // takes the value, and logs a wrong one with `path`; the ack below is the
  // same either way, so a sender learns nothing of the token from it.
  caf::anon_send(exec, edge_atom::value, pre.graph, h.version, pre.op, std::move(value),
                 pre.sent_ns, std::move(path),
                 std::string(reinterpret_cast<const char*>(pre.token), sizeof(pre.token)));
  wire::header reply;
  return req.reply(reply, nullptr);
}

} // namespace af
