// train start/status/mode/wait/stop: a training job in the background, one
// thread and one session per worker task.

#include "repl/interpreter_state.hpp"

#include "dist/sparse_job.hpp"
#include "dist/train_client.hpp"

namespace af::repl {

void interpreter::state::train_cmd(const stmt& st) {
  if (st.words.empty())
    fail(st.command_at, "train: usage: " + std::string{find_command("train")->usage});
  const auto& sub = st.words[0].text;
  if (sub == "start")
    return train_start(st);
  if (sub == "status") {
    expect_words(st, 1, 1);
    return train_status();
  }
  if (sub == "mode") {
    expect_words(st, 2, 2);
    if (!job)
      fail(st.words[0].at, "train mode: no job was started here (train start FILE)");
    // Right after `train start` the aggregators may not exist yet: while
    // the job runs, look again until they do (bounded by the timeout).
    auto until = std::chrono::steady_clock::now() + opts.timeout;
    auto text = job_switch(sess(), job->cfg, st.words[1].text);
    while (!text && is(text.error(), af_error::not_found) && train_running()
           && std::chrono::steady_clock::now() < until && pause(ms{50}))
      text = job_switch(sess(), job->cfg, st.words[1].text);
    if (!text)
      fail(st.words[1].at, describe(text.error()));
    *out << *text;
    return;
  }
  if (sub == "stop") {
    expect_words(st, 1, 1);
    if (!job)
      fail(st.words[0].at, "train stop: no job was started here (train start FILE)");
    job->stop->store(true);
    return train_wait(st, opts.timeout);
  }
  if (sub == "wait") {
    expect_words(st, 1, 2);
    ms total{3600000};
    if (st.words.size() == 2) {
      auto d = parse_duration(st.words[1].text);
      if (!d)
        fail(st.words[1].at, "train wait: '" + st.words[1].text + "' is not a duration (30s, 5m)");
      total = *d;
    }
    return train_wait(st, total);
  }
  fail(st.words[0].at, "train: unknown subcommand '" + sub + "': start, status, mode, wait or stop");
}

bool interpreter::state::train_running() {
  std::lock_guard<std::mutex> g{job->m};
  return job->running > 0;
}

void interpreter::state::train_start(const stmt& st) {
  if (st.words.size() < 2)
    fail(st.words[0].at, "train start: usage: train start FILE [KEY=VALUE...]");
  if (job) {
    std::lock_guard<std::mutex> g{job->m};
    if (job->running > 0)
      fail(st.words[0].at, "train start: a job is running (train status; train wait)");
  }
  job.reset();
  auto c = train::load_train_config(st.words[1].text);
  if (!c)
    fail(st.words[1].at, c.error().what);
  std::vector<std::string> sets;
  ms step_delay{0};
  for (size_t i = 2; i < st.words.size(); ++i) {
    // step_delay_ms=N: every worker sleeps N ms per step (a slow job to
    // watch and switch; actorflow-train's --step-delay-ms).
    const auto& w = st.words[i];
    if (w.text.rfind("step_delay_ms=", 0) == 0) {
      auto d = parse_duration(w.text.substr(14) + "ms");
      if (!d || *d > ms{1000})
        fail(w.at, "train start: step_delay_ms takes milliseconds from 0 to 1000");
      step_delay = *d;
      continue;
    }
    sets.push_back(w.text);
  }
  auto cfg = train::apply_overrides(*c, sets);
  if (!cfg)
    fail(st.words.size() > 2 ? st.words[2].at : st.words[1].at, cfg.error().what);
  if (auto why = train::validate(*cfg); !why.empty())
    fail(st.words[1].at, why);
  // Its workers run the dense job, which knows no sparse model: each
  // worker failed with "model 'recommender' is unknown".
  if (sparse_job(*cfg))
    fail(st.words[1].at, "train start: model '" + cfg->model + "' is a sparse job "
                         "(docs/sparse.md), which the REPL does not run yet: run actorflow-train "
                         "--config FILE (embedded, or --job for this cluster's tasks); the REPL "
                         "declares tables with partitioned_table");
  auto workers = spec.num_tasks("worker");
  if (workers == 0)
    fail(st.words[0].at, "train start: the cluster has no worker job to train on");
  if (cfg->mode != "allreduce" && spec.num_tasks("ps") == 0)
    fail(st.words[0].at, "train start: mode " + cfg->mode + " needs a ps job, and this cluster has none");
  // Each worker task trains through a session of its own (not the REPL's).
  std::vector<session> sessions;
  if (auto why = job_preflight(*cfg); !why.empty())
    fail(st.words[1].at, "train start: " + why);
  for (size_t w = 0; w < workers; ++w) {
    auto s = make_session("worker", static_cast<int32_t>(w), false);
    if (!s)
      fail(s.error(), "train start");
    sessions.push_back(std::move(*s));
  }
  job = std::make_unique<train_job>();
  job->cfg = *cfg;
  job->file = st.words[1].text;
  job->running = workers;
  auto* j = job.get();
  for (size_t w = 0; w < workers; ++w)
    j->threads.emplace_back([j, w, step_delay,
                             s = std::make_shared<session>(std::move(sessions[w]))]() mutable {
      train_options o;
      o.print = false;
      o.step_delay = step_delay;
      o.stop = j->stop;
      o.shutdown_ps = false; // the REPL's cluster outlives the job
      if (w == 0)
        o.on_progress = [j](const worker_progress& p) {
          std::lock_guard<std::mutex> g{j->m};
          j->last_loss = p.loss;
          j->last_progress = "step " + std::to_string(p.step) + ", loss "
                             + std::to_string(p.loss)
                             + (p.accuracy >= 0 ? ", held-out accuracy " + std::to_string(p.accuracy) : "")
                             + ", " + std::to_string(static_cast<int64_t>(p.examples_per_s))
                             + " examples/s";
        };
      auto r = run_worker_task(*s, j->cfg, static_cast<uint32_t>(w), o);
      std::lock_guard<std::mutex> g{j->m};
      if (!r)
        j->failures.push_back("worker " + std::to_string(w) + ": " + describe(r.error()));
      else if (w == 0)
        j->chief = std::move(*r);
      s.reset();
      j->running -= 1;
      j->cv.notify_all();
    });
  *out << "training started in the background: mode " << cfg->mode << ", model " << cfg->model
       << ", data " << cfg->data << ", " << workers << " worker" << (workers == 1 ? "" : "s")
       << " (train status; train mode MODE; train wait)\n";
}

std::string interpreter::state::train_result_text() {
  std::string text;
  if (job->chief) {
    const auto& r = job->chief->result;
    if (job->chief->start_step > 0)
      text = "train: resumed from the checkpoint at global step "
             + std::to_string(job->chief->start_step) + " in " + job->cfg.checkpoint_dir + "\n";
    text += "train done: global step " + std::to_string(r.global_step) + " in "
           + std::to_string(static_cast<int64_t>(r.seconds * 1000)) + " ms";
    if (job->last_loss >= 0)
      text += ", training loss " + std::to_string(job->last_loss);
    if (r.accuracy >= 0)
      text += ", held-out accuracy " + std::to_string(r.accuracy);
    else if (r.test_loss >= 0)
      text += ", held-out loss " + std::to_string(r.test_loss);
    const auto& stats = job->chief->stats;
    if (stats.switches > 0)
      text += ", mode " + stats.mode + " (after " + std::to_string(stats.switches)
              + " live switch" + (stats.switches == 1 ? "" : "es") + " from " + job->cfg.mode + ")";
    else
      text += ", mode " + job->cfg.mode;
    if (!job->chief->checkpoint.empty())
      text += ", checkpoint " + job->chief->checkpoint;
    text += "\n";
    if (auto why = job_checkpoint_problem(job->cfg, *job->chief); !why.empty())
      text += "train failed: " + why + "\n";
  }
  // A worker that `train stop` ended says so; any other failure is one.
  bool stopped = false;
  for (const auto& f : job->failures) {
    if (job->stop->load() && f.find("its client stopped the job") != std::string::npos) {
      stopped = true;
      continue;
    }
    text += "train failed: " + f + "\n";
  }
  if (stopped)
    text = "train stopped (train stop)"
           + (job->last_progress.empty() ? std::string{} : "; last: " + job->last_progress) + "\n"
           + text;
  return text;
}

void interpreter::state::train_status() {
  if (!job)
    fail("train status: no job was started here (train start FILE)");
  std::unique_lock<std::mutex> g{job->m};
  auto secs = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now()
                                                               - job->started).count();
  if (job->running > 0) {
    *out << "training (" << job->file << ", started as " << job->cfg.mode << ") running for " << secs
         << " s, " << job->running << " worker(s) still training"
         << (job->last_progress.empty() ? "" : "; last: " + job->last_progress) << "\n";
    g.unlock();
    if (job->cfg.mode != "allreduce") {
      auto text = job_status_text(sess(), opts.timeout);
      if (!text && is(text.error(), af_error::not_found) && train_running())
        *out << "(the job is starting: its ps aggregators are not up yet)\n";
      else if (!text)
        fail(text.error(), "train status");
      else
        *out << *text;
    }
    return;
  }
  *out << train_result_text();
}

void interpreter::state::train_wait(const stmt& st, ms total) {
  if (!job)
    fail(st.words[0].at, "train wait: no job was started here (train start FILE)");
  auto until = std::chrono::steady_clock::now() + total;
  std::unique_lock<std::mutex> g{job->m};
  while (job->running > 0) {
    if (cancelled())
      fail(st.at, "train wait: cancelled (the job goes on: train status)");
    if (std::chrono::steady_clock::now() >= until)
      fail(st.at, "train wait: the job is still running after " + std::to_string(total.count())
                    + " ms (" + std::to_string(job->running) + " worker(s) training)");
    job->cv.wait_for(g, ms{20});
  }
  g.unlock();
  for (auto& t : job->threads)
    if (t.joinable())
      t.join();
  auto text = train_result_text();
  *out << text;
  if (text.find("train failed: ") != std::string::npos)
    fail("train: the job failed (above)");
}

} // namespace af::repl
