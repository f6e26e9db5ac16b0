#include "train/recommender.hpp"

#include <cmath>

#include <fmt/format.h>

namespace af::train {

namespace {

graph_error bad(std::string what) {
  return graph_error{af_error::invalid_argument, "recommender: " + std::move(what)};
}

const char* table_name(size_t t) {
  return t == recommender::user_table ? "user_emb" : "item_emb";
}

/// dst[f] += g * src[f] for f < n. The rows are of two tensors (a gradient
/// and a parameter), never the same memory: said, so that the loop is
/// vectorized (the same products and sums, element by element).
void add_scaled(float* __restrict dst, const float* __restrict src, float g, int64_t n) {
  for (int64_t f = 0; f < n; ++f)
    dst[f] += g * src[f];
}

} // namespace

outcome<recommender> recommender::make(const recommender_spec& spec) {
  if (spec.users <= 0)
    return bad(fmt::format("users = {}: a table needs at least one row", spec.users));
  if (spec.items <= 0)
    return bad(fmt::format("items = {}: a table needs at least one row", spec.items));
  if (spec.dim <= 0)
    return bad(fmt::format("dim = {}: at least one latent factor", spec.dim));
  if (!(spec.init_stddev >= 0) || !std::isfinite(spec.init_stddev))
    return bad(fmt::format("init_stddev = {}: a number >= 0", spec.init_stddev));
  return recommender{spec};
}

std::vector<table_spec> recommender::tables() const {
  // Distinct seeds: the two tables must not start as the same numbers.
  // A table's initializer (initializer::table): drawn per (row, column), so
  // a shard on a ps computes exactly its rows of this one-piece table.
  auto init = [&](uint64_t k) {
    auto i = initializer::normal(0, spec_.init_stddev, spec_.seed * 2 + k);
    i.table = true;
    return i;
  };
  return {table_spec{"user_emb", spec_.users, spec_.dim + 1, init(0)},
          table_spec{"item_emb", spec_.items, spec_.dim + 1, init(1)}};
}

std::vector<parameter> recommender::dense_parameters() const {
  return {parameter{"global_bias", {1}, initializer::zeros()}};
}

outcome<sparse_step_result> recommender::step(const std::vector<tensor>& rows,
                                              const std::vector<std::vector<int32_t>>& index,
                                              const std::vector<tensor>& dense,
                                              const std::vector<float>& labels, bool want_grads) {
  const int64_t width = spec_.dim + 1;
  const size_t n = labels.size();
  if (rows.size() != 2 || index.size() != 2)
    return bad(fmt::format("{} row tensors and {} index lists: the model has 2 tables "
                           "(user_emb, item_emb)", rows.size(), index.size()));
  if (dense.size() != 1 || dense[0].type() != dtype::float32 || dense[0].num_elements() != 1)
    return bad("the dense parameters must be one float32 global_bias of 1 element");
  for (size_t t = 0; t < 2; ++t) {
    const auto& s = rows[t].shape();
    if (rows[t].type() != dtype::float32 || s.size() != 2 || s[1] != width)
      return bad(fmt::format("rows of {} must be float32 [unique ids, {}], not {} elements of "
                             "rank {}", table_name(t), width, rows[t].num_elements(), s.size()));
    if (index[t].size() != n)
      return bad(fmt::format("{} has {} indices for {} labels: one per example",
                             table_name(t), index[t].size(), n));
    for (size_t e = 0; e < n; ++e)
      if (index[t][e] < 0 || index[t][e] >= s[0])
        return bad(fmt::format("{} index of example {} is {}: not in [0, {}) (the rows given)",
                               table_name(t), e, index[t][e], s[0]));
  }
  if (n == 0)
    return bad("an empty batch");
  const float* user = rows[user_table].data<float>();
  const float* item = rows[item_table].data<float>();
  const double w0 = dense[0].data<float>()[0];

  sparse_step_result out;
  out.predictions.resize(n);
  std::vector<double> dz(n); // d loss / d logit of each example
  double loss = 0;
  for (size_t e = 0; e < n; ++e) {
    const float* u = user + index[user_table][e] * width;
    const float* v = item + index[item_table][e] * width;
    double z = fm_logit(u, v, spec_.dim, w0);
    double y = labels[e];
    // One exp: e^-|z| is exp(-z) for z >= 0 and exp(z) below.
    double a = std::exp(-std::fabs(z));
    loss += std::max(z, 0.0) - z * y + std::log1p(a);
    double p = z >= 0 ? 1 / (1 + a) : a / (1 + a);
    out.predictions[e] = static_cast<float>(p);
    dz[e] = (p - y) / static_cast<double>(n);
  }
  out.loss = loss / static_cast<double>(n);
  if (!want_grads)
    return out;

  // Gradients summed per distinct row: a row of `rows` is one id, so every
  // example that names it adds into the same place (the duplicates summed).
  tensor gu = tensor::filled(dtype::float32, rows[user_table].shape(), 0.0);
  tensor gi = tensor::filled(dtype::float32, rows[item_table].shape(), 0.0);
  float* du = gu.mutable_data<float>();
  float* di = gi.mutable_data<float>();
  double dw0 = 0;
  for (size_t e = 0; e < n; ++e) {
    int64_t ru = index[user_table][e] * width, ri = index[item_table][e] * width;
    const float g = static_cast<float>(dz[e]);
    add_scaled(du + ru, item + ri, g, spec_.dim);
    add_scaled(di + ri, user + ru, g, spec_.dim);
    du[ru + spec_.dim] += g;
    di[ri + spec_.dim] += g;
    dw0 += dz[e];
  }
  out.row_grads = {std::move(gu), std::move(gi)};
  out.dense_grads = {tensor::from_values<float>({1}, {static_cast<float>(dw0)})};
  return out;
}

} // namespace af::train
