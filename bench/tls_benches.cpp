// actorflow-bench's TLS metrics (issue 11) and the event-loop prototype
// (docs/wire.md): a forked process serves the data plane with and without
// TLS, this process is its client.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include <asio.hpp>
#include <openssl/opensslv.h>

#include "actors/variable.hpp"
#include "bench/bench_util.hpp"
#include "bench/benches.hpp"
#include "net/aes_gcm.hpp"
#include "net/data_plane.hpp"
#include "net/tls.hpp"

namespace af::bench {

namespace {

// -- the event loop question (docs/wire.md): an Asio prototype ---------------
//
// The same frames served by one thread running an asio::io_context instead
// of one thread per connection: variable ops only (read, assign, assign_add,
// assign_sub), no TLS, no aggregators, no limits, no timeouts. Enough to
// measure what an event loop costs or saves against today's server.

class asio_conn : public std::enable_shared_from_this<asio_conn> {
public:
  asio_conn(asio::ip::tcp::socket sock, std::shared_ptr<af::variable_directory> dir)
    : sock_(std::move(sock)), dir_(std::move(dir)) {
    sock_.set_option(asio::ip::tcp::no_delay(true));
  }
  void start() { read_header(); }

private:
  void read_header() {
    asio::async_read(sock_, asio::buffer(&h_, sizeof(h_)),
                     [self = shared_from_this()](std::error_code ec, size_t) {
                       if (!ec)
                         self->on_header();
                     });
  }
  void on_header() {
    if (!af::wire::validate(h_).empty() || !af::valid_var_op(h_.kind))
      return; // the prototype just hangs up
    name_.resize(h_.name_len);
    asio::async_read(sock_, asio::buffer(name_), [self = shared_from_this()](std::error_code ec, size_t) {
      if (!ec)
        self->on_name();
    });
  }
  void on_name() {
    cell_ = dir_->get(name_).cell;
    if (!cell_)
      return;
    operand_ = af::tensor{};
    if (!h_.has_tensor || h_.payload_bytes == 0)
      return apply();
    operand_.reset(static_cast<af::dtype>(h_.dtype), af::wire::shape_of(h_));
    asio::async_read(sock_, asio::buffer(operand_.mutable_bytes(), h_.payload_bytes),
                     [self = shared_from_this()](std::error_code ec, size_t) {
                       if (!ec)
                         self->apply();
                     });
  }
  void apply() {
    auto r = cell_->apply(static_cast<af::var_op>(h_.kind), operand_, h_.want_value != 0);
    if (!r)
      return;
    reply_ = af::wire::header{};
    reply_.kind = static_cast<uint8_t>(af::wire::kind::reply);
    reply_.version = r->version;
    value_ = std::move(r->value);
    std::vector<asio::const_buffer> out{asio::buffer(&reply_, sizeof(reply_))};
    if (!value_.empty() && af::wire::describe_tensor(value_, reply_))
      out.push_back(asio::buffer(value_.bytes(), value_.nbytes()));
    asio::async_write(sock_, out, [self = shared_from_this()](std::error_code ec, size_t) {
      if (!ec)
        self->read_header();
    });
  }

  asio::ip::tcp::socket sock_;
  std::shared_ptr<af::variable_directory> dir_;
  af::wire::header h_;
  std::string name_;
  std::shared_ptr<af::variable_cell> cell_;
  af::tensor operand_;
  af::wire::header reply_;
  af::tensor value_;
};

struct asio_server {
  asio::io_context io{1};
  asio::ip::tcp::acceptor acceptor{io, {asio::ip::make_address("127.0.0.1"), 0}};
  std::shared_ptr<af::variable_directory> dir;
  std::thread thread;

  explicit asio_server(std::shared_ptr<af::variable_directory> d) : dir(std::move(d)) {
    accept();
    thread = std::thread{[this] { io.run(); }};
  }
  ~asio_server() {
    io.stop();
    thread.join();
  }
  uint16_t port() const { return acceptor.local_endpoint().port(); }
  void accept() {
    acceptor.async_accept([this](std::error_code ec, asio::ip::tcp::socket sock) {
      if (!ec)
        std::make_shared<asio_conn>(std::move(sock), dir)->start();
      accept();
    });
  }
};

// -- the data plane with and without TLS (issue 11) ----------------------------
//
// A forked process serves one plaintext and one TLS data plane (the same
// variables); this process is the client. Each figure is TLS against the
// same op without TLS, measured alternately in the same run.

/// A CA and one certificate for both ends, made with the openssl command line
/// in a fresh folder; empty if that failed.
std::string make_bench_certs() {
  char tmpl[] = "/tmp/actorflow-bench-certs-XXXXXX";
  if (mkdtemp(tmpl) == nullptr)
    return {};
  std::string d = tmpl;
  auto run = [](const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; };
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
  if (!run("openssl req -x509" + ec + "-keyout " + d + "/ca.key -out " + d + "/ca.pem -days 2 -subj /CN=bench-ca")
      || !run("openssl req" + ec + "-keyout " + d + "/node.key -out " + d
              + "/node.csr -subj /CN=node -addext subjectAltName=IP:127.0.0.1")
      // The data plane checks that the node's certificate names the host dialled.
      || !run("openssl x509 -req -in " + d + "/node.csr -CA " + d + "/ca.pem -CAkey " + d
              + "/ca.key -CAcreateserial -copy_extensions copy -out " + d + "/node.pem -days 2"))
    return {};
  return d;
}
using channel = caf::expected<std::unique_ptr<af::data_channel>>;

/// The forked server: one plaintext and one TLS data plane (and the Asio
/// prototype if `event_loop`) over the same variables; writes their ports
/// to `ports_w` and serves until `stop_r` closes.
[[noreturn]] void serve_tls_bench(const af::security_options& sec, bool event_loop, int ports_w,
                                  int stop_r) {
  const int64_t n = 16 << 20; // 64 MiB of float32
  auto tls = af::make_tls_context(sec, "bench node");
  if (!tls)
    _exit(3);
  auto d = std::make_shared<af::variable_directory>();
  auto spec_big = af::variable_spec{"big", af::dtype::float32, {n}, "/job:ps/replica:0/task:0/device:CPU:0"};
  auto spec_counter = af::variable_spec{"counter", af::dtype::float32, {}, "/job:ps/replica:0/task:0/device:CPU:0"};
  auto big = std::make_shared<af::variable_cell>(spec_big);
  auto counter = std::make_shared<af::variable_cell>(spec_counter);
  if (!big->initialize(af::initializer::zeros(), false, "")
      || !counter->initialize(af::initializer::zeros(), false, ""))
    _exit(4);
  d->put("big", {af::variable_cell_actor{}, big});
  d->put("counter", {af::variable_cell_actor{}, counter});
  auto plain = af::data_plane_server::start(d, "127.0.0.1", 0, "bench node", {});
  auto secure = af::data_plane_server::start(d, "127.0.0.1", 0, "bench node", {}, *tls);
  if (!plain || !secure)
    _exit(5);
  std::unique_ptr<asio_server> loop;
  if (event_loop)
    loop = std::make_unique<asio_server>(d);
  uint16_t p[3] = {(*plain)->port(), (*secure)->port(), loop ? loop->port() : uint16_t{0}};
  if (write(ports_w, p, sizeof(p)) != sizeof(p))
    _exit(6);
  char byte;
  while (read(stop_r, &byte, 1) > 0) {
  } // until the parent closes its end
  (*plain)->stop();
  (*secure)->stop();
  _exit(0);
}

void remote_assign_add_rtt_tls(channel& secure, channel& plain, int rounds) {
  auto one = af::tensor::scalar(1);
  std::vector<double> ours, base;
  const int block = 100, blocks = std::max(1, rounds / block) + 1; // the first: warm-up
  for (int b = 0; b < blocks; ++b)
    for (auto* ch : {secure->get(), plain->get()})
      for (int i = 0; i < block; ++i) {
        auto t0 = clock_type::now();
        call(*ch, af::var_op::assign_add, "counter", &one);
        auto us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
        if (b > 0)
          (ch == secure->get() ? ours : base).push_back(us);
      }
  report("remote_assign_add_rtt_tls", median(ours), median(base), "us");
}

/// `child`: the server process, whose CPU time is reported beside ours.
void tensor_64mib_assign_tls(channel& secure, channel& plain, pid_t child, int reps) {
  const int64_t n = 16 << 20; // 64 MiB of float32
  auto value = af::tensor::filled(af::dtype::float32, {n}, 1);
  auto mbps = [&](af::data_channel& ch) {
    auto t0 = clock_type::now();
    call(ch, af::var_op::assign, "big", &value);
    return value.nbytes() / 1e6 / std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  // CPU time of both processes (client: this one; server: the child), so
  // that on a busy machine the cost can be told from the waiting.
  auto client_ms = [] {
    rusage self{};
    getrusage(RUSAGE_SELF, &self);
    auto tv_ms = [](const timeval& tv) { return tv.tv_sec * 1e3 + tv.tv_usec / 1e3; };
    return tv_ms(self.ru_utime) + tv_ms(self.ru_stime);
  };
  auto cpu_ms = [&] {
    double ms = client_ms();
    std::ifstream stat{"/proc/" + std::to_string(child) + "/stat"};
    std::string line;
    std::getline(stat, line);
    auto close_paren = line.rfind(')');
    std::istringstream fields{close_paren == std::string::npos ? "" : line.substr(close_paren + 2)};
    std::string field;
    double ticks = 0;
    for (int i = 3; fields >> field; ++i)
      if (i == 14 || i == 15)
        ticks += std::stod(field);
    return ms + ticks * 1e3 / static_cast<double>(sysconf(_SC_CLK_TCK));
  };
  mbps(**secure); // warm both ends
  mbps(**plain);
  std::vector<double> ours, base;
  double cpu_tls = 0, cpu_plain = 0, client_tls = 0, client_plain = 0;
  for (int i = 0; i < reps; ++i) {
    auto c0 = cpu_ms(), s0 = client_ms();
    ours.push_back(mbps(**secure));
    auto c1 = cpu_ms(), s1 = client_ms();
    base.push_back(mbps(**plain));
    auto c2 = cpu_ms(), s2 = client_ms();
    cpu_tls += c1 - c0;
    cpu_plain += c2 - c1;
    client_tls += s1 - s0;
    client_plain += s2 - s1;
  }
  // The wall time next to the CPU time says how much the two ends overlap
  // (on 2 cores, wall = CPU / 2 at best).
  std::printf("# tensor_64mib_assign_tls: CPU per assign, client + server: TLS %.0f + %.0f ms "
              "(wall %.0f ms), plaintext %.0f + %.0f ms (wall %.0f ms); CPU ratio %.2f\n",
              client_tls / reps, (cpu_tls - client_tls) / reps, value.nbytes() / 1e3 / median(ours),
              client_plain / reps, (cpu_plain - client_plain) / reps,
              value.nbytes() / 1e3 / median(base), cpu_plain / std::max(cpu_tls, 1e-9));
  report("tensor_64mib_assign_tls", median(ours), median(base), "MB/s");
}

/// Today's server against the Asio prototype on `p[2]`; non-zero: failed.
int event_loop_benches(channel& plain, const uint16_t* p, std::chrono::microseconds poll, int rounds,
                       int reps) {
  const int64_t n = 16 << 20; // 64 MiB of float32
  // Today's server (a thread per connection) against the Asio prototype
  // (one io_context thread), the same frames and client. ours = Asio.
  auto loop = af::data_channel::connect("127.0.0.1", p[2], "bench node (asio)",
                                        std::chrono::seconds(60), poll, nullptr, nullptr, false);
  if (!loop) {
    std::cerr << "actorflow-bench: " << af::describe(loop.error()) << std::endl;
    return 1;
  }
  auto one = af::tensor::scalar(1);
  std::vector<double> ours, base;
  const int block = 100, blocks = std::max(1, rounds / block) + 1;
  for (int b = 0; b < blocks; ++b)
    for (auto* ch : {loop->get(), plain->get()})
      for (int i = 0; i < block; ++i) {
        auto t0 = clock_type::now();
        call(*ch, af::var_op::assign_add, "counter", &one);
        auto us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
        if (b > 0)
          (ch == loop->get() ? ours : base).push_back(us);
      }
  report("event_loop_assign_add_rtt", median(ours), median(base), "us");
  auto value = af::tensor::filled(af::dtype::float32, {n}, 1);
  auto mbps = [&](af::data_channel& ch) {
    auto t0 = clock_type::now();
    call(ch, af::var_op::assign, "big", &value);
    return value.nbytes() / 1e6 / std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  mbps(**loop);
  mbps(**plain);
  std::vector<double> ours_w, base_w;
  for (int i = 0; i < reps; ++i) {
    ours_w.push_back(mbps(**loop));
    base_w.push_back(mbps(**plain));
  }
  report("event_loop_64mib_assign", median(ours_w), median(base_w), "MB/s");
  // Many clients at once: 8 connections, each a closed loop of round trips
  // from its own thread; the figure is the total op rate.
  auto rate = [&](uint16_t port) {
    std::vector<std::unique_ptr<af::data_channel>> chans;
    for (int i = 0; i < 8; ++i)
      chans.push_back(std::move(*af::data_channel::connect("127.0.0.1", port, "bench node",
                                                             std::chrono::seconds(60), poll,
                                                             nullptr, nullptr, false)));
    std::atomic<long> ops{0};
    auto until = clock_type::now() + std::chrono::milliseconds(1000);
    std::vector<std::thread> ts;
    for (auto& c : chans)
      ts.emplace_back([&, ch = c.get()] {
        while (clock_type::now() < until) {
          call(*ch, af::var_op::assign_add, "counter", &one);
          ++ops;
        }
      });
    for (auto& t : ts)
      t.join();
    return ops.load() / 1.0;
  };
  std::vector<double> ours_r, base_r;
  for (int i = 0; i < 3; ++i) {
    ours_r.push_back(rate(p[2]));
    base_r.push_back(rate(p[0]));
  }
  report("event_loop_8_clients_ops", median(ours_r), median(base_r), "ops/s");
  loop->reset();
  return 0;
}

} // namespace


int tls_benches(const std::function<bool(const std::string&)>& wanted, int rounds, int reps,
                int poll_us) {
  bool event_loop = wanted("event_loop_prototype");
  auto dir = make_bench_certs();
  if (dir.empty()) {
    std::printf("# tls benches skipped: the openssl command line could not make certificates\n");
    return 0;
  }
  af::security_options sec;
  sec.ca_file = dir + "/ca.pem";
  sec.cert_file = dir + "/node.pem";
  sec.key_file = dir + "/node.key";
  int ports[2];
  if (pipe(ports) != 0)
    return 1;
  int stop[2];
  if (pipe(stop) != 0)
    return 1;
  pid_t child = fork();
  if (child == 0) {
    close(ports[0]);
    close(stop[1]);
    serve_tls_bench(sec, event_loop, ports[1], stop[0]);
  }
  close(ports[1]);
  close(stop[0]);
  uint16_t p[3] = {0, 0, 0};
  bool up = read(ports[0], p, sizeof(p)) == sizeof(p);
  close(ports[0]);
  auto finish = [&](int rc) {
    close(stop[1]);
    int status = 0;
    waitpid(child, &status, 0);
    std::filesystem::remove_all(dir);
    return rc;
  };
  if (!up) {
    std::cerr << "actorflow-bench: the TLS bench's server did not start" << std::endl;
    return finish(1);
  }
  auto tls = af::make_tls_context(sec, "bench client");
  if (!tls) {
    std::cerr << "actorflow-bench: " << af::describe(tls.error()) << std::endl;
    return finish(1);
  }
  auto poll = std::chrono::microseconds{poll_us};
  // TCP, not shared memory (this host's default), for the plaintext baseline:
  // TLS connections never take shared memory, and the event-loop figures
  // compare TCP servers.
  auto plain = af::data_channel::connect("127.0.0.1", p[0], "bench node (plaintext)",
                                         std::chrono::seconds(60), poll, nullptr, nullptr, false);
  auto secure = af::data_channel::connect("127.0.0.1", p[1], "bench node (TLS)",
                                          std::chrono::seconds(60), poll, *tls);
  if (!plain || !secure) {
    std::cerr << "actorflow-bench: " << af::describe(!plain ? plain.error() : secure.error()) << std::endl;
    return finish(1);
  }
  std::printf("# tls: client and data-plane server in separate processes on loopback; %s (%s); "
              "records' AES-128-GCM by %s (ACTORFLOW_AES_GCM=openssl for OpenSSL's); the same op "
              "without TLS is the baseline\n",
              (*secure)->tls_description().c_str(), OPENSSL_VERSION_TEXT,
              af::aes_gcm::describe(af::aes_gcm::best()).c_str());
  if (wanted("remote_assign_add_rtt_tls"))
    remote_assign_add_rtt_tls(secure, plain, rounds);
  if (wanted("tensor_64mib_assign_tls"))
    tensor_64mib_assign_tls(secure, plain, child, reps);
  if (event_loop)
    if (int rc = event_loop_benches(plain, p, poll, rounds, reps))
      return finish(rc);
  plain->reset();
  secure->reset();
  return finish(0);
}

} // namespace af::bench
