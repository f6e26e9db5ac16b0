#include "dist/training_report.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/log.hpp"
#include "dist/training.hpp"

namespace af {

namespace {

/// "  staleness median M max X histogram 0:n0 1:n1 ..." (buckets with a count).
std::string staleness_summary(const std::vector<uint64_t>& h) {
  uint64_t total = 0, max = 0;
  for (size_t s = 0; s < h.size(); ++s) {
    total += h[s];
    if (h[s] > 0)
      max = s;
  }
  if (total == 0)
    return "";
  uint64_t seen = 0, median = 0;
  for (size_t s = 0; s < h.size(); ++s) {
    seen += h[s];
    if (2 * seen >= total) {
      median = s;
      break;
    }
  }
  std::string hist;
  for (size_t s = 0; s < h.size(); ++s)
    if (h[s] > 0)
      hist += fmt::format(" {}{}:{}", s, s + 1 == h.size() ? "+" : "", h[s]);
  return fmt::format("  staleness median {} max {}{} histogram{}", median, max,
                     max + 1 == h.size() ? "+" : "", hist);
}

/// "  late 2:5  skipped 2:40  refused 0:1  guarded 1:3": per worker,
/// gradients that came after their step closed (dropped), steps it did not
/// send because it was told they had closed, values refused or abstained
/// from, and gradients the norm guard scaled down; "" if none.
std::string per_worker_summary(const aggregator_stats& s) {
  std::string late, skipped, refused, guarded;
  for (const auto& w : s.workers) {
    if (w.late > 0)
      late += fmt::format(" {}:{}", w.worker, w.late);
    if (w.skipped > 0)
      skipped += fmt::format(" {}:{}", w.worker, w.skipped);
    if (w.refused > 0)
      refused += fmt::format(" {}:{}", w.worker, w.refused);
    if (w.guarded > 0)
      guarded += fmt::format(" {}:{}", w.worker, w.guarded);
  }
  std::string out;
  if (!late.empty())
    out += "  late (dropped)" + late;
  if (!skipped.empty())
    out += "  skipped (step closed)" + skipped;
  if (!refused.empty())
    out += "  refused" + refused;
  if (!guarded.empty())
    out += "  guarded" + guarded;
  return out;
}

} // namespace

namespace training_detail {

/// The columns of <metrics stem>.workers.csv.
const char* const worker_rows_header = "step,wall_s,worker,task,status,examples_per_s,pushes,"
                                           "applied,late,refused,stale,waited_ms,clock,skipped";

/// Whether a resumed job appends to the per-worker rows at `path`: only to
/// a file with this header. One written with another (an older version's,
/// without the skipped column) is moved aside to <path>.old, said, so that
/// no file mixes two layouts; the job then starts a new one.
bool keep_worker_rows(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return false;
  std::string first;
  if (auto* f = std::fopen(path.c_str(), "r")) {
    char line[512];
    if (std::fgets(line, sizeof line, f))
      first = line;
    std::fclose(f);
  }
  while (!first.empty() && (first.back() == '\n' || first.back() == '\r'))
    first.pop_back();
  if (first == worker_rows_header)
    return true;
  auto aside = path + ".old";
  std::filesystem::rename(path, aside, ec);
  log::get()->warn("chief: {} has other columns than this version writes (its header: '{}'); "
                   "{}; this job writes a new {} with the header '{}'",
                   path, first,
                   ec ? fmt::format("it could not be moved aside ({}), and is written over",
                                    ec.message())
                      : "its rows were moved to " + aside,
                   path, worker_rows_header);
  return false;
}

void reporter::open_worker_rows(const std::string& metrics_csv, uint64_t start_step) {
  // A resumed job appends (its earlier rows stay, as in the metrics CSV).
  auto path = metrics_stem(metrics_csv) + ".workers.csv";
  bool fresh = start_step == 0 || !keep_worker_rows(path);
  per_worker = std::fopen(path.c_str(), fresh ? "w" : "a");
  if (!per_worker)
    log::get()->warn("chief: cannot write {} ({}); the per-worker rows are not kept", path,
                     std::strerror(errno));
  else if (fresh)
    std::fprintf(per_worker, "%s\n", worker_rows_header);
}

std::string metrics_stem(const std::string& csv) {
  return csv.size() > 4 && csv.substr(csv.size() - 4) == ".csv" ? csv.substr(0, csv.size() - 4) : csv;
}

void reporter::operator()(const worker_progress& p) {
  last_loss = p.loss;
  reports += 1;
  if (print) {
    std::printf("%s\n",
                progress_line(*cfg, total, start, p, time_left ? time_left() : "").c_str());
    // Who joined or left (and mode switches) since the last line.
    const auto& ev = p.stats.events;
    auto fresh = events.take(p.stats.events_total, ev.size());
    for (size_t i = ev.size() - fresh; i < ev.size(); ++i)
      std::printf("  %s\n", ev[i].c_str());
    std::fflush(stdout);
  }
  if (per_worker) {
    for (const auto& w : p.stats.workers)
      std::fprintf(per_worker, "%llu,%.3f,%u,%s,%s,%.1f,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu\n",
                   static_cast<unsigned long long>(p.step), p.seconds, w.worker, w.task.c_str(),
                   w.status.c_str(), w.examples_per_s, static_cast<unsigned long long>(w.pushes),
                   static_cast<unsigned long long>(w.applied),
                   static_cast<unsigned long long>(w.late),
                   static_cast<unsigned long long>(w.refused),
                   static_cast<unsigned long long>(w.stale),
                   static_cast<unsigned long long>(w.waited_ms),
                   static_cast<unsigned long long>(w.clock),
                   static_cast<unsigned long long>(w.skipped));
    std::fflush(per_worker);
  }
  if (metrics) {
    train::metrics_row row;
    row.step = p.step;
    row.wall_s = p.seconds;
    row.loss = p.loss;
    row.accuracy = p.accuracy;
    row.mode = cfg->mode;
    row.workers = workers;
    row.examples_per_s = p.examples_per_s * workers;
    metrics->write(row);
  }
  if (summary)
    summary->report(p, workers);
  if (forward)
    forward(p);
}

} // namespace training_detail

std::string progress_line(const train::train_config& c, uint64_t total, uint64_t start,
                          const worker_progress& p, const std::string& timed_left) {
  // A timed run stops at its window's end, not at `total`: the time left
  // is its warm-up's or window's (timed_left), never an estimate from steps.
  std::string left = timed_left;
  if (c.window_secs <= 0) {
    double secs = 0;
    uint64_t done = p.step > start ? p.step - start : 0;
    if (done > 0 && p.step < total)
      secs = p.seconds * static_cast<double>(total - p.step) / static_cast<double>(done);
    // Tenths under 10 s: a short job's lines said "0 s left" from its first.
    left = secs < 9.95 ? fmt::format("  {:.1f} s left", secs) : fmt::format("  {:.0f} s left", secs);
  }
  std::string acc = p.accuracy >= 0 ? fmt::format("  held-out {:.4f}", p.accuracy) : "";
  std::string what;
  if (c.mode == "average")
    what = fmt::format(" local steps of each replica, {} averaging round{} (every {})",
                       p.rounds, p.rounds == 1 ? "" : "s", std::max<uint32_t>(1, c.average_every));
  else if (c.mode == "allreduce")
    what = " steps of each replica";
  return fmt::format("step {}/{}{}  loss {:.4f}{}  {:.0f} examples/s (this worker){}{}{}",
                     p.step, total, what, p.loss, acc, p.examples_per_s,
                     staleness_summary(p.stats.staleness), per_worker_summary(p.stats), left);
}

std::string status_report(const std::string& where, const aggregator_stats& s) {
  std::string out = fmt::format("{}: mode {}, global step {}, {} update(s) applied, {} push(es), "
                                "{} member(s) pushing",
                                where, s.mode, s.global_step, s.applied, s.pushes, s.active);
  if (s.closed_at_deadline > 0)
    out += fmt::format(", {} step(s) closed at the deadline", s.closed_at_deadline);
  if (s.switches > 0)
    out += fmt::format(", {} mode switch(es)", s.switches);
  if (s.pipelined_rounds > 0 || !s.pipeline_auto.empty())
    out += fmt::format(", {} round(s) pipelined", s.pipelined_rounds);
  if (!s.pipeline_auto.empty())
    out += fmt::format(" (pipeline_sync = \"auto\": {})", s.pipeline_auto);
  out += "\n";
  out += fmt::format("  {:>6} {:<22} {:<7} {:>10} {:>7} {:>7} {:>6} {:>7} {:>6} {:>9} {:>7}\n",
                     "worker", "task", "status", "examples/s", "pushes", "applied", "late",
                     "refused", "stale", "waited_s", "idle_s");
  for (const auto& w : s.workers)
    out += fmt::format("  {:>6} {:<22} {:<7} {:>10.1f} {:>7} {:>7} {:>6} {:>7} {:>6} {:>9.1f} {:>7}\n",
                       w.worker, w.task.empty() ? "-" : w.task, w.status, w.examples_per_s,
                       w.pushes, w.applied, w.late, w.refused, w.stale,
                       static_cast<double>(w.waited_ms) / 1000.0,
                       w.idle_s < 0 ? std::string{"-"} : fmt::format("{:.1f}", w.idle_s));
  for (const auto& e : s.events)
    out += "  event: " + e + "\n";
  return out;
}

} // namespace af
