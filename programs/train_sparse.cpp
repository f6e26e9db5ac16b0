#include "programs/train_sparse.hpp"

#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/log.hpp"
#include "dist/embedded_cluster.hpp"
#include "dist/sparse_in_graph.hpp"
#include "messages/error.hpp"
#include "train/config_model.hpp"
#include "train/local.hpp"

namespace af::programs {

namespace {

void print_scores(double auc, double log_loss, size_t test_examples, bool has_truth,
                  double truth_auc, double truth_log_loss) {
  std::printf("held-out: auc=%.4f log_loss=%.4f examples=%zu", auc, log_loss, test_examples);
  if (has_truth)
    std::printf(" (planted truth: auc=%.4f log_loss=%.4f)", truth_auc, truth_log_loss);
  std::printf("\n");
}

} // namespace

int run_sparse_local(const train::train_config& c, fail_fn fail) {
  if (!c.checkpoint_dir.empty() || !c.metrics.empty())
    std::fprintf(stderr, "actorflow-train: --local writes no checkpoint or metrics CSV for model "
                         "%s (checkpoint_dir and metrics are for its job: run without --local)\n",
                 c.model.c_str());
  std::printf("actorflow-train: model %s in one process: users %lld, items %lld, dim %lld, "
              "data %s, optimizer %s\n",
              c.model.c_str(), static_cast<long long>(c.users), static_cast<long long>(c.items),
              static_cast<long long>(c.dim), c.data.c_str(), c.optimizer.kind.c_str());
  std::fflush(stdout);
  auto rep = train::train_recommender_local(c, [](uint64_t step, double loss) {
    std::printf("step %llu: loss %.6f\n", static_cast<unsigned long long>(step), loss);
    std::fflush(stdout);
  });
  if (!rep)
    return fail(rep.error().what, 1); // its data (a CSV) or the run failed, as a job's worker
  const auto& r = rep->result;
  print_scores(r.auc, r.log_loss, rep->test_examples, rep->has_truth, rep->truth_auc,
               rep->truth_log_loss);
  std::printf("train done: mode=local workers=1 global_step=%llu seconds=%.3f loss=%.6g "
              "train_examples=%zu\n",
              static_cast<unsigned long long>(r.steps), r.seconds, r.last_loss,
              rep->train_examples);
  std::fflush(stdout);
  return 0;
}

void print_sparse_summary(const train::train_config& c, uint32_t workers, const sparse_outcome& o) {
  print_scores(o.auc, o.log_loss, o.test_examples, o.has_truth, o.truth_auc, o.truth_log_loss);
  std::printf("wire: %.0f bytes per step (ids out, rows back, gradients out), %.2fx the touched "
              "rows and their ids (%.0f bytes)\n",
              o.bytes_per_step,
              o.touched_bytes_per_step > 0 ? o.bytes_per_step / o.touched_bytes_per_step : 0.0,
              o.touched_bytes_per_step);
  std::printf("train done: mode=%s workers=%u global_step=%llu seconds=%.3f loss=%.6g "
              "train_examples=%zu steps_per_s=%.1f\n",
              c.mode.c_str(), workers, static_cast<unsigned long long>(o.global_step), o.seconds,
              o.last_loss, o.train_examples,
              o.seconds > 0 ? static_cast<double>(o.local_steps) / o.seconds : 0.0);
  std::fflush(stdout);
}

/// The embedded cluster's ps are all in this one process: its tables must
/// fit max_data_bytes whole, not a ps's share of them (each ps checks only its
/// own share, so 3 ps of an embedded job could hold 3x the limit between them).
std::string embedded_tables_problem(const train::train_config& c) {
  return train::recommender_table_problem(c, 1);
}

int run_sparse_embedded(const train::train_config& c, int ps, int workers, fail_fn fail) {
  if (auto why = embedded_tables_problem(c); !why.empty())
    return fail(why, 1);
  auto cluster = embedded_cluster::start({{"worker", workers}, {"ps", ps}},
                                         embedded_cluster::defaults());
  if (!cluster)
    return fail(describe(cluster.error()), is(cluster.error(), af_error::resource_exhausted) ? 1 : 2);
  std::printf("actorflow-train: embedded cluster (%d ps + %d workers), mode %s, model %s "
              "(users %lld, items %lld, dim %lld, tables cut by %s), data %s\n",
              ps, workers, c.mode.c_str(), c.model.c_str(), static_cast<long long>(c.users),
              static_cast<long long>(c.items), static_cast<long long>(c.dim),
              c.partition_strategy.c_str(), c.data.c_str());
  std::fflush(stdout);
  std::vector<caf::expected<sparse_outcome>> results(
    workers, make_error(af_error::internal, "not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      auto s = (*cluster)->session_for("worker", w);
      if (!s) {
        results[w] = std::move(s.error());
        return;
      }
      sparse_job_options o;
      o.shutdown_ps = false; // the embedded cluster stops its nodes itself
      // Its ps live and end with this process: one that is gone was stopped
      // below (worker 0 failed) and never comes back, so no worker waits
      // ps_recovery_timeout_ms (60 s) for it before it says why it ends.
      auto mine = c;
      mine.ps_recovery_timeout_ms = 0;
      results[w] = run_sparse_worker_task(*s, mine, static_cast<uint32_t>(w), o);
      if (w == 0 && !results[w]) {
        // Say why now, and stop the ps: the other workers would otherwise
        // wait init_timeout_ms for a chief that is gone.
        fail("worker 0: " + describe(results[w].error()), 1);
        for (int k = 0; k < ps; ++k)
          if (auto err = s->shutdown("ps", k))
            log::get()->warn("chief: stopping /job:ps/task:{}: {}", k, describe(err));
      }
    });
  for (auto& t : threads)
    t.join();
  for (int w = 0; w < workers; ++w)
    if (!results[w])
      return w == 0 ? 1 // said when it happened
                    : fail("worker " + std::to_string(w) + ": " + describe(results[w].error()), 1);
  print_sparse_summary(c, workers, *results[0]);
  return 0;
}

int run_sparse_in_graph_embedded(const train::train_config& c, int ps, int workers,
                                 fail_fn fail) {
  if (auto why = embedded_tables_problem(c); !why.empty())
    return fail(why, 1);
  auto cluster = embedded_cluster::start({{"worker", workers}, {"ps", ps}},
                                         embedded_cluster::defaults());
  if (!cluster)
    return fail(describe(cluster.error()), is(cluster.error(), af_error::resource_exhausted) ? 1 : 2);
  std::printf("actorflow-train: embedded cluster (%d ps + %d workers), in-graph: one client, a "
              "replica per worker, mode %s, model %s (users %lld, items %lld, dim %lld, tables "
              "cut by %s), data %s\n",
              ps, workers, c.mode.c_str(), c.model.c_str(), static_cast<long long>(c.users),
              static_cast<long long>(c.items), static_cast<long long>(c.dim),
              c.partition_strategy.c_str(), c.data.c_str());
  std::fflush(stdout);
  auto s = (*cluster)->session_for("worker", 0);
  if (!s)
    return fail(describe(s.error()), 1);
  sparse_job_options o;
  o.shutdown_ps = false; // the embedded cluster stops its nodes itself
  auto out = run_sparse_in_graph(*s, c, o);
  if (!out)
    return fail("in-graph client: " + describe(out.error()), 1);
  print_sparse_summary(c, static_cast<uint32_t>(workers), *out);
  return 0;
}

} // namespace af::programs
