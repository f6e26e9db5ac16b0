#pragma once
/// What one step did, where: TF's step_stats / timeline for actorflow.

#include <cstdint>
#include <string>
#include <vector>

namespace af {

/// Where one op, variable access or transfer of a run went. Times are on the
/// client's steady clock: times taken on another node are shifted by that
/// node's clock offset, measured at connect (half a round trip, as NTP does;
/// docs/runtime.md says how accurate that is).
struct trace_entry {
  std::string op;        ///< graph name: "w", "add", "var/assign_add", "relu -> layer2"
  std::string kind;      ///< the op (add, matmul, ...), read, transfer, assign, assign_add, ...
  std::string requested; ///< the device as requested (scopes merged; may be partial)
  std::string device;    ///< the device it ran on (transfers: the receiving one), fully specified
  std::string node;      ///< host:port of the node
  std::string note;      ///< why soft placement moved it; for transfers, the path taken
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint64_t bytes_in = 0;  ///< ops: bytes of their inputs; transfers: bytes that arrived
  uint64_t bytes_out = 0; ///< ops: bytes of their result
};

struct run_trace {
  std::vector<trace_entry> entries;

  /// TF's run_with_location_trace printout: each device, then its ops.
  std::string by_device() const;

  /// One line per entry: op -> requested -> actual device @ node (note).
  std::string to_string() const;

  /// The entry of graph op `op`, or nullptr.
  const trace_entry* find(const std::string& op) const;

  /// Chrome trace-event JSON (open in Perfetto or chrome://tracing): one
  /// process per node, one thread per device, a span per entry; transfers
  /// are spans of their own, from when the value left to when it arrived.
  std::string to_chrome_json() const;
};

} // namespace af
