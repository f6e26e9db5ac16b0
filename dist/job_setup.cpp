#include "dist/job_setup.hpp"

#include <fmt/format.h>

#include "core/log.hpp"
#include "messages/error.hpp"
#include "train/local.hpp"
#include "train/partition.hpp"

namespace af::training_detail {

namespace {

/// A global batch (batch_size from each of `replicas`) must fit in the
/// training set: a larger one would leave the step's inputs empty, and the
/// failure would only say that a matmul had no input.
caf::error check_batch(const train::train_config& c, size_t examples, uint32_t replicas) {
  auto global = static_cast<uint64_t>(c.batch_size) * replicas;
  if (global <= examples)
    return caf::none;
  return make_error(af_error::invalid_argument,
                    fmt::format("batch_size {} x {} worker(s) = {} examples per step, more than "
                                "the {} training examples of data '{}'; lower batch_size or use "
                                "more data",
                                c.batch_size, replicas, global, examples, c.data));
}

} // namespace

caf::error to_error(const graph_error& e) {
  return make_error(e.code, e.what);
}

caf::error check_config(const train::train_config& c) {
  if (auto bad = train::validate(c); !bad.empty())
    return make_error(af_error::invalid_argument, "training config: " + bad);
  return caf::none;
}

caf::expected<job_data> load_job(const train::train_config& c, uint32_t replicas,
                                 uint32_t per_step) {
  auto data = train::load_data(c);
  if (!data)
    return to_error(data.error());
  if (auto err = check_batch(c, data->train.size(), replicas))
    return err;
  job_data out;
  out.data = std::make_shared<const train::split>(std::move(*data));
  const auto& train_set = out.data->train;
  auto params = train::parameters(c.model, train_set.features, train_set.classes, c.hidden, c.seed);
  if (!params)
    return to_error(params.error());
  out.params = std::move(*params);
  out.total = train::total_steps(c, train_set.size(), per_step);
  return out;
}

aggregator_spec aggregator_spec_of(const train::train_config& c, const std::string& mode,
                                   uint32_t workers) {
  aggregator_spec spec;
  spec.mode = mode;
  spec.workers = workers;
  spec.optimizer = c.optimizer;
  spec.step_timeout_ms = c.step_timeout_ms;
  spec.replicas_to_aggregate = c.replicas_to_aggregate;
  spec.grad_norm_guard = c.grad_norm_guard;
  spec.step_deadline_ms = c.step_deadline_ms;
  spec.min_replicas = c.min_replicas;
  spec.staleness = c.staleness;
  spec.pipeline_auto = c.pipeline_sync_auto; // it acts in sync only (after a switch too)
  return spec;
}

caf::expected<ps_placement> place_on_ps(session& s, const train::train_config& c,
                                        const std::vector<train::parameter>& params,
                                        const std::string& name_prefix, const std::string& mode,
                                        uint32_t workers) {
  auto n_ps = static_cast<uint32_t>(s.cluster().num_tasks("ps"));
  auto plan = train::plan_partitions(params, n_ps, c.max_partitions, c.min_slice_bytes);
  if (!plan)
    return to_error(plan.error());
  // A piece starts as its rows of the parameter's first value, so a
  // partitioned job trains exactly as an unpartitioned one. A whole
  // parameter keeps its own initializer (nothing to compute here).
  std::vector<tensor> logical;
  for (const auto& p : plan->pieces)
    if (!p.whole()) {
      auto init = train::initial_values(params);
      if (!init)
        return to_error(init.error());
      logical = std::move(*init);
      break;
    }
  ps_placement out;
  for (const auto& p : plan->pieces) {
    auto scope = s.device("/job:ps/task:" + std::to_string(p.ps));
    if (!scope)
      return std::move(scope.error());
    auto init = params[p.param].init;
    if (!p.whole()) {
      auto slice = train::slice_of(p, logical[p.param]);
      if (!slice)
        return to_error(slice.error());
      init = initializer::from_tensor(std::move(*slice));
    }
    auto v = s.variable(p.name, p.shape, init);
    if (!v)
      return std::move(v.error());
    out.vars.push_back(*v);
  }
  for (uint32_t k = 0; k < n_ps; ++k) {
    auto mine = plan->on_ps(k);
    if (mine.empty())
      continue;
    auto task = static_cast<int32_t>(k);
    auto spec = aggregator_spec_of(c, mode, workers);
    spec.name = name_prefix + "ps" + std::to_string(k);
    for (auto i : mine)
      spec.variables.push_back(plan->pieces[i].name);
    auto agg = s.aggregator("ps", task, spec);
    if (!agg)
      return std::move(agg.error());
    auto info = s.ping("ps", task);
    if (!info)
      return std::move(info.error());
    param_shard shard;
    shard.task = "/job:ps/task:" + std::to_string(k);
    shard.aggregator = spec.name;
    shard.actor = *agg;
    shard.host = s.cluster().address("ps", task)->host;
    shard.data_port = info->data_port;
    shard.incarnation = info->incarnation;
    std::vector<output> vars;
    for (auto i : mine) {
      shard.pieces.push_back(plan->pieces[i]);
      vars.push_back(out.vars[i]);
    }
    out.shards.push_back(std::move(shard));
    out.shard_vars.push_back(std::move(vars));
    out.specs.push_back(spec);
  }
  return out;
}

caf::expected<chief_store> chief_store_of(session& s) {
  auto store = s.kv_store("worker", 0);
  if (!store)
    return std::move(store.error());
  auto info = s.ping("worker", 0);
  if (!info)
    return std::move(info.error());
  return chief_store{*store, info->incarnation};
}

std::string start_key(uint64_t chief_incarnation) {
  return fmt::format("train/{}/start", chief_incarnation);
}

caf::expected<checkpoint_access> checkpoint_access_of(const train::train_config& c,
                                                      const std::vector<train::parameter>& params,
                                                      uint64_t total, uint32_t workers) {
  checkpoint_access out;
  out.dir = c.checkpoint_dir;
  if (!c.checkpoint_key.empty()) {
    auto key = train::load_checkpoint_key(c.checkpoint_key);
    if (!key)
      return to_error(key.error());
    out.key = std::move(*key);
  }
  out.expect.params = params;
  out.expect.optimizer_kind = c.optimizer.kind;
  out.expect.max_step = train::max_checkpoint_step(total, workers);
  return out;
}

caf::expected<std::optional<std::pair<std::string, train::checkpoint>>>
load_latest_checkpoint(const checkpoint_access& from) {
  auto latest = train::latest(from.dir);
  if (!latest)
    return to_error(latest.error());
  if (latest->empty())
    return std::optional<std::pair<std::string, train::checkpoint>>{};
  auto ck = train::load(*latest, from.key);
  if (!ck)
    return to_error(ck.error());
  if (auto st = train::check_checkpoint(*ck, *latest, from.expect); !st)
    return to_error(st.error());
  if (auto why = train::slot_mismatch(*ck, from.expect.optimizer_kind); !why.empty())
    log::get()->warn("restoring {}: {}", *latest, why);
  return std::make_optional(std::make_pair(std::move(*latest), std::move(*ck)));
}

/// An error naming every worker whose done said it failed (a worker that
/// failed and joined again, and then finished, is not named), or none.
caf::error failed_workers(const aggregator_stats& stats) {
  std::vector<std::string> failed;
  for (const auto& w : stats.workers)
    if (!w.error.empty())
      failed.push_back(fmt::format("worker {}{}{}: {}", w.worker, w.task.empty() ? "" : " ",
                                   w.task, w.error));
  if (failed.empty())
    return caf::none;
  auto msg = fmt::format("the job failed: {} of its workers ended in error: {}", failed.size(),
                         fmt::join(failed, "; "));
  log::get()->error("chief: {}", msg);
  return make_error(af_error::aborted, std::move(msg));
}

} // namespace af::training_detail
