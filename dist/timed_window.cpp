#include "dist/timed_window.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "actors/blocking_ask.hpp"
#include "core/log.hpp"
#include "dist/job_setup.hpp"
#include "messages/aggregator.hpp"
#include "messages/atoms.hpp"
#include "messages/error.hpp"

namespace af::training_detail {

namespace {

using steady = std::chrono::steady_clock;

/// How often the watch looks at ps 0 (before the warm-up) and at the user's stop.
constexpr std::chrono::milliseconds tick{10};

/// How long a request to the chief's store waits for any answer.
constexpr std::chrono::milliseconds kv_wait{5000};

/// What changed on ps 0 between `from` (the warm-up's start) and `to` (the
/// window's end) that makes the window another measurement than the
/// defined one: workers that joined, left or finished, a mode switch or a
/// change of its settings. "" if nothing did.
std::string changes(const aggregator_stats& from, const aggregator_stats& to) {
  std::vector<std::string> what;
  if (to.events_total > from.events_total) {
    // The events since `from` that `to` still holds (it keeps the last 32).
    auto fresh = std::min<uint64_t>(to.events_total - from.events_total, to.events.size());
    for (auto i = to.events.size() - fresh; i < to.events.size(); ++i)
      what.push_back(to.events[i]);
    if (fresh < to.events_total - from.events_total)
      what.push_back(fmt::format("{} earlier event(s)", to.events_total - from.events_total - fresh));
  }
  if (to.events_total < from.events_total) // counts start again: another aggregator
    what.push_back("ps 0's aggregator is a new one (its ps died and came back)");
  if (to.switches != from.switches && what.empty())
    what.push_back(fmt::format("mode {} -> {}", from.mode, to.mode));
  // A worker the job started with that finishes says so in no event.
  if (to.workers_done != from.workers_done || to.active != from.active)
    what.push_back(fmt::format("workers pushing {} -> {}", from.active, to.active));
  return fmt::format("{}", fmt::join(what, "; "));
}

} // namespace

std::string window_phase::left() const {
  auto phase = now.load();
  if (phase == starting)
    return "  waiting for every worker's first step";
  if (phase == over)
    return "";
  auto ns = until_ns.load() - steady::now().time_since_epoch().count();
  double secs = std::max<double>(0, static_cast<double>(ns) / 1e9);
  return fmt::format(secs < 10 ? "  {} {:.1f} s left" : "  {} {:.0f} s left",
                     phase == warm_up ? "warm-up" : "window", secs);
}

std::string stop_key(uint64_t chief_incarnation) {
  return fmt::format("train/window-stop/{}", chief_incarnation);
}

timed_window::timed_window(session& s, const train::train_config& c, uint32_t task,
                           uint32_t workers, aggregator_actor ps0, kv_store_actor store,
                           uint64_t incarnation, std::shared_ptr<const std::atomic<bool>> user_stop)
  : s_(s),
    c_(c),
    task_(task),
    workers_(workers),
    ps0_(std::move(ps0)),
    client_(std::in_place, s.system(), std::move(store), kv_wait),
    incarnation_(incarnation),
    user_stop_(std::move(user_stop)) {
  if (task == 0)
    thread_ = std::thread{[this] { run_chief(); }};
  else
    thread_ = std::thread{[this] { run_other(); }};
}

timed_window::~timed_window() {
  close();
}

window_result timed_window::close() {
  {
    std::lock_guard<std::mutex> guard{mutex_};
    closing_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable())
    thread_.join();
  return result_;
}

bool timed_window::wait_until(steady::time_point t) {
  std::unique_lock<std::mutex> lock{mutex_};
  for (;;) {
    if (closing_)
      return false;
    if (user_stop_ && user_stop_->load())
      stop_->store(true);
    auto now = steady::now();
    if (now >= t)
      return true;
    wake_.wait_for(lock, std::min<steady::duration>(t - now, tick));
  }
}

void timed_window::say_stop() {
  by_time_.store(true);
  stop_->store(true);
}

void timed_window::stop_for(caf::error why) {
  failure_ = std::move(why);
  stop_->store(true);
}

std::chrono::milliseconds timed_window::start_limit() const {
  // The others wait up to init_timeout_ms for the chief's start, then join
  // and take their first step.
  return std::chrono::milliseconds{uint64_t{c_.init_timeout_ms} + c_.step_timeout_ms};
}

void timed_window::run_chief() {
  auto timeout = std::chrono::milliseconds{std::min<uint32_t>(c_.step_timeout_ms, 5000)};
  // ps 0's global step, read at the midpoint of the request's round trip.
  aggregator_stats last;
  auto sample = [&](uint64_t& step, steady::time_point& at) {
    auto asked = steady::now();
    auto st = ask<aggregator_stats>(s_, ps0_, timeout, stats_atom::value);
    auto answered = steady::now();
    if (!st) {
      // No step count, no window: end the job cut short (it ran on towards
      // `steps`, its progress saying "window 0.0 s left", before).
      log::get()->error("chief: timed window: asking /job:ps/task:0 for its global step: {}; "
                        "ending the job without a measured window",
                        describe(st.error()));
      break_off();
      return false;
    }
    step = st->global_step;
    at = asked + (answered - asked) / 2;
    last = std::move(*st);
    return true;
  };
  auto enter = [&](window_phase::phase p, steady::time_point until) {
    phase_->until_ns.store(until.time_since_epoch().count());
    phase_->now.store(p);
  };
  aggregator_stats began; // ps 0 as the warm-up starts: its workers and mode
  // 1. every worker has taken a step: pushed, or skipped one that closed
  // without it (a backup worker slower than the others may skip every step
  // and never push)
  auto limit = steady::now() + start_limit();
  for (;;) {
    auto st = ask<aggregator_stats>(s_, ps0_, timeout, stats_atom::value);
    std::vector<std::string> idle;
    if (st)
      for (const auto& w : st->workers)
        if (w.pushes == 0 && w.skipped == 0)
          idle.push_back(fmt::format("worker {}{}{}", w.worker, w.task.empty() ? "" : " ",
                                     w.task));
    auto stepped = st ? st->workers.size() - idle.size() : 0;
    if (st && stepped >= workers_) {
      began = std::move(*st);
      break;
    }
    if (steady::now() >= limit) {
      // The window cannot be measured as defined (after every worker's
      // first step): the job ends cut short (`train done: window=cut_short`).
      log::get()->error(
        "chief: timed window: {} of {} workers took a step within {} ms (init_timeout_ms + "
        "step_timeout_ms) of the job's start{}{}; ending the job without measuring a window: "
        "check that every worker task was started and reaches /job:ps/task:0",
        stepped, workers_, start_limit().count(), idle.empty() ? "" : "; none yet from ",
        fmt::join(idle, ", "));
      if (!st)
        log::get()->error("chief: timed window: asking /job:ps/task:0 for its workers: {}",
                          describe(st.error()));
      break_off();
      return;
    }
    if (!wait_until(steady::now() + tick))
      return;
  }
  // 2. the warm-up, 3. the window
  auto both = steady::now();
  auto warm_end = both + std::chrono::duration_cast<steady::duration>(
                           std::chrono::duration<double>(c_.warmup_secs));
  enter(window_phase::warm_up, warm_end);
  if (!wait_until(warm_end))
    return;
  uint64_t g0 = 0, g1 = 0;
  steady::time_point t0, t1;
  if (!sample(g0, t0))
    return;
  auto window_end = t0 + std::chrono::duration_cast<steady::duration>(
                           std::chrono::duration<double>(c_.window_secs));
  enter(window_phase::window, window_end);
  if (!wait_until(window_end))
    return;
  if (!sample(g1, t1))
    return;
  phase_->now.store(window_phase::over);
  result_.steps = g1 >= g0 ? g1 - g0 : 0;
  result_.seconds = std::chrono::duration<double>(t1 - t0).count();
  // Another set of workers or another mode within the warm-up or the
  // window: not the defined measurement (its steps/s would mix two jobs).
  result_.not_measured = changes(began, last);
  result_.measured = result_.not_measured.empty();
  if (!result_.measured)
    log::get()->warn("chief: timed window: not measured: during the warm-up or the window: {}",
                     result_.not_measured);
  // 4. everyone stops: the others through the store, this worker at once
  break_off();
}

void timed_window::break_off() {
  if (auto err = client_->put(stop_key(incarnation_), "stop"))
    log::get()->warn("chief: could not tell the other workers that the timed window ended: {}",
                     describe(err));
  say_stop();
}

bool timed_window::look_up_store() {
  if (!relink_) {
    session_options so;
    so.timeout = kv_wait;
    so.connect_timeout = kv_wait;
    auto own = session::make(s_.system(), s_.cluster(), "/job:worker/task:" + std::to_string(task_),
                             so);
    if (!own)
      return false;
    relink_.emplace(std::move(*own));
  }
  auto chief = chief_store_of(*relink_);
  if (!chief || chief->incarnation != incarnation_)
    return false; // gone, stuck, or another chief: the callers say so
  client_.emplace(s_.system(), chief->store, kv_wait);
  return true;
}

void timed_window::run_other() {
  // The chief's stop comes after every worker's first step (start_limit),
  // the warm-up, the window, and a request to ps 0 (a step's timeout).
  auto waits = std::chrono::duration_cast<steady::duration>(
    std::chrono::duration<double>(c_.warmup_secs + c_.window_secs));
  auto limit = steady::now() + start_limit() + waits
               + std::chrono::milliseconds{c_.step_timeout_ms};
  std::string last_error;
  for (;;) {
    // The store answers a get once the key is there, or at the get's timeout.
    auto asked = steady::now();
    auto word = client_->get(stop_key(incarnation_), std::chrono::milliseconds{200});
    if (word) {
      say_stop();
      return;
    }
    bool down = is(word.error(), af_error::peer_down) || is(word.error(), af_error::unreachable);
    // No answer at all (not the store's own "not yet" after 200 ms): the
    // handle may reach nothing, as a down one. This worker's CAF link to the
    // chief breaks when it is stopped past connection_timeout_ms, the chief
    // living on; the old handle went with the link (its requests then fail,
    // or go unanswered), so the store is looked up anew, once per failure.
    if ((down || steady::now() - asked >= kv_wait) && look_up_store()) {
      log::get()->info("worker {}: looked the chief's key-value store up again ({})", task_,
                       describe(word.error()));
      continue;
    }
    if (down) {
      auto msg = fmt::format(
        "worker {}: the chief (/job:worker/task:0), whose key-value store says when the timed "
        "window ends, is gone ({}): this worker stops; the window's figures are the chief's, "
        "so this run has none: see the chief's log, and restart every task of the job",
        task_, describe(word.error()));
      log::get()->error("{}", msg);
      stop_for(make_error(af_error::peer_down, msg));
      return;
    }
    last_error = describe(word.error());
    if (steady::now() >= limit) {
      auto msg = fmt::format(
        "worker {}: the chief (/job:worker/task:0) did not say the timed window ended within "
        "{:.1f} s (init_timeout_ms + step_timeout_ms for every worker's first step, "
        "warmup_secs {} + window_secs {}, and step_timeout_ms); the last answer of its "
        "key-value store: {}: this worker stops; see the chief's log (is it alive, stuck?), "
        "and restart every task of the job",
        task_,
        std::chrono::duration<double>(start_limit() + waits
                                      + std::chrono::milliseconds{c_.step_timeout_ms})
          .count(),
        c_.warmup_secs, c_.window_secs, last_error);
      log::get()->error("{}", msg);
      stop_for(make_error(af_error::timeout, msg));
      return;
    }
    if (!wait_until(steady::now() + tick))
      return;
  }
}

} // namespace af::training_detail
