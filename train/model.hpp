#pragma once
/// The models a training job builds with the graph API (graph/graph.hpp):
/// softmax regression, an MLP, and linear regression without a bias
/// ("linear": 0.5 * mean((x w - y)^2)) or with one ("linear_bias":
/// mean((x w + b - y)^2), the 1 M workload's model). Their parameters are placeholders, so one
/// graph serves every mode: a worker feeds the parameters it holds (pulled
/// from the aggregator, or its own replica) with each batch.

#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.hpp"
#include "graph/outcome.hpp"
#include "core/variable_spec.hpp"

namespace af::train {

/// One parameter of a model: its name, shape and first value.
struct parameter {
  std::string name;   ///< e.g. "layer0/w"
  shape_type shape;
  initializer init;
};

/// The parameters of model `kind` ("softmax", "mlp" with `hidden` sizes,
/// "linear" or "linear_bias": linear/w [features, 1] and linear/b [1] at 0)
/// for `features` inputs and `classes` outputs; weights start Glorot-uniform
/// from `seed`, biases at zero (the same seed, the same values everywhere).
outcome<std::vector<parameter>> parameters(const std::string& kind, size_t features,
                                           uint32_t classes, const std::vector<int64_t>& hidden,
                                           uint64_t seed);

/// The nodes of one replica of the model in a graph.
struct replica {
  std::vector<output> params;  ///< placeholders, one per parameter
  output x;                    ///< placeholder [batch, features]
  output y;                    ///< placeholder [batch] int32
  output loss;                 ///< mean cross-entropy (scalar)
  output correct;              ///< number of correct predictions (scalar float)
  std::vector<output> grads;   ///< d loss / d params, in params' order
};

/// Adds a replica of the model to `g` in the current device scope: forward,
/// loss, correct count and gradients. `prefix` names its nodes.
outcome<replica> build_replica(graph& g, const std::vector<parameter>& params,
                               const std::string& kind, const std::string& prefix = "");

} // namespace af::train
