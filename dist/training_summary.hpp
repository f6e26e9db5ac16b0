#pragma once
/// The chief's TensorBoard runs of a training job (train_config::logdir;
/// docs/watching.md, "TensorBoard"): <logdir>/train holds the job's scalars
/// (loss, held-out accuracy and loss, learning rate, examples/s, steps/s) and,
/// every histogram_every reports, a histogram of each variable's values and
/// gradients; <logdir>/worker_<i> holds worker i's accounting from ps 0's
/// aggregator (pushes, applied, late, refused, stale, skipped, time waited,
/// examples/s), so TensorBoard draws the workers as lines of one chart.
/// Internal to dist/ (the reporter of dist/training_report.hpp writes it).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "caf/expected.hpp"

#include "dist/worker.hpp"
#include "summary/event_file.hpp"
#include "train/config.hpp"

namespace af::training_detail {

class job_summary {
public:
  /// Opens the job's run <c.logdir>/train (a new event file; the folders
  /// are made). A job at global step `start_step` (0: fresh; > 0: resumed)
  /// appends to its runs: new files that begin with a SessionLog START at
  /// start_step + 1 (TensorBoard then drops what an earlier job wrote past
  /// the checkpoint, or all of it for a fresh job) and hold only later
  /// steps, so no step is shown twice.
  /// `names`: the variables' names, in the order of worker_progress::values.
  static caf::expected<std::unique_ptr<job_summary>>
  open(const train::train_config& c, uint64_t start_step, std::vector<std::string> names);

  /// The events of one progress report of a job of `workers` workers, flushed.
  void report(const worker_progress& p, uint32_t workers);

  /// The job's held-out accuracy and loss after its last step (negative:
  /// not evaluated), at its last report's step (else `global_step`), unless
  /// that report carried them: the figure the job prints last is the run's
  /// last point.
  void final_eval(uint64_t global_step, double accuracy, double test_loss);

  /// The end of the job: every run's file flushed, synced to its disk
  /// (fsync) and closed, so that a finished job's runs survive a crash of
  /// the machine; a file that fails is said. Events after it are dropped.
  void close();

  /// Empty if `logdir` can hold the runs (it is made if needed, and this
  /// user can write it), else a sentence naming it, why and what to do.
  static std::string check_logdir(const std::string& logdir);

  /// The run folder of the job's scalars, and of worker `w`'s.
  static std::string job_run(const std::string& logdir);
  static std::string worker_run(const std::string& logdir, uint32_t w);
  /// The file a job holds an advisory lock (flock) on while it writes
  /// `logdir`, so that a second job writing it at once is told.
  static std::string lock_file(const std::string& logdir);

  ~job_summary();
  job_summary(const job_summary&) = delete;
  job_summary& operator=(const job_summary&) = delete;

private:
  job_summary() = default;
  /// Takes the logdir's lock (lock_file) for the job's life; if another
  /// job holds it, says so (both jobs' steps would mix in the runs).
  void lock_logdir();
  /// Worker `w`'s file, opened at its first report (null: it cannot be written, said once).
  summary::event_file* worker_file(uint32_t w);
  void histograms(const worker_progress& p, int64_t step);
  /// Flushes `f`; a file that fails is said once and written no more.
  void flush(std::unique_ptr<summary::event_file>& f);

  train::train_config cfg_;
  uint64_t start_step_ = 0;
  std::vector<std::string> names_;
  std::unique_ptr<summary::event_file> job_;
  std::map<uint32_t, std::unique_ptr<summary::event_file>> workers_;
  uint64_t reports_ = 0;
  uint64_t last_step_ = 0;     ///< the last step written (or the start): later ones only
  bool last_evaluated_ = false; ///< the report of last_step_ carried held-out figures
  double last_seconds_ = 0;
  int lock_fd_ = -1; ///< lock_file's, held while the job writes
  bool closed_ = false; ///< close() was called: later reports are dropped
};

} // namespace af::training_detail
