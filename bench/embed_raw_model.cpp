// The raw workers' model of train_embed_10m_2w (embed_raw_model.hpp).
#include "bench/embed_raw_model.hpp"

#include <cstdio>

namespace af::bench {

std::optional<click_batches> click_batches::make(const spec& s) {
  train::click_spec c;
  c.users = s.users;
  c.items = 3;
  c.dim = s.width - 1;
  c.zipf = 0;
  c.examples = s.examples;
  c.holdout = 0.2;
  c.seed = s.seed;
  auto data = train::make_synthetic_clicks(c);
  if (!data) {
    std::fprintf(stderr, "embed-worker: the synthetic clicks: %s\n", data.error().what.c_str());
    return std::nullopt;
  }
  return click_batches{s, std::move(data->data)};
}

click_batches::click_batches(const spec& s, train::click_split data)
  : s_(s), data_(std::move(data)), order_(data_.train.labels.size(), s.seed) {
}

const std::vector<int64_t>& click_batches::users(uint64_t step) {
  order_.positions((step * s_.workers + s_.rank) * s_.batch, s_.batch, picks_);
  const auto& t = data_.train;
  users_.resize(picks_.size());
  items_.resize(picks_.size());
  labels_.resize(picks_.size());
  for (size_t j = 0; j < picks_.size(); ++j) {
    users_[j] = t.ids[train::recommender::user_table][picks_[j]];
    items_[j] = static_cast<int32_t>(t.ids[train::recommender::item_table][picks_[j]]);
    labels_[j] = t.labels[picks_[j]];
  }
  return users_;
}

std::vector<std::string> raw_train_worker_args(int rank, uint64_t run, uint64_t job_seed,
                                               bool model, size_t examples) {
  return {"rank=" + std::to_string(rank), "run=" + std::to_string(run),
          "seed=" + std::to_string(job_seed), "ids=clicks",
          model ? "model=fm" : "model=none", "examples=" + std::to_string(examples)};
}

std::optional<raw_fm_trainer> raw_fm_trainer::make(const spec& s) {
  auto b = click_batches::make(s.data);
  if (!b)
    return std::nullopt;
  const auto& d = s.data;
  auto m = train::recommender::make({d.users, 3, d.width - 1, 0.1, d.seed});
  if (!m) {
    std::fprintf(stderr, "embed-worker: the model: %s\n", m.error().what.c_str());
    return std::nullopt;
  }
  return raw_fm_trainer{s, std::move(*m), std::move(*b)};
}

raw_fm_trainer::raw_fm_trainer(const spec& s, train::recommender m, click_batches b)
  : s_(s),
    model_(std::move(m)),
    batches_(std::move(b)),
    index_(2),
    items_(tensor::filled(dtype::float32, {3, s.data.width}, 0.01)),
    bias_(tensor::filled(dtype::float32, {1}, 0.0)) {
}

float* raw_fm_trainer::rows_for(size_t unique) {
  user_rows_ = tensor{dtype::float32, {static_cast<int64_t>(unique), s_.data.width}};
  return user_rows_.mutable_data<float>();
}

const float* raw_fm_trainer::step(const std::vector<uint32_t>& example_row) {
  index_[0].assign(example_row.begin(), example_row.end());
  index_[1] = batches_.items();
  auto r = model_.step({user_rows_, items_}, index_, {bias_}, batches_.labels(), true);
  if (!r) {
    std::fprintf(stderr, "embed-worker: the model's step: %s\n", r.error().what.c_str());
    return nullptr;
  }
  last_loss = r->loss;
  user_grads_ = r->row_grads[train::recommender::user_table];
  // The small dense part, here: SGD on the item rows and the bias.
  auto sgd = [&](tensor& v, const tensor& grad) {
    float* p = v.mutable_data<float>();
    const float* d = grad.data<float>();
    for (size_t i = 0; i < v.num_elements(); ++i)
      p[i] -= s_.lr * d[i];
  };
  sgd(items_, r->row_grads[train::recommender::item_table]);
  sgd(bias_, r->dense_grads[0]);
  return user_grads_.data<float>();
}

} // namespace af::bench
