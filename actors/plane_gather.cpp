// The data plane's gather_many (core/wire_format.hpp, kind 14; docs/wire.md
// "gather_many"): every read a sparse step makes of one ps (each table
// shard's rows by id, each dense variable's value) in one frame and one
// reply. One frame instead of one per variable saves the ps a header, name
// and payload read and a reply write per variable, and the worker as many
// sends and reads: on loopback those system calls, not the bytes, were most
// of a sparse step's cost.
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "actors/variable_directory.hpp"
#include "core/log.hpp"
#include "messages/error.hpp"
#include "net/data_link.hpp"

namespace af {

namespace {

/// One part of a request, parsed: its variable's name and, for rows, its
/// ids (int64, in the request's buffer).
struct part_ask {
  std::string_view name;
  wire::gather_part_kind what = wire::gather_part_kind::rows;
  const int64_t* ids = nullptr;
  uint64_t count = 0;
};

/// The parts of the request payload `p` (`bytes` long, 8-byte aligned), or
/// why it is not one. Every length is checked against the payload before
/// it is used, and the payload must be exactly what its parts describe.
std::string parse_parts(const std::byte* p, uint64_t bytes, std::vector<part_ask>& out) {
  out.clear();
  if (bytes < 8)
    return fmt::format("a payload of {} bytes (at least 8)", bytes);
  uint32_t parts = 0;
  std::memcpy(&parts, p, sizeof(parts));
  if (parts == 0 || parts > wire::max_gather_parts)
    return fmt::format("{} parts (1 to {})", parts, wire::max_gather_parts);
  uint64_t at = 8 + sizeof(wire::gather_part) * uint64_t{parts};
  if (at > bytes)
    return fmt::format("{} parts described in {} bytes", parts, bytes);
  unsigned __int128 names = 0, ids = 0;
  out.resize(parts);
  for (uint32_t i = 0; i < parts; ++i) {
    wire::gather_part d;
    std::memcpy(&d, p + 8 + sizeof(d) * i, sizeof(d));
    if (d.what > static_cast<uint32_t>(wire::gather_part_kind::value))
      return fmt::format("part {} of kind {} (0: rows, 1: a value)", i, d.what);
    auto what = static_cast<wire::gather_part_kind>(d.what);
    if (d.name_len == 0 || d.name_len > wire::max_name)
      return fmt::format("part {} names a variable of {} bytes (1 to {})", i, d.name_len,
                         wire::max_name);
    if (what == wire::gather_part_kind::value && d.count != 0)
      return fmt::format("part {} reads a value with {} ids", i, d.count);
    if (what == wire::gather_part_kind::rows && d.count == 0)
      return fmt::format("part {} asks for no rows", i);
    if (d.count > bytes / sizeof(int64_t))
      return fmt::format("part {} announces {} ids in a payload of {} bytes", i, d.count, bytes);
    out[i].what = what;
    out[i].count = d.count;
    names += d.name_len;
    ids += d.count;
  }
  unsigned __int128 need = at + (names + 7) / 8 * 8 + ids * sizeof(int64_t);
  if (need != bytes)
    return fmt::format("a payload of {} bytes where its parts need {}", bytes,
                       static_cast<uint64_t>(std::min<unsigned __int128>(need, UINT64_MAX)));
  const auto* name = reinterpret_cast<const char*>(p + at);
  const auto* id = reinterpret_cast<const int64_t*>(p + at + (static_cast<uint64_t>(names) + 7) / 8 * 8);
  for (uint32_t i = 0; i < parts; ++i) {
    wire::gather_part d;
    std::memcpy(&d, p + 8 + sizeof(d) * i, sizeof(d));
    out[i].name = std::string_view{name, d.name_len};
    name += d.name_len;
    if (out[i].what == wire::gather_part_kind::rows) {
      out[i].ids = id;
      id += d.count;
    }
  }
  return {};
}

/// Buffers a data-plane thread reuses from request to request (no
/// allocation per step); given back once one grew past `keep` bytes.
struct gather_buffers {
  static constexpr size_t keep = size_t{4} << 20;
  std::vector<uint64_t> in; ///< the request's payload, 8-byte aligned for its ids
  std::vector<std::byte> out;
  std::vector<part_ask> asks;
  void trim() {
    if (in.capacity() * sizeof(uint64_t) > keep)
      std::vector<uint64_t>{}.swap(in);
    if (out.capacity() > keep)
      std::vector<std::byte>{}.swap(out);
  }
};

/// A value part: `cell`'s value copied to `dst` (`size` bytes, as its
/// spec says); the version it was read at.
caf::expected<uint64_t> read_value_into(variable_cell& cell, std::byte* dst, uint64_t size,
                                        const std::string& node_name) {
  caf::expected<variable_cell::applied> r{caf::error{}};
  try {
    r = cell.apply(var_op::read, tensor{}, true, 0);
  } catch (const std::bad_alloc&) {
    r = make_error(af_error::resource_exhausted, node_name + " ran out of memory");
  }
  if (!r)
    return std::move(r.error());
  if (r->value.nbytes() != size)
    return make_error(af_error::internal,
                      fmt::format("the value of '{}' is {}, expected {} bytes",
                                  cell.spec().name, r->value.summary(), size));
  if (size > 0)
    std::memcpy(dst, r->value.bytes(), size);
  return r->version;
}

} // namespace

bool variable_directory::gather_many(plane_request& req) {
  const auto& h = req.header();
  const auto& node_name = req.node_name();
  const auto& limits = req.limits();
  if (!h.has_tensor || static_cast<dtype>(h.dtype) != dtype::int32 || h.rank != 1
      || !req.name().empty() || h.payload_bytes % 8 != 0)
    return req.refuse(af_error::invalid_argument,
                      fmt::format("gather_many from {}: a frame with {} a name and a payload of "
                                  "{} bytes, described as {}; expected no name and int32 words, "
                                  "a multiple of 8 bytes (docs/wire.md \"gather_many\")",
                                  req.peer(), req.name().empty() ? "no" : "", h.payload_bytes,
                                  h.has_tensor ? dtype_name(static_cast<dtype>(h.dtype))
                                                   + shape_string(wire::shape_of(h))
                                               : std::string{"no tensor"}));
  if (h.payload_bytes > static_cast<uint64_t>(limits.max_message_bytes))
    return req.refuse(af_error::resource_exhausted,
                      fmt::format("gather_many: {} bytes of request are over {}'s limit of {} "
                                  "bytes per message ([node] max_message_bytes)",
                                  h.payload_bytes, node_name, limits.max_message_bytes));
  thread_local gather_buffers buf;
  struct trim_after {
    ~trim_after() { buf.trim(); }
  } trim;
  try {
    buf.in.resize(h.payload_bytes / 8);
  } catch (const std::bad_alloc&) {
    return req.refuse(af_error::resource_exhausted,
                      fmt::format("{} cannot allocate {} bytes for a gather_many (out of memory)",
                                  node_name, h.payload_bytes));
  }
  if (!req.read_payload(buf.in.data()))
    return false;
  const auto* payload = reinterpret_cast<const std::byte*>(buf.in.data());
  auto problem = parse_parts(payload, h.payload_bytes, buf.asks);
  if (!problem.empty())
    return req.reply_error(af_error::invalid_argument,
                           fmt::format("gather_many from {}: {}", req.peer(), problem));
  const auto& asks = buf.asks;
  // Each part's variable and size, checked before anything is read: the
  // reply must fit a message as any other.
  std::vector<entry> found(asks.size());
  std::vector<uint64_t> sizes(asks.size());
  unsigned __int128 total = 0;
  for (size_t i = 0; i < asks.size(); ++i) {
    std::string name{asks[i].name};
    found[i] = get(name);
    if (!found[i].cell)
      return req.reply_error(af_error::not_found, fmt::format("gather_many part {}: no variable "
                                                              "'{}' on {}",
                                                              i, name, node_name));
    const auto& spec = found[i].cell->spec();
    unsigned __int128 part = dtype_size(spec.type);
    if (asks[i].what == wire::gather_part_kind::rows) {
      if (spec.shape.empty())
        return req.reply_error(af_error::invalid_argument,
                               fmt::format("gather_many part {}: '{}' is a scalar: it has no "
                                           "rows to gather",
                                           i, name));
      for (size_t d = 1; d < spec.shape.size(); ++d)
        part *= static_cast<uint64_t>(std::max<int64_t>(spec.shape[d], 0));
      part *= asks[i].count;
    } else {
      part *= static_cast<uint64_t>(std::max<int64_t>(num_elements(spec.shape), 0));
    }
    total += part;
    if (total > static_cast<uint64_t>(limits.max_message_bytes))
      return req.reply_error(af_error::resource_exhausted,
                             fmt::format("gather_many: the answer reaches {} bytes at part {} "
                                         "('{}'), over {}'s limit of {} bytes per message "
                                         "([node] max_message_bytes); ask in smaller batches",
                                         static_cast<uint64_t>(total), i, name, node_name,
                                         limits.max_message_bytes));
    sizes[i] = static_cast<uint64_t>(part);
  }
  auto at = wire::gather_many_offsets(sizes);
  // The whole answer, its descriptions and alignment too (up to 152 bytes
  // a part more than the parts' bytes checked above).
  if (at.back() > static_cast<uint64_t>(limits.max_message_bytes))
    return req.reply_error(af_error::resource_exhausted,
                           fmt::format("gather_many: the answer of {} parts is {} bytes, over "
                                       "{}'s limit of {} bytes per message ([node] "
                                       "max_message_bytes); ask in smaller batches",
                                       asks.size(), at.back(), node_name,
                                       limits.max_message_bytes));
  try {
    buf.out.resize(at.back());
  } catch (const std::bad_alloc&) {
    return req.reply_error(af_error::resource_exhausted,
                           fmt::format("{} cannot allocate {} bytes for a gather_many's answer "
                                       "(out of memory)",
                                       node_name, at.back()));
  }
  std::byte* out = buf.out.data();
  // The descriptions and the gaps between parts are zeros: no byte of an
  // earlier answer goes out again.
  std::memset(out, 0, at.front());
  for (size_t i = 0; i < asks.size(); ++i) {
    auto end = i + 1 < asks.size() ? at[i + 1] : at.back();
    std::memset(out + at[i] + sizes[i], 0, end - at[i] - sizes[i]);
  }
  auto parts = static_cast<uint32_t>(asks.size());
  std::memcpy(out, &parts, sizeof(parts));
  for (size_t i = 0; i < asks.size(); ++i) {
    const auto& cell = *found[i].cell;
    wire::gathered_part d;
    d.dtype = static_cast<uint8_t>(cell.spec().type);
    d.bytes = sizes[i];
    shape_type shape = cell.spec().shape;
    if (asks[i].what == wire::gather_part_kind::rows) {
      // The ids in place: a tensor over the request's buffer (no copy).
      auto ids = tensor::over(
        dtype::int64, {static_cast<int64_t>(asks[i].count)},
        std::shared_ptr<std::byte>(std::shared_ptr<void>{},
                                   const_cast<std::byte*>(
                                     reinterpret_cast<const std::byte*>(asks[i].ids))));
      auto v = cell.gather_rows_into(ids, out + at[i], sizes[i]);
      if (!v)
        return req.reply_error(plane_io::wire_code(v.error()),
                               fmt::format("gather_many part {}: {}", i, describe(v.error())));
      d.version = *v;
      shape[0] = static_cast<int64_t>(asks[i].count);
    } else {
      auto v = read_value_into(*found[i].cell, out + at[i], sizes[i], node_name);
      if (!v)
        return req.reply_error(plane_io::wire_code(v.error()),
                               fmt::format("gather_many part {}: {}", i, describe(v.error())));
      d.version = *v;
    }
    if (shape.size() > wire::max_rank)
      return req.reply_error(af_error::invalid_argument,
                             fmt::format("gather_many part {}: '{}' has rank {}; the data plane "
                                         "carries rank <= 8",
                                         i, asks[i].name, shape.size()));
    d.rank = static_cast<uint8_t>(shape.size());
    for (size_t k = 0; k < shape.size(); ++k)
      d.dims[k] = shape[k];
    std::memcpy(out + 8 + sizeof(d) * i, &d, sizeof(d));
  }
  wire::header reply;
  reply.has_tensor = 1;
  reply.dtype = static_cast<uint8_t>(dtype::int32);
  reply.rank = 1;
  reply.dims[0] = static_cast<int64_t>(at.back() / 4);
  reply.payload_bytes = at.back();
  return req.reply(reply, out);
}

} // namespace af
