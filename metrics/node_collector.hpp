#pragma once
/// The collector behind a node's /metrics (metrics/node_metrics.hpp): at each
/// scrape it reads the node's counters and asks its actors for the rest.
/// Not for other users.

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "caf/actor_system.hpp"

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "actors/node.hpp"

namespace af {

/// What a scrape builds, family by family.
using families = std::deque<prometheus::MetricFamily>;

class scrape_requests;

class node_collector : public prometheus::Collectable {
public:
  /// The requests of one scrape to the node's actors are sent together and
  /// all wait at most `scrape_budget_ms` (or `request_timeout_ms` if less):
  /// one deadline for the whole scrape, so that an actor that does not
  /// answer holds civetweb's thread for the budget, not for request_timeout_ms
  /// per executor. What did not answer by then is left out and named
  /// (actorflow_scrape_skipped, and a warning when that changes).
  node_collector(caf::actor_system& sys, running_node node, int32_t request_timeout_ms,
                 int32_t scrape_budget_ms)
    : sys_(sys), node_(std::move(node)), timeout_ms_(request_timeout_ms),
      budget_ms_(scrape_budget_ms) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

private:
  /// The data plane's families (connections, refusals, bytes, ops by transport).
  void collect_data_plane(families& out) const;
  /// The executors' step latencies, graphs and open steps; parked waiters
  /// (asked through `rq`, filled in when it awaits its answers).
  void collect_runtime(families& out, scrape_requests& rq) const;
  /// Each aggregator's rounds and its workers' pushes (asked through `rq`).
  void collect_aggregators(families& out, scrape_requests& rq) const;
  /// actorflow_scrape_skipped and _incomplete; a warning when the parts
  /// that did not answer are other than the last scrape's.
  void report_skipped(families& out, std::vector<std::string> skipped) const;

  caf::actor_system& sys_;
  running_node node_;
  int32_t timeout_ms_;
  int32_t budget_ms_;
  mutable std::mutex said_mtx_;
  mutable std::string said_; ///< the parts the last warning named ("": all answered)
};

/// This process's resident set (bytes) and threads, from /proc/self/status;
/// -1 where it cannot be read.
void process_usage(int64_t& rss_bytes, int64_t& threads);

} // namespace af
