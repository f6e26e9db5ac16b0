// The sparse job's metrics CSV and per-worker rows (dist/sparse_metrics.hpp),
// written by the dense job's reporter (dist/training_report.hpp).
#include "dist/sparse_metrics.hpp"

#include "actors/blocking_ask.hpp"
#include "core/log.hpp"
#include "dist/job_setup.hpp"
#include "dist/training_report.hpp"
#include "messages/error.hpp"

namespace af {

using namespace training_detail;

caf::expected<std::unique_ptr<sparse_metrics>>
sparse_metrics::open(const train::train_config& c, uint32_t workers, uint64_t start_step) {
  std::unique_ptr<sparse_metrics> out{new sparse_metrics};
  out->rep_ = std::make_unique<reporter>();
  auto& rep = *out->rep_;
  rep.cfg = &c;
  rep.workers = workers;
  rep.start = start_step;
  rep.print = false; // the sparse job prints its own progress lines
  if (!c.logdir.empty()) {
    // Scalars only: its reports carry no parameters (histogram_every is
    // the dense between-graph job's), said rather than ignored.
    if (c.histogram_every > 0)
      log::get()->warn("chief: histogram_every = {} is not written by this job (a sparse or "
                       "in-graph job's TensorBoard runs hold scalars only; the dense "
                       "between-graph job writes the histograms)",
                       c.histogram_every);
    auto runs = job_summary::open(c, start_step, {});
    if (!runs)
      return std::move(runs.error());
    rep.summary = std::move(*runs);
  }
  if (c.metrics.empty())
    return out;
  auto m = train::metrics_writer::open(c.metrics, start_step);
  if (!m)
    return to_error(m.error());
  rep.metrics.emplace(std::move(*m));
  rep.open_worker_rows(c.metrics, start_step);
  return out;
}

sparse_metrics::~sparse_metrics() = default;

std::string sparse_metrics::finish(uint64_t global_step, double accuracy, double test_loss,
                                   bool plot) {
  auto& rep = *rep_;
  if (rep.summary) {
    rep.summary->final_eval(global_step, accuracy, test_loss);
    rep.summary->close();
  }
  if (!rep.metrics)
    return "";
  auto csv = rep.metrics->path();
  rep.metrics.reset(); // closed: its rows are in the file
  return plot ? train::plot(csv, metrics_stem(csv) + ".png") : "";
}

void sparse_metrics::report(session& s, const aggregator_actor& ps0,
                            std::chrono::milliseconds timeout, uint64_t step, double seconds,
                            double loss, double examples_per_s) {
  worker_progress p;
  p.step = p.global_step = step;
  p.seconds = seconds;
  p.loss = loss;
  p.examples_per_s = examples_per_s;
  if (auto stats = ask<aggregator_stats>(s, ps0, timeout, stats_atom::value))
    p.stats = std::move(*stats);
  else
    log::get()->warn("chief: the stats of ps 0's aggregator at global step {}: {}; the "
                     "per-worker rows of this report are left out",
                     step, describe(stats.error()));
  (*rep_)(p);
}

} // namespace af
