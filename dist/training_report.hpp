#pragma once
/// What the chief of a training job reports while it trains: its progress
/// lines (with membership events), the metrics CSV and the per-worker rows
/// beside it. Internal to dist/ (progress_line and status_report are public:
/// dist/training.hpp).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "dist/training_summary.hpp"
#include "dist/worker.hpp"
#include "train/config.hpp"
#include "train/metrics.hpp"

namespace af::training_detail {

/// The metrics CSV's path without ".csv": the plot and the per-worker rows go beside it.
std::string metrics_stem(const std::string& csv);

/// The columns of <metrics stem>.workers.csv.
extern const char* const worker_rows_header;

/// Whether a resumed job appends to the per-worker rows at `path`: only to
/// a file with worker_rows_header (one with another is moved aside to
/// <path>.old, said).
bool keep_worker_rows(const std::string& path);

/// Which of ps 0's membership and mode events a progress line has not
/// printed yet: the aggregator keeps its last few (`kept`) and counts all it
/// had (`total`). Plain data: tests/test_worker_loop.cpp drives it.
struct event_cursor {
  uint64_t seen = 0; ///< events printed so far (the aggregator's count)

  /// How many of the last `kept` events are new, and marks them seen. A
  /// count below what was seen: ps 0 died and its aggregator is a new one
  /// (its count starts again), whose events are all fresh.
  size_t take(uint64_t total, size_t kept) {
    if (total < seen)
      seen = 0;
    auto fresh = std::min<uint64_t>(total > seen ? total - seen : 0, kept);
    seen = std::max(seen, total);
    return static_cast<size_t>(fresh);
  }
};

/// The chief's progress line and metrics rows (the job's, and one per worker
/// in <metrics stem>.workers.csv), and its TensorBoard events.
struct reporter {
  const train::train_config* cfg = nullptr;
  uint32_t workers = 0;
  uint64_t total = 0;
  uint64_t start = 0;
  bool print = true;
  std::optional<train::metrics_writer> metrics;
  std::FILE* per_worker = nullptr;
  /// The TensorBoard runs (train_config::logdir); null: none.
  std::unique_ptr<job_summary> summary;
  event_cursor events;
  std::function<void(const worker_progress&)> forward;
  double last_loss = 0; ///< the last report's mean training loss
  uint64_t reports = 0; ///< reports so far (0: no loss was measured)
  /// A timed run, the chief: where its watch is (the lines show the time
  /// left in the warm-up or window); null otherwise.
  std::function<std::string()> time_left;

  ~reporter() {
    if (per_worker)
      std::fclose(per_worker);
  }

  /// Opens per_worker, <stem of `metrics_csv`>.workers.csv, for a job at
  /// `start_step`: a resumed job appends to rows it can keep, a fresh one
  /// starts the file with worker_rows_header; one that cannot be written is
  /// said, and the rows are not kept.
  void open_worker_rows(const std::string& metrics_csv, uint64_t start_step);

  /// Prints the line (chief), writes the rows, forwards the report.
  void operator()(const worker_progress& p);
};

} // namespace af::training_detail
