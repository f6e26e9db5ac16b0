#pragma once
/// The cut of a step's ops into one partition per device (TF's graph
/// partitioning before _Send/_Recv), as plain data. The runtime turns a plan
/// into executor messages (messages/executor.hpp): it adds actor handles and
/// data-plane addresses, nothing else.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.hpp"
#include "graph/placement.hpp"

namespace af {

/// Where an input of a planned op comes from.
struct planned_input {
  enum kind_t : uint8_t { local = 0, variable = 1, constant = 2, feed = 3, remote = 4 };
  kind_t kind = local;
  int32_t node = -1; ///< the producing node (the variable, constant or placeholder node)
  size_t from = 0;   ///< remote: the producing partition
};

struct planned_op {
  int32_t id = -1; ///< the graph node
  std::string op;  ///< kernel op, or assign / assign_add / assign_sub
  std::string name;
  op_attrs attrs;
  std::vector<planned_input> inputs;
  std::vector<size_t> consumers; ///< other partitions that need this op's value
  bool fetch = false;            ///< the value goes back to the caller
  bool want_value = true;        ///< updates: read the value back
};

struct planned_partition {
  placed_device device;
  std::vector<planned_op> ops;   ///< in topological order
  std::vector<int32_t> feeds;    ///< placeholders this partition reads
};

struct step_plan {
  std::vector<planned_partition> partitions;
  std::map<int32_t, size_t> partition_of; ///< compute/update node -> partition
  std::vector<int32_t> roots;
  bool want_values = true;
};

/// Where a compute node runs (updates run on their variable's device and are
/// not asked about).
using op_placer = std::function<outcome<placed_device>(const graph_node&)>;

/// Cuts what `roots` need into partitions, one per device, in the order the
/// devices are first used. Every variable the plan touches must have been
/// placed (spec.device set).
outcome<step_plan> partition(const graph& g, const std::vector<int32_t>& roots, bool want_values,
                             const op_placer& place_op);

/// A key that is equal for two runs that would register the same partitions
/// (same roots, same want_values).
std::string plan_signature(const std::vector<int32_t>& roots, bool want_values);

} // namespace af
