#include "dist/training_summary.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"
#include "summary/histogram.hpp"
#include "train/optimizer.hpp"

namespace af::training_detail {

namespace {

/// The histogram of one tensor (any dtype; float32 read in place).
summary::histogram histogram_of(const tensor& t) {
  if (t.type() == dtype::float32)
    return summary::make_histogram(t.data<float>(), t.num_elements());
  auto v = t.values<float>();
  return summary::make_histogram(v.data(), v.size());
}

} // namespace

std::string job_summary::check_logdir(const std::string& logdir) {
  auto refuse = [&](const std::string& what) {
    return fmt::format("TensorBoard logdir '{}': {}; choose a folder this user can write "
                       "(logdir in [train], or --logdir DIR)",
                       logdir, what);
  };
  std::error_code ec;
  // Before creating it: create_directories on a file says only "Not a
  // directory" (or "File exists"), which does not say which is the file.
  if (std::filesystem::exists(logdir, ec) && !std::filesystem::is_directory(logdir, ec))
    return refuse("it is a file, not a folder");
  std::filesystem::create_directories(logdir, ec);
  if (ec)
    return refuse("cannot create it: " + ec.message());
  if (::access(logdir.c_str(), W_OK | X_OK) != 0)
    return refuse(std::string{"cannot write in it: "} + std::strerror(errno));
  // The job's run folder: a file in its place is found by the chief only
  // once the cluster runs, and the other workers then wait out their
  // ps_recovery_timeout_ms for a chief that has gone.
  auto run = job_run(logdir);
  if (std::filesystem::exists(run, ec) && !std::filesystem::is_directory(run, ec))
    return refuse("'" + run + "', its job's run folder, is a file, not a folder");
  return {};
}

std::string job_summary::job_run(const std::string& logdir) {
  return (std::filesystem::path{logdir} / "train").string();
}

std::string job_summary::worker_run(const std::string& logdir, uint32_t w) {
  return (std::filesystem::path{logdir} / fmt::format("worker_{}", w)).string();
}

std::string job_summary::lock_file(const std::string& logdir) {
  return (std::filesystem::path{logdir} / ".actorflow-tensorboard.lock").string();
}

job_summary::~job_summary() {
  if (lock_fd_ >= 0)
    ::close(lock_fd_); // releases the flock
}

void job_summary::lock_logdir() {
  auto path = lock_file(cfg_.logdir);
  std::error_code ec;
  std::filesystem::create_directories(cfg_.logdir, ec);
  // Read-only, no symlink followed: the lock is all this file is for, and
  // a link planted in a shared logdir opens nothing elsewhere.
  lock_fd_ = ::open(path.c_str(), O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (lock_fd_ < 0)
    return; // the event files say if the folder cannot be written
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) == 0)
    return;
  bool held = errno == EWOULDBLOCK;
  ::close(lock_fd_);
  lock_fd_ = -1;
  // A warning, not a refusal: the lock is advisory (a folder on NFS may not
  // hold it), and the job itself trains as well either way.
  if (held)
    log::get()->warn("chief: another job is writing TensorBoard runs in '{}' now (it holds {}); "
                     "both jobs' steps mix in its runs and TensorBoard draws neither well: "
                     "give each job its own logdir ([train] logdir, or --logdir DIR)",
                     cfg_.logdir, path);
}

caf::expected<std::unique_ptr<job_summary>>
job_summary::open(const train::train_config& c, uint64_t start_step,
                  std::vector<std::string> names) {
  std::unique_ptr<job_summary> out{new job_summary};
  out->cfg_ = c;
  out->start_step_ = start_step;
  out->last_step_ = start_step;
  out->names_ = std::move(names);
  out->lock_logdir();
  std::string why;
  out->job_ = summary::event_file::open(job_run(c.logdir), why);
  if (!out->job_)
    return make_error(af_error::invalid_argument,
                      why + "; choose a logdir this user can write ([train] logdir, or --logdir DIR)");
  // Every job, fresh or resumed, begins its files with a START: TensorBoard
  // then drops what the run's earlier files hold from that step on (a run
  // that died past its checkpoint; or, for a fresh job, an earlier job of
  // the same logdir, whose steps would otherwise be drawn as a second line
  // zigzagging through this one's: with file_version 2 TensorBoard purges
  // on a START only, never on steps that go back).
  out->job_->start_at(static_cast<int64_t>(start_step + 1));
  out->flush(out->job_);
  return out;
}

summary::event_file* job_summary::worker_file(uint32_t w) {
  auto it = workers_.find(w);
  if (it != workers_.end())
    return it->second.get();
  std::string why;
  auto f = summary::event_file::open(worker_run(cfg_.logdir, w), why);
  if (!f)
    log::get()->warn("chief: worker {}'s TensorBoard run is not written: {}", w, why);
  else
    f->start_at(static_cast<int64_t>(start_step_ + 1)); // as the job's run (open)
  return workers_.emplace(w, std::move(f)).first->second.get();
}

void job_summary::flush(std::unique_ptr<summary::event_file>& f) {
  if (f && !f->flush()) {
    log::get()->warn("chief: {}; its TensorBoard run is written no more", f->error());
    f.reset();
  }
}

void job_summary::close() {
  auto close_one = [](std::unique_ptr<summary::event_file>& f) {
    if (f && !f->close())
      log::get()->warn("chief: {}; the end of its TensorBoard run may be lost", f->error());
    f.reset();
  };
  closed_ = true;
  close_one(job_);
  for (auto& [w, f] : workers_)
    close_one(f);
}

void job_summary::report(const worker_progress& p, uint32_t workers) {
  // Later steps only, whatever a report says: past the last one written
  // and, in a resumed job, past its checkpoint's step (the worker's loop
  // reports so; this keeps a run's files free of a step written twice).
  if (p.step <= last_step_ || closed_)
    return;
  auto step = static_cast<int64_t>(p.step);
  reports_ += 1;
  if (job_) {
    std::vector<std::pair<std::string, double>> s;
    s.emplace_back("loss", p.loss);
    if (p.accuracy >= 0)
      s.emplace_back("heldout/accuracy", p.accuracy);
    if (p.test_loss >= 0)
      s.emplace_back("heldout/loss", p.test_loss);
    s.emplace_back("learning_rate", train::learning_rate(cfg_.optimizer, p.step));
    // As the metrics CSV: the chief's rate times the workers.
    s.emplace_back("examples_per_s", p.examples_per_s * workers);
    double dt = p.seconds - last_seconds_;
    if (dt > 0)
      s.emplace_back("steps_per_s", static_cast<double>(p.step - last_step_) / dt);
    last_evaluated_ = p.accuracy >= 0 || p.test_loss >= 0;
    job_->scalars(step, s);
    if (cfg_.histogram_every > 0 && reports_ % cfg_.histogram_every == 0)
      histograms(p, step);
    flush(job_);
  }
  last_step_ = p.step;
  last_seconds_ = p.seconds;
  for (const auto& w : p.stats.workers) {
    auto* f = worker_file(w.worker);
    if (!f)
      continue;
    f->scalars(step, {{"pushes", static_cast<double>(w.pushes)},
                      {"applied", static_cast<double>(w.applied)},
                      {"late", static_cast<double>(w.late)},
                      {"refused", static_cast<double>(w.refused)},
                      {"stale", static_cast<double>(w.stale)},
                      {"skipped", static_cast<double>(w.skipped)},
                      {"waited_s", static_cast<double>(w.waited_ms) / 1000.0},
                      {"examples_per_s", w.examples_per_s}});
    flush(workers_[w.worker]);
  }
}

void job_summary::final_eval(uint64_t global_step, double accuracy, double test_loss) {
  // The dense job's last report does not evaluate (its end does), but a
  // report that did is not written twice.
  if (!job_ || closed_ || last_evaluated_ || (accuracy < 0 && test_loss < 0))
    return;
  auto step = static_cast<int64_t>(reports_ > 0 ? last_step_ : global_step);
  std::vector<std::pair<std::string, double>> s;
  if (accuracy >= 0)
    s.emplace_back("heldout/accuracy", accuracy);
  if (test_loss >= 0)
    s.emplace_back("heldout/loss", test_loss);
  job_->scalars(step, s);
  last_evaluated_ = true;
  flush(job_);
}

void job_summary::histograms(const worker_progress& p, int64_t step) {
  auto name = [&](size_t i) {
    return i < names_.size() ? names_[i] : fmt::format("variable_{}", i);
  };
  std::vector<std::pair<std::string, summary::histogram>> h;
  for (size_t i = 0; i < p.values.size(); ++i)
    h.emplace_back("values/" + name(i), histogram_of(p.values[i]));
  for (size_t i = 0; i < p.gradients.size(); ++i)
    h.emplace_back("gradients/" + name(i), histogram_of(p.gradients[i]));
  if (!h.empty())
    job_->histograms(step, h);
}

} // namespace af::training_detail
