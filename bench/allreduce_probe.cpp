// Measures one all-reduce of a float buffer (4 MiB by default) between two
// processes on loopback, against the raw-TCP exchange of the same bytes, for
// our ring (dist/allreduce.hpp) and for Gloo's chunked ring and its
// newer ring (libgloo-dev), both with rendezvous through our kv store.
// The figures in docs/training.md come from it. Not installed, no CMake
// target (so that the library does not need Gloo); build it against a build
// folder's libraries:
//
//   B=build-allreduce
//   g++ -O3 -std=c++17 -I. bench/allreduce_probe.cpp -o $B/allreduce-probe  (continued)
//     $B/libactorflow_dist.a $B/libactorflow_runtime.a $B/libactorflow_net.a  (continued)
//     $B/libactorflow_config.a $B/libactorflow_messages.a $B/libactorflow_train.a  (continued)
//     $B/libactorflow_graph.a $B/libactorflow_kernels.a $B/libactorflow_core.a  (continued)
//     -lgloo -lcaf_openssl -lcaf_io -lcaf_core -lssl -lcrypto -lspdlog -lfmt -lopenblas -lz  (continued)
//     -lpthread   (and -lIPSec_MB -lucp -lucs when the build found them)
//   $B/allreduce-probe [--floats N] [--reps R]
//
// With no --rank it starts rank 0 (which hosts the store) and rank 1 as child
// processes and waits for them. Our ring runs with ACTORFLOW_DATA_SHM=off, on
// TCP as the others. Each repetition runs every method once, in
// turn, after a one-byte barrier; rank 0 prints the medians.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "caf/all.hpp"
#include "caf/io/all.hpp"

#include "dist/allreduce.hpp"
#include "actors/kv_store.hpp"
#include "actors/system.hpp"
#include "core/child_process.hpp"
#include "net/socket.hpp"
#include "messages/error.hpp"

using namespace af;
using clock_type = std::chrono::steady_clock;

namespace {

/// Gloo's rendezvous store over our kv store.
class kv_gloo_store : public gloo::rendezvous::Store {
public:
  kv_gloo_store(kv_client& kv, std::chrono::milliseconds timeout) : kv_(kv), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    if (auto err = kv_.put(key, std::string(data.begin(), data.end())))
      throw gloo::IoException(describe(err));
  }

  std::vector<char> get(const std::string& key) override {
    auto v = kv_.get(key, timeout_);
    if (!v)
      throw gloo::IoException(describe(v.error()));
    return std::vector<char>(v->begin(), v->end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, timeout_);
  }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    auto deadline = clock_type::now() + timeout;
    for (auto& key : keys) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
      auto v = kv_.get(key, std::max(left, std::chrono::milliseconds{0}));
      if (!v)
        throw gloo::IoException(describe(v.error()));
    }
  }

private:
  kv_client& kv_;
  std::chrono::milliseconds timeout_;
};

void tune(int fd) {
  sock::set_nodelay(fd);
  sock::set_buffers(fd, 4 * 1024 * 1024);
}

[[noreturn]] void die(const std::string& what) {
  std::cerr << "allreduce-probe: " << what << "\n";
  std::exit(1);
}

/// The baseline: send all of `out` and receive all of `in` at once over one
/// socket, as fast as the kernel takes them.
void exchange(int fd, const char* out, char* in, size_t bytes) {
  size_t sent = 0;
  size_t got = 0;
  constexpr size_t slice = 256 * 1024;
  while (sent < bytes || got < bytes) {
    bool moved = false;
    if (got < bytes) {
      auto r = ::recv(fd, in + got, std::min(bytes - got, slice), MSG_DONTWAIT);
      if (r == 0)
        die("raw peer closed");
      if (r > 0) {
        got += static_cast<size_t>(r);
        moved = true;
      }
    }
    if (sent < bytes) {
      auto r = ::send(fd, out + sent, std::min(bytes - sent, slice), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (r > 0) {
        sent += static_cast<size_t>(r);
        moved = true;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        die(std::string{"raw send: "} + std::strerror(errno));
      }
    }
    if (!moved) {
      pollfd pfd{fd, static_cast<short>((got < bytes ? POLLIN : 0) | (sent < bytes ? POLLOUT : 0)), 0};
      ::poll(&pfd, 1, 10000);
    }
  }
}

void barrier(int fd) {
  char byte = 1;
  char in = 0;
  exchange(fd, &byte, &in, 1);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string cpu_model() {
  std::ifstream in{"/proc/cpuinfo"};
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0)
      return line.substr(line.find(':') + 2);
  return "unknown";
}

int run_rank(int rank, uint16_t store_port, int port_fd, size_t floats, int reps) {
  system_config cfg;
  auto sys_owner = af::start_actor_system(cfg);
  caf::actor_system& sys = *sys_owner;
  kv_store_actor store;
  if (rank == 0) {
    store = spawn_kv_store(sys);
    auto port = sys.middleman().publish(store, 0, "127.0.0.1");
    if (!port)
      die("publish: " + sys.render(port.error()));
    auto text = std::to_string(*port) + "\n";
    if (::write(port_fd, text.data(), text.size()) < 0)
      die("cannot hand the store's port on");
    close(port_fd);
  } else {
    auto remote = caf::io::remote_actor<kv_store_actor>(sys, "127.0.0.1", store_port);
    if (!remote)
      die("remote store: " + sys.render(remote.error()));
    store = *remote;
  }
  int result = 0;
  {
    kv_client kv{sys, store};
    const std::chrono::milliseconds timeout{30000};
    const size_t bytes = floats * sizeof(float);
    // The raw socket: the baseline, and the barrier between methods.
    int raw = -1;
    if (rank == 0) {
      int lfd = socket(AF_INET, SOCK_STREAM, 0);
      tune(lfd);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t len = sizeof(addr);
      if (bind(lfd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(lfd, 1) != 0)
        die("raw listen");
      getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
      if (auto err = kv.put("probe/raw", std::to_string(ntohs(addr.sin_port))))
        die(describe(err));
      raw = accept(lfd, nullptr, nullptr);
      close(lfd);
    } else {
      auto port = kv.get("probe/raw", timeout);
      if (!port)
        die(describe(port.error()));
      raw = socket(AF_INET, SOCK_STREAM, 0);
      tune(raw);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(std::stoi(*port)));
      if (connect(raw, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
        die("raw connect");
    }
    tune(raw);
    auto ring = allreduce_group::create(static_cast<uint32_t>(rank), 2, "probe/ring", kv, timeout);
    if (!ring)
      die(describe(ring.error()));
    kv_gloo_store gloo_store{kv, timeout};
    gloo::rendezvous::PrefixStore prefixed{"probe/gloo", gloo_store};
    auto device = gloo::transport::tcp::CreateDevice("127.0.0.1");
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, 2);
    context->setTimeout(timeout);
    context->connectFullMesh(prefixed, device);

    std::vector<float> data(floats);
    std::vector<float> peer(floats);
    auto fill = [&] {
      for (size_t i = 0; i < floats; ++i)
        data[i] = static_cast<float>(i % 1000) * 0.001f + static_cast<float>(rank);
    };
    fill();
    gloo::AllreduceRingChunked<float> chunked{context, {data.data()}, static_cast<int>(floats)};
    auto halve = [&] {
      for (auto& x : data)
        x /= 2.0f;
    };
    struct method {
      const char* name;
      std::function<void()> run;
      std::vector<double> ms;
    };
    std::vector<method> methods{
      {"raw TCP exchange (baseline)",
       [&] { exchange(raw, reinterpret_cast<const char*>(data.data()),
                      reinterpret_cast<char*>(peer.data()), bytes); },
       {}},
      {"actorflow ring allreduce_mean",
       [&] {
         if (auto err = (*ring)->allreduce_mean(data.data(), floats))
           die(describe(err));
       },
       {}},
      {"gloo AllreduceRingChunked + /2",
       [&] {
         chunked.run();
         halve();
       },
       {}},
      {"gloo::allreduce RING + /2",
       [&] {
         gloo::AllreduceOptions opts{context};
         opts.setOutput(data.data(), floats);
         opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
         opts.setReduceFunction(
           static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
         gloo::allreduce(opts);
         halve();
       },
       {}},
    };
    const int warmup = 5;
    for (int rep = 0; rep < warmup + reps; ++rep)
      for (auto& m : methods) {
        fill();
        barrier(raw);
        auto start = clock_type::now();
        m.run();
        auto ms = std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
        if (rep >= warmup)
          m.ms.push_back(ms);
      }
    barrier(raw);
    if (rank == 0) {
      auto base = median(methods[0].ms);
      std::printf("cpu: %s, %u cpus\n", cpu_model().c_str(), std::thread::hardware_concurrency());
      std::printf("%zu floats (%.2f MiB) per rank, 2 processes on loopback, %d reps (median)\n",
                  floats, bytes / 1048576.0, reps);
      for (auto& m : methods) {
        auto med = median(m.ms);
        std::printf("  %-34s %8.3f ms  %6.2f GB/s  ratio vs raw %.2f\n", m.name, med,
                    bytes / med / 1e6, base / med);
      }
    }
    close(raw);
  }
  caf::anon_send_exit(store, caf::exit_reason::user_shutdown);
  return result;
}

} // namespace

int main(int argc, char** argv) {
  // Every method here is TCP: our ring too, which would otherwise take
  // shared memory between these two processes of one host (the bench's
  // allreduce_4mib_2w_shm measures that).
  setenv("ACTORFLOW_DATA_SHM", "off", 1);
  int rank = -1;
  uint16_t store_port = 0;
  int port_fd = -1;
  size_t floats = 1u << 20; // 4 MiB
  int reps = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string opt = argv[i];
    std::string val = argv[i + 1];
    if (opt == "--rank")
      rank = std::stoi(val);
    else if (opt == "--store-port")
      store_port = static_cast<uint16_t>(std::stoi(val));
    else if (opt == "--port-fd")
      port_fd = std::stoi(val);
    else if (opt == "--floats")
      floats = std::stoul(val);
    else if (opt == "--reps")
      reps = std::stoi(val);
    else
      die("unknown option " + opt);
  }
  if (rank >= 0) {
    try {
      return run_rank(rank, store_port, port_fd, floats, reps);
    } catch (const std::exception& e) {
      die(std::string{"rank "} + std::to_string(rank) + ": " + e.what());
    }
  }
  // The launcher: rank 0 tells us its store's port through a pipe.
  int fds[2];
  if (pipe(fds) != 0)
    die("pipe");
  auto common = std::vector<std::string>{"--floats", std::to_string(floats), "--reps",
                                         std::to_string(reps)};
  auto start = [&](std::vector<std::string> args) {
    af::child_spec spec;
    spec.program = "/proc/self/exe";
    spec.argv = {argv[0]};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.argv.insert(spec.argv.end(), common.begin(), common.end());
    return af::child_process{spec};
  };
  auto r0 = start({"--rank", "0", "--port-fd", std::to_string(fds[1])});
  close(fds[1]);
  std::string port;
  char c;
  while (read(fds[0], &c, 1) == 1 && c != '\n')
    port += c;
  if (port.empty())
    die("rank 0 did not start its store");
  auto r1 = start({"--rank", "1", "--store-port", port});
  int status0 = r0.wait();
  int status1 = r1.wait();
  bool ok = WIFEXITED(status0) && WEXITSTATUS(status0) == 0 && WIFEXITED(status1)
            && WEXITSTATUS(status1) == 0;
  return ok ? 0 : 1;
}
