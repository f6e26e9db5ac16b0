#include "dist/train_client.hpp"

#include "caf/all.hpp"

#include "actors/kv_store.hpp"
#include "actors/system.hpp"
#include "dist/job_setup.hpp"
#include "dist/sparse_job.hpp"
#include "dist/training.hpp"
#include "dist/training_summary.hpp"
#include "messages/atoms.hpp"
#include "messages/error.hpp"
#include "train/checkpoint.hpp"
#include "train/metrics.hpp"

namespace af {

namespace {

std::string ps_name(int32_t k) {
  return "/job:ps/task:" + std::to_string(k);
}

/// The af_error that `err` is, or stands for: callers can still tell a
/// timeout from a refusal after `about` rewords it.
af_error code_of(const caf::error& err) {
  if (err.category() == error_category)
    return static_cast<af_error>(err.code());
  return err == caf::sec::request_timeout ? af_error::timeout : af_error::peer_down;
}

/// `err` with `what` (naming the ps) in front of its sentence.
caf::error about(const std::string& what, const caf::error& err) {
  return make_error(code_of(err), what + ": " + describe(err));
}

} // namespace

caf::expected<std::vector<std::pair<int32_t, aggregator_actor>>>
job_aggregators(session& s, const std::string& prefix) {
  auto n_ps = static_cast<int32_t>(s.cluster().num_tasks("ps"));
  if (n_ps == 0)
    return make_error(af_error::invalid_config,
                      "the cluster has no ps job: a job's status and its live switch come "
                      "from the ps tasks' aggregators (allreduce jobs have none)");
  std::vector<std::pair<int32_t, aggregator_actor>> out;
  caf::error missing;
  for (int32_t k = 0; k < n_ps; ++k) {
    aggregator_spec lookup;
    lookup.name = prefix + std::to_string(k);
    lookup.workers = 0; // as it runs
    auto agg = s.aggregator("ps", k, lookup);
    if (!agg && is(agg.error(), af_error::not_found)) {
      missing = std::move(agg.error());
      continue;
    }
    if (!agg)
      return about(ps_name(k), agg.error());
    out.emplace_back(k, std::move(*agg));
  }
  if (out.empty())
    return missing;
  return out;
}

caf::expected<std::string> job_status_text(session& s, std::chrono::milliseconds timeout,
                                           const std::string& prefix, size_t* unanswered) {
  auto n_ps = static_cast<int32_t>(s.cluster().num_tasks("ps"));
  if (n_ps == 0)
    return job_aggregators(s, prefix).error(); // the cluster's fault, said there
  thread_logger_release done{s.system()}; // this thread may outlive the cluster
  caf::scoped_actor self{s.system()};
  std::string text;
  caf::error missing, first_failed;
  size_t reports = 0, failed = 0;
  // Each ps on its own: one that does not answer (stopped, hung, gone) is
  // named after the others' reports, its wait bounded by the session's
  // timeout (the lookup) and `timeout` (the stats).
  for (int32_t k = 0; k < n_ps; ++k) {
    auto where = ps_name(k);
    aggregator_spec lookup;
    lookup.name = prefix + std::to_string(k);
    lookup.workers = 0; // as it runs
    auto agg = s.aggregator("ps", k, lookup);
    caf::error err;
    if (!agg && is(agg.error(), af_error::not_found)) {
      missing = std::move(agg.error());
      continue;
    }
    if (!agg)
      err = about(where, agg.error());
    else
      self->request(*agg, timeout, stats_atom::value)
        .receive(
          [&](aggregator_stats& st) {
            text += status_report(where, st);
            ++reports;
          },
          [&](caf::error& e) { err = about(where + ": stats", e); });
    if (!err)
      continue;
    ++failed;
    text += describe(err) + " (no report from it: is it stopped, hung or gone? the job waits "
                            "for it within ps_recovery_timeout_ms, if set)\n";
    if (!first_failed)
      first_failed = std::move(err);
  }
  if (unanswered)
    *unanswered = failed;
  if (reports == 0 && failed > 0)
    return first_failed; // nothing to show: the first failure, as before
  if (reports == 0)
    return missing;
  return text;
}

caf::error check_switch_mode(const std::string& mode, bool sparse) {
  if (sparse && mode == "average")
    return make_error(af_error::invalid_argument,
                      "switch to average: a sparse job's tables take sparse gradients, which "
                      "averaging cannot (it would move whole tables); a sparse job switches "
                      "between sync, async and ssp");
  if (mode == "allreduce")
    return make_error(af_error::invalid_argument,
                      "switch to allreduce: an allreduce job has no ps, so a running ps job "
                      "cannot become one; restart from the checkpoint with mode = \"allreduce\"");
  if (mode != "sync" && mode != "async" && mode != "ssp" && mode != "average")
    return make_error(af_error::invalid_argument,
                      "switch to '" + mode + "': unknown mode; a running job switches to sync, "
                      "async, ssp or average");
  return caf::none;
}

namespace {

/// A sparse job switches only between-graph: its chief says how it runs
/// (sparse_client_key). In-graph, the replicas take turns on one thread, so
/// a sync round of theirs could never fill (the first replica's push would
/// wait for the next one's), and its sync is the client's one merged push.
caf::error refuse_in_graph_switch(session& s, const train::train_config& c,
                                  const std::string& mode) {
  auto chief = training_detail::chief_store_of(s);
  // Two bounds: `wait` for the key to be put (a chief that has not trained
  // yet; at once when it has), and `answer` for the chief's store to answer
  // at all, as long as --switch's other requests to it (its session's
  // timeout, programs/train_main.cpp's run_client). With `wait` for both, a
  // chief busy or stalled for 4 s (a loaded machine) refused the switch as
  // one that "did not say how the job runs".
  auto wait = std::chrono::milliseconds{std::min<uint32_t>(c.step_timeout_ms, 2000)};
  auto answer = std::chrono::milliseconds{std::min<uint32_t>(c.step_timeout_ms, 10000)};
  caf::expected<std::string> client = make_error(af_error::internal, "not asked");
  if (chief)
    client = kv_client{s.system(), chief->store, answer}.get(
      sparse_client_key(chief->incarnation), wait);
  else
    client = std::move(chief.error());
  if (!client)
    return make_error(code_of(client.error()),
                      "switch to " + mode + ": the sparse job's chief (/job:worker/task:0) did "
                      "not say how the job runs (" + describe(client.error()) + "): a sparse "
                      "job switches once its chief trains; run the command again then");
  if (*client != "in-graph")
    return caf::none;
  return make_error(af_error::invalid_argument,
                    "switch to " + mode + ": this sparse job runs in-graph (one client whose "
                    "replicas take turns on one thread): a sync round of its replicas could "
                    "never fill (the first replica's push would wait for the next one's), and "
                    "its sync is the client's one merged push, not members' rounds; a live "
                    "switch is for between-graph jobs (a process per worker). To change its "
                    "mode, stop it and start it again from its checkpoint with --set mode=" + mode);
}

} // namespace

caf::expected<std::string> job_switch(session& s, const train::train_config& c,
                                      const std::string& mode) {
  // A sparse job's aggregators have names of their own (dist/sparse_job.hpp).
  bool sparse = sparse_job(c);
  if (auto err = check_switch_mode(mode, sparse))
    return err;
  if (sparse)
    if (auto err = refuse_in_graph_switch(s, c, mode))
      return err;
  auto aggs = job_aggregators(s, sparse ? sparse_aggregator_prefix : "train/ps");
  if (!aggs)
    return std::move(aggs.error());
  // The job's spec in the new mode (a switch takes its mode and its
  // settings; the aggregator keeps its name, workers and optimizer).
  auto want = training_detail::aggregator_spec_of(c, mode, 0);
  thread_logger_release done{s.system()}; // this thread may outlive the cluster
  caf::scoped_actor self{s.system()};
  std::string text;
  std::string switched; // the ps that did, for the message of one that then fails
  for (const auto& [k, agg] : *aggs) {
    caf::error err;
    auto where = ps_name(k);
    self->request(agg, std::chrono::milliseconds{c.step_timeout_ms}, switch_atom::value, want)
      .receive(
        [&](uint64_t step) {
          text += where + ": now " + mode + ", at global step " + std::to_string(step) + "\n";
          switched += (switched.empty() ? "" : ", ") + where;
        },
        [&](caf::error& e) { err = e; });
    if (!err)
      continue;
    auto why = where + ": switch: " + describe(err);
    if (switched.empty())
      return make_error(code_of(err), why);
    // The ps before it run the new mode now: say which, so that the user can
    // finish the switch or undo it.
    return make_error(code_of(err), why + "; " + switched + " did switch: run the command again "
                                      "(a ps already in " + mode + " only takes the settings) "
                                      "or switch those back");
  }
  return text;
}

std::string job_preflight(const train::train_config& c) {
  if (!c.checkpoint_dir.empty())
    if (auto why = train::check_checkpoint_dir(c.checkpoint_dir); !why.empty())
      return why;
  if (!c.checkpoint_key.empty())
    if (auto key = train::load_checkpoint_key(c.checkpoint_key); !key)
      return key.error().what;
  if (!c.metrics.empty())
    if (auto why = train::check_metrics_path(c.metrics); !why.empty())
      return why;
  if (!c.logdir.empty())
    if (auto why = training_detail::job_summary::check_logdir(c.logdir); !why.empty())
      return why;
  return {};
}

std::string job_checkpoint_problem(const train::train_config& c, const train_outcome& o) {
  if (c.checkpoint_dir.empty())
    return {};
  const auto& r = o.result;
  if (!o.checkpoint.empty() && r.checkpoint_failures == 0)
    return {};
  std::string what = o.checkpoint.empty()
                       ? "no checkpoint was written to '" + c.checkpoint_dir + "'"
                       : std::to_string(r.checkpoint_failures) + " checkpoint(s) of this run failed ("
                           + r.checkpoint_error + "); the last one written is " + o.checkpoint;
  return what + ": check the directory (space, permissions) and run again";
}

} // namespace af
