#pragma once
/// A dense push in bf16 on the node's data plane ([train] wire_dtype =
/// "bf16"; docs/wire.md "bf16 on the wire"): its payload widened to float32
/// as it arrives, and the parameters of its answer narrowed to bf16. The
/// aggregator sees float32 only; its variables and optimizer slots stay
/// float32. For actors/plane_handler.cpp.

#include <cstdint>
#include <string>

#include <sys/uio.h>

#include "core/tensor.hpp"
#include "net/plane_handler.hpp"

namespace af::plane_bf16 {

/// True if `req` is a push whose values are bf16 (its answer goes back in bf16).
bool asked(const plane_request& req);

/// How a refusal names dtype byte `code` ("bf16", "float32", ...), and what
/// it adds after "expected float32[N]" for a bf16 one (that bf16 is taken too).
std::string dtype_text(uint8_t code);
const char* or_bf16(uint8_t code);

/// Reads a bf16 push's payload into `values` (float32, its shape already
/// the frame's), widening each piece and checking it for non-finite floats
/// as it arrives (`finite` false once one is found). False: the connection
/// is to be dropped.
bool read_push(plane_request& req, tensor& values, bool& finite);

/// The answer `reply` with the parameters of `pieces` (float32, `floats` in
/// all, one after the other) narrowed to bf16 (round to nearest even).
/// `copied(context)`, if given, runs once they are narrowed (their holder
/// lets them go before the answer is sent). False: the connection is to be
/// dropped.
bool reply(plane_request& req, wire::header& reply, const iovec* pieces, size_t count,
           uint64_t floats, void (*copied)(void*) = nullptr, void* context = nullptr);

} // namespace af::plane_bf16
