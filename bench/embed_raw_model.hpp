#pragma once
// The raw workers' model for train_embed_10m_2w (embed_benches.hpp): what a
// hand-written trainer of the sparse job's model does each step besides moving
// rows, so that the line compares like with like (issue 24's rule; the dense
// 1 M line's raw worker computes its model's gradient too). It reads its
// share of each batch from the same synthetic clicks the job trains on, runs
// the same kernel the job's worker runs (train::recommender::step) on the rows
// the shards sent, keeps the 3-row item table and the global bias itself (SGD:
// small dense parameters a hand-written trainer would not send anywhere), and
// gives the user rows' gradients to push. No actorflow runtime: no CAF, no
// data plane, no tensors kept between steps beyond the model's own.
#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.hpp"
#include "train/clicks.hpp"
#include "train/local.hpp"
#include "train/recommender.hpp"

namespace af::bench {

class raw_fm_trainer {
public:
  struct spec {
    int64_t users = 0;
    int64_t width = 0;     ///< a row: width - 1 factors and the id's bias
    size_t examples = 0;   ///< of the synthetic clicks (a fifth held out)
    uint64_t seed = 1;     ///< the job's: the same clicks, the same order
    size_t batch = 0;
    uint32_t rank = 0, workers = 1;
    float lr = 0.1f;       ///< of the item table and the global bias
  };

  /// The job's data and model (items 3, zipf 0, holdout 0.2), or nothing
  /// with why on stderr.
  static std::optional<raw_fm_trainer> make(const spec& s);

  /// The user ids of this worker's share of batch `step` (the job's rule:
  /// positions (step * workers + rank) * batch of the shuffled order).
  const std::vector<int64_t>& batch_ids(uint64_t step);

  /// The step on the batch batch_ids() chose: `rows` the distinct users'
  /// rows ([unique, width], in the order `example_row` refers to them),
  /// `example_row[e]` example e's row. The user rows' gradients land in
  /// `grads` ([unique, width]); the item rows and the bias are updated here.
  /// False, with why on stderr, if the model refused the batch.
  bool step(const float* rows, size_t unique, const std::vector<uint32_t>& example_row,
            std::vector<float>& grads);

  double last_loss = 0;

private:
  raw_fm_trainer(const spec& s, train::recommender m, train::click_split data);

  spec s_;
  train::recommender model_;
  train::click_split data_;
  train::example_order order_;
  std::vector<size_t> picks_;
  std::vector<int64_t> users_;
  std::vector<float> labels_;
  std::vector<std::vector<int32_t>> index_; ///< [user, item][example]
  tensor items_, bias_;
};

} // namespace af::bench
