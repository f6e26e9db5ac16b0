// In-graph replication of a sparse job (dist/sparse_in_graph.hpp): one
// client, a replica per worker task, each replica's step the between-graph
// worker's (run_sparse_step); sync merges the replicas' pushes into one per
// ps, async and ssp push each replica's as it comes.
#include "dist/sparse_in_graph.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "actors/blocking_ask.hpp"
#include "core/log.hpp"
#include "dist/job_setup.hpp"
#include "dist/sparse_job_detail.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

using namespace sparse_job_detail;
using clock_type = std::chrono::steady_clock;

/// Sync: the pushes the replicas of one step send one ps, merged into one.
class merged_push {
public:
  explicit merged_push(size_t replicas) : replicas_(replicas) {}

  /// A replica's push; true once every replica's is in.
  bool add(const sparse_push_values& v) {
    parts_.push_back(v); // tensors share their buffers: no copy of the rows
    return parts_.size() == replicas_;
  }

  /// The replicas' pushes as one, as a sync round of as many workers would
  /// apply them: each replica's rows times 1 / replicas, a repeated id's
  /// summed in replica order (variable_cell::apply_sparse_gradient's sum);
  /// the dense gradients summed in replica order, then times 1 / replicas
  /// (aggregation_round's mean). Clears the parts for the next step.
  sparse_push_values take();

private:
  size_t replicas_;
  std::vector<sparse_push_values> parts_;
};

sparse_push_values merged_push::take() {
  auto parts = std::move(parts_);
  parts_.clear();
  if (parts.size() == 1)
    return std::move(parts[0]);
  const float scale = 1.0f / static_cast<float>(parts.size());
  sparse_push_values out;
  for (size_t i = 0; i < parts[0].dense.size(); ++i) {
    auto sum = tensor::filled(dtype::float32, parts[0].dense[i].shape(), 0);
    float* dst = sum.mutable_data<float>();
    const size_t n = sum.num_elements();
    for (const auto& p : parts) {
      const float* src = p.dense[i].data<float>();
      for (size_t k = 0; k < n; ++k)
        dst[k] += src[k];
    }
    for (size_t k = 0; k < n; ++k)
      dst[k] *= scale;
    out.dense.push_back(std::move(sum));
  }
  std::vector<float> scaled;
  for (size_t j = 0; j < parts[0].ids.size(); ++j) {
    const auto width = static_cast<size_t>(parts[0].rows[j].shape().at(1));
    std::unordered_map<int64_t, size_t> at;
    std::vector<int64_t> ids;
    std::vector<float> rows;
    for (const auto& p : parts) {
      const size_t n = p.ids[j].num_elements();
      const int64_t* pid = p.ids[j].data<int64_t>();
      const float* src = p.rows[j].data<float>();
      // Scaled first, then added: the aggregator's two steps, not one fused.
      scaled.resize(n * width);
      for (size_t k = 0; k < n * width; ++k)
        scaled[k] = src[k] * scale;
      for (size_t e = 0; e < n; ++e) {
        auto [it, fresh] = at.emplace(pid[e], ids.size());
        if (fresh) {
          ids.push_back(pid[e]);
          rows.resize(rows.size() + width, 0.0f);
        }
        float* dst = rows.data() + it->second * width;
        for (size_t w = 0; w < width; ++w)
          dst[w] += scaled[e * width + w];
      }
    }
    const auto n = static_cast<int64_t>(ids.size());
    tensor tid{dtype::int64, {n}};
    tensor trows{dtype::float32, {n, static_cast<int64_t>(width)}};
    if (n > 0) {
      std::memcpy(tid.mutable_data<int64_t>(), ids.data(), ids.size() * sizeof(int64_t));
      std::memcpy(trows.mutable_data<float>(), rows.data(), rows.size() * sizeof(float));
    }
    out.ids.push_back(std::move(tid));
    out.rows.push_back(std::move(trows));
  }
  return out;
}

/// A replica's link to a ps in a sync step: reads go to the client's link;
/// a push is kept until every replica's is in, and the last replica's
/// sends them merged. The others' answers are placeholders (the step they
/// pushed for, not late): the step's outcome is the last replica's.
class merging_link : public sparse_ps_link {
public:
  merging_link(sparse_ps_link& link, merged_push& round) : link_(link), round_(round) {}

  caf::error start_gather_rows(const std::string& var, const tensor& ids) override {
    return forward(link_.start_gather_rows(var, ids));
  }
  caf::error start_read(const std::string& var) override {
    return forward(link_.start_read(var));
  }
  caf::error start_push(uint64_t step, const sparse_push_values& values) override {
    if (!round_.add(values)) {
      held_.push_back(answer{tensor{}, step, false});
      return caf::none;
    }
    return forward(link_.start_push(step, round_.take()));
  }
  void flush() override { link_.flush(); }
  caf::expected<answer> finish() override {
    if (held_.empty())
      return make_error(af_error::internal, "an answer asked of a merging link with no request");
    auto next = std::move(held_.front());
    held_.pop_front();
    if (next)
      return std::move(*next);
    return link_.finish();
  }

private:
  /// A request that went out on the client's link: its answer comes from it.
  caf::error forward(caf::error err) {
    if (!err)
      held_.emplace_back(std::nullopt);
    return err;
  }
  sparse_ps_link& link_;
  merged_push& round_;
  /// Per request started, in order: the answer of a held push, or none
  /// (the client's link answers it).
  std::deque<std::optional<answer>> held_;
};

/// The client's state: the chief's task (its model, layout, data, links)
/// and, async and ssp, a membership per other replica.
struct in_graph_run {
  sparse_task& chief;
  uint32_t replicas = 0;
  bool sync = true;
  /// Who pushes: sync, the chief alone; async, ssp: replica r is members[r].
  std::vector<sparse_task*> members;
  std::vector<std::unique_ptr<sparse_task>> others;
  /// sync: per ps, the step's merged push and the replicas' link to it.
  std::vector<std::unique_ptr<merged_push>> rounds;
  std::vector<std::unique_ptr<merging_link>> merging;
  std::vector<sparse_ps_link*> merging_ptrs;
};

/// Replica `m`'s links through the death of a ps (async, ssp; the
/// client's own, replica 0's, are armed by set_up): the ps is waited for
/// and restored once, by the client's recovery (`chief`'s), whichever
/// replica saw it go first; every other replica then joins its new
/// aggregator as itself and its links go on there (sparse_recovery's
/// recover). A replica that took the client's view of ps k as it is now
/// waits through the client's recovery; one behind it (the client's
/// recovered the ps since) takes the ps as the client has it at once.
caf::error arm_replica_recovery(sparse_task& m, sparse_task& chief) {
  auto& client = *chief.recovering;
  // Per ps: the client's generation this replica last took.
  auto seen = std::make_shared<std::vector<uint64_t>>(chief.shards.size(), 0);
  auto recover = [&client, seen](size_t k, uint64_t, const std::string& why,
                                 bool) -> caf::expected<recovered_shard> {
    auto now = client.current(k);
    if (now.generation == (*seen)[k]) {
      auto r = client.recover(k, now.generation, why);
      if (!r)
        return std::move(r.error());
      now = std::move(*r);
    }
    (*seen)[k] = now.generation;
    return recovered_shard{now.shard, now.restored_step};
  };
  return wrap_links(m, std::move(recover), training_detail::find_aggregator_of(chief.recovery));
}

/// The memberships and links of replicas 1.. (async, ssp), the chief's
/// layout shared (the replicas step one after another).
caf::error join_replicas(in_graph_run& g) {
  auto& t = g.chief;
  auto n_ps = static_cast<uint32_t>(t.layout.ps_order.size());
  g.members.push_back(&t);
  if (g.sync) {
    for (uint32_t k = 0; k < n_ps; ++k) {
      g.rounds.push_back(std::make_unique<merged_push>(g.replicas));
      g.merging.push_back(std::make_unique<merging_link>(*t.link_ptrs[k], *g.rounds.back()));
      g.merging_ptrs.push_back(g.merging.back().get());
    }
    return caf::none;
  }
  for (uint32_t r = 1; r < g.replicas; ++r) {
    auto m = std::make_unique<sparse_task>(t.s, t.c);
    m->task = r;
    m->workers = t.workers;
    m->timeout = t.timeout;
    m->layout = t.layout;
    m->self = std::make_unique<caf::scoped_actor>(t.s.system());
    g.others.push_back(std::move(m));
    g.members.push_back(g.others.back().get());
    for (uint32_t k = 0; k < n_ps; ++k)
      if (auto err = join_ps(*g.members.back(), k))
        return err;
    if (t.recovering)
      if (auto err = arm_replica_recovery(*g.members.back(), t))
        return err;
  }
  return caf::none;
}

/// After the training loop (async, ssp): a replica that did not step again
/// after the client's recovery of a ps (the job's steps ran out first)
/// joins that ps's new aggregator now, so that its done goes there; then
/// every replica's membership is taken as the recoveries left it.
void take_recovered_replicas(in_graph_run& g) {
  auto& t = g.chief;
  take_recovered(t);
  if (!t.recovering)
    return;
  for (auto& m : g.others) {
    if (!m->recovering)
      continue;
    for (size_t k = 0; k < m->shards.size(); ++k) {
      auto mine = m->recovering->current(k);
      if (mine.shard.incarnation == t.recovering->current(k).shard.incarnation)
        continue;
      if (auto r = m->recovering->recover(k, mine.generation, "the client recovered it"); !r)
        log::get()->warn("in-graph client: replica {} could not join {} again: {}", m->task,
                         mine.shard.task, describe(r.error()));
    }
    take_recovered(*m);
  }
}

/// Every member's links' bytes so far.
uint64_t all_bytes(const in_graph_run& g) {
  uint64_t n = 0;
  for (const auto* m : g.members)
    n += link_bytes(*m);
  return n;
}

/// What one step of a replica touched: each distinct row and its id, out and back.
uint64_t touched_bytes(const std::vector<train::table_spec>& specs,
                       const sparse_step_report& r) {
  uint64_t n = 0;
  for (size_t i = 0; i < specs.size(); ++i)
    n += 2 * static_cast<uint64_t>(r.unique[i])
         * (sizeof(int64_t) + sizeof(float) * static_cast<uint64_t>(specs[i].width));
  return n;
}

/// The training loop: every replica's step on its share of the global batch
/// (sync: of step `global`; async: of its own next step), until the global
/// step reaches `total`.
caf::error train_replicas(in_graph_run& g, uint64_t total, const sparse_job_options& o,
                          sparse_outcome& out) {
  auto& t = g.chief;
  const auto& train_set = t.data.data.train;
  train::example_order order(train_set.labels.size(), t.c.seed);
  const auto batch_size = static_cast<uint64_t>(t.c.batch_size);
  const uint64_t n = g.replicas;
  auto specs = t.model->tables();
  uint64_t global = t.start_step, touched = 0, steps = 0, bytes0 = all_bytes(g);
  for (const auto* m : g.members)
    global = std::min(global, m->start_step);
  // async: each replica's data resumes at the restored step's share of it.
  const uint64_t data_start = g.sync ? 0 : global / n;
  std::vector<uint64_t> local(n, 0);
  bool saving = !t.c.checkpoint_dir.empty();
  // The global step and the time of the last checkpoint taken or tried
  // (one that failed while a ps recovers is tried again at the next due).
  uint64_t last_save_step = global;
  auto last_save = clock_type::now();
  double loss_sum = 0;
  uint64_t loss_count = 0;
  std::vector<size_t> picks;
  train::sparse_batch batch;
  auto start = clock_type::now();
  // One replica's step: sync through the merging links (the last one's
  // push sends the merged one), async through its own membership.
  auto step_of = [&](uint32_t r, uint64_t data_step) -> caf::expected<sparse_step_report> {
    order.positions((data_step * n + r) * batch_size, batch_size, picks);
    take(train_set, picks, batch);
    if (o.step_delay.count() > 0) // tests: a job that lasts long enough to kill a ps in
      std::this_thread::sleep_for(o.step_delay);
    auto* m = g.members[g.sync ? 0 : r];
    if (t.recovering) // the step a ps that died is restored at (the job's, not 0)
      t.recovering->step.store(global);
    auto rep = run_sparse_step(*t.model, t.layout, g.sync ? g.merging_ptrs : m->link_ptrs, batch,
                               global);
    if (!rep) {
      if (t.recovering) // a ps that did not come back: the cause of what else failed
        if (auto gone = t.recovering->failure())
          return gone;
      return rep;
    }
    if (!std::isfinite(rep->result.loss))
      return make_error(af_error::non_finite,
                        fmt::format("replica {}: the loss of global step {} is {}: the model "
                                    "diverged (lower learning_rate, or restore a checkpoint)",
                                    r, global, rep->result.loss));
    touched += touched_bytes(specs, *rep);
    loss_sum += rep->result.loss;
    ++loss_count;
    return rep;
  };
  while (global < total && !(o.stop && o.stop->load())) {
    caf::expected<sparse_step_report> last = make_error(af_error::internal, "no replica");
    for (uint32_t r = 0; r < n && global < total; ++r) {
      last = step_of(r, g.sync ? global : data_start + local[r]);
      if (!last)
        return std::move(last.error());
      ++local[r];
      if (!g.sync) { // each push is a step of its own
        global = *std::min_element(last->global_steps.begin(), last->global_steps.end());
        ++out.local_steps;
      }
    }
    if (g.sync)
      ++out.local_steps; // one step of the client: every replica's batch
    global = *std::min_element(last->global_steps.begin(), last->global_steps.end());
    if (std::any_of(last->dropped_late.begin(), last->dropped_late.end(), [](bool b) { return b; }))
      ++out.late;
    ++steps;
    out.last_loss = loss_sum / static_cast<double>(loss_count); // the replicas' mean
    uint64_t position = g.sync ? global : data_start + *std::min_element(local.begin(), local.end());
    if (saving && global < total
        && (train::steps_checkpoint_due(t.c.checkpoint_steps, global, last_save_step)
            || (t.c.checkpoint_secs > 0
                && std::chrono::duration<double>(clock_type::now() - last_save).count()
                     >= t.c.checkpoint_secs))) {
      if (auto err = checkpoint(t, global, position, o.print)) {
        // A ps may be down (its save failed): with recovery, the job goes
        // on and the next step waits for it; the latest checkpoint stays.
        if (!t.recovering)
          return err;
        log::get()->warn("in-graph client: the checkpoint of global step {} is skipped: {}; "
                         "the latest one stays",
                         global, describe(err));
      }
      last_save_step = global;
      last_save = clock_type::now();
    }
    if (t.c.log_every > 0 && steps % t.c.log_every == 0) {
      report_metrics(t, global, g.sync ? out.local_steps : out.local_steps / n, // a replica's
                     std::chrono::duration<double>(clock_type::now() - start).count(),
                     out.last_loss);
      if (o.print) {
        std::printf("step %llu/%llu: loss %.6f (in-graph, %u replicas)\n",
                    static_cast<unsigned long long>(global),
                    static_cast<unsigned long long>(total), out.last_loss, g.replicas);
        std::fflush(stdout);
      }
      if (o.on_progress)
        o.on_progress(global, out.local_steps,
                      std::chrono::duration<double>(clock_type::now() - start).count(),
                      out.last_loss);
      loss_sum = 0;
      loss_count = 0;
    }
  }
  out.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  out.global_step = global;
  if (t.c.log_every == 0 || steps % t.c.log_every != 0) // the last row
    report_metrics(t, global, g.sync ? out.local_steps : out.local_steps / n, out.seconds,
                   out.last_loss);
  if (steps > 0) {
    out.bytes_per_step = static_cast<double>(all_bytes(g) - bytes0) / static_cast<double>(steps);
    out.touched_bytes_per_step = static_cast<double>(touched) / static_cast<double>(steps);
  }
  return caf::none;
}

/// Every member says it is done (`why`: empty, or why the client failed).
caf::error all_done(in_graph_run& g, const std::string& why) {
  caf::error first;
  for (auto* m : g.members)
    if (!m->members.empty())
      if (auto err = say_done(*m, why); err && !first)
        first = std::move(err);
  return first;
}

/// The end: the checkpoint at the step every ps reached, then the scores.
caf::error finish(in_graph_run& g, const sparse_job_options& o, sparse_outcome& out) {
  auto& t = g.chief;
  if (!t.c.checkpoint_dir.empty()) {
    uint64_t global = out.global_step;
    for (size_t k = 0; k < t.members.size(); ++k) {
      auto stats = ask<aggregator_stats>(t.s, t.members[k].actor, t.timeout, stats_atom::value);
      if (!stats)
        return std::move(stats.error());
      global = k == 0 ? stats->global_step : std::min(global, stats->global_step);
    }
    if (auto e = checkpoint(t, global, g.sync ? global : global / g.replicas, o.print))
      return e;
  }
  return score(t, out);
}

caf::expected<sparse_outcome> run_client(in_graph_run& g, const sparse_job_options& o) {
  auto& t = g.chief;
  const auto& c = t.c;
  auto err = set_up(t);
  if (!err && g.sync) {
    // The step's global batch is every replica's (set_up checked one).
    auto per_step = static_cast<uint64_t>(c.batch_size) * g.replicas;
    if (per_step > t.data.data.train.labels.size())
      err = make_error(af_error::invalid_argument,
                       fmt::format("batch_size = {} ({} examples a step, {} replicas) is more "
                                   "than the {} training examples: lower batch_size",
                                   c.batch_size, per_step, g.replicas,
                                   t.data.data.train.labels.size()));
  }
  if (!err)
    err = join_replicas(g);
  if (!err)
    err = open_metrics(t, g.replicas);
  sparse_outcome out;
  out.workers = g.replicas; // the replicas, all in this process: they finish together
  if (!err) {
    out.has_truth = t.data.has_truth;
    out.truth_auc = t.data.truth_auc;
    out.truth_log_loss = t.data.truth_log_loss;
    out.train_examples = t.data.data.train.labels.size();
    out.test_examples = t.data.data.test.labels.size();
    out.auc = out.log_loss = std::numeric_limits<double>::quiet_NaN();
    auto total = train::total_steps(c, out.train_examples,
                                    train::step_per_push(c.mode) ? 1 : g.replicas);
    err = train_replicas(g, total, o, out);
    // A ps recovered on the way has a new aggregator: done, the stats and
    // the last checkpoint go to it, not to the one that died.
    take_recovered_replicas(g);
    if (t.recovering)
      out.ps_recoveries = t.recovering->recoveries.load();
  }
  if (err) {
    // The aggregators stop waiting for this client's members at once.
    all_done(g, describe(err));
    return err;
  }
  if (auto done = all_done(g, {}))
    return done;
  if (auto e = finish(g, o, out))
    return e;
  return out;
}

} // namespace

caf::expected<sparse_outcome> run_sparse_in_graph(session& s, const train::train_config& c,
                                                  const sparse_job_options& o) {
  if (auto err = refuse_mode(c))
    return err;
  if (auto err = training_detail::check_config(c))
    return err;
  auto replicas = static_cast<uint32_t>(s.cluster().num_tasks("worker"));
  if (replicas == 0)
    return make_error(af_error::invalid_argument,
                      "in-graph replication needs worker tasks: a replica each");
  sparse_task t(s, c);
  t.task = 0;
  t.chief = true;
  t.in_graph = true;
  t.timeout = std::chrono::milliseconds{c.init_timeout_ms};
  in_graph_run g{t, replicas, c.mode == "sync", {}, {}, {}, {}, {}};
  // sync: the client is the one member of each aggregator (it pushes the
  // merged step); async, ssp: a member per replica.
  t.workers = g.sync ? 1 : replicas;
  auto out = run_client(g, o);
  if (out && o.shutdown_ps)
    for (size_t k = 0; k < s.cluster().num_tasks("ps"); ++k)
      if (auto err = s.shutdown("ps", static_cast<int32_t>(k)))
        log::get()->warn("in-graph client: stopping /job:ps/task:{}: {}", k, describe(err));
  return out;
}

} // namespace af
