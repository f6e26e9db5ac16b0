#include "train/metrics.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <limits>
#include <numeric>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/child_process.hpp"

namespace af::train {

namespace {

namespace fs = std::filesystem;

constexpr const char* csv_header = "step,wall_s,loss,accuracy,mode,workers,examples_per_s\n";

/// A CSV field: quoted only if it needs to be.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos)
    return s;
  std::string out = "\"";
  for (char c : s)
    out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

/// `name` in a directory of $PATH, or "".
std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr)
    return {};
  std::string dirs = path;
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos)
      end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    auto candidate = (fs::path{dir.empty() ? "." : dir} / name).string();
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    start = end + 1;
  }
  return {};
}

/// A gnuplot single-quoted string: only ' is special (written twice).
std::string gnuplot_string(const std::string& s) {
  std::string out = "'";
  for (char c : s)
    out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

struct run_result {
  int exit_code = -1;
  std::string errors; ///< what it wrote on stderr
};

/// Runs `program script` with no shell (no path reaches a command line),
/// stdout discarded, stderr captured.
run_result run_gnuplot(const std::string& program, const std::string& script) {
  run_result r;
  child_spec spec;
  spec.argv = {"gnuplot", script};
  spec.program = program;
  spec.stdin_null = true;
  spec.out = child_output::discard;
  spec.err = child_output::capture;
  spec.max_output = 65536;
  child_process gnuplot{spec};
  if (!gnuplot.started()) {
    r.errors = gnuplot.start_error();
    return r;
  }
  int status = gnuplot.wait();
  r.errors = gnuplot.output();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

/// The last non-blank line of gnuplot's complaints (the one that says what).
std::string last_line(const std::string& text) {
  std::istringstream in{text};
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t^") != std::string::npos)
      last = line;
  return last;
}

} // namespace

std::string check_metrics_path(const std::string& path) {
  auto refuse = [&](const std::string& what, int err) {
    return fmt::format("metrics file '{}': {}: {}; choose a path this user can write (metrics "
                       "in [train], or --set metrics=FILE.csv)",
                       path, what, std::strerror(err));
  };
  std::error_code ec;
  auto parent = fs::path{path}.parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec)
      return refuse("cannot create its folder '" + parent.string() + "'", ec.value());
  }
  bool existed = fs::exists(path, ec);
  // A device or a fifo is no CSV: writing /dev/full fails on every row, and
  // reading it back for the plot never ends.
  if (existed && !fs::is_regular_file(path, ec))
    return refuse("it exists and is not a regular file", EINVAL);
  // O_APPEND without O_TRUNC: the check leaves an existing file as it was.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    return refuse("cannot open it for writing", errno);
  ::close(fd);
  if (!existed)
    ::unlink(path.c_str());
  return {};
}

outcome<metrics_writer> metrics_writer::open(const std::string& path, uint64_t resume_after) {
  std::error_code ec;
  auto parent = fs::path{path}.parent_path();
  if (!parent.empty())
    fs::create_directories(parent, ec);
  // The earlier run's rows up to the resumed step (a regular file with our
  // header only; at most 64 MiB of it is read).
  std::string kept;
  if (resume_after > 0 && fs::is_regular_file(path, ec)) {
    std::ifstream in{path};
    std::string line;
    constexpr size_t most = size_t{64} << 20;
    if (std::getline(in, line) && line + "\n" == csv_header)
      while (kept.size() < most && std::getline(in, line)) {
        char* end = nullptr;
        auto step = std::strtoull(line.c_str(), &end, 10);
        if (end != line.c_str() && *end == ',' && step <= resume_after)
          kept += line + "\n";
      }
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr)
    return graph_error{af_error::invalid_argument,
                       fmt::format("cannot write the metrics CSV '{}': {} (check the metrics "
                                   "path in the training config)",
                                   path, std::strerror(errno))};
  std::fputs(csv_header, f);
  std::fputs(kept.c_str(), f);
  std::fflush(f);
  return metrics_writer{f, path};
}

metrics_writer::metrics_writer(metrics_writer&& other) noexcept
  : f_(std::exchange(other.f_, nullptr)), path_(std::move(other.path_)) {
  // nop
}

metrics_writer& metrics_writer::operator=(metrics_writer&& other) noexcept {
  if (this != &other) {
    if (f_ != nullptr)
      std::fclose(f_);
    f_ = std::exchange(other.f_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

metrics_writer::~metrics_writer() {
  if (f_ != nullptr)
    std::fclose(f_);
}

void metrics_writer::write(const metrics_row& row) {
  if (f_ == nullptr)
    return;
  auto line = fmt::format("{},{:.3f},{:.6g},{},{},{},{:.1f}\n", row.step, row.wall_s, row.loss,
                          row.accuracy < 0 ? std::string{} : fmt::format("{:.4f}", row.accuracy),
                          csv_field(row.mode), row.workers, row.examples_per_s);
  std::fputs(line.c_str(), f_);
  std::fflush(f_);
}

std::string plot(const std::string& csv, const std::string& png) {
  const auto gnuplot = find_on_path("gnuplot");
  if (gnuplot.empty())
    return fmt::format("plot: gnuplot not found; apt-get install gnuplot-nox to get {}", png);
  if (png.find_first_of("\n\r") != std::string::npos)
    return "plot: the PNG path holds a line break, which gnuplot cannot take; no plot";
  // The data goes into the script as datablocks: only the PNG's path is
  // quoted, and rows without an accuracy simply are not in that block.
  std::error_code ec;
  if (!fs::is_regular_file(csv, ec))
    return fmt::format("plot: {} is not a regular file; no {}", csv, png);
  std::ifstream in{csv};
  if (!in)
    return fmt::format("plot: cannot read {}: {}; no {}", csv, std::strerror(errno), png);
  std::string loss_rows, accuracy_rows, line;
  std::getline(in, line); // the header
  while (std::getline(in, line)) {
    std::vector<std::string> cols;
    std::istringstream fields{line};
    for (std::string f; std::getline(fields, f, ',');)
      cols.push_back(f);
    if (cols.size() < 4)
      continue;
    loss_rows += cols[0] + " " + cols[2] + "\n";
    if (!cols[3].empty())
      accuracy_rows += cols[0] + " " + cols[3] + "\n";
  }
  if (loss_rows.empty())
    return fmt::format("plot: {} has no rows yet; no {}", csv, png);

  auto write_script = [&](const char* terminal) {
    std::string s;
    s += fmt::format("set terminal {} size 900,540\n", terminal);
    s += "set output " + gnuplot_string(png) + "\n";
    s += "$loss << EOD\n" + loss_rows + "EOD\n";
    if (!accuracy_rows.empty())
      s += "$accuracy << EOD\n" + accuracy_rows + "EOD\n";
    s += "set title " + gnuplot_string(fs::path{csv}.filename().string()) + " noenhanced\n";
    s += "set xlabel 'step'\nset ylabel 'training loss'\nset ytics nomirror\nset grid\n"
         "set key top center\n";
    if (!accuracy_rows.empty())
      s += "set y2label 'held-out accuracy'\nset y2range [0:1]\nset y2tics\n"
           "plot $loss using 1:2 with lines lw 2 title 'loss' axes x1y1, "
           "$accuracy using 1:2 with linespoints lw 2 pt 7 title 'held-out accuracy' axes x1y2\n";
    else
      s += "plot $loss using 1:2 with lines lw 2 title 'loss'\n";
    return s;
  };

  auto script_path = (fs::temp_directory_path() / "actorflow-plot-XXXXXX").string();
  int fd = ::mkstemp(script_path.data());
  if (fd < 0)
    return fmt::format("plot: cannot write a gnuplot script in {}: {}; no {}",
                       fs::temp_directory_path().string(), std::strerror(errno), png);
  ::close(fd);
  run_result r;
  // pngcairo draws better; gnuplot builds without cairo have only png.
  for (const char* terminal : {"pngcairo", "png"}) {
    std::ofstream{script_path, std::ios::trunc} << write_script(terminal);
    r = run_gnuplot(gnuplot, script_path);
    if (r.exit_code == 0 || r.errors.find("terminal") == std::string::npos)
      break;
  }
  fs::remove(script_path, ec);
  if (r.exit_code != 0 || !fs::exists(png, ec) || fs::file_size(png, ec) == 0)
    return fmt::format("plot: gnuplot could not draw {}: {}", png,
                       r.errors.empty() ? fmt::format("exit code {}", r.exit_code)
                                        : last_line(r.errors));
  return "plot: " + png;
}

double auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  const size_t n = scores.size();
  if (labels.size() != n)
    return std::numeric_limits<double>::quiet_NaN();
  // A NaN score (a diverged model) has no rank: the AUC is undefined, as
  // the log-loss is then. It would also break the sort's order and stall
  // the tie runs below (NaN equals nothing, itself included).
  for (float s : scores)
    if (std::isnan(s))
      return std::numeric_limits<double>::quiet_NaN();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Sum of the positives' ranks (1-based), each run of tied scores given
  // its average rank.
  double rank_sum = 0, positives = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]])
      ++j;
    double average_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    for (size_t k = i; k < j; ++k)
      if (labels[order[k]] > 0.5f) {
        rank_sum += average_rank;
        positives += 1;
      }
    i = j;
  }
  double negatives = static_cast<double>(n) - positives;
  if (positives == 0 || negatives == 0)
    return std::numeric_limits<double>::quiet_NaN();
  double u = rank_sum - positives * (positives + 1) / 2; // pairs a positive wins
  return u / (positives * negatives);
}

double log_loss(const std::vector<float>& p, const std::vector<float>& labels, double eps) {
  if (p.empty() || p.size() != labels.size())
    return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (size_t e = 0; e < p.size(); ++e) {
    double q = std::clamp(static_cast<double>(p[e]), eps, 1 - eps);
    sum -= labels[e] > 0.5f ? std::log(q) : std::log1p(-q);
  }
  return sum / static_cast<double>(p.size());
}

} // namespace af::train
