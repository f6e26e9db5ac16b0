#include "train/clicks.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "train/metrics.hpp"
#include "train/recommender.hpp"

namespace af::train {

namespace {

graph_error bad(std::string what) {
  return graph_error{af_error::invalid_argument, std::move(what)};
}

/// Draws ids 0..n-1 with P(r) proportional to 1 / (r + 1)^s: a binary
/// search of the cumulative weights (exact for any s >= 0, n floats of
/// memory, log n a draw).
class zipf_ids {
public:
  zipf_ids(int64_t n, double s) : cdf_(static_cast<size_t>(n)) {
    double sum = 0;
    for (int64_t r = 0; r < n; ++r)
      cdf_[static_cast<size_t>(r)] = sum += std::pow(static_cast<double>(r + 1), -s);
    for (auto& c : cdf_)
      c /= sum;
    cdf_.back() = 1; // no draw may fall past the end by rounding
  }
  int64_t operator()(std::mt19937_64& rng) {
    double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
  }

private:
  std::vector<double> cdf_;
};

double sigmoid(double z) {
  return z >= 0 ? 1 / (1 + std::exp(-z)) : std::exp(z) / (1 + std::exp(z));
}

/// A uniform number in [0, 1) from (seed, e): splitmix64's finalizer.
double unit_hash(uint64_t seed, uint64_t e) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + e + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1p-53;
}

/// The truth's element (t, row, col): a standard normal from the hash of
/// (seed, t, row, col) (Box-Muller's cosine branch), scaled by its stddev.
float truth_element(const click_truth& truth, size_t t, int64_t row, int64_t col) {
  auto width = static_cast<uint64_t>(truth.dim + 1);
  uint64_t key = (static_cast<uint64_t>(row) * width + static_cast<uint64_t>(col)) * 4 + t * 2;
  double u1 = std::max(unit_hash(truth.seed, key), 0x1p-60);
  double u2 = unit_hash(truth.seed, key + 1);
  double z = std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  return static_cast<float>(z * (col < truth.dim ? truth.factor_stddev : truth.bias_stddev));
}

/// The whole table `t` of `rows` rows, computed row by row (cached when small).
tensor truth_table(const click_truth& truth, size_t t, int64_t rows) {
  tensor out(dtype::float32, {rows, truth.dim + 1});
  float* p = out.mutable_data<float>();
  for (int64_t r = 0; r < rows; ++r)
    truth.row(t, r, p + r * (truth.dim + 1));
  return out;
}

void push(sparse_batch& b, int64_t user, int64_t item, float label) {
  b.ids[0].push_back(user);
  b.ids[1].push_back(item);
  b.labels.push_back(label);
}

} // namespace

void click_truth::row(size_t t, int64_t id, float* out) const {
  const auto& cached = t == recommender::user_table ? user_table : item_table;
  const int64_t w = dim + 1;
  if (!cached.empty()) {
    std::copy_n(cached.data<float>() + id * w, w, out);
    return;
  }
  for (int64_t c = 0; c < w; ++c)
    out[c] = truth_element(*this, t, id, c);
}

double truth_probability(const click_truth& t, int64_t user, int64_t item) {
  const auto w = static_cast<size_t>(t.dim + 1);
  thread_local std::vector<float> u, i;
  u.resize(w);
  i.resize(w);
  t.row(recommender::user_table, user, u.data());
  t.row(recommender::item_table, item, i.data());
  return sigmoid(fm_logit(u.data(), i.data(), t.dim, t.global_bias));
}

outcome<synthetic_clicks> make_synthetic_clicks(const click_spec& spec) {
  if (spec.users <= 0 || spec.items <= 0 || spec.dim <= 0)
    return bad(fmt::format("synthetic clicks: users = {}, items = {}, dim = {}: each must be at "
                           "least 1", spec.users, spec.items, spec.dim));
  if (!(spec.zipf >= 0) || !std::isfinite(spec.zipf))
    return bad(fmt::format("synthetic clicks: zipf = {}: the exponent must be a number >= 0",
                           spec.zipf));
  if (!(spec.holdout > 0 && spec.holdout < 1))
    return bad(fmt::format("synthetic clicks: holdout = {}: between 0 and 1, both excluded",
                           spec.holdout));
  auto held = static_cast<size_t>(std::floor(static_cast<double>(spec.examples) * spec.holdout));
  if (held == 0 || held == spec.examples)
    return bad(fmt::format("synthetic clicks: {} examples with holdout = {} leave no training or "
                           "no held-out example", spec.examples, spec.holdout));
  std::mt19937_64 rng(spec.seed);
  double factor_sd = spec.factor_stddev >= 0 ? spec.factor_stddev
                                             : std::pow(static_cast<double>(spec.dim), -0.25);
  synthetic_clicks out;
  auto& truth = out.truth;
  truth.dim = spec.dim;
  truth.global_bias = spec.global_bias;
  truth.seed = rng();
  truth.factor_stddev = factor_sd;
  truth.bias_stddev = spec.bias_stddev;
  if (spec.users <= click_truth::cache_rows)
    truth.user_table = truth_table(truth, recommender::user_table, spec.users);
  if (spec.items <= click_truth::cache_rows)
    truth.item_table = truth_table(truth, recommender::item_table, spec.items);

  zipf_ids draw_user(spec.users, spec.zipf), draw_item(spec.items, spec.zipf);
  auto& d = out.data;
  d.users = spec.users;
  d.items = spec.items;
  for (auto* b : {&d.train, &d.test})
    b->ids.assign(2, {});
  std::vector<float> truth_p;
  for (size_t e = 0; e < spec.examples; ++e) {
    int64_t u = draw_user(rng), i = draw_item(rng);
    double p = truth_probability(truth, u, i);
    float label = std::uniform_real_distribution<double>(0, 1)(rng) < p ? 1.0f : 0.0f;
    bool test = e >= spec.examples - held;
    push(test ? d.test : d.train, u, i, label);
    if (test)
      truth_p.push_back(static_cast<float>(p));
  }
  out.truth_auc = auc(truth_p, d.test.labels);
  out.truth_log_loss = log_loss(truth_p, d.test.labels);
  return out;
}

outcome<click_split> read_clicks_csv(const std::string& path, int64_t users, int64_t items,
                                     double holdout, uint64_t seed) {
  std::ifstream in(path);
  if (!in)
    return graph_error{af_error::not_found,
                       fmt::format("cannot open click data '{}' (check the path)", path)};
  // A directory opens, then reads as no rows: say what it is.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return bad(fmt::format("click data '{}' is a directory: data = \"csv:PATH\" names a file of "
                           "user,item,label rows", path));
  click_split out;
  out.users = users;
  out.items = items;
  out.train.ids.assign(2, {});
  out.test.ids.assign(2, {});
  static const char* const names[] = {"user", "item", "label"};
  std::string line;
  uint64_t example = 0;
  for (size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (line.empty() || (line_no == 1 && line == "user,item,label"))
      continue;
    int64_t v[3] = {0, 0, 0};
    size_t at = 0;
    for (int col = 0; col < 3; ++col) {
      size_t end = col < 2 ? line.find(',', at) : line.size();
      if (end == std::string::npos)
        return bad(fmt::format("{}:{}: '{}' has {} column(s): each row is user,item,label", path,
                               line_no, line.substr(0, 80), col + 1));
      std::string field = line.substr(at, end - at);
      if (col == 2 && field.find(',') != std::string::npos)
        return bad(fmt::format("{}:{}: '{}' has more than 3 columns: each row is user,item,label",
                               path, line_no, line.substr(0, 80)));
      const int64_t limit[3] = {users, items, 2};
      auto [p, ec] = std::from_chars(field.data(), field.data() + field.size(), v[col]);
      bool whole = !field.empty() && ec == std::errc{} && p == field.data() + field.size();
      if (!whole || v[col] < 0 || v[col] >= limit[col])
        return bad(fmt::format("{}:{}: column {} ({}) = '{}': {}", path, line_no, col + 1,
                               names[col], field.substr(0, 80),
                               col == 2 ? std::string{"a label is 0 or 1"}
                                        : fmt::format("an id is an integer in [0, {}) (the "
                                                      "declared {})", limit[col],
                                                      col == 0 ? "users" : "items")));
      at = end + 1;
    }
    bool test = unit_hash(seed, example++) < holdout;
    push(test ? out.test : out.train, v[0], v[1], static_cast<float>(v[2]));
  }
  if (out.train.labels.empty() || out.test.labels.empty())
    return bad(fmt::format("{}: {} example(s) leave no training or no held-out example (holdout "
                           "= {})", path, example, holdout));
  return out;
}

} // namespace af::train
