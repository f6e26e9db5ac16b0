#include "train/model.hpp"

#include <cmath>

#include <fmt/format.h>

namespace af::train {

outcome<std::vector<parameter>> parameters(const std::string& kind, size_t features,
                                           uint32_t classes, const std::vector<int64_t>& hidden,
                                           uint64_t seed) {
  if (features == 0)
    return graph_error{af_error::invalid_argument, "the model needs at least one input feature"};
  std::vector<parameter> out;
  auto layer = [&](const std::string& name, int64_t in, int64_t units) {
    // Glorot (Xavier) uniform, TF's default for dense layers; biases at 0.
    double limit = std::sqrt(6.0 / static_cast<double>(in + units));
    out.push_back({name + "/w", {in, units},
                   initializer::uniform(-limit, limit, seed * 1000003 + out.size())});
    out.push_back({name + "/b", {units}, initializer::zeros()});
  };
  auto f = static_cast<int64_t>(features);
  if (kind == "linear" || kind == "linear_bias") {
    out.push_back({"linear/w", {f, 1}, initializer::zeros()});
    if (kind == "linear_bias")
      out.push_back({"linear/b", {1}, initializer::zeros()});
    return out;
  }
  if (classes < 2)
    return graph_error{af_error::invalid_argument,
                       fmt::format("model '{}' needs at least 2 classes, the data has {}", kind,
                                   classes)};
  if (kind == "softmax") {
    layer("softmax", f, classes);
    return out;
  }
  if (kind == "mlp") {
    int64_t in = f;
    for (size_t i = 0; i < hidden.size(); ++i) {
      if (hidden[i] <= 0)
        return graph_error{af_error::invalid_argument,
                           fmt::format("mlp hidden layer {} has size {}: sizes must be positive",
                                       i, hidden[i])};
      layer(fmt::format("hidden{}", i), in, hidden[i]);
      in = hidden[i];
    }
    layer("logits", in, classes);
    return out;
  }
  return graph_error{af_error::invalid_argument,
                     fmt::format("model '{}' is unknown: use softmax, mlp, linear or linear_bias",
                                 kind)};
}

outcome<replica> build_replica(graph& g, const std::vector<parameter>& params,
                               const std::string& kind, const std::string& prefix) {
  replica r;
  for (const auto& p : params)
    r.params.push_back(g.placeholder(prefix + p.name));
  r.x = g.placeholder(prefix + "x");
  r.y = g.placeholder(prefix + "y");
  if (kind == "linear") {
    // 0.5 * mean((x w - y)^2), y fed as [batch, 1]
    auto pred = g.matmul(r.x, r.params[0], false, false, prefix + "predict");
    auto err = g.sub(pred, r.y, prefix + "error");
    r.loss = g.mul(g.reduce_mean(g.square(err)), g.constant(tensor::scalar(0.5f)), prefix + "loss");
  } else if (kind == "linear_bias") {
    // mean((x w + b - y)^2): with one example, the 1 M workload's (x.w + b - y)^2
    auto pred = g.add(g.matmul(r.x, r.params[0], false, false, prefix + "predict"), r.params[1],
                      prefix + "predict_b");
    auto err = g.sub(pred, r.y, prefix + "error");
    r.loss = g.reduce_mean(g.square(err));
  } else {
    output h = r.x;
    size_t layers = params.size() / 2;
    for (size_t i = 0; i < layers; ++i) {
      h = g.add(g.matmul(h, r.params[2 * i]), r.params[2 * i + 1], prefix + params[2 * i].name);
      if (i + 1 < layers)
        h = g.relu(h);
    }
    r.loss = g.reduce_mean(g.softmax_xent(h, r.y), std::nullopt, false);
    r.correct = g.op("correct_count", {h, r.y}, {}, prefix + "correct");
  }
  auto grads = gradients(g, r.loss, r.params);
  if (!grads)
    return grads.error();
  r.grads = std::move(*grads);
  return r;
}

} // namespace af::train
