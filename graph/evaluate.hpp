#pragma once
/// Runs a graph in this process on one kernels backend, with no cluster: the
/// reference for tests (gradients against finite differences, partitioned
/// runs against one-process runs) and the one-process baseline of benchmarks.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.hpp"
#include "kernels/kernels.hpp"

namespace af {

/// Variable values by name; updates write here.
using variable_values = std::map<std::string, tensor>;

/// A variable's first value from its initializer (constant, zeros, ones,
/// uniform, normal, tensor). A tensor of another dtype or shape, an unknown
/// kind, or a value too large to allocate is an error naming the variable.
outcome<tensor> initial_value(const variable_spec& spec, const initializer& init);

/// Sets every variable of `g` that `vars` lacks from its initializer.
graph_status initialize_values(const graph& g, variable_values& vars);

/// The values of `fetches` after one step. A variable without a value, a
/// placeholder without a feed, or a failing kernel is an error naming it.
outcome<std::vector<tensor>> evaluate(const graph& g, const std::vector<output>& fetches,
                                      const std::vector<std::pair<output, tensor>>& feeds,
                                      variable_values& vars, kernels::backend& backend);

} // namespace af
