/// What a node's /metrics says (metrics/node_collector.hpp). Names follow
/// Prometheus' conventions: actorflow_..._total for counters, _seconds and
/// _bytes for units; labels for transport, reason, executor, aggregator, worker.
#include "metrics/node_collector.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <sstream>

#include "caf/all.hpp"

#include "actors/node_watch.hpp"
#include "core/log.hpp"
#include "actors/variable_directory.hpp"
#include "messages/aggregator.hpp"
#include "messages/executor.hpp"
#include "messages/node.hpp"
#include "net/data_plane.hpp"

namespace af {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using labels = std::vector<ClientMetric::Label>;

/// A new family at the end of `out` (a deque: the families made before stay
/// where they are while their metrics are added).
MetricFamily& family(families& out, std::string name, std::string help, MetricType type) {
  out.push_back(MetricFamily{std::move(name), std::move(help), type, {}});
  return out.back();
}

void add_counter(MetricFamily& f, double value, labels l = {}) {
  ClientMetric m;
  m.label = std::move(l);
  m.counter.value = value;
  f.metric.push_back(std::move(m));
}

void add_gauge(MetricFamily& f, double value, labels l = {}) {
  ClientMetric m;
  m.label = std::move(l);
  m.gauge.value = value;
  f.metric.push_back(std::move(m));
}

void add_histogram(MetricFamily& f, const latency_histogram::snapshot& s, labels l) {
  ClientMetric m;
  m.label = std::move(l);
  m.histogram.sample_count = s.count;
  m.histogram.sample_sum = s.sum_s;
  uint64_t cumulative = 0;
  const auto& bounds = latency_histogram::bounds();
  for (size_t k = 0; k < bounds.size(); ++k) {
    cumulative += s.counts[k];
    m.histogram.bucket.push_back({cumulative, bounds[k]});
  }
  m.histogram.bucket.push_back({s.count, std::numeric_limits<double>::infinity()});
  f.metric.push_back(std::move(m));
}

double as_double(uint64_t x) {
  return static_cast<double>(x);
}

} // namespace

/// One scrape's requests to the node's actors. Each is sent when asked for,
/// with the scrape's budget as its timeout, and awaited only when all are
/// sent: they run side by side and all end by one deadline (the first
/// send plus the budget), whatever answers and whatever hangs. An answer
/// that comes while another is awaited waits in the mailbox for its turn.
class scrape_requests {
public:
  scrape_requests(caf::actor_system& sys, std::chrono::milliseconds budget)
    : self_(sys), budget_(budget) {}

  /// Asks `dest` for `msg...`; `on_value` takes the answer. `part` names
  /// what did not answer by the deadline ("executor /job:ps/...").
  template <class Dest, class OnValue, class... Ts>
  void ask(const Dest& dest, std::string part, OnValue on_value, Ts&&... msg) {
    auto h = self_->request(dest, budget_, std::forward<Ts>(msg)...);
    awaits_.push_back([this, h, part = std::move(part), on_value]() mutable {
      h.receive(on_value, [&](caf::error& e) {
        // Any other error: it ended meanwhile, and is not there.
        if (e == caf::sec::request_timeout)
          skipped.push_back(part);
      });
    });
  }

  /// Awaits every answer (or its timeout), in the order asked.
  void await_all() {
    for (auto& f : awaits_)
      f();
    awaits_.clear();
  }

  std::vector<std::string> skipped; ///< the parts that did not answer in time

private:
  caf::scoped_actor self_;
  std::chrono::milliseconds budget_;
  std::vector<std::function<void()>> awaits_;
};

void process_usage(int64_t& rss_bytes, int64_t& threads) {
  rss_bytes = -1;
  threads = -1;
  std::ifstream in{"/proc/self/status"};
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields{line};
    std::string key;
    int64_t value = 0;
    fields >> key >> value;
    if (key == "VmRSS:" && fields)
      rss_bytes = value * 1024; // the file says kB
    else if (key == "Threads:" && fields)
      threads = value;
  }
}

std::vector<MetricFamily> node_collector::Collect() const {
  families out;
  collect_data_plane(out);
  auto budget = std::max(1, std::min(budget_ms_, timeout_ms_));
  scrape_requests rq{sys_, std::chrono::milliseconds{budget}};
  collect_runtime(out, rq);
  collect_aggregators(out, rq);
  rq.await_all();
  report_skipped(out, rq.skipped);
  int64_t rss = 0, threads = 0;
  process_usage(rss, threads);
  if (rss >= 0)
    add_gauge(family(out, "actorflow_process_resident_memory_bytes",
                     "Resident memory of the node's process", MetricType::Gauge),
              static_cast<double>(rss));
  if (threads >= 0)
    add_gauge(family(out, "actorflow_process_threads", "Threads of the node's process",
                     MetricType::Gauge),
              static_cast<double>(threads));
  return {std::make_move_iterator(out.begin()), std::make_move_iterator(out.end())};
}

void node_collector::collect_data_plane(families& out) const {
  auto& ops = family(out, "actorflow_variable_ops_total",
                     "Variable ops served, by how they came: the data plane's tcp, tls, shm or "
                     "ucx, or caf (messages to the variable's actor; counted per process)",
                     MetricType::Counter);
  auto& bytes = family(out, "actorflow_transport_bytes_total",
                       "Bytes moved, by transport and direction: every data-plane frame (ops, "
                       "pushes, edges; received requests, sent replies), and the tensors of "
                       "variable ops over caf (per process)",
                       MetricType::Counter);
  auto& requests = family(out, "actorflow_data_plane_requests_total",
                          "Request frames the data plane served (variable ops, aggregator pushes "
                          "and pulls, edges), by transport",
                          MetricType::Counter);
  if (const auto* plane = node_.data_plane.get()) {
    const auto& c = plane->counters();
    for (auto t : {plane_transport::tcp, plane_transport::tls, plane_transport::shm,
                   plane_transport::ucx}) {
      const auto& p = c.of(t);
      std::string name = to_string(t);
      add_counter(ops, as_double(p.variable_ops.load(std::memory_order_relaxed)),
                  {{"transport", name}});
      add_counter(bytes, as_double(p.bytes_received.load(std::memory_order_relaxed)),
                  {{"direction", "received"}, {"transport", name}});
      add_counter(bytes, as_double(p.bytes_sent.load(std::memory_order_relaxed)),
                  {{"direction", "sent"}, {"transport", name}});
      add_counter(requests, as_double(p.requests.load(std::memory_order_relaxed)),
                  {{"transport", name}});
    }
    add_counter(family(out, "actorflow_data_plane_connections_accepted_total",
                       "Data-plane connections admitted", MetricType::Counter),
                as_double(c.accepted.load(std::memory_order_relaxed)));
    add_gauge(family(out, "actorflow_data_plane_connections",
                     "Data-plane connections served now", MetricType::Gauge),
              static_cast<double>(c.open.load(std::memory_order_relaxed)));
    add_gauge(family(out, "actorflow_data_plane_connections_limit",
                     "[node] max_data_connections", MetricType::Gauge),
              static_cast<double>(plane->limits().max_connections));
    auto& refused = family(out, "actorflow_data_plane_refused_total",
                           "Data-plane connections refused or dropped, by reason",
                           MetricType::Counter);
    for (auto r : {plane_refusal::max_connections, plane_refusal::handshakes, plane_refusal::tls,
                   plane_refusal::bad_frame})
      add_counter(refused, as_double(c.refused[static_cast<size_t>(r)].load(std::memory_order_relaxed)),
                  {{"reason", to_string(r)}});
    add_gauge(family(out, "actorflow_shm_bytes",
                     "Shared memory the data plane maps for its clients now", MetricType::Gauge),
              static_cast<double>(plane->shm_bytes_mapped()));
  }
  const auto& caf_ops = caf_variable_ops();
  add_counter(ops, as_double(caf_ops.ops.load(std::memory_order_relaxed)), {{"transport", "caf"}});
  add_counter(bytes, as_double(caf_ops.bytes_received.load(std::memory_order_relaxed)),
              {{"direction", "received"}, {"transport", "caf"}});
  add_counter(bytes, as_double(caf_ops.bytes_sent.load(std::memory_order_relaxed)),
              {{"direction", "sent"}, {"transport", "caf"}});
}

void node_collector::report_skipped(families& out, std::vector<std::string> skipped) const {
  std::sort(skipped.begin(), skipped.end()); // the same parts, the same sentence
  add_gauge(family(out, "actorflow_scrape_incomplete",
                   "Parts of the node (executors, aggregators, the node's variables) that did "
                   "not answer this scrape within its budget; their figures are left out",
                   MetricType::Gauge),
            static_cast<double>(skipped.size()));
  auto& named = family(out, "actorflow_scrape_skipped",
                       "1 for each part of the node that did not answer this scrape in time",
                       MetricType::Gauge);
  std::string parts;
  for (const auto& p : skipped) {
    add_gauge(named, 1, {{"part", p}});
    parts += (parts.empty() ? "" : ", ") + p;
  }
  // Said once while the same parts hang, not at every scrape.
  std::lock_guard<std::mutex> guard{said_mtx_};
  if (parts == said_)
    return;
  if (parts.empty())
    log::get()->info("/metrics of {}: every part of the node answers the scrape again",
                     node_.address);
  else
    log::get()->warn("/metrics of {}: {} did not answer within the scrape's budget of {} ms; "
                     "the scrape leaves out their figures (actorflow_scrape_skipped) and is "
                     "said again only when what does not answer changes",
                     node_.address, parts, std::min(budget_ms_, timeout_ms_));
  said_ = parts;
}

void node_collector::collect_runtime(families& out, scrape_requests& rq) const {
  auto& latency = family(out, "actorflow_step_latency_seconds",
                         "Steps of registered graphs, run_step to reply, per executor",
                         MetricType::Histogram);
  auto& graphs = family(out, "actorflow_graphs", "Graphs registered on each executor now",
                        MetricType::Gauge);
  auto& steps = family(out, "actorflow_open_steps", "Steps open on each executor now",
                       MetricType::Gauge);
  if (node_.directory)
    for (const auto& [device, exec] : node_.directory->executors()) {
      if (auto h = step_latency_of(caf::actor_cast<caf::actor_addr>(exec), false))
        add_histogram(latency, h->read(), {{"executor", device}});
      rq.ask(
        exec, "executor " + device,
        [&graphs = graphs, &steps = steps, device = device](uint64_t g, uint64_t s) {
          add_gauge(graphs, as_double(g), {{"executor", device}});
          add_gauge(steps, as_double(s), {{"executor", device}});
        },
        info_atom::value);
    }
  rq.ask(
    node_.actor, "the node's variables",
    [&out = out](std::vector<variable_info>& vars) {
      uint64_t parked = 0;
      for (const auto& v : vars)
        parked += v.waiters;
      add_gauge(family(out, "actorflow_parked_waiters",
                       "Requests parked on the node's variables, waiting for their initialization",
                       MetricType::Gauge),
                as_double(parked));
    },
    list_atom::value);
}

void node_collector::collect_aggregators(families& out, scrape_requests& rq) const {
  auto& rounds = family(out, "actorflow_aggregator_rounds_total",
                        "Updates an aggregator applied to its variables (its global step)",
                        MetricType::Counter);
  auto& pushes = family(out, "actorflow_aggregator_pushes_total",
                        "Pushes an aggregator received, per worker", MetricType::Counter);
  auto& late = family(out, "actorflow_aggregator_late_pushes_total",
                      "sync: pushes that came after their step closed (dropped), per worker",
                      MetricType::Counter);
  auto& refused = family(out, "actorflow_aggregator_refused_pushes_total",
                         "Pushes refused (not finite, abstained), per worker",
                         MetricType::Counter);
  auto& stale = family(out, "actorflow_aggregator_stale_pushes_total",
                       "async, ssp: pushes applied with staleness > 0, per worker",
                       MetricType::Counter);
  auto& members = family(out, "actorflow_aggregator_active_workers",
                         "Members still pushing", MetricType::Gauge);
  if (!node_.directory)
    return;
  for (const auto& [name, agg] : node_.directory->aggregators()) {
    // The families by init-captured references: they live in `out` (a
    // deque), the answer comes after this function returned.
    rq.ask(
      agg, "aggregator " + name,
      [&rounds = rounds, &members = members, &pushes = pushes, &late = late,
       &refused = refused, &stale = stale, name = name](aggregator_stats& s) {
        add_counter(rounds, as_double(s.applied), {{"aggregator", name}});
        add_gauge(members, as_double(s.active), {{"aggregator", name}});
        for (const auto& w : s.workers) {
          labels l{{"aggregator", name}, {"worker", std::to_string(w.worker)}};
          add_counter(pushes, as_double(w.pushes), l);
          add_counter(late, as_double(w.late), l);
          add_counter(refused, as_double(w.refused), l);
          add_counter(stale, as_double(w.stale), l);
        }
      },
      stats_atom::value);
  }
}

} // namespace af
