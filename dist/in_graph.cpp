// In-graph replication (run_in_graph, dist/training.hpp): one client, a
// replica of the step per worker task, the mean of their gradients in the
// graph, pushed to a sync aggregator of one worker (the client) on each ps.
#include "dist/training.hpp"

#include <chrono>
#include <cstdio>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "actors/system.hpp"
#include "core/log.hpp"
#include "dist/job_setup.hpp"
#include "dist/sparse_metrics.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "train/local.hpp"
#include "train/partition.hpp"

namespace af {

namespace {

using namespace training_detail;

/// One ps as the client pushes to it: its data plane and its pieces.
struct in_graph_shard {
  std::unique_ptr<data_channel> chan;
  std::string name;
  std::vector<train::piece> pieces;
  std::string token; ///< its aggregator's answer to this client's join
  uint64_t seq = 0;  ///< this client's last push there
};

/// Connects to every ps's data plane and joins its aggregator. Its pushes
/// speak for worker 0: it joins as it, for its token, with `member`, an
/// actor that lives as long as this job (when it ends, the membership does,
/// and the next in-graph job on these ps joins again).
caf::expected<std::vector<in_graph_shard>> join_shards(session& s, const ps_placement& placed,
                                                      const train::train_config& c,
                                                      uint32_t towers,
                                                      caf::scoped_actor& member) {
  std::chrono::milliseconds timeout{c.step_timeout_ms};
  std::vector<in_graph_shard> shards;
  for (const auto& p : placed.shards) {
    auto chan = data_channel::connect(p.host, p.data_port, p.task, timeout, {},
                                      system_tls(s.system()));
    if (!chan)
      return std::move(chan.error());
    caf::error joined;
    std::string token;
    uint64_t seq = 0;
    member->request(p.actor, timeout, join_atom::value, uint32_t{0},
                    std::string{"/job:worker/task:0 (in-graph client)"}, std::string{},
                    static_cast<uint32_t>(c.batch_size * towers),
                    caf::actor_cast<caf::actor>(member.ptr()))
      .receive(
        [&](uint64_t, std::string& t, uint64_t q) {
          token = std::move(t);
          seq = q;
        },
        [&](caf::error& e) { joined = std::move(e); });
    if (joined)
      return joined;
    shards.push_back({std::move(*chan), p.aggregator, p.pieces, std::move(token), seq});
  }
  return shards;
}

/// The replicas, one per worker task, and what a step fetches: the mean
/// loss, then the mean gradient of each parameter.
struct towers_graph {
  std::vector<train::replica> reps;
  std::vector<output> fetches;
};

caf::expected<towers_graph> build_towers(session& s, const train::train_config& c,
                                         const std::vector<train::parameter>& params,
                                         uint32_t towers) {
  // One replica per worker task; the mean of their gradients in the graph.
  auto& g = s.builder();
  towers_graph out;
  auto& reps = out.reps;
  for (uint32_t t = 0; t < towers; ++t) {
    auto scope = s.device("/job:worker/task:" + std::to_string(t));
    if (!scope)
      return std::move(scope.error());
    auto r = train::build_replica(g, params, c.model, "tower" + std::to_string(t) + "/");
    if (!r)
      return to_error(r.error());
    reps.push_back(std::move(*r));
  }
  auto scope = s.device("/job:worker/task:0");
  auto inv = g.constant(tensor::scalar(1.0f / static_cast<float>(towers)));
  output loss = reps[0].loss;
  for (uint32_t t = 1; t < towers; ++t)
    loss = g.add(loss, reps[t].loss);
  out.fetches.push_back(g.mul(loss, inv, "mean_loss"));
  for (size_t j = 0; j < params.size(); ++j) {
    output sum = reps[0].grads[j];
    for (uint32_t t = 1; t < towers; ++t)
      sum = g.add(sum, reps[t].grads[j]);
    out.fetches.push_back(g.mul(sum, inv, "mean_grad/" + params[j].name));
  }
  return out;
}

/// The client's pushes and pulls: the parameters it runs with and the
/// global step the shards answered.
struct in_graph_exchange {
  std::vector<in_graph_shard> shards;
  std::chrono::milliseconds timeout;
  std::vector<tensor> current;
  uint64_t global_step = 0;

  /// Pulls (`grads` null) or pushes the mean gradients to every shard, and
  /// takes the parameters they answer. Gradients are cut along the pieces'
  /// rows; the parameters pulled are assembled from them.
  caf::error operator()(bool pull, const std::vector<tensor>* grads) {
    std::vector<tensor> next(current.size());
    // Every shard gets this step's push: with more than one ps, taking the
    // first answer's step before pushing to the next made that push a step
    // ahead of its aggregator.
    uint64_t answered = UINT64_MAX;
    for (auto& sh : shards) {
      auto part = grads ? train::rows_for(sh.pieces, *grads) : std::vector<tensor>{};
      auto r = sh.chan->aggregate(pull ? wire::kind::pull : wire::kind::push, sh.name, 0,
                                  global_step, part, timeout, sh.token,
                                  pull ? 0 : ++sh.seq);
      if (!r)
        return std::move(r.error());
      answered = std::min(answered, r->first);
      if (auto ok = train::take_pieces(sh.pieces, r->second, next); !ok)
        return to_error(ok.error());
    }
    global_step = answered;
    current = std::move(next);
    return caf::none;
  }
};

/// Where the loop's reports go: the chief's metrics CSV and TensorBoard
/// runs (null: neither is asked for), with ps 0's aggregator's accounting.
struct in_graph_reports {
  sparse_metrics* metrics = nullptr;
  aggregator_actor ps0;
};

/// The loop: run every tower on its shard of the global batch, push the
/// mean, take the next parameters; until the job's steps are done. Every
/// log_every steps a report: the progress line, and the metrics' rows.
caf::expected<train_outcome> train_towers(session& s, const train::train_config& c,
                                          const train_options& opts, const job_data& job,
                                          const towers_graph& model, in_graph_exchange& exchange,
                                          const in_graph_reports& reports) {
  auto towers = static_cast<uint32_t>(model.reps.size());
  std::vector<train::batcher> batches;
  for (uint32_t t = 0; t < towers; ++t)
    batches.emplace_back(job.data->train, c.batch_size, t, towers, c.seed);
  if (auto err = exchange(true, nullptr))
    return err;
  train_outcome outcome;
  auto t0 = std::chrono::steady_clock::now();
  double loss_sum = 0;
  uint64_t loss_n = 0;
  const auto total = job.total;
  const auto first = exchange.global_step;
  while (exchange.global_step < total) {
    if (opts.stop && opts.stop->load()) // one client: no peer waits on its push
      break;
    std::vector<std::pair<output, tensor>> feeds;
    for (uint32_t t = 0; t < towers; ++t) {
      auto f = train::feeds(model.reps[t], exchange.current, batches[t].at(exchange.global_step));
      feeds.insert(feeds.end(), f.begin(), f.end());
    }
    auto out = s.run(model.fetches, feeds);
    if (!out)
      return std::move(out.error());
    loss_sum += (*out)[0].at(0);
    loss_n += 1;
    std::vector<tensor> grads(out->begin() + 1, out->end());
    if (auto err = exchange(false, &grads))
      return err;
    auto global_step = exchange.global_step;
    if (c.log_every > 0 && (global_step % c.log_every == 0 || global_step == total)) {
      double loss = loss_sum / static_cast<double>(loss_n);
      if (opts.print) {
        std::printf("step %llu/%llu  loss %.4f  (in-graph, %u replicas)\n",
                    static_cast<unsigned long long>(global_step),
                    static_cast<unsigned long long>(total), loss, towers);
        std::fflush(stdout);
      }
      double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // One replica's examples/s (the CSV's and TensorBoard's are the job's:
      // times the replicas), as a between-graph worker reports.
      double examples = static_cast<double>(global_step - first) * c.batch_size;
      double examples_per_s = seconds > 0 ? examples / seconds : 0.0;
      if (reports.metrics)
        reports.metrics->report(s, reports.ps0, exchange.timeout, global_step, seconds, loss,
                                examples_per_s);
      if (opts.on_progress) { // a tower's figures, as a between-graph worker's
        worker_progress p;
        p.local_step = p.global_step = p.step = global_step;
        p.loss = loss;
        p.seconds = seconds;
        p.examples_per_s = examples_per_s;
        p.final = global_step == total;
        opts.on_progress(p);
      }
      loss_sum = 0;
      loss_n = 0;
    }
  }
  outcome.result.seconds =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  outcome.result.global_step = exchange.global_step;
  outcome.result.local_steps = exchange.global_step;
  outcome.result.params = exchange.current;
  return outcome;
}

} // namespace

caf::expected<train_outcome> run_in_graph(session& s, const train::train_config& c,
                                          const train_options& opts) {
  if (auto err = check_config(c))
    return err;
  if (!c.checkpoint_dir.empty())
    log::get()->warn("in-graph: checkpoint_dir is not written in-graph yet (only between-graph "
                     "jobs write checkpoints); this run trains without them");
  if (c.mode != "sync")
    return make_error(af_error::invalid_argument,
                      "in-graph replication averages in the graph: mode must be sync, not '"
                        + c.mode + "'");
  const auto& cluster = s.cluster();
  auto towers = static_cast<uint32_t>(cluster.num_tasks("worker"));
  auto n_ps = static_cast<uint32_t>(cluster.num_tasks("ps"));
  if (towers == 0 || n_ps == 0)
    return make_error(af_error::invalid_argument,
                      "in-graph replication needs worker tasks (one replica each) and a ps job");
  auto job = load_job(c, towers, towers);
  if (!job)
    return std::move(job.error());
  // The metrics CSV and TensorBoard runs, as a between-graph job's chief
  // writes them (refused here, before the ps hold anything, if they cannot be).
  std::unique_ptr<sparse_metrics> metrics;
  if (!c.metrics.empty() || !c.logdir.empty()) {
    auto m = sparse_metrics::open(c, towers, 0);
    if (!m)
      return std::move(m.error());
    metrics = std::move(*m);
  }

  // Variables on the ps tasks, initialized by this client (it is the chief),
  // and a sync aggregator of one worker (this client) on each.
  auto placed = place_on_ps(s, c, job->params, "train/in-graph/", "sync", 1);
  if (!placed)
    return std::move(placed.error());
  if (auto err = s.initialize(placed->vars))
    return err;
  caf::scoped_actor member{s.system()};
  auto shards = join_shards(s, *placed, c, towers, member);
  if (!shards)
    return std::move(shards.error());
  auto model = build_towers(s, c, job->params, towers);
  if (!model)
    return std::move(model.error());

  // The parameters, then the loop: run, push the mean, take the next parameters.
  in_graph_exchange exchange{std::move(*shards), std::chrono::milliseconds{c.step_timeout_ms},
                             std::vector<tensor>(job->params.size()), 0};
  in_graph_reports reports{metrics.get(), placed->shards.front().actor};
  auto outcome = train_towers(s, c, opts, *job, *model, exchange, reports);
  if (!outcome)
    return outcome;
  auto ev = train::evaluate_local(c, job->data->test, exchange.current);
  if (!ev)
    return to_error(ev.error());
  outcome->result.test_loss = ev->first;
  outcome->result.accuracy = ev->second;
  if (metrics)
    outcome->plot = metrics->finish(exchange.global_step, ev->second, ev->first, true);
  if (opts.shutdown_ps)
    for (uint32_t k = 0; k < n_ps; ++k)
      if (auto err = s.shutdown("ps", static_cast<int32_t>(k)))
        log::get()->warn("in-graph client: shutting down /job:ps/task:{}: {}", k, describe(err));
  return outcome;
}

} // namespace af
