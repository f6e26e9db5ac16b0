#pragma once
/// What the user sees of a training run, no CAF: the metrics CSV and a plot.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "graph/outcome.hpp"

namespace af::train {

struct metrics_row {
  uint64_t step = 0;
  double wall_s = 0;      ///< since the run started
  double loss = 0;        ///< training loss (mean of the last steps)
  double accuracy = -1;   ///< held-out accuracy, -1 if not measured at this row
  std::string mode;
  uint32_t workers = 0;
  double examples_per_s = 0;
};

/// Appends rows to a CSV with the header
/// step,wall_s,loss,accuracy,mode,workers,examples_per_s
/// (accuracy empty when not measured). Each row is flushed.
class metrics_writer {
public:
  /// Starts the CSV at `path`. A job resumed at global step `resume_after`
  /// (> 0) keeps the rows of an earlier run up to that step (the rows
  /// after it are of steps the job runs again), so the file and its plot
  /// show the whole run; otherwise the file starts empty.
  static outcome<metrics_writer> open(const std::string& path, uint64_t resume_after = 0);
  metrics_writer(metrics_writer&&) noexcept;
  metrics_writer& operator=(metrics_writer&&) noexcept;
  ~metrics_writer();
  void write(const metrics_row& row);
  const std::string& path() const { return path_; }

private:
  metrics_writer(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  std::FILE* f_ = nullptr;
  std::string path_;
};

/// Empty if metrics_writer::open(path) can create the file (its folder is
/// created if needed; a file that exists is left as it is, a probe file is
/// removed again). Else a sentence naming the path, why and what to do, so
/// that a job is refused before it trains.
std::string check_metrics_path(const std::string& path);

/// Plots loss and accuracy against the step from `csv` into `png` with
/// gnuplot. Returns a sentence for the user: where the PNG is, or why there
/// is none (gnuplot not installed: "apt-get install gnuplot-nox").
std::string plot(const std::string& csv, const std::string& png);

/// Area under the ROC curve of `scores` for 0/1 `labels` (a label > 0.5 is
/// a positive): the Mann-Whitney U statistic over positives x negatives, the
/// chance that a random positive scores above a random negative, a tie
/// counting one half (ranks of tied scores averaged). NaN when the labels
/// hold no positive or no negative (the AUC is undefined), when a score is
/// NaN, or when the sizes differ. O(n log n).
double auc(const std::vector<float>& scores, const std::vector<float>& labels);

/// Mean binary cross-entropy of probabilities `p` against 0/1 `labels`,
/// each p clipped to [eps, 1 - eps] first (sklearn's log_loss: a confident
/// mistake costs -log(eps), not infinity). NaN for no examples or sizes
/// that differ.
double log_loss(const std::vector<float>& p, const std::vector<float>& labels, double eps = 1e-7);

} // namespace af::train
