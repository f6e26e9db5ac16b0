#pragma once
/// What the chief of a training job reports while it trains: its progress
/// lines (with membership events), the metrics CSV and the per-worker rows
/// beside it. Internal to dist/ (progress_line and status_report are public:
/// dist/training.hpp).

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "dist/worker.hpp"
#include "train/config.hpp"
#include "train/metrics.hpp"

namespace af::training_detail {

/// The metrics CSV's path without ".csv": the plot and the per-worker rows go beside it.
std::string metrics_stem(const std::string& csv);

/// The chief's progress line and metrics rows (the job's, and one per worker
/// in <metrics stem>.workers.csv).
struct reporter {
  const train::train_config* cfg = nullptr;
  uint32_t workers = 0;
  uint64_t total = 0;
  uint64_t start = 0;
  bool print = true;
  std::optional<train::metrics_writer> metrics;
  std::FILE* per_worker = nullptr;
  uint64_t events_seen = 0;
  std::function<void(const worker_progress&)> forward;

  ~reporter() {
    if (per_worker)
      std::fclose(per_worker);
  }

  /// Prints the line (chief), writes the rows, forwards the report.
  void operator()(const worker_progress& p);
};

} // namespace af::training_detail
