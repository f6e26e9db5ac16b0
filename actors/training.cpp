#include "actors/training.hpp"

#include <cstdio>
#include <future>
#include <thread>

#include "caf/all.hpp"

#include <fmt/format.h>

#include "actors/allreduce.hpp"
#include "actors/data_plane.hpp"
#include "actors/kv_store.hpp"
#include "actors/log.hpp"
#include "messages/error.hpp"
#include "train/checkpoint.hpp"
#include "train/local.hpp"
#include "train/metrics.hpp"

namespace af {

namespace {

caf::error to_error(const graph_error& e) {
  return make_error(e.code, e.what);
}

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
  return fmt::format("  staleness median {} max {}{}", median, max,
                     max + 1 == h.size() ? "+" : "");
}

/// The chief's progress line and metrics row.
struct reporter {
  const train::train_config* cfg = nullptr;
  uint32_t workers = 0;
  uint64_t total = 0;
  uint64_t start = 0;
  bool print = true;
  std::optional<train::metrics_writer> metrics;
  std::function<void(const worker_progress&)> forward;

  void operator()(const worker_progress& p) {
    if (print) {
      double left = 0;
      uint64_t done = p.global_step > start ? p.global_step - start : 0;
      if (done > 0 && p.global_step < total)
        left = p.seconds * static_cast<double>(total - p.global_step) / static_cast<double>(done);
      std::string acc = p.accuracy >= 0 ? fmt::format("  held-out {:.4f}", p.accuracy) : "";
      std::printf("step %llu/%llu  loss %.4f%s  %.0f examples/s (this worker)%s  %.0f s left\n",
                  static_cast<unsigned long long>(p.global_step),
                  static_cast<unsigned long long>(total), p.loss, acc.c_str(),
                  p.examples_per_s, staleness_summary(p.stats.staleness).c_str(), left);
      std::fflush(stdout);
    }
    if (metrics) {
      train::metrics_row row;
      row.step = p.global_step;
      row.wall_s = p.seconds;
      row.loss = p.loss;
      row.accuracy = p.accuracy;
      row.mode = cfg->mode;
      row.workers = workers;
      row.examples_per_s = p.examples_per_s * workers;
      metrics->write(row);
    }
    if (forward)
      forward(p);
  }
};

/// A blocking request from the session's system.
template <class Result, class Handle, class... Ts>
caf::expected<Result> ask(session& s, const Handle& h, std::chrono::milliseconds timeout, Ts&&... xs) {
  caf::scoped_actor self{s.system()};
  caf::expected<Result> out{make_error(af_error::internal, "no answer")};
  self->request(h, timeout, std::forward<Ts>(xs)...)
    .receive([&](Result& r) { out = std::move(r); }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

} // namespace

caf::expected<train_outcome> run_worker_task(session& s, const train::train_config& c,
                                             uint32_t task, const train_options& opts) {
  if (auto bad = train::validate(c); !bad.empty())
    return make_error(af_error::invalid_argument, "training config: " + bad);
  const auto& cluster = s.cluster();
  auto workers = static_cast<uint32_t>(cluster.num_tasks("worker"));
  if (workers == 0 || task >= workers)
    return make_error(af_error::invalid_argument,
                      fmt::format("worker task {} of a cluster with {} worker tasks", task, workers));
  bool chief = task == 0;
  bool allreduce = c.mode == "allreduce";
  auto n_ps = static_cast<uint32_t>(cluster.num_tasks("ps"));
  if (!allreduce && n_ps == 0)
    return make_error(af_error::invalid_argument,
                      "mode '" + c.mode + "' needs a ps job in the cluster; allreduce needs none");
  std::chrono::milliseconds timeout{c.step_timeout_ms};

  // 1. data and parameters
  auto data = train::load_data(c);
  if (!data)
    return to_error(data.error());
  auto shared_data = std::make_shared<const train::split>(std::move(*data));
  const auto& train_set = shared_data->train;
  auto params = train::parameters(c.model, train_set.features, train_set.classes, c.hidden, c.seed);
  if (!params)
    return to_error(params.error());
  uint64_t total = train::total_steps(c, train_set.size(), c.mode == "async" ? 1 : workers);

  worker_setup setup;
  setup.index = task;
  setup.workers = workers;
  setup.cfg = c;
  setup.data = shared_data;
  setup.params = *params;
  setup.total_steps = total;
  setup.timeout = timeout;
  setup.tamper = opts.tamper;

  // The latest checkpoint, if the job has one: the chief restores it
  // (allreduce: every worker does, from the shared directory).
  std::optional<train::checkpoint> restored;
  if (!c.checkpoint_dir.empty() && (chief || allreduce)) {
    auto latest = train::latest(c.checkpoint_dir);
    if (!latest)
      return to_error(latest.error());
    if (!latest->empty()) {
      auto ck = train::load(*latest);
      if (!ck)
        return to_error(ck.error());
      restored = std::move(*ck);
      log::get()->info("worker {}: restoring {} (global step {})", task, *latest,
                       restored->global_step);
    }
  }

  // 2-3. variables, aggregators, initialization
  if (!allreduce) {
    std::vector<std::vector<size_t>> on_ps(n_ps);
    std::vector<output> vars;
    for (size_t i = 0; i < params->size(); ++i) {
      const auto& p = (*params)[i];
      auto k = static_cast<uint32_t>(i % n_ps);
      auto scope = s.device("/job:ps/task:" + std::to_string(k));
      if (!scope)
        return std::move(scope.error());
      auto v = s.variable(p.name, p.shape, p.init);
      if (!v)
        return std::move(v.error());
      vars.push_back(*v);
      on_ps[k].push_back(i);
    }
    for (uint32_t k = 0; k < n_ps; ++k) {
      if (on_ps[k].empty())
        continue;
      param_shard shard;
      shard.task = "/job:ps/task:" + std::to_string(k);
      aggregator_spec spec;
      spec.name = "train/" + c.mode + "/ps" + std::to_string(k);
      spec.mode = c.mode;
      spec.workers = workers;
      spec.optimizer = c.optimizer;
      spec.step_timeout_ms = c.step_timeout_ms;
      for (auto i : on_ps[k])
        spec.variables.push_back((*params)[i].name);
      auto agg = s.aggregator("ps", static_cast<int32_t>(k), spec);
      if (!agg)
        return std::move(agg.error());
      auto info = s.ping("ps", static_cast<int32_t>(k));
      if (!info)
        return std::move(info.error());
      auto addr = cluster.address("ps", static_cast<int32_t>(k));
      shard.aggregator = spec.name;
      shard.actor = *agg;
      shard.host = addr->host;
      shard.data_port = info->data_port;
      shard.params = on_ps[k];
      setup.shards.push_back(std::move(shard));
    }
    if (chief) {
      if (restored) {
        for (auto& shard : setup.shards) {
          aggregator_state state;
          state.global_step = restored->global_step;
          auto names = train::slot_names(c.optimizer.kind);
          for (auto i : shard.params) {
            const auto& name = (*params)[i].name;
            auto it = std::find_if(restored->variables.begin(), restored->variables.end(),
                                   [&](const train::saved_variable& v) { return v.name == name; });
            if (it == restored->variables.end())
              return make_error(af_error::invalid_argument,
                                "the checkpoint in " + c.checkpoint_dir + " has no variable '" + name
                                  + "': it was written by another model");
            state.names.push_back(name);
            state.values.push_back(it->value);
            std::vector<tensor> slots;
            for (const auto& sn : names) {
              auto sl = it->slots.find(sn);
              slots.push_back(sl != it->slots.end() ? sl->second
                                                    : tensor::filled(dtype::float32, it->value.shape(), 0));
            }
            state.slots.push_back(std::move(slots));
          }
          auto r = ask<uint64_t>(s, shard.actor, timeout, restore_atom::value, std::move(state));
          if (!r)
            return std::move(r.error());
        }
      } else if (auto err = s.initialize(vars)) {
        return err;
      }
    } else if (auto err = s.wait_initialized(std::chrono::milliseconds{c.init_timeout_ms}, vars)) {
      return err;
    }
    // Where the job stands: the global step of ps 0's aggregator.
    auto stats = ask<aggregator_stats>(s, setup.shards[0].actor, timeout, stats_atom::value);
    if (!stats)
      return std::move(stats.error());
    setup.start_step = restored ? restored->global_step : stats->global_step;
  } else {
    // allreduce: the same first values everywhere (the same seeds), or the checkpoint's.
    auto init = train::initial_values(*params);
    if (!init)
      return to_error(init.error());
    setup.initial = std::move(*init);
    if (restored) {
      auto names = train::slot_names(c.optimizer.kind);
      setup.initial_slots.resize(params->size());
      for (size_t i = 0; i < params->size(); ++i) {
        auto it = std::find_if(restored->variables.begin(), restored->variables.end(),
                               [&](const train::saved_variable& v) { return v.name == (*params)[i].name; });
        if (it == restored->variables.end())
          return make_error(af_error::invalid_argument,
                            "the checkpoint has no variable '" + (*params)[i].name + "'");
        setup.initial[i] = it->value;
        for (const auto& sn : names) {
          auto sl = it->slots.find(sn);
          setup.initial_slots[i].push_back(sl != it->slots.end() ? sl->second
                                                                 : tensor::filled(dtype::float32, it->value.shape(), 0));
        }
      }
      setup.start_step = restored->global_step;
    }
    auto store = s.kv_store("worker", 0);
    if (!store)
      return std::move(store.error());
    auto chief_info = s.ping("worker", 0);
    if (!chief_info)
      return std::move(chief_info.error());
    kv_client client{s.system(), *store, timeout};
    auto group = allreduce_group::create(task, workers,
                                         fmt::format("train/{}/{}", chief_info->incarnation,
                                                     setup.start_step),
                                         client, timeout,
                                         cluster.address("worker", static_cast<int32_t>(task))->host);
    if (!group)
      return std::move(group.error());
    setup.group = std::shared_ptr<allreduce_group>(std::move(*group));
  }

  // 4. the replica of the step on this worker's own device
  {
    auto scope = s.device("/job:worker/task:" + std::to_string(task));
    if (!scope)
      return std::move(scope.error());
    auto r = train::build_replica(s.builder(), *params, c.model, "replica/");
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
  if (chief) {
    std::vector<output> eval{setup.model.loss};
    if (setup.model.correct.valid())
      eval.push_back(setup.model.correct);
    auto ev = s.prepare(eval);
    if (!ev)
      return std::move(ev.error());
    setup.eval = *ev;
  }

  train_outcome outcome;
  outcome.start_step = setup.start_step;
  auto rep = std::make_shared<reporter>();
  rep->cfg = &c;
  rep->workers = workers;
  rep->total = total;
  rep->start = setup.start_step;
  rep->print = opts.print && chief;
  rep->forward = opts.on_progress;
  if (chief && !c.metrics.empty()) {
    auto m = train::metrics_writer::open(c.metrics);
    if (!m)
      return to_error(m.error());
    rep->metrics.emplace(std::move(*m));
  }
  setup.on_progress = [rep](const worker_progress& p) { (*rep)(p); };
  auto last_checkpoint = std::make_shared<std::string>();
  if (chief && !c.checkpoint_dir.empty())
    setup.save = [dir = c.checkpoint_dir, last_checkpoint](const train::checkpoint& ck)
      -> caf::expected<std::string> {
      auto where = train::save(dir, ck);
      if (!where)
        return to_error(where.error());
      *last_checkpoint = *where;
      return *where;
    };

  // 5. train
  auto shards = setup.shards;
  std::promise<caf::expected<worker_result>> finished;
  auto result = finished.get_future();
  spawn_worker(s.system(), std::move(setup), [&finished](caf::expected<worker_result> r) {
    finished.set_value(std::move(r));
  });
  auto r = result.get();
  if (!r)
    return std::move(r.error());
  outcome.result = std::move(*r);
  outcome.checkpoint = *last_checkpoint;
  if (!chief)
    return outcome;
  if (!allreduce) {
    // The other workers finish the same step (sync) or soon after (async,
    // average): wait for them, bounded, then stop the ps tasks.
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto stats = ask<aggregator_stats>(s, shards[0].actor, timeout, stats_atom::value);
      if (!stats)
        return std::move(stats.error());
      outcome.stats = *stats;
      if (stats->workers_done >= workers)
        break;
      if (std::chrono::steady_clock::now() >= deadline) {
        log::get()->warn("chief: {} of {} workers said they were done after {} ms; stopping the "
                         "ps tasks anyway",
                         stats->workers_done, workers, timeout.count());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (opts.shutdown_ps)
      for (uint32_t k = 0; k < n_ps; ++k)
        if (auto err = s.shutdown("ps", static_cast<int32_t>(k)))
          log::get()->warn("chief: shutting down /job:ps/task:{}: {}", k, describe(err));
  }
  if (rep->metrics) {
    auto csv = rep->metrics->path();
    rep->metrics.reset();
    auto png = csv.size() > 4 && csv.substr(csv.size() - 4) == ".csv" ? csv.substr(0, csv.size() - 4) + ".png"
                                                                      : csv + ".png";
    outcome.plot = train::plot(csv, png);
  }
  return outcome;
}

} // namespace af

namespace af {

caf::expected<train_outcome> run_in_graph(session& s, const train::train_config& c,
                                          const train_options& opts) {
  if (auto bad = train::validate(c); !bad.empty())
    return make_error(af_error::invalid_argument, "training config: " + bad);
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
  std::chrono::milliseconds timeout{c.step_timeout_ms};
  auto data = train::load_data(c);
  if (!data)
    return to_error(data.error());
  auto params = train::parameters(c.model, data->train.features, data->train.classes, c.hidden,
                                  c.seed);
  if (!params)
    return to_error(params.error());
  uint64_t total = train::total_steps(c, data->train.size(), towers);

  // Variables on the ps tasks, initialized by this client (it is the chief).
  std::vector<std::vector<size_t>> on_ps(n_ps);
  std::vector<output> vars;
  for (size_t i = 0; i < params->size(); ++i) {
    auto k = static_cast<uint32_t>(i % n_ps);
    auto scope = s.device("/job:ps/task:" + std::to_string(k));
    if (!scope)
      return std::move(scope.error());
    auto v = s.variable((*params)[i].name, (*params)[i].shape, (*params)[i].init);
    if (!v)
      return std::move(v.error());
    vars.push_back(*v);
    on_ps[k].push_back(i);
  }
  if (auto err = s.initialize(vars))
    return err;
  struct shard {
    aggregator_actor actor;
    std::unique_ptr<data_channel> chan;
    std::string name;
    std::vector<size_t> params;
  };
  std::vector<shard> shards;
  for (uint32_t k = 0; k < n_ps; ++k) {
    if (on_ps[k].empty())
      continue;
    aggregator_spec spec;
    spec.name = "train/in-graph/ps" + std::to_string(k);
    spec.mode = "sync";
    spec.workers = 1; // the one client
    spec.optimizer = c.optimizer;
    spec.step_timeout_ms = c.step_timeout_ms;
    for (auto i : on_ps[k])
      spec.variables.push_back((*params)[i].name);
    auto agg = s.aggregator("ps", static_cast<int32_t>(k), spec);
    if (!agg)
      return std::move(agg.error());
    auto info = s.ping("ps", static_cast<int32_t>(k));
    if (!info)
      return std::move(info.error());
    auto chan = data_channel::connect(cluster.address("ps", static_cast<int32_t>(k))->host,
                                      info->data_port, "/job:ps/task:" + std::to_string(k), timeout);
    if (!chan)
      return std::move(chan.error());
    shards.push_back({*agg, std::move(*chan), spec.name, on_ps[k]});
  }

  // One replica per worker task; the mean of their gradients in the graph.
  auto& g = s.builder();
  std::vector<train::replica> reps;
  for (uint32_t t = 0; t < towers; ++t) {
    auto scope = s.device("/job:worker/task:" + std::to_string(t));
    if (!scope)
      return std::move(scope.error());
    auto r = train::build_replica(g, *params, c.model, "tower" + std::to_string(t) + "/");
    if (!r)
      return to_error(r.error());
    reps.push_back(std::move(*r));
  }
  std::vector<output> fetches;
  {
    auto scope = s.device("/job:worker/task:0");
    auto inv = g.constant(tensor::scalar(1.0f / static_cast<float>(towers)));
    output loss = reps[0].loss;
    for (uint32_t t = 1; t < towers; ++t)
      loss = g.add(loss, reps[t].loss);
    fetches.push_back(g.mul(loss, inv, "mean_loss"));
    for (size_t j = 0; j < params->size(); ++j) {
      output sum = reps[0].grads[j];
      for (uint32_t t = 1; t < towers; ++t)
        sum = g.add(sum, reps[t].grads[j]);
      fetches.push_back(g.mul(sum, inv, "mean_grad/" + (*params)[j].name));
    }
  }
  std::vector<train::batcher> batches;
  for (uint32_t t = 0; t < towers; ++t)
    batches.emplace_back(data->train, c.batch_size, t, towers, c.seed);

  // The parameters, then the loop: run, push the mean, take the next parameters.
  std::vector<tensor> current(params->size());
  uint64_t global_step = 0;
  auto exchange = [&](bool pull, const std::vector<tensor>* grads) -> caf::error {
    for (auto& sh : shards) {
      std::vector<tensor> part;
      if (grads)
        for (auto i : sh.params)
          part.push_back((*grads)[i]);
      auto r = sh.chan->aggregate(pull ? wire::kind::pull : wire::kind::push, sh.name, 0,
                                  global_step, part, timeout);
      if (!r)
        return std::move(r.error());
      std::vector<shape_type> shapes;
      for (auto i : sh.params)
        shapes.push_back((*params)[i].shape);
      auto values = train::unflatten(r->second, shapes);
      if (!values)
        return to_error(values.error());
      for (size_t j = 0; j < sh.params.size(); ++j)
        current[sh.params[j]] = std::move((*values)[j]);
      global_step = r->first;
    }
    return caf::none;
  };
  if (auto err = exchange(true, nullptr))
    return err;
  train_outcome outcome;
  auto t0 = std::chrono::steady_clock::now();
  double loss_sum = 0;
  uint64_t loss_n = 0;
  while (global_step < total) {
    std::vector<std::pair<output, tensor>> feeds;
    for (uint32_t t = 0; t < towers; ++t) {
      auto f = train::feeds(reps[t], current, batches[t].at(global_step));
      feeds.insert(feeds.end(), f.begin(), f.end());
    }
    auto out = s.run(fetches, feeds);
    if (!out)
      return std::move(out.error());
    loss_sum += (*out)[0].at(0);
    loss_n += 1;
    std::vector<tensor> grads(out->begin() + 1, out->end());
    if (auto err = exchange(false, &grads))
      return err;
    if (opts.print && c.log_every > 0 && (global_step % c.log_every == 0 || global_step == total)) {
      std::printf("step %llu/%llu  loss %.4f  (in-graph, %u replicas)\n",
                  static_cast<unsigned long long>(global_step),
                  static_cast<unsigned long long>(total), loss_sum / static_cast<double>(loss_n),
                  towers);
      std::fflush(stdout);
      loss_sum = 0;
      loss_n = 0;
    }
  }
  outcome.result.seconds =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  outcome.result.global_step = global_step;
  outcome.result.local_steps = global_step;
  outcome.result.params = current;
  auto ev = train::evaluate_local(c, data->test, current);
  if (!ev)
    return to_error(ev.error());
  outcome.result.test_loss = ev->first;
  outcome.result.accuracy = ev->second;
  if (opts.shutdown_ps)
    for (uint32_t k = 0; k < n_ps; ++k)
      if (auto err = s.shutdown("ps", static_cast<int32_t>(k)))
        log::get()->warn("in-graph client: shutting down /job:ps/task:{}: {}", k, describe(err));
  return outcome;
}

} // namespace af
