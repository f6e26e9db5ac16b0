#pragma once
/// Click data for the recommendation model (train/recommender.hpp): a
/// synthetic set generated from a seed with a planted truth, and a CSV of
/// (user, item, label) rows a user supplies. No CAF.
///
/// The synthetic truth has the model's own form (fm_logit: factors dotted,
/// plus a user bias, an item bias and a global bias), so a trained model can
/// in principle match it; its held-out AUC and log-loss are the ceiling a
/// run is measured against. Ids are Zipf-distributed (id 0 the most
/// frequent, P(id = r) proportional to 1 / (r + 1)^zipf), as users' and
/// items' popularity is: most of a batch's ids repeat a few hot rows, and a
/// long tail is seen rarely.

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "graph/outcome.hpp"
#include "train/sparse_model.hpp"

namespace af::train {

struct click_spec {
  int64_t users = 1000;
  int64_t items = 1000;
  int64_t dim = 8;         ///< the truth's latent factors
  double zipf = 1.0;       ///< exponent of the ids' popularity (0: uniform)
  size_t examples = 100000;
  double holdout = 0.2;    ///< fraction of the examples held out
  uint64_t seed = 1;
  /// Standard deviations of the truth's factors (default dim^-1/4: a
  /// factor dot product of stddev about 1) and of its per-id biases; the
  /// global bias (-1: a click rate near 0.3).
  double factor_stddev = -1; ///< < 0: dim^-1/4
  double bias_stddev = 0.5;
  double global_bias = -1;
};

/// The planted truth: tables in the model's layout (a row is dim factors,
/// then the bias) and the global bias. Each element is a function of
/// (seed, table, row, column) alone, so a row is computed when it is needed
/// and a truth of 10 million users is never held whole; a table of at most
/// `cache_rows` rows is computed once (the same values).
struct click_truth {
  double global_bias = 0;
  int64_t dim = 0;
  uint64_t seed = 0;
  double factor_stddev = 0;
  double bias_stddev = 0;
  static constexpr int64_t cache_rows = 1 << 20;
  tensor user_table; ///< [users, dim + 1] when users <= cache_rows, else empty
  tensor item_table; ///< likewise for the items

  /// Row `id` of table `t` (recommender::user_table or item_table) into
  /// `out` (dim + 1 floats).
  void row(size_t t, int64_t id, float* out) const;
};

/// A data set split into training and held-out examples, each a
/// sparse_batch with two tables (users, items).
struct click_split {
  sparse_batch train;
  sparse_batch test;
  int64_t users = 0;
  int64_t items = 0;
};

struct synthetic_clicks {
  click_split data;
  click_truth truth;
  /// The truth's own probabilities on the held-out set scored: its AUC and
  /// log-loss (the best a model of this form can expect).
  double truth_auc = 0;
  double truth_log_loss = 0;
};

/// Generates `spec` (the same seed, the same data): truth, then examples
/// (user, item ~ Zipf, label ~ Bernoulli(sigmoid(truth logit))); the last
/// `holdout` of them held out (they are independent, so that is a fixed
/// random split). An error names a bad field.
outcome<synthetic_clicks> make_synthetic_clicks(const click_spec& spec);

/// The truth's probability of a click for (user, item).
double truth_probability(const click_truth& t, int64_t user, int64_t item);

/// Reads a CSV of `user,item,label` rows (an optional first line
/// `user,item,label`; blank lines skipped): ids integers in [0, users) and
/// [0, items) (the declared table sizes), labels 0 or 1. Example e is held
/// out when a hash of (seed, e) falls below `holdout` (a fixed split that
/// does not depend on the file's order elsewhere). An error names the file,
/// the line, the column and the value.
outcome<click_split> read_clicks_csv(const std::string& path, int64_t users, int64_t items,
                                     double holdout, uint64_t seed);

} // namespace af::train
