#include "graph/replicate.hpp"

namespace af {

namespace {

/// Restores the graph's scopes when replicate() returns, on every path.
struct scope_restorer {
  graph& g;
  std::vector<device_name> saved;
  ~scope_restorer() { g.set_scopes(std::move(saved)); }
};

} // namespace

outcome<replicated_model> replicate(graph& g, const std::vector<std::string>& devices,
                                    const std::vector<output>& vars,
                                    const std::function<tower(graph&, size_t)>& model,
                                    const std::string& average_on) {
  if (devices.empty())
    return graph_error{af_error::invalid_argument, "replicate() needs at least one device"};
  std::optional<device_name> average_scope;
  if (!average_on.empty()) {
    std::string why;
    average_scope = device_name::parse(average_on, &why);
    if (!average_scope)
      return graph_error{af_error::invalid_device, "replicate(): average_on: " + why};
  }
  scope_restorer restore{g, g.scopes()};
  replicated_model m;
  for (size_t i = 0; i < devices.size(); ++i) {
    std::string why;
    auto d = device_name::parse(devices[i], &why);
    if (!d)
      return graph_error{af_error::invalid_device,
                         "replicate(): replica " + std::to_string(i) + ": " + why};
    g.push_scope(*d);
    auto t = model(g, i);
    auto grads = gradients(g, t.loss, vars);
    g.pop_scope();
    if (!grads)
      return graph_error{grads.error().code, "replicate(): replica " + std::to_string(i) + " on "
                                               + devices[i] + ": " + grads.error().what};
    m.towers.push_back(std::move(t));
    m.tower_grads.push_back(std::move(*grads));
  }
  if (average_scope)
    g.push_scope(*average_scope);
  const size_t k = devices.size();
  for (size_t j = 0; j < vars.size(); ++j) {
    auto sum = m.tower_grads[0][j];
    for (size_t r = 1; r < k; ++r)
      sum = g.add(sum, m.tower_grads[r][j], "tower_grad_sum");
    if (k == 1) {
      m.mean_grads.push_back(sum);
      continue;
    }
    // 1/k in the variable's dtype, so that the product type-checks.
    const auto* var = g.variable_node(vars[j]);
    auto type = var != nullptr ? var->spec.type : dtype::float32;
    auto scale = g.constant(tensor::filled(type, {}, 1.0 / static_cast<double>(k)), "tower_scale");
    m.mean_grads.push_back(g.mul(sum, scale, "tower_grad_mean"));
  }
  // The losses' dtype is not known while building: divide by k ones of the
  // loss's own dtype instead of multiplying by a constant.
  auto loss_sum = m.towers[0].loss;
  for (size_t r = 1; r < k; ++r)
    loss_sum = g.add(loss_sum, m.towers[r].loss, "tower_loss_sum");
  if (k == 1) {
    m.mean_loss = loss_sum;
  } else {
    auto one = g.op("ones_like", {m.towers[0].loss}, {}, "tower_one");
    auto count = one;
    for (size_t r = 1; r < k; ++r)
      count = g.add(count, one, "tower_count");
    m.mean_loss = g.div(loss_sum, count, "tower_loss_mean");
  }
  return m;
}

} // namespace af
