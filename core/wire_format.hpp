#pragma once
/// The tensor data plane's frame: how variable ops and their tensors travel
/// between a session and a remote node, beside CAF's control plane.
///
/// A frame is a fixed 96-byte header, then `name_len` bytes of variable name
/// (requests only), then `payload_bytes` of payload: a tensor's raw bytes, or
/// on an error reply the error's text. Integers are in host byte order (x86
/// clusters, like CAF's apply_raw blobs). The header is decoded defensively:
/// `validate` rejects anything a peer could get wrong or forge.

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "core/variable_spec.hpp"

namespace af::wire {

constexpr uint32_t magic = 0x50444641; // "AFDP"
constexpr uint8_t max_rank = 8;
constexpr uint32_t max_name = 4096;

/// A frame's kind byte. A request's is its var_op (core/variable_spec.hpp);
/// the request names below are those values, for code that builds frames.
enum class kind : uint8_t {
  read = 1,
  assign = 2,
  assign_add = 3,
  assign_sub = 4,
  /// Training (messages/aggregator.hpp): the name is an aggregator's (a
  /// push's: a push_prefix, then the aggregator's name), `version` the
  /// worker's step, `reserved` the worker's index, the payload one flat
  /// float32 tensor (gradients or parameters; none for pull). The reply's
  /// `version` is the global step, its payload the flat parameters.
  push = 5,
  pull = 6,
  push_params = 7,  ///< as push, the payload parameters (average), not gradients
  /// The client offers shared memory (net/shm_ring.hpp): the name is the
  /// segment's, `version` its size, no payload. The reply's `version` is 1
  /// if the node took it (every later frame goes through its rings), else 0.
  shm_offer = 8,
  /// A value for another partition's executor (model parallelism; actors/
  /// executor.hpp): `version` is the step, the name an edge_prefix (with the
  /// graph's token) followed by the consumer executor's full device name, the
  /// payload the tensor.
  /// The reply is an empty ack, or an error (not_found: no such executor).
  edge = 9,
  /// The client offers UCX (net/ucx_link.hpp; a peer on another host of a
  /// trusted fabric): the payload is its UCP worker's address (in
  /// ucx_link's envelope, at most 64 KiB), no name. The reply's `version` is
  /// 1 if the node took it, its payload then the node's worker address
  /// (every later frame goes over UCX), else 0 and no payload.
  ucx_offer = 10,
  /// The rows of a table (messages/variable.hpp's gather): the name is the
  /// variable's, the payload its ids (a 1-D int32 or int64 tensor). The
  /// reply's `version` is the variable's, its payload the rows [n] +
  /// shape[1:]: only the rows named cross the wire.
  gather_rows = 11,
  /// A sparse push (messages/aggregator.hpp's push, sparse): named, numbered
  /// and addressed as push, the payload (described as int32[payload_bytes /
  /// 4], so that validate bounds it as a tensor) the dense variables' floats
  /// and each table's (ids, rows): docs/wire.md ("Sparse push"). No payload:
  /// an abstention. The reply's `version` is the global step, `reserved`
  /// reply_flags, and it carries no parameters.
  push_sparse = 12,
  /// Padding on a shared-memory connection (net/shm_ring.hpp): no name, no
  /// tensor, a payload of fewer than 64 bytes that the reader skips, and no
  /// reply. A writer puts one before a frame whose tensor payload would
  /// otherwise not start at a multiple of 64 bytes of the ring, so that the
  /// reader can use the payload in place (docs/wire.md "Shared memory").
  shm_pad = 13,
  /// Several reads of one node's variables in one frame (a sparse step's
  /// phase to one ps: every shard's rows and every dense value it needs):
  /// no name, the payload (described as int32[payload_bytes / 4], as
  /// push_sparse's) a gather_many_request, then the parts' names, then
  /// their ids. The reply's payload is a gather_many_reply, then each
  /// part's bytes at a multiple of 64 bytes of the payload. Any part
  /// refused refuses the frame, naming the part (docs/wire.md "gather_many").
  gather_many = 14,
  /// A dense sync push streamed (docs/wire.md "A pipelined sync round"):
  /// framed, named and numbered as push, but the node may answer while it
  /// still reads: a reply header (status ok, payload the parameters' size,
  /// version the round's new global step), the parameters chunk by chunk,
  /// then a trailer: a reply without a payload if the round committed, else
  /// an error reply naming why (the worker drops what it read). A push
  /// refused before its answer started gets one error reply, no trailer.
  /// Plain TCP only ([train] pipeline_sync).
  push_streamed = 15,
  reply = 16,
};

/// The dtype byte of a tensor sent as bfloat16 (core/bf16.hpp; [train]
/// wire_dtype = "bf16"): 2 bytes an element. A wire-only code, not one of
/// core/tensor.hpp's dtypes (14 is TensorFlow's DT_BFLOAT16; the runtime's
/// own codes stay 0 to 3 and may grow from 4). Only a dense push (kind
/// push: the gradients) and a reply (the parameters, to a push that came in
/// bf16) may carry it: validate refuses it on any other frame. A node of a
/// build before it refuses the frame as "unknown dtype code 14", never
/// reads 2-byte elements as 4-byte ones.
constexpr uint8_t bf16_dtype = 14;

/// True if `k` is a request to an aggregator (push_sparse included).
constexpr bool aggregator_kind(uint8_t k) {
  return k == static_cast<uint8_t>(kind::push) || k == static_cast<uint8_t>(kind::pull)
         || k == static_cast<uint8_t>(kind::push_params)
         || k == static_cast<uint8_t>(kind::push_sparse)
         || k == static_cast<uint8_t>(kind::push_streamed);
}

static_assert(static_cast<uint8_t>(kind::read) == static_cast<uint8_t>(var_op::read)
                && static_cast<uint8_t>(kind::assign) == static_cast<uint8_t>(var_op::assign)
                && static_cast<uint8_t>(kind::assign_add) == static_cast<uint8_t>(var_op::assign_add)
                && static_cast<uint8_t>(kind::assign_sub) == static_cast<uint8_t>(var_op::assign_sub),
              "a request frame's kind byte is its var_op");
static_assert(!valid_var_op(static_cast<uint8_t>(kind::reply)), "a reply is no var_op");

/// The fixed start of an edge frame's name (then the device name).
struct edge_prefix {
  uint64_t graph = 0;
  int64_t sent_ns = 0; ///< the producer's steady clock as it sent
  int32_t op = -1;     ///< the producing op's graph id
  uint32_t reserved = 0;
  /// The graph's secret (partition::edge_token): the consumer's executor
  /// takes the value only if it matches the token it registered the graph with.
  uint8_t token[16] = {};
};
static_assert(sizeof(edge_prefix) == 40, "an edge frame's name starts with 40 bytes");

/// The fixed start of a push frame's name (then the aggregator's name): the
/// token the worker's join was answered with, and the push's number
/// (messages/aggregator.hpp's push_credentials).
struct push_prefix {
  unsigned char token[16] = {};
  uint64_t seq = 0;
};
static_assert(sizeof(push_prefix) == 24, "a push frame's name starts with 24 bytes");

/// A gather_many frame's parts: at most this many (a step asks one ps for a
/// part per table shard and dense variable it holds).
constexpr uint32_t max_gather_parts = 256;

/// What one part of a gather_many asks for.
enum class gather_part_kind : uint32_t {
  rows = 0,  ///< the rows of a table by id (as gather_rows): `count` int64 ids
  value = 1, ///< the whole value of a variable (as read): `count` 0
};

/// One part of a gather_many request, after the payload's first 8 bytes
/// (uint32 parts, uint32 0): then the names, then zero bytes to a multiple
/// of 8, then each rows part's int64 ids, in the parts' order.
struct gather_part {
  uint32_t name_len = 0;
  uint32_t what = 0; ///< a gather_part_kind
  uint64_t count = 0;
};
static_assert(sizeof(gather_part) == 16, "a gather_many part is described in 16 bytes");

/// One part of a gather_many reply, after the payload's first 8 bytes
/// (uint32 parts, uint32 0): its tensor and the variable's version. The
/// parts' bytes follow the descriptions, each at the next multiple of 64
/// bytes of the payload (gather_many_offsets), so that a reader can use
/// them in place.
struct gathered_part {
  uint8_t dtype = 0;
  uint8_t rank = 0;
  uint8_t reserved[6] = {};
  uint64_t version = 0;
  uint64_t bytes = 0;
  int64_t dims[max_rank] = {};
};
static_assert(sizeof(gathered_part) == 88, "a gather_many reply part is described in 88 bytes");

/// Where a gather_many reply's part bytes start: the first at the first
/// multiple of 64 after the descriptions, each next one at the multiple of
/// 64 after the one before. `bytes[i]` the parts' sizes; the last entry of
/// the result is the payload's size (the last part's end, up to a multiple
/// of 8).
std::vector<uint64_t> gather_many_offsets(const std::vector<uint64_t>& bytes);

/// The kind byte of a request for `op`.
constexpr uint8_t request_kind(var_op op) {
  return static_cast<uint8_t>(op);
}

struct header {
  uint32_t magic = wire::magic;
  uint8_t kind = 0;
  uint8_t want_value = 0; ///< requests: send the value after the update back
  uint8_t has_tensor = 0; ///< payload is a tensor of dtype/rank/dims
  uint8_t dtype = 0;
  uint8_t rank = 0;
  uint8_t status = 0;     ///< replies: 0 = ok, else an af_error code (check valid_af_error)
  /// push / pull: the worker's index; a push's reply: reply_flags
  uint16_t reserved = 0;
  uint32_t name_len = 0;
  uint64_t version = 0;   ///< replies: the variable's version; variable-op requests: the
                          ///< request id (0: none; an update is applied once per id)
  uint64_t payload_bytes = 0;
  int64_t dims[max_rank] = {};
};

/// Bits of a push's reply's `reserved`. A node older than the flag sends 0.
namespace reply_flags {
/// sync: the push was dropped as late (its step had closed without it): the
/// worker asks `closed` before its next pushes (dist/worker.hpp).
constexpr uint16_t dropped_late = 1;
/// The aggregator asks for the worker's next dense sync push whole (kind 5),
/// not streamed: its pipeline_sync = "auto" found store-and-forward rounds
/// faster (dist/pipeline_tuner.hpp). Without it a worker that streams goes on.
constexpr uint16_t whole_pushes = 2;
} // namespace reply_flags

static_assert(sizeof(header) == 96, "the frame header is 96 bytes on the wire");

/// Fills dtype/rank/dims/payload_bytes for `t`; false if its rank is too high.
bool describe_tensor(const tensor& t, header& h);

/// Empty if `h` is well formed, else what is wrong with it. A bf16 tensor
/// (bf16_dtype) is well formed only on a push or a reply, its payload 2
/// bytes per element of its shape.
std::string validate(const header& h);

/// Bytes per element of dtype byte `code` (2 for bf16_dtype; 0 if unknown).
size_t element_bytes(uint8_t code);

/// The shape in `h` (after validate).
shape_type shape_of(const header& h);

} // namespace af::wire
