#pragma once
/// Binds a graph's step plan (graph/partition.hpp) to the cluster: each
/// partition to its node's executor, each variable input to the variable's
/// actor (and, when it lives on another node, that node's data plane), each
/// consumer to its executor; the executors and variables a partition needs
/// become its monitored peers. The result runs on a step_runner.

#include <functional>
#include <memory>
#include <string>

#include "caf/expected.hpp"

#include "actors/cluster_link.hpp"
#include "actors/step_runner.hpp"
#include "graph/graph.hpp"
#include "graph/partition.hpp"

namespace af {

/// The handle of a variable node, bound when the variable was placed.
struct var_binding {
  variable_actor actor;
  std::string task;    ///< /job:J/task:T of its node
  std::string address; ///< host:port of its node
  bool gone = false;   ///< its node restarted without it
  std::string job;     ///< J and T of `task`, kept so that an op need not parse its device
  int32_t task_index = 0;
};

/// `binding_of(node id)` gives a variable node's binding (or why there is none).
caf::expected<std::shared_ptr<prepared_step>>
bind_step(const graph& g, const step_plan& plan, cluster_link& link, const session_options& opts,
          const std::function<caf::expected<const var_binding*>(int32_t)>& binding_of);

} // namespace af
