#include "core/wire_format.hpp"

namespace af::wire {

bool describe_tensor(const tensor& t, header& h) {
  if (t.shape().size() > max_rank)
    return false;
  h.has_tensor = 1;
  h.dtype = static_cast<uint8_t>(t.type());
  h.rank = static_cast<uint8_t>(t.shape().size());
  for (size_t i = 0; i < t.shape().size(); ++i)
    h.dims[i] = t.shape()[i];
  h.payload_bytes = t.nbytes();
  return true;
}

std::string validate(const header& h) {
  if (h.magic != magic)
    return "not an actorflow data-plane frame (bad magic)";
  auto k = h.kind;
  if (!valid_var_op(k) && !aggregator_kind(k) && k != static_cast<uint8_t>(kind::reply)
      && k != static_cast<uint8_t>(kind::shm_offer) && k != static_cast<uint8_t>(kind::edge)
      && k != static_cast<uint8_t>(kind::ucx_offer) && k != static_cast<uint8_t>(kind::gather_rows)
      && k != static_cast<uint8_t>(kind::shm_pad) && k != static_cast<uint8_t>(kind::gather_many))
    return "unknown frame kind " + std::to_string(k);
  if (h.name_len > max_name)
    return "variable name of " + std::to_string(h.name_len) + " bytes (at most "
           + std::to_string(max_name) + ")";
  if (!h.has_tensor)
    return h.payload_bytes > (1u << 20) ? "error text of " + std::to_string(h.payload_bytes) + " bytes"
                                        : std::string{};
  const bool bf16 = h.dtype == bf16_dtype;
  if (bf16 && h.kind != static_cast<uint8_t>(kind::push)
      && h.kind != static_cast<uint8_t>(kind::reply))
    return "bf16 values (dtype code 14) on a frame of kind " + std::to_string(k)
           + ": only a dense push (kind 5) and a reply carry bf16";
  if (!bf16 && !valid_dtype(h.dtype))
    return "unknown dtype code " + std::to_string(h.dtype);
  if (h.rank > max_rank)
    return "rank " + std::to_string(h.rank) + " (the data plane carries rank <= 8)";
  // Count elements without overflow: a forged shape must not wrap around.
  unsigned __int128 count = 1;
  for (uint8_t i = 0; i < h.rank; ++i) {
    if (h.dims[i] < 0)
      return "negative dimension " + std::to_string(h.dims[i]);
    count *= static_cast<uint64_t>(h.dims[i]);
    if (count > (uint64_t{1} << 40))
      return "a tensor of more than 2^40 elements";
  }
  auto expected = static_cast<uint64_t>(count) * element_bytes(h.dtype);
  if (h.payload_bytes != expected && bf16)
    return "a bf16 payload of " + std::to_string(h.payload_bytes) + " bytes for "
           + std::to_string(static_cast<uint64_t>(count)) + " elements of 2 bytes ("
           + std::to_string(expected) + " bytes)";
  if (h.payload_bytes != expected)
    return "payload of " + std::to_string(h.payload_bytes) + " bytes for a tensor of "
           + std::to_string(expected) + " bytes";
  return {};
}

std::vector<uint64_t> gather_many_offsets(const std::vector<uint64_t>& bytes) {
  auto up = [](uint64_t n, uint64_t to) { return (n + to - 1) / to * to; };
  std::vector<uint64_t> at;
  at.reserve(bytes.size() + 1);
  uint64_t end = 8 + sizeof(gathered_part) * bytes.size();
  for (auto b : bytes) {
    at.push_back(up(end, 64));
    end = at.back() + b;
  }
  at.push_back(up(end, 8)); // the payload is int32 words: whole ones
  return at;
}

size_t element_bytes(uint8_t code) {
  if (code == bf16_dtype)
    return 2;
  return valid_dtype(code) ? dtype_size(static_cast<dtype>(code)) : 0;
}

shape_type shape_of(const header& h) {
  return shape_type(h.dims, h.dims + h.rank);
}

} // namespace af::wire
