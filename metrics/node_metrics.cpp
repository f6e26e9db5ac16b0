/// A node's /metrics and /healthz (metrics/node_metrics.hpp): prometheus-cpp's
/// Exposer serves /metrics from node_collector; /healthz is answered in
/// civetweb's begin_request callback, which the Exposer hands to its server.
#include "metrics/node_metrics.hpp"

#include <algorithm>
#include <CivetServer.h>
#include <civetweb.h>

#include <prometheus/exposer.h>

#include <netdb.h>
#include <sys/socket.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "core/log.hpp"
#include "messages/error.hpp"
#include "metrics/node_collector.hpp"
#include "metrics/thread_stack.hpp"
#include "net/data_plane.hpp"

namespace af {

/// What /healthz reads: set from the node's end (attach_functor) and from
/// shutting_down(), read by civetweb's threads.
struct metrics_health {
  std::mutex mtx;
  std::string stopping; ///< why it stops; "" while it serves
  std::shared_ptr<data_plane_server> plane;

  /// 200 "ok", or 503 and why not.
  std::pair<int, std::string> check() {
    {
      std::lock_guard<std::mutex> guard{mtx};
      if (!stopping.empty())
        return {503, "shutting down: " + stopping};
    }
    if (plane) {
      const auto& c = plane->counters();
      auto open = c.open.load(std::memory_order_relaxed);
      auto most = plane->limits().max_connections;
      if (open >= most)
        return {503, fmt::format("refusing work: the data plane serves {} connections, the most "
                                 "it may ([node] max_data_connections = {}); new ones are refused",
                                 open, most)};
    }
    return {200, "ok"};
  }
};

class node_metrics_server {
public:
  std::shared_ptr<metrics_health> health = std::make_shared<metrics_health>();
  std::shared_ptr<node_collector> collector;
  std::unique_ptr<prometheus::Exposer> exposer;
  uint16_t port = 0;
};

namespace {

/// The servers of this process by port: civetweb's callback has no user data
/// of its own (the Exposer's CivetServer takes it), only the port it came on.
std::mutex& servers_mutex() {
  static std::mutex m;
  return m;
}

std::map<int, std::shared_ptr<metrics_health>>& servers() {
  static std::map<int, std::shared_ptr<metrics_health>> m;
  return m;
}

/// civetweb's begin_request: answers /healthz; 0 leaves every other request
/// (/metrics) to the Exposer's handlers.
int answer_health(mg_connection* conn) {
  const mg_request_info* req = mg_get_request_info(conn);
  if (req == nullptr || req->local_uri == nullptr || std::strcmp(req->local_uri, "/healthz") != 0)
    return 0;
  std::shared_ptr<metrics_health> health;
  {
    std::lock_guard<std::mutex> guard{servers_mutex()};
    auto it = servers().find(req->server_port);
    if (it != servers().end())
      health = it->second;
  }
  // A probe asks with GET, or HEAD for the status alone: HEAD's answer has
  // no body (a client that keeps the connection would read the body as
  // its next answer); a method that asks to change something is refused.
  const char* method = req->request_method != nullptr ? req->request_method : "";
  bool head = std::strcmp(method, "HEAD") == 0;
  if (!head && std::strcmp(method, "GET") != 0) {
    mg_printf(conn, "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Type: "
                    "text/plain; charset=utf-8\r\nContent-Length: 27\r\nConnection: "
                    "close\r\n\r\n/healthz takes GET or HEAD\n");
    return 405;
  }
  auto [code, text] = health ? health->check() : std::pair<int, std::string>{503, "not serving"};
  text += "\n";
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: "
            "%zu\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n%s",
            code, code == 200 ? "OK" : "Service Unavailable", text.size(),
            head ? "" : text.c_str());
  return code;
}

/// civetweb's listening address for `host`: an IPv4 host (a name, or "127.1")
/// as the dotted quad it resolves to, which every civetweb parses; an IPv6
/// literal in brackets. "" if it names no address civetweb can serve.
std::string listening_host(const std::string& host) {
  if (host.find(':') != std::string::npos)
    return host.front() == '[' ? host : "[" + host + "]";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr)
    return "";
  char text[INET_ADDRSTRLEN] = {};
  auto* in = reinterpret_cast<sockaddr_in*>(found->ai_addr);
  bool ok = ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr;
  ::freeaddrinfo(found);
  return ok ? std::string{text} : std::string{};
}

} // namespace

bool metrics_serve_ipv6() {
  return mg_check_feature(8) != 0; // 8: IPv6 (civetweb.h)
}

node_metrics::~node_metrics() {
  if (!impl_)
    return;
  {
    std::lock_guard<std::mutex> guard{servers_mutex()};
    servers().erase(impl_->port);
  }
  impl_->exposer.reset(); // joins civetweb's threads: no scrape runs after this
}

uint16_t node_metrics::port() const {
  return impl_->port;
}

void node_metrics::shutting_down(const std::string& why) {
  std::lock_guard<std::mutex> guard{impl_->health->mtx};
  if (impl_->health->stopping.empty())
    impl_->health->stopping = why.empty() ? "asked to" : why;
}

namespace {

/// A library's message without its closing full stop, for the middle of ours.
std::string trimmed_reason(std::string why) {
  while (!why.empty() && (why.back() == '.' || why.back() == ' '))
    why.pop_back();
  return why;
}

} // namespace

caf::error check_metrics_options(const node_options& opts, const security_options& sec,
                                const std::string& name) {
  if (opts.metrics_port <= 0 || opts.metrics_port > 65535)
    return make_error(af_error::invalid_config,
                      fmt::format("{}: [node] metrics_port = {} is not a port to serve /metrics "
                                  "on: pass 1..65535 (0 serves none)",
                                  name, opts.metrics_port));
  const auto& host = opts.metrics_bind;
  // An address with its port or in brackets is no host: said so, rather
  // than "not a loopback address" (the port is metrics_port's).
  auto colons = std::count(host.begin(), host.end(), ':');
  if (host.empty() || host.front() == '[' || colons == 1)
    return make_error(af_error::invalid_config,
                      fmt::format("{}: [node] metrics_bind = \"{}\" is not a host name or address: "
                                  "give it without brackets or a port (the port is "
                                  "metrics_port), as \"127.0.0.1\" or \"::1\"",
                                  name, host));
  if (!is_loopback_host(host) && !sec.metrics_public && !sec.insecure)
    return make_error(af_error::invalid_config,
                      fmt::format("{}: [node] metrics_bind = \"{}\" is not a loopback address, and "
                                  "/metrics and /healthz are plain HTTP without authentication: "
                                  "set [security] metrics_public = true to serve them there, or "
                                  "bind 127.0.0.1 and scrape through a proxy",
                                  name, host));
  if (host.find(':') != std::string::npos && !metrics_serve_ipv6())
    return make_error(af_error::invalid_config,
                      fmt::format("{}: [node] metrics_bind = \"{}\" is an IPv6 address, and this "
                                  "system's civetweb (the HTTP server of /metrics) serves IPv4 "
                                  "only: bind 127.0.0.1 or another IPv4 address",
                                  name, host));
  return caf::none;
}

std::string metrics_exposure_warning(const node_options& opts, const security_options& sec,
                                     const std::string& name) {
  const auto& host = opts.metrics_bind;
  if (is_loopback_host(host))
    return {};
  return fmt::format("{}: /metrics and /healthz listen on {} port {} ([node] metrics_bind = "
                     "\"{}\", allowed by [security] {}): plain HTTP without authentication, so "
                     "anyone who can reach that port reads this node's metrics (its variables' "
                     "traffic, its workers, its aggregators) and its health; keep the port behind "
                     "a firewall, or bind 127.0.0.1 and scrape through a proxy",
                     name, host, opts.metrics_port, host,
                     sec.metrics_public ? "metrics_public = true" : "insecure = true");
}

caf::expected<std::unique_ptr<node_metrics>>
start_node_metrics(caf::actor_system& sys, const running_node& node, const std::string& name,
                   const node_options& opts, const security_options& sec) {
  if (auto err = check_metrics_options(opts, sec, name))
    return err;
  const auto& host = opts.metrics_bind;
  auto listen_host = listening_host(host);
  if (listen_host.empty())
    return make_error(af_error::invalid_config,
                      fmt::format("{}: [node] metrics_bind = \"{}\" does not resolve to an IPv4 "
                                  "address to serve /metrics on",
                                  name, host));
  auto where = listen_host + ":" + std::to_string(opts.metrics_port);
  std::unique_ptr<node_metrics> out{new node_metrics};
  out->impl_ = std::make_unique<node_metrics_server>();
  auto& impl = *out->impl_;
  impl.health->plane = node.data_plane;
  impl.collector = std::make_shared<node_collector>(sys, node, opts.request_timeout_ms,
                                                    metrics_scrape_budget_ms);
  static const CivetCallbacks callbacks = [] {
    CivetCallbacks c; // all null
    c.begin_request = answer_health;
    return c;
  }();
  // civetweb's threads must have room for the process's TLS (metrics/thread_stack.hpp).
  if (!metrics_thread_stack_active())
    return make_error(af_error::internal,
                      fmt::format("{}: cannot serve /metrics: civetweb's threads would get its "
                                  "100 KiB stacks, too small beside this process's TLS "
                                  "(metrics/thread_stack.hpp); link actorflow_metrics into the "
                                  "executable",
                                  name));
  {
    // Registered before the server starts: its first /healthz finds it.
    std::lock_guard<std::mutex> guard{servers_mutex()};
    if (servers().count(opts.metrics_port) > 0)
      return make_error(af_error::bind_failed,
                        fmt::format("{}: [node] metrics_port = {} is taken by another node of this "
                                    "process; give each node its own",
                                    name, opts.metrics_port));
    servers()[opts.metrics_port] = impl.health;
  }
  try {
    // civetweb serves one connection per thread, and a connection that sends
    // no request holds its thread for request_timeout_ms (civetweb's default:
    // 30 s): two idle connections kept /healthz from answering a probe for
    // that long. Four threads and 5 s bound what a slow or idle client holds;
    // a scraper sends its request at once.
    impl.exposer = std::make_unique<prometheus::Exposer>(
      std::vector<std::string>{"listening_ports", where, "num_threads",
                               std::to_string(metrics_server_threads), "request_timeout_ms",
                               std::to_string(metrics_request_timeout_ms)},
      &callbacks);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> guard{servers_mutex()};
    servers().erase(opts.metrics_port);
    return make_error(af_error::bind_failed,
                      fmt::format("{}: cannot serve /metrics on {} ([node] metrics_port = {}, "
                                  "metrics_bind = \"{}\"): {}; is another process using the "
                                  "port? Pick another metrics_port",
                                  name, where, opts.metrics_port, host,
                                  trimmed_reason(e.what())));
  }
  impl.port = static_cast<uint16_t>(opts.metrics_port);
  impl.exposer->RegisterCollectable(impl.collector);
  // A node that ends (a failure, a shutdown request) says so at once.
  caf::actor_cast<caf::abstract_actor*>(node.actor)
    ->attach_functor([health = impl.health](const caf::error& reason) {
      std::lock_guard<std::mutex> guard{health->mtx};
      if (health->stopping.empty())
        health->stopping = "the node stopped (" + caf::to_string(reason) + ")";
    });
  log::get()->info("{}: /metrics and /healthz on http://{}", name, where);
  if (auto open = metrics_exposure_warning(opts, sec, name); !open.empty())
    log::get()->warn("{}", open);
  return out;
}

} // namespace af
