#pragma once
/// The metrics of a sparse job's chief (issue 25; metrics = "PATH"), as the
/// dense job's chief writes them (docs/training.md): the metrics CSV (a row
/// per progress report: step, wall_s, loss, mode, workers, examples_per_s;
/// accuracy empty, the held-out AUC is in the job's summary) and beside it
/// <stem>.workers.csv, a row per worker of ps 0's aggregator at each report.
/// A job resumed from a checkpoint keeps the rows up to its step. With
/// logdir, the same reports go to TensorBoard runs as the dense job's
/// (dist/training_summary.hpp; scalars, no histograms).
///
/// The dense in-graph job (dist/in_graph.cpp) writes its metrics through it
/// too: like the sparse job, its chief runs its own loop rather than the
/// worker actor whose reports feed the between-graph job's reporter.

#include <chrono>
#include <cstdint>
#include <memory>

#include "caf/expected.hpp"

#include "actors/session.hpp"
#include "messages/aggregator.hpp"
#include "train/config.hpp"

namespace af {

namespace training_detail {
struct reporter;
}

/// The chief's metrics files of one sparse job (open, then report at each progress report).
class sparse_metrics {
public:
  /// The files of `c.metrics` and the runs under `c.logdir` (either may be
  /// empty) for a job of `workers` workers (in-graph: its replicas) starting
  /// at global step `start_step`; an error names the path.
  static caf::expected<std::unique_ptr<sparse_metrics>>
  open(const train::train_config& c, uint32_t workers, uint64_t start_step);
  ~sparse_metrics();

  /// A report at global step `step`: `seconds` since the loop began, the
  /// mean loss since the last report, the examples/s of one worker (the
  /// CSV's are the job's: times workers), and ps 0's aggregator (asked for
  /// its stats through `s`, bounded by `timeout`; a failed ask writes the
  /// job's row without the workers').
  void report(session& s, const aggregator_actor& ps0, std::chrono::milliseconds timeout,
              uint64_t step, double seconds, double loss, double examples_per_s);

  /// The job's end: its held-out accuracy and loss (negative: none) as the
  /// runs' last point (at the last report's step, else `global_step`), the
  /// runs synced and closed, and the metrics CSV closed and, with `plot`,
  /// drawn beside it (<stem>.png). What became of the plot (as
  /// train::plot says; "" without one).
  std::string finish(uint64_t global_step, double accuracy, double test_loss, bool plot);

private:
  sparse_metrics() = default;
  std::unique_ptr<training_detail::reporter> rep_;
};

} // namespace af
