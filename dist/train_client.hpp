#pragma once
/// The client side of a running training job (docs/training.md): what
/// `actorflow-train --status` and `--switch` do, through any session on the
/// job's cluster, so that other clients (the REPL) say the same.
///
///   auto text = af::job_status_text(s, std::chrono::seconds(10));
///   auto done = af::job_switch(s, config, "async");
///
/// Each ps task k holds the aggregator "train/ps<k>" for the job's life
/// (dist/training.hpp); these functions look them up as they run (the
/// mode they have switched to included) and never create one. Errors come
/// back as actorflow errors whose sentence names the ps they are about.

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "caf/error.hpp"
#include "caf/expected.hpp"

#include "actors/session.hpp"
#include "messages/aggregator.hpp"
#include "dist/training.hpp"
#include "train/config.hpp"

namespace af {

/// The aggregators "<prefix><k>" of a running job ("train/ps<k>"; a sparse
/// job's: dist/sparse_job.hpp's sparse_aggregator_prefix), in ps order, looked up
/// through `s` (any session on the cluster; each lookup is bounded by its
/// session_options::timeout). A ps that holds none (a small model may leave
/// a ps without variables) is skipped. Errors: invalid_config if the cluster
/// has no ps job; the first ps that fails, as "/job:ps/task:K: <why>" with
/// that failure's code; if no ps holds one, the last not_found as it came.
caf::expected<std::vector<std::pair<int32_t, aggregator_actor>>>
job_aggregators(session& s, const std::string& prefix = "train/ps");

/// What `--status` prints: status_report() of every ps's aggregator, in ps
/// order, each asked for its stats with `timeout` (its lookup bounded by the
/// session's timeout). A ps that does not answer (stopped, hung, gone) gets
/// a line naming it and why, "/job:ps/task:K: ...", in its place, and the
/// others' reports still come (`unanswered`, if given: how many such ps).
/// Errors: job_aggregators' when no ps reports: invalid_config without a ps
/// job, the first ps's failure when every ps failed, the last not_found
/// when none holds an aggregator.
caf::expected<std::string> job_status_text(session& s, std::chrono::milliseconds timeout,
                                           const std::string& prefix = "train/ps",
                                           size_t* unanswered = nullptr);

/// invalid_argument naming `mode` and what to do if a running ps job cannot
/// switch to it (allreduce, or an unknown mode; a `sparse` job average
/// too); none for sync, async, ssp and (dense) average. job_switch checks it
/// first; a client checks it before it connects to say so without a cluster.
caf::error check_switch_mode(const std::string& mode, bool sparse = false);

/// The live switch of every ps's aggregator to `mode` with `c`'s
/// replicas_to_aggregate, step_deadline_ms, min_replicas, staleness,
/// step_timeout_ms and optimizer (the optimizer only matters to the check:
/// the job's stays), one ps after another, each request bounded by
/// c.step_timeout_ms. The text has a line per ps,
/// "/job:ps/task:K: now MODE, at global step N\n". Errors: check_switch_mode's
/// (before anything is looked up), job_aggregators' (before any ps switched),
/// and "/job:ps/task:K: switch: <why>", which, when ps before it did switch,
/// names them and says to run the command again or switch them back. A
/// sparse job's (sparse_job(c)) aggregators are train/sparse/ps<k>; one
/// that runs in-graph is refused (invalid_argument saying why and what to
/// do), and so is one whose chief does not say how it runs (not set up yet).
caf::expected<std::string> job_switch(session& s, const train::train_config& c,
                                      const std::string& mode);

/// What must hold before a chief trains: its checkpoint directory, its
/// metrics file and its TensorBoard logdir can be written (else it would
/// fail, or lose its work, at the first checkpoint or metrics row). Empty if
/// they can, else why not.
std::string job_preflight(const train::train_config& c);

/// Empty if every checkpoint the chief attempted was written, else why not.
/// A chief that fails to write one logs it and trains on (a full disk should
/// not cost the run); the job must still not end as a success.
std::string job_checkpoint_problem(const train::train_config& c, const train_outcome& o);

} // namespace af
