#pragma once
/// The collector behind a node's /metrics (metrics/node_metrics.hpp): at each
/// scrape it reads the node's counters and asks its actors for the rest.
/// Not for other users.

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "caf/actor_system.hpp"

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "actors/node.hpp"

namespace af {

/// What a scrape builds, family by family.
using families = std::deque<prometheus::MetricFamily>;

class node_collector : public prometheus::Collectable {
public:
  /// Its requests to the node's actors wait at most `request_timeout_ms`.
  node_collector(caf::actor_system& sys, running_node node, int32_t request_timeout_ms)
    : sys_(sys), node_(std::move(node)), timeout_ms_(request_timeout_ms) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

private:
  /// The data plane's families (connections, refusals, bytes, ops by transport).
  void collect_data_plane(families& out) const;
  /// The executors' step latencies, graphs and open steps; parked waiters.
  void collect_runtime(families& out) const;
  /// Each aggregator's rounds and its workers' pushes.
  void collect_aggregators(families& out) const;

  caf::actor_system& sys_;
  running_node node_;
  int32_t timeout_ms_;
};

/// This process's resident set (bytes) and threads, from /proc/self/status;
/// -1 where it cannot be read.
void process_usage(int64_t& rss_bytes, int64_t& threads);

} // namespace af
