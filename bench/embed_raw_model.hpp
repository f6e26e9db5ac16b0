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
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "train/clicks.hpp"
#include "train/local.hpp"
#include "train/recommender.hpp"

namespace af::bench {

/// One worker's batches of the sparse job: its synthetic clicks (items 3,
/// zipf 0, holdout 0.2) in its order (train::example_order, the job's seed),
/// worker `rank`'s share of global batch `step` being positions
/// (step * workers + rank) * batch on (dist/sparse_job.cpp's rule). Both raw
/// runs of the line read these: with the model (the baseline) and without it
/// (transport only), so that they touch the rows the job touches.
class click_batches {
public:
  struct spec {
    int64_t users = 0;
    int64_t width = 0;     ///< a row: width - 1 factors and the id's bias
    size_t examples = 0;   ///< of the synthetic clicks (a fifth held out)
    uint64_t seed = 1;     ///< the job's: the same clicks, the same order
    size_t batch = 0;
    uint32_t rank = 0, workers = 1;
  };

  /// The job's data, or nothing with why on stderr.
  static std::optional<click_batches> make(const spec& s);

  /// Batch `step`: the user ids (returned), item ids and labels of this
  /// worker's share.
  const std::vector<int64_t>& users(uint64_t step);
  const std::vector<int32_t>& items() const { return items_; }
  const std::vector<float>& labels() const { return labels_; }

private:
  click_batches(const spec& s, train::click_split data);

  spec s_;
  train::click_split data_;
  train::example_order order_;
  std::vector<size_t> picks_;
  std::vector<int64_t> users_;
  std::vector<int32_t> items_;
  std::vector<float> labels_;
};

/// The key=value words of raw worker `rank` of one raw run of the line, after
/// the common ones (ports, rows, dim, batch, mode, warmup, window): `run` the
/// run's number (the shards tell runs apart by it), `job_seed` the seed of the
/// rep's sparse job (both raw runs read its clicks in its order), `model`:
/// the workers run the model step (the baseline), else they push their rows
/// scaled (transport only, on the same ids).
std::vector<std::string> raw_train_worker_args(int rank, uint64_t run, uint64_t job_seed,
                                               bool model, size_t examples);

class raw_fm_trainer {
public:
  struct spec {
    click_batches::spec data;
    float lr = 0.1f;       ///< of the item table and the global bias
  };

  /// The job's data and model, or nothing with why on stderr.
  static std::optional<raw_fm_trainer> make(const spec& s);

  /// The user ids of this worker's share of batch `step` (click_batches).
  const std::vector<int64_t>& batch_ids(uint64_t step) { return batches_.users(step); }

  /// Where the caller writes the distinct users' rows of the next step
  /// ([unique, width], in the order step()'s `example_row` refers to them).
  float* rows_for(size_t unique);

  /// The step on the batch batch_ids() chose and the rows written to
  /// rows_for(): `example_row[e]` is example e's row. Gives the user rows'
  /// gradients ([unique, width], valid until the next step); the item rows
  /// and the bias are updated here. Null, with why on stderr, if the model
  /// refused the batch.
  const float* step(const std::vector<uint32_t>& example_row);

  double last_loss = 0;

private:
  raw_fm_trainer(const spec& s, train::recommender m, click_batches b);

  spec s_;
  train::recommender model_;
  click_batches batches_;
  std::vector<std::vector<int32_t>> index_; ///< [user, item][example]
  tensor items_, bias_;
  tensor user_rows_;  ///< the step's rows, written by the caller
  tensor user_grads_; ///< the last step's gradients of them
};

} // namespace af::bench
