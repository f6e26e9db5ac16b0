#pragma once
/// A node's /metrics (Prometheus' text format) and /healthz, served by
/// prometheus-cpp's Exposer (civetweb) on [node] metrics_port
/// (docs/watching.md "Prometheus").
///
/// Pull, not push: at each scrape a collector reads what the node already
/// counts (the data plane's counters, the step latency histograms, the CAF
/// variable ops: relaxed atomics) and asks the node's actors for the rest
/// (its executors' graphs, its variables' parked waiters, its aggregators'
/// stats: one request each, as a client would, all of one scrape under one
/// deadline, metrics_scrape_budget_ms). The paths that serve work
/// take no lock and do no more than a relaxed increment for it.
///
/// This layer sits above dist/ and actors/ and reads them; the programs that
/// start nodes (actorflow-node, and whoever embeds a cluster) start it beside
/// the node with start_node_metrics().

#include <cstdint>
#include <memory>
#include <string>

#include "caf/actor_system.hpp"
#include "caf/expected.hpp"

#include "actors/node.hpp"
#include "config/cluster_spec.hpp"

namespace af {

class node_metrics_server;

/// civetweb's threads for /metrics and /healthz: each serves one connection
/// at a time.
constexpr int metrics_server_threads = 4;

/// How long a connection may take to send its request (and to take its
/// answer) before civetweb closes it and its thread serves the next.
constexpr int metrics_request_timeout_ms = 5000;

/// How long one scrape of /metrics waits for the node's actors, all its
/// requests together (node_collector): an executor or aggregator that does
/// not answer by then is left out of that scrape and named in
/// actorflow_scrape_skipped, well within a Prometheus scrape_timeout (10 s
/// by default). [node] request_timeout_ms bounds it too, if less.
constexpr int metrics_scrape_budget_ms = 2000;

/// Whether this system's civetweb serves IPv6 (Debian's does not: an IPv6
/// metrics_bind is refused by check_metrics_options).
bool metrics_serve_ipv6();

/// /metrics and /healthz of one node, while this lives. Destroy it before
/// the node's actor system.
class node_metrics {
public:
  ~node_metrics();
  node_metrics(const node_metrics&) = delete;
  node_metrics& operator=(const node_metrics&) = delete;

  /// The port it listens on.
  uint16_t port() const;

  /// From now on /healthz answers 503 with "shutting down: `why`" (a
  /// program calls it when a signal or a shutdown request comes; a node
  /// that ended says so by itself).
  void shutting_down(const std::string& why);

private:
  friend caf::expected<std::unique_ptr<node_metrics>>
  start_node_metrics(caf::actor_system&, const running_node&, const std::string&,
                     const node_options&, const security_options&);
  node_metrics() = default;
  std::unique_ptr<node_metrics_server> impl_;
};

/// What start_node_metrics checks before it binds: a port in 1..65535 and a
/// metrics_bind that is loopback or allowed by [security]; the error names
/// the option. A program calls it before it starts the node.
caf::error check_metrics_options(const node_options& opts, const security_options& sec,
                                 const std::string& name);

/// The warning start_node_metrics logs when it serves on an address other
/// than loopback (allowed by [security] metrics_public or insecure): it names
/// the address and port, and says that anyone who can reach them reads the
/// node's metrics. Empty for a loopback metrics_bind.
std::string metrics_exposure_warning(const node_options& opts, const security_options& sec,
                                     const std::string& name);

/// Serves `node`'s /metrics and /healthz on opts.metrics_bind:opts.metrics_port
/// ([node] metrics_port must be 1..65535). `name` ("/job:ps/task:0") names it in
/// errors. An address other than loopback needs sec.metrics_public (or
/// sec.insecure); a port in use, a bad address or one not allowed is an
/// af_error::invalid_config or bind_failed whose message names the option.
caf::expected<std::unique_ptr<node_metrics>>
start_node_metrics(caf::actor_system& sys, const running_node& node, const std::string& name,
                   const node_options& opts, const security_options& sec = {});

} // namespace af
