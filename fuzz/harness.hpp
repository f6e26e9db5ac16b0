#pragma once
/// What each fuzz target does with one input (docs/fuzzing.md). The libFuzzer
/// targets (fuzz/fuzz_*.cpp, clang only) and the regression cases
/// (tests/test_fuzz_regressions.cpp, the normal build) call these same
/// functions, so a crash input replays the exact code path it was found on.
///
/// Each returns "" when the input was handled as it must be (accepted, or
/// refused with an error), else what went wrong: a target aborts on it, a
/// test fails with it. Crashes, leaks, overflows and undefined behaviour are
/// the sanitizers' to see.

#include <cstddef>
#include <cstdint>
#include <string>

namespace af::fuzz {

/// config/cluster_spec.hpp: parse_cluster_toml; what parses also survives
/// to_toml and back with the same jobs.
std::string cluster_toml(const uint8_t* data, size_t size);

/// parse_cluster_json (TF_CONFIG's shape or a bare job map); what parses
/// survives to_json and back.
std::string cluster_json(const uint8_t* data, size_t size);

/// train/config.hpp: parse_train_config, validate; what parses survives
/// to_toml and back.
std::string train_config(const uint8_t* data, size_t size);

/// core/device_name.hpp: parse; a parsed name prints to text that parses
/// to the same name, and merging keeps it.
std::string device_name(const uint8_t* data, size_t size);

/// core/wire_format.hpp: the first 96 bytes (zero padded) as a frame header;
/// a header that validate() accepts has a shape whose size is its payload.
std::string wire_header(const uint8_t* data, size_t size);

/// messages/serialization.hpp: the bytes through caf::binary_deserializer
/// into an af::tensor, with the decoder's cap at tensor_cap_bytes; a decoded
/// tensor is within the cap and serializes back to the bytes it came from.
constexpr uint64_t tensor_cap_bytes = uint64_t{16} << 20;
std::string tensor_decode(const uint8_t* data, size_t size);

/// repl/parser.hpp: parse, explain an error, bracket_balance, incomplete.
std::string repl_parser(const uint8_t* data, size_t size);

/// net/data_plane.hpp: the bytes sent to a ps node's data plane (one per
/// process, started on first use, on 127.0.0.1, with a sync and an async
/// aggregator whose workers joined: harness_plane.cpp) on a fresh
/// connection, which is then closed for writing; the server must close it
/// within a bound, still answer a well-formed read on a new connection, and
/// its aggregators their stats.
std::string data_plane(const uint8_t* data, size_t size);

} // namespace af::fuzz
