#include "actors/plane_bf16.hpp"

#include <algorithm>
#include <vector>

#include "core/bf16.hpp"
#include "train/optimizer.hpp"

namespace af::plane_bf16 {

bool asked(const plane_request& req) {
  const auto& h = req.header();
  return h.kind == static_cast<uint8_t>(wire::kind::push) && h.has_tensor != 0
         && h.dtype == wire::bf16_dtype;
}

std::string dtype_text(uint8_t code) {
  return code == wire::bf16_dtype ? "bf16" : dtype_name(static_cast<dtype>(code));
}

const char* or_bf16(uint8_t code) {
  return code == wire::bf16_dtype ? " (or bf16, on a plain push: kind 5)" : "";
}

bool read_push(plane_request& req, tensor& values, bool& finite) {
  // Through a small buffer, 256 KiB of bf16 at a time: each piece is
  // widened and checked while it is in cache (as a float32 push's pieces
  // are checked).
  constexpr size_t piece = 128 << 10;
  thread_local std::vector<uint16_t> staging(piece);
  auto* dst = values.mutable_data<float>();
  const auto n = static_cast<size_t>(values.num_elements());
  for (size_t at = 0; at < n; at += piece) {
    size_t k = std::min(piece, n - at);
    if (!req.read_part(staging.data(), k * sizeof(uint16_t), true))
      return false;
    bf16::widen(staging.data(), dst + at, k);
    if (finite)
      finite = train::first_non_finite(dst + at, k) == k;
  }
  return true;
}

bool reply(plane_request& req, wire::header& reply, const iovec* pieces, size_t count,
           uint64_t floats, void (*copied)(void*), void* context) {
  thread_local std::vector<uint16_t> narrowed;
  narrowed.resize(floats); // grows to the largest answer once, then stays
  uint64_t at = 0;
  for (size_t i = 0; i < count; ++i) {
    size_t k = pieces[i].iov_len / sizeof(float);
    bf16::narrow(static_cast<const float*>(pieces[i].iov_base), narrowed.data() + at, k);
    at += k;
  }
  if (copied != nullptr)
    copied(context);
  reply.has_tensor = 1;
  reply.dtype = wire::bf16_dtype;
  reply.rank = 1;
  reply.dims[0] = static_cast<int64_t>(floats);
  reply.payload_bytes = floats * sizeof(uint16_t);
  return req.reply(reply, narrowed.data());
}

} // namespace af::plane_bf16
