#include "dist/training.hpp"
#include "actors/system.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "dist/allreduce.hpp"
#include "actors/blocking_ask.hpp"
#include "dist/chief_start.hpp"
#include "dist/job_setup.hpp"
#include "dist/ps_recovery.hpp"
#include "dist/timed_window.hpp"
#include "dist/training_report.hpp"
#include "actors/kv_store.hpp"
#include "core/log.hpp"
#include "messages/error.hpp"
#include "train/checkpoint.hpp"
#include "train/checkpoint_check.hpp"
#include "train/local.hpp"
#include "train/metrics.hpp"
#include "train/partition.hpp"

namespace af {

namespace {

using namespace training_detail;

/// The snapshot of every shard's aggregator as one checkpoint (the step: the
/// latest of theirs), at the data position of `position(step)`.
caf::expected<train::checkpoint> snapshot(session& s, const std::vector<param_shard>& shards,
                                          const std::vector<train::parameter>& params,
                                          const train::train_config& c,
                                          const std::function<uint64_t(uint64_t)>& position) {
  train::checkpoint ck;
  std::chrono::milliseconds timeout{c.step_timeout_ms};
  std::vector<aggregator_state> states;
  for (const auto& shard : shards) {
    auto state = ask<aggregator_state>(s, shard.actor, timeout, save_atom::value);
    if (!state)
      return std::move(state.error());
    auto& seqs = ck.push_seqs[shard.aggregator];
    for (size_t i = 0; i < state->seq_workers.size() && i < state->seq_taken.size(); ++i)
      seqs[state->seq_workers[i]] = state->seq_taken[i];
    states.push_back(std::move(*state));
  }
  if (auto err = add_shard_states(ck, states, params, shards, c.optimizer.kind))
    return err;
  ck.data_position = position(ck.global_step);
  ck.config = train::to_toml(c);
  return ck;
}

/// What the phases of run_task share: the job as this worker task sees it,
/// and what each phase hands the next.
struct task_run {
  session& s;
  const train::train_config& c;
  uint32_t task;
  const train_options& opts;
  /// Set once the chief published its start under start_key, so that a
  /// failure before that is published (as the reason) by run_worker_task.
  bool& start_said;
  uint32_t workers = 0;
  uint32_t n_ps = 0;
  bool chief = false;
  bool allreduce = false;
  std::chrono::milliseconds timeout{0};
  job_data job;
  worker_setup setup;
  /// The latest checkpoint, if the job has one (find_checkpoint).
  std::optional<train::checkpoint> restored;
  std::string restored_path;
  checkpoint_access checkpoints;
  caf::error unreadable;
  /// sync, async, average: waits for a ps that died (start_on_ps).
  std::shared_ptr<recovery_context> recovery;
  std::shared_ptr<reporter> rep;
  std::shared_ptr<std::string> last_checkpoint = std::make_shared<std::string>();

  task_run(session& session_, const train::train_config& config, uint32_t index,
           const train_options& options, bool& said)
    : s(session_), c(config), task(index), opts(options), start_said(said) {}
};

/// The config, and this task's place in the cluster.
caf::error check_task(task_run& t) {
  const auto& c = t.c;
  if (auto err = check_config(c))
    return err;
  const auto& cluster = t.s.cluster();
  t.workers = static_cast<uint32_t>(cluster.num_tasks("worker"));
  auto workers = t.workers;
  if (workers == 0 || t.task >= workers)
    return make_error(af_error::invalid_argument,
                      fmt::format("worker task {} of a cluster with {} worker tasks", t.task,
                                  workers));
  if (auto bad = train::check_workers(c, workers); !bad.empty())
    return make_error(af_error::invalid_config, bad);
  t.chief = t.task == 0;
  t.allreduce = c.mode == "allreduce";
  t.n_ps = static_cast<uint32_t>(cluster.num_tasks("ps"));
  if (!t.allreduce && t.n_ps == 0)
    return make_error(af_error::invalid_argument,
                      "mode '" + c.mode + "' needs a ps job in the cluster; allreduce needs none");
  t.timeout = std::chrono::milliseconds{c.step_timeout_ms};
  return caf::none;
}

/// 1. data and parameters, and what the worker actor is given of them.
caf::error load_task(task_run& t) {
  const auto& c = t.c;
  auto job = load_job(c, t.workers, train::step_per_push(c.mode) ? 1 : t.workers);
  if (!job)
    return std::move(job.error());
  t.job = std::move(*job);
  auto& setup = t.setup;
  setup.index = t.task;
  setup.workers = t.workers;
  setup.cfg = c;
  setup.data = t.job.data;
  setup.params = t.job.params;
  setup.total_steps = t.job.total;
  setup.timeout = t.timeout;
  setup.tamper = t.opts.tamper;
  setup.before_push = t.opts.before_push;
  setup.step_delay = t.opts.step_delay;
  setup.stop = t.opts.stop;
  setup.task_name = "/job:worker/task:" + std::to_string(t.task);
  if (auto addr = t.s.cluster().address("worker", static_cast<int32_t>(t.task)))
    setup.address = addr->to_string();
  if (t.opts.join && (t.chief || t.allreduce))
    return make_error(af_error::invalid_argument,
                      t.chief ? "--join is for a worker that joins a running job; worker 0 is "
                                "the chief, which starts it"
                              : "mode allreduce has no aggregator to join: its workers are fixed");
  return caf::none;
}

/// The latest checkpoint, if the job has one: the chief restores it to a
/// ps without state (not to one that runs the job already:
/// start_job_on_ps); in allreduce every worker does, from the shared
/// directory. The checkpoint_key is needed to write checkpoints too: a bad
/// one fails here. A latest checkpoint that cannot be read fails the chief
/// only if a ps needs it (start_job_on_ps): a running job whose every ps
/// is live does not. (A chief that fails before it published its start
/// tells the others why: run_worker_task.)
caf::error find_checkpoint(task_run& t) {
  const auto& c = t.c;
  if (c.checkpoint_dir.empty() || !(t.chief || t.allreduce))
    return caf::none;
  auto access = checkpoint_access_of(c, t.job.params, t.job.total, t.workers);
  if (!access)
    return std::move(access.error());
  t.checkpoints = std::move(*access);
  auto latest = load_latest_checkpoint(t.checkpoints);
  if (!latest) {
    if (t.allreduce)
      return std::move(latest.error());
    t.unreadable = std::move(latest.error());
  } else if (*latest) {
    t.restored = std::move((*latest)->second);
    t.restored_path = (*latest)->first;
    if (t.allreduce)
      log::get()->info("worker {}: restoring {} (global step {})", t.task, t.restored_path,
                       t.restored->global_step);
  }
  return caf::none;
}

/// The recovery of a ps that dies while the job runs (ps_recovery.hpp).
void arm_recovery(task_run& t, const ps_placement& placed, const chief_store& chief_info) {
  if (t.c.ps_recovery_timeout_ms == 0)
    return;
  auto ctx = std::make_shared<recovery_context>();
  t.recovery = ctx;
  ctx->s = &t.s;
  ctx->c = t.c;
  ctx->params = t.job.params;
  ctx->shards = t.setup.shards;
  ctx->vars = placed.shard_vars;
  ctx->specs = placed.specs;
  ctx->store = chief_info.store;
  ctx->checkpoints = t.checkpoints;
  ctx->chief_incarnation = chief_info.incarnation;
  ctx->task = t.task;
  ctx->stop = t.opts.stop;
  t.setup.recover_ps = recover_ps_of(ctx);
  t.setup.find_ps = find_aggregator_of(ctx);
}

/// The chief: starts the job on the ps tasks and publishes where it starts.
caf::error chief_starts_job(task_run& t, const ps_placement& placed, kv_client& client,
                            uint64_t incarnation) {
  // A ps that runs the job already (the chief died and came back) is
  // taken as it is; only one without state is restored or initialized.
  ps_found found_here = ps_found::unknown;
  auto started = start_job_on_ps(t.s, t.c, t.job.params, t.setup.shards, placed.shard_vars,
                                 t.workers, t.restored, t.restored_path, t.unreadable, found_here);
  if (t.opts.found)
    t.opts.found->store(found_here);
  if (!started)
    return std::move(started.error());
  t.setup.start_step = started->step;
  t.setup.start_position = started->position;
  if (auto err = client.put(start_key(incarnation),
                            fmt::format("{} {} {}", t.setup.start_step, t.setup.start_position,
                                        t.job.total)))
    return err;
  t.start_said = true;
  return caf::none;
}

/// Another worker: waits for the chief's word (its start, or why it could
/// not), then for the variables, and starts where the job is now.
caf::error wait_for_chief(task_run& t, const ps_placement& placed, kv_client& client,
                          uint64_t incarnation) {
  const auto& c = t.c;
  auto& setup = t.setup;
  auto word = client.get(start_key(incarnation), std::chrono::milliseconds{c.init_timeout_ms});
  if (!word)
    return std::move(word.error());
  if (word->rfind("failed ", 0) == 0)
    return make_error(af_error::aborted,
                      fmt::format("the chief (worker 0) could not start the job: {}",
                                  word->substr(7)));
  std::string published = std::move(*word);
  if (auto err = t.s.wait_initialized(std::chrono::milliseconds{c.init_timeout_ms}, placed.vars))
    return err;
  auto stats = ask<aggregator_stats>(t.s, setup.shards[0].actor, t.timeout, stats_atom::value);
  if (!stats)
    return std::move(stats.error());
  setup.start_step = stats->global_step;
  // sync, async and ssp workers push gradients and may meet any of those
  // modes (a live switch); average workers push parameters after local
  // steps. A joiner whose config says otherwise would push the wrong kind.
  if (t.opts.join && (stats->mode == "average") != (c.mode == "average"))
    return make_error(af_error::invalid_argument,
                      fmt::format("the job runs mode {}, this worker's config says {}: join "
                                  "with --set mode={}",
                                  stats->mode, c.mode, stats->mode));
  // The chief's start, moved on by the steps the job took since.
  unsigned long long step0 = 0, position0 = 0, total0 = 0;
  if (std::sscanf(published.c_str(), "%llu %llu %llu", &step0, &position0, &total0) != 3)
    return make_error(af_error::internal, "the chief published its start as '" + published
                                            + "', not '<global step> <data position> <total "
                                              "steps>'");
  // The chief's count of steps: a worker that joins with a config of
  // more workers would count fewer (sync: a global batch per step).
  t.job.total = total0;
  setup.total_steps = t.job.total;
  setup.start_position = data_position(c.mode, t.workers, step0, position0,
                                       setup.start_step - std::min<uint64_t>(step0, setup.start_step),
                                       setup.start_step);
  return caf::none;
}

/// average: every replica starts from the job's slots (restored, else
/// zeros), their pieces assembled per parameter, as a checkpoint holds them.
caf::error average_slots(task_run& t) {
  const auto& c = t.c;
  const auto& params = t.job.params;
  train::checkpoint held;
  std::vector<aggregator_state> states;
  for (const auto& shard : t.setup.shards) {
    auto state = ask<aggregator_state>(t.s, shard.actor, t.timeout, save_atom::value);
    if (!state)
      return std::move(state.error());
    states.push_back(std::move(*state));
  }
  if (auto err = add_shard_states(held, states, params, t.setup.shards, c.optimizer.kind))
    return err;
  auto slot_names = train::slot_names(c.optimizer.kind);
  t.setup.initial_slots.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    for (auto& v : held.variables)
      if (v.name == params[i].name)
        for (const auto& sn : slot_names)
          t.setup.initial_slots[i].push_back(std::move(v.slots[sn]));
  return caf::none;
}

/// 2-3. sync, async, average: variables and aggregators on the ps tasks,
/// initialized or restored by the chief, waited for by the others.
caf::error start_on_ps(task_run& t) {
  // One name per ps for the job's life: a live switch changes the mode of
  // the aggregator behind it, and --status and --switch find it by it.
  auto placed = place_on_ps(t.s, t.c, t.job.params, "train/", t.c.mode,
                            t.opts.join ? 0 : t.workers);
  if (!placed)
    return std::move(placed.error());
  t.setup.shards = std::move(placed->shards);
  auto chief_info = chief_store_of(t.s);
  if (!chief_info)
    return std::move(chief_info.error());
  arm_recovery(t, *placed, *chief_info);
  // The store answers a get at its own deadline; the client's margin
  // only covers a round trip. A store whose node died (a chief killed or
  // failed at start) answers nothing, and CAF does not fail a request to
  // a dead remote actor: the margin is how late the others learn of it.
  kv_client client{t.s.system(), chief_info->store,
                   std::min<std::chrono::milliseconds>(t.timeout, std::chrono::seconds{5})};
  // The chief publishes where the job starts once it has initialized or
  // restored the variables, or why it could not: the others wait for that
  // word instead of waiting init_timeout_ms for variables that a failed
  // chief will never initialize.
  auto err = t.chief ? chief_starts_job(t, *placed, client, chief_info->incarnation)
                     : wait_for_chief(t, *placed, client, chief_info->incarnation);
  if (err)
    return err;
  if (t.c.mode == "average")
    return average_slots(t);
  return caf::none;
}

/// 2-3. allreduce: the same first values everywhere (the same seeds), or
/// the checkpoint's, and the group of workers that all-reduces.
caf::error start_allreduce(task_run& t) {
  const auto& c = t.c;
  const auto& params = t.job.params;
  auto& setup = t.setup;
  auto init = train::initial_values(params);
  if (!init)
    return to_error(init.error());
  setup.initial = std::move(*init);
  if (t.restored) {
    // Every parameter whole: the plan of one ps with no partitions.
    auto whole = train::plan_partitions(params, 1, 1, 1);
    if (!whole)
      return to_error(whole.error());
    auto state = restored_state(*t.restored, c.checkpoint_dir, params, whole->pieces,
                                c.optimizer);
    if (!state)
      return std::move(state.error());
    setup.initial = std::move(state->values);
    setup.initial_slots = std::move(state->slots);
    setup.start_step = t.restored->global_step;
    setup.start_position = t.restored->data_position;
  }
  auto chief_info = chief_store_of(t.s);
  if (!chief_info)
    return std::move(chief_info.error());
  kv_client client{t.s.system(), chief_info->store, t.timeout};
  auto group = allreduce_group::create(
    t.task, t.workers, fmt::format("train/{}/{}", chief_info->incarnation, setup.start_step),
    client, t.timeout, t.s.cluster().address("worker", static_cast<int32_t>(t.task))->host);
  if (!group)
    return std::move(group.error());
  auto& g = **group;
  // The ring's links are plain TCP (no TLS) where they are not shared memory
  // between processes of one host under one user: said loudly with
  // [security] (docs/security.md).
  if (system_tls(t.s.system()) != nullptr && !(g.shm_to_right() && g.shm_from_left()))
    log::get()->warn("worker {}: [security] is set, but the all-reduce ring has no TLS: {}; "
                     "its TCP links carry gradients unencrypted, and admit a peer by its "
                     "introduction, not a certificate (docs/security.md): run allreduce jobs "
                     "only on a network that is the cluster's own",
                     t.task, g.transport());
  else
    log::get()->info("worker {}: all-reduce ring: {}", t.task, g.transport());
  setup.group = std::shared_ptr<allreduce_group>(std::move(*group));
  return caf::none;
}

/// 4. the replica of the step on this worker's own device.
caf::error build_task_replica(task_run& t) {
  auto& s = t.s;
  auto& setup = t.setup;
  {
    auto scope = s.device("/job:worker/task:" + std::to_string(t.task));
    if (!scope)
      return std::move(scope.error());
    auto r = train::build_replica(s.builder(), t.job.params, t.c.model, "replica/");
    if (!r)
      return to_error(r.error());
    setup.model = std::move(*r);
  }
  std::vector<output> fetches{setup.model.loss};
  fetches.insert(fetches.end(), setup.model.grads.begin(), setup.model.grads.end());
  auto step = s.prepare(fetches);
  if (!step)
    return std::move(step.error());
  setup.step = *step;
  if (t.chief) {
    std::vector<output> eval{setup.model.loss};
    if (setup.model.correct.valid())
      eval.push_back(setup.model.correct);
    auto ev = s.prepare(eval);
    if (!ev)
      return std::move(ev.error());
    setup.eval = *ev;
  }
  return caf::none;
}

/// The progress reports (the chief's lines and metrics rows) and the chief's
/// checkpoint writer.
caf::error report_and_save(task_run& t) {
  const auto& c = t.c;
  auto& setup = t.setup;
  auto rep = std::make_shared<reporter>();
  t.rep = rep;
  rep->cfg = &c;
  rep->workers = t.workers;
  rep->total = t.job.total;
  rep->start = setup.start_step;
  rep->print = t.opts.print && t.chief;
  rep->forward = t.opts.on_progress;
  if (t.chief && !c.metrics.empty()) {
    auto m = train::metrics_writer::open(c.metrics, setup.start_step);
    if (!m)
      return to_error(m.error());
    rep->metrics.emplace(std::move(*m));
    if (!t.allreduce)
      rep->open_worker_rows(c.metrics, setup.start_step);
  }
  if (t.chief && !c.logdir.empty()) {
    std::vector<std::string> names;
    for (const auto& param : setup.params)
      names.push_back(param.name);
    auto runs = job_summary::open(c, setup.start_step, std::move(names));
    if (!runs)
      return std::move(runs.error());
    rep->summary = std::move(*runs);
  }
  setup.on_progress = [rep](const worker_progress& p) { (*rep)(p); };
  auto last_checkpoint = t.last_checkpoint;
  if (t.chief && !c.checkpoint_dir.empty())
    setup.save = [checkpoints = t.checkpoints, last_checkpoint](const train::checkpoint& ck)
      -> caf::expected<std::string> {
      // One that no job could restore is not written over a good one.
      if (auto bad = train::first_non_finite_value(ck); !bad.empty())
        return make_error(af_error::non_finite,
                          fmt::format("the checkpoint of global step {} is not written: it {}",
                                      ck.global_step, bad));
      auto where = train::save(checkpoints.dir, ck, 3, checkpoints.key);
      if (!where)
        return to_error(where.error());
      *last_checkpoint = *where;
      return *where;
    };
  return caf::none;
}

/// 5. the step loop: the worker actor trains; this thread waits for it.
caf::expected<worker_result> train_task(task_run& t, worker_setup setup) {
  std::promise<caf::expected<worker_result>> finished;
  auto result = finished.get_future();
  spawn_worker(t.s.system(), std::move(setup), [&finished](caf::expected<worker_result> r) {
    finished.set_value(std::move(r));
  });
  auto r = result.get();
  // The recovery link may outlive the worker a little: its session goes now,
  // before this one and the actor system.
  if (t.recovery)
    close_recovery(*t.recovery);
  return r;
}

/// Another worker at its end. A sync job's rounds go on without a chief
/// that died (its aggregators dropped it from the membership), so this
/// worker can reach the end alone: nothing it trained since the chief's last
/// checkpoint is saved, and the job has no result. Said, not "done": the
/// aggregator knows whether the chief finished or left (after a normal end
/// the ps may be stopped already: no answer is no news).
caf::expected<train_outcome> finish_worker(task_run& t, train_outcome outcome,
                                           const std::vector<param_shard>& shards) {
  if (!t.allreduce && !shards.empty())
    if (auto st = ask<aggregator_stats>(t.s, shards[0].actor, std::chrono::milliseconds{2000},
                                        stats_atom::value))
      for (const auto& w : st->workers)
        if (w.worker == 0 && w.status == "left")
          return make_error(af_error::aborted,
                            fmt::format("worker {} reached the end of the job, but the chief "
                                        "/job:worker/task:0 left it (it died) before: the steps "
                                        "trained since its last checkpoint were not saved and "
                                        "the job has no result; restart every task of the "
                                        "job, and the chief resumes from the latest "
                                        "checkpoint",
                                        t.task));
  outcome.checkpoint = *t.last_checkpoint;
  return outcome;
}

/// The chief: the other workers finish the same step (sync) or soon after
/// (async, average): waits for them, bounded, with ps 0's stats in `outcome`.
caf::error wait_for_workers(task_run& t, train_outcome& outcome,
                            const std::vector<param_shard>& shards) {
  auto timeout = t.timeout;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto stats = ask<aggregator_stats>(t.s, shards[0].actor, timeout, stats_atom::value);
    if (!stats)
      return std::move(stats.error());
    outcome.stats = *stats;
    // Every member done or gone (workers that joined included).
    if (stats->active == 0)
      return caf::none;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::vector<std::string> who;
      for (const auto& w : stats->workers)
        if (w.status == "member" || w.status == "held")
          who.push_back(fmt::format("worker {} ({}, last push {:.1f} s ago)", w.worker,
                                    w.task.empty() ? "never joined" : w.task, w.idle_s));
      log::get()->warn("chief: {} still pushing {} ms after the chief finished (stopped? not "
                       "started?); stopping the ps tasks anyway",
                       fmt::join(who, ", "), timeout.count());
      return caf::none;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// sync: every shard closes the same rounds, so the shards end at one step
/// unless a live switch left them apart. A shard that ended elsewhere is
/// said, with every shard's step: the job's step is the first shard's, which
/// may differ from the one the workers stopped at.
void warn_uneven_shards(task_run& t, const train_outcome& outcome,
                        const std::vector<param_shard>& shards) {
  if (outcome.stats.mode != "sync" || shards.size() <= 1)
    return;
  std::vector<std::string> at;
  bool differ = false;
  for (const auto& shard : shards) {
    auto st = ask<aggregator_stats>(t.s, shard.actor, t.timeout, stats_atom::value);
    if (!st)
      break;
    differ = differ || st->global_step != outcome.stats.global_step;
    at.push_back(fmt::format("{} at {}", shard.task, st->global_step));
  }
  if (differ)
    log::get()->warn("chief: the sync job's ps ended at different global steps ({}); the "
                     "chief stopped at {}",
                     fmt::join(at, ", "), outcome.result.global_step);
}

/// What the chief's worker actor started from and saves with (setup is
/// handed to the actor).
struct chief_view {
  std::vector<param_shard> shards;
  uint64_t start_step = 0;
  uint64_t start_position = 0;
  std::function<caf::expected<std::string>(const train::checkpoint&)> save;
};

/// The chief, sync, async, average: waits for the other workers, saves the
/// aggregators' state (sync, async, ssp: decided by the mode the job ended
/// in: a live switch may have changed it), stops the ps tasks, and fails
/// the job if a worker failed.
caf::error finish_ps_job(task_run& t, train_outcome& outcome, const chief_view& v) {
  const auto& c = t.c;
  const auto& shards = v.shards;
  if (auto err = wait_for_workers(t, outcome, shards))
    return err;
  warn_uneven_shards(t, outcome, shards);
  // The job's last step (async: the others' last pushes came after the
  // chief's), which the final checkpoint records too.
  outcome.result.global_step = std::max(outcome.result.global_step, outcome.stats.global_step);
  auto final_mode = outcome.stats.mode.empty() ? c.mode : outcome.stats.mode;
  if (v.save && final_mode != "average") {
    auto local_steps = outcome.result.local_steps;
    auto workers = t.workers;
    auto ck = snapshot(t.s, shards, t.job.params, c, [&](uint64_t g) {
      return data_position(final_mode, workers, v.start_step, v.start_position, local_steps, g);
    });
    if (!ck)
      return std::move(ck.error());
    auto where = v.save(*ck);
    if (!where)
      return std::move(where.error());
  }
  if (t.opts.shutdown_ps)
    for (uint32_t k = 0; k < t.n_ps; ++k)
      if (auto err = t.s.shutdown("ps", static_cast<int32_t>(k)))
        log::get()->warn("chief: shutting down /job:ps/task:{}: {}", k, describe(err));
  // A worker that ended in error (its done said why) fails the job: its
  // share of the steps was not trained, or something refused it.
  return failed_workers(outcome.stats);
}

/// window_secs > 0 (sync, async, ssp): the watch that ends the job after
/// its timed window (dist/timed_window.hpp), given to the worker as its stop.
caf::expected<std::unique_ptr<timed_window>> arm_window(task_run& t) {
  if (t.c.window_secs <= 0 || t.allreduce || t.setup.shards.empty())
    return std::unique_ptr<timed_window>{};
  auto chief_info = chief_store_of(t.s);
  if (!chief_info)
    return std::move(chief_info.error());
  auto w = std::make_unique<timed_window>(t.s, t.c, t.task, t.workers, t.setup.shards[0].actor,
                                          chief_info->store, chief_info->incarnation, t.opts.stop);
  t.setup.stop = w->stop();
  t.setup.stopped = std::make_shared<stopped_counts>();
  if (t.chief && t.rep)
    t.rep->time_left = [phase = w->phase()] { return phase->left(); };
  return w;
}

/// The worker that the window stopped (cancelled before a step) ended as
/// the job meant it to: its result, as far as a stopped worker knows it
/// (the loss: the chief's last progress report's).
worker_result timed_end(task_run& t, const window_result& w, const stopped_counts& own) {
  worker_result r;
  r.seconds = w.seconds;
  r.has_loss = t.rep && t.rep->reports > 0;
  r.loss = r.has_loss ? t.rep->last_loss : 0;
  r.shards = t.setup.shards;
  // Its own counts as it stopped: its steps, the skipped ones among them (a
  // backup worker's), and the global step it last saw.
  r.local_steps = own.local_steps;
  r.skipped = own.skipped;
  r.pulls = own.pulls;
  r.computed = own.computed;
  r.global_step = own.global_step;
  // The job's global step, which may have moved past the worker's.
  if (auto st = ask<aggregator_stats>(t.s, t.setup.shards[0].actor, std::chrono::milliseconds{2000},
                                      stats_atom::value)) {
    r.global_step = std::max(r.global_step, st->global_step);
    if (!own.set) // it did not stop at its stop flag: ps 0's count of its pushes
      for (const auto& ws : st->workers)
        if (ws.worker == t.task)
          r.local_steps = ws.pushes;
  }
  return r;
}

/// Sets up this worker task in named phases, trains, and finishes.
caf::expected<train_outcome> run_task(session& s, const train::train_config& c, uint32_t task,
                                      const train_options& opts, bool& start_said) {
  task_run t{s, c, task, opts, start_said};
  if (auto err = check_task(t))
    return err;
  if (auto err = load_task(t))
    return err;
  if (auto err = find_checkpoint(t))
    return err;
  if (auto err = t.allreduce ? start_allreduce(t) : start_on_ps(t))
    return err;
  if (auto err = build_task_replica(t))
    return err;
  train_outcome outcome;
  outcome.start_step = t.setup.start_step;
  outcome.start_position = t.setup.start_position;
  if (auto err = report_and_save(t))
    return err;
  // sync, async, ssp save the aggregators' state once every worker is done.
  chief_view v{t.setup.shards, t.setup.start_step, t.setup.start_position,
               t.allreduce ? nullptr : t.setup.save};
  auto window = arm_window(t);
  if (!window)
    return std::move(window.error());
  auto shards = t.setup.shards;
  auto stopped = t.setup.stopped;
  auto r = train_task(t, std::move(t.setup));
  if (*window) {
    auto measured = (*window)->close();
    t.setup.shards = std::move(shards);
    if (!r && is(r.error(), af_error::cancelled)) {
      if (auto why = (*window)->failure())
        return why;
      if ((*window)->ended_by_time())
        r = timed_end(t, measured, stopped ? *stopped : stopped_counts{});
    }
    outcome.window_steps = measured.steps;
    outcome.window_seconds = measured.measured ? measured.seconds : 0;
    outcome.window_not_measured = measured.not_measured;
    if (t.rep)
      t.rep->time_left = nullptr; // the watch is closed
  }
  if (!r)
    return std::move(r.error());
  outcome.result = std::move(*r);
  // A ps that died and came back has a new aggregator.
  if (!outcome.result.shards.empty())
    v.shards = outcome.result.shards;
  if (!t.chief)
    return finish_worker(t, std::move(outcome), v.shards);
  if (!t.allreduce)
    if (auto err = finish_ps_job(t, outcome, v))
      return err;
  outcome.checkpoint = *t.last_checkpoint;
  if (t.rep->summary) {
    t.rep->summary->final_eval(outcome.result.global_step, outcome.result.accuracy,
                               outcome.result.test_loss);
    t.rep->summary->close();
  }
  if (t.rep->metrics) {
    auto csv = t.rep->metrics->path();
    t.rep->metrics.reset();
    auto png = metrics_stem(csv) + ".png";
    outcome.plot = train::plot(csv, png);
  }
  return outcome;
}

} // namespace

caf::expected<train_outcome> run_worker_task(session& s, const train::train_config& c,
                                             uint32_t task, const train_options& opts) {
  bool start_said = false;
  auto out = run_task(s, c, task, opts, start_said);
  // A chief that fails before it published its start (the checkpoint does
  // not load, the ps cannot be reached, ...) says so to the workers waiting
  // for that word: they stop at once instead of after init_timeout_ms.
  // Best effort: a chief that cannot reach its own store has nobody to tell.
  // allreduce's workers do not wait for it.
  if (!out && task == 0 && !start_said && c.mode != "allreduce")
    if (auto chief_info = chief_store_of(s)) {
      kv_client client{s.system(), chief_info->store, std::chrono::milliseconds{5000}};
      if (auto err = client.put(start_key(chief_info->incarnation),
                                "failed " + describe(out.error())))
        log::get()->warn("chief: could not tell the other workers that it failed: {}",
                         describe(err));
    }
  return out;
}

} // namespace af
