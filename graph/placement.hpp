#pragma once
/// Placement of graph nodes on a cluster's devices, TensorFlow's rules, with
/// no CAF: the caller says which devices each task has (a session asks the
/// nodes; a test passes a table).
///
/// A requested device (the scopes merged) is completed like this:
///   - a variable with no job goes to task 0 of the session's job (so clients
///     of different servers of one job share it by name); with a job but no
///     task, to task 0 of that job;
///   - an op with no job runs on the session's own task;
///   - no device type means CPU:0; a device the task lacks falls back to its
///     CPU:0 with a note (soft placement), or is an error when soft placement
///     is off;
///   - a replica other than 0 is an error (actorflow runs replica 0 of each task).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graph/outcome.hpp"
#include "core/device_name.hpp"

namespace af {

struct placement_policy {
  std::string job;     ///< the session's own task
  int32_t task = 0;
  bool soft_placement = true;
};

struct placed_device {
  std::string job;
  int32_t task = 0;
  std::string local; ///< "CPU:0"
  std::string full;  ///< /job:J/replica:0/task:T/device:CPU:0
  std::string note;  ///< why soft placement moved it, or empty

  /// "/job:J/task:T"
  std::string task_name() const;
};

/// The local devices ("CPU:0", "GPU:0") of /job:J/task:T, or why there are
/// none to be had (unknown job, task out of range, node unreachable).
using device_catalog =
  std::function<outcome<std::vector<std::string>>(const std::string& job, int32_t task)>;

/// Where a variable (`for_variable`) or an op asking for `requested` goes.
/// A catalog error comes back as "device X: <its text>", with its own code
/// when it is about reaching the node (unreachable, timeout, peer_down) and
/// unknown_device otherwise (an unknown job, a task out of range).
outcome<placed_device> place(const device_name& requested, bool for_variable,
                             const placement_policy& policy, const device_catalog& catalog);

/// The placed_device of a full device name (a variable's spec.device).
outcome<placed_device> placed_from_full(const std::string& full);

} // namespace af
