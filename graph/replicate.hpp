#pragma once
/// In-graph replication (TF's towers): build a model function once per device
/// and average the replicas' gradients, as the towers example did by hand.

#include <functional>
#include <string>
#include <vector>

#include "graph/graph.hpp"

namespace af {

/// What the model function builds for one replica.
struct tower {
  output loss;                ///< a scalar
  std::vector<output> extras; ///< anything else to fetch (accuracy, logits)
};

struct replicated_model {
  std::vector<tower> towers;                    ///< one per device
  std::vector<std::vector<output>> tower_grads; ///< [replica][variable]
  std::vector<output> mean_grads;               ///< per variable, averaged over replicas
  output mean_loss;                             ///< the replicas' losses averaged
};

/// Builds `model(g, i)` in a scope of `devices[i]` for each i, the gradients
/// of each replica's loss w.r.t. `vars` on that replica's device, and their
/// mean in a scope of `average_on` (empty: the scopes open at the call).
outcome<replicated_model> replicate(graph& g, const std::vector<std::string>& devices,
                                    const std::vector<output>& vars,
                                    const std::function<tower(graph&, size_t)>& model,
                                    const std::string& average_on = "");

} // namespace af
