#pragma once
// What the pipelined-push tests share (test_pipelined_push.cpp, sync;
// test_pipelined_async.cpp, async): an embedded cluster with one ps, twin
// aggregators over variables of their own with a TCP data channel per
// member, gradients whose bits show the order of additions, and a TCP
// connection written by hand.

#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "caf/all.hpp"

#include "core/wire_format.hpp"
#include "dist/embedded_cluster.hpp"
#include "dist/training.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "members.hpp"

namespace af::test {

using namespace std::chrono_literals;

using push_result = caf::expected<std::pair<uint64_t, tensor>>;

/// One member's gradient of one step: floats spanning magnitudes, so that
/// the order of additions shows in the bits.
inline tensor gradient(size_t n, uint32_t seed) {
  tensor t{dtype::float32, {static_cast<int64_t>(n)}};
  float* g = t.mutable_data<float>();
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    g[i] = static_cast<float>(static_cast<int32_t>(seed)) * std::ldexp(1.0f, int(seed % 24) - 40);
  }
  return t;
}

/// An aggregator over its own w [n] and b [1] with `workers` members, each
/// joined and with a TCP data channel of its own.
struct twin {
  std::string name;
  aggregator_actor agg;
  std::vector<std::string> tokens;
  std::vector<std::unique_ptr<data_channel>> chans;
};

struct bed {
  std::unique_ptr<embedded_cluster> cluster;
  std::optional<session> s;
  std::unique_ptr<caf::scoped_actor> self;
  uint16_t port = 0;

  /// `opts`: the nodes' options (a short data_frame_timeout_ms for a test
  /// of a peer that stalls).
  explicit bed(node_options opts = embedded_cluster::defaults()) {
    auto c = embedded_cluster::start({{"ps", 1}, {"worker", 1}}, opts);
    REQUIRE(c);
    cluster = std::move(*c);
    auto ss = cluster->session_for("worker", 0);
    REQUIRE(ss);
    s.emplace(std::move(*ss));
    self = std::make_unique<caf::scoped_actor>(s->system());
    auto info = s->ping("ps", 0);
    REQUIRE(info);
    port = info->data_port;
  }

  twin make(const std::string& name, size_t n, int workers, const std::string& optimizer,
            const std::string& mode = "sync", uint32_t step_timeout_ms = 20000,
            bool pipeline_auto = false, double grad_norm_guard = 0) {
    {
      auto scope = s->device("/job:ps/task:0");
      REQUIRE(s->variable("w_" + name, {static_cast<int64_t>(n)}, initializer::constant(0.25f)));
      REQUIRE(s->variable("b_" + name, {1}, initializer::constant(-0.5f)));
    }
    REQUIRE_FALSE(s->initialize());
    aggregator_spec spec;
    spec.name = "test/" + name;
    spec.mode = mode;
    spec.variables = {"w_" + name, "b_" + name};
    spec.workers = static_cast<uint32_t>(workers);
    spec.optimizer.kind = optimizer;
    spec.optimizer.lr = 0.1;
    spec.step_timeout_ms = step_timeout_ms;
    spec.pipeline_auto = pipeline_auto;
    spec.grad_norm_guard = grad_norm_guard;
    auto agg = s->aggregator("ps", 0, spec);
    REQUIRE(agg);
    twin t{spec.name, *agg, {}, {}};
    for (int w = 0; w < workers; ++w) {
      t.tokens.push_back(test::join_for_token(*self, *agg, static_cast<uint32_t>(w)));
      auto chan = data_channel::connect("127.0.0.1", port, "ps", 5s, {}, nullptr, nullptr,
                                        false); // TCP: a streamed push is plain TCP's
      REQUIRE(chan);
      REQUIRE((*chan)->aggregate(wire::kind::pull, t.name, 0, 0, {}, 10s));
      REQUIRE((*chan)->plain_tcp());
      t.chans.push_back(std::move(*chan));
    }
    return t;
  }

  aggregator_stats stats(const twin& t) {
    aggregator_stats out;
    (*self)->request(t.agg, 10s, stats_atom::value).receive(
      [&](aggregator_stats& st) { out = std::move(st); }, [&](caf::error&) {});
    return out;
  }

  /// Every variable's value and slots, as bytes, and the global step.
  std::pair<std::vector<std::byte>, uint64_t> saved(const twin& t) {
    std::vector<std::byte> out;
    uint64_t step = 0;
    (*self)->request(t.agg, 10s, save_atom::value).receive(
      [&](aggregator_state& st) {
        step = st.global_step;
        auto add = [&](const tensor& x) { out.insert(out.end(), x.bytes(), x.bytes() + x.nbytes()); };
        for (const auto& v : st.values)
          add(v);
        for (const auto& per : st.slots)
          for (const auto& x : per)
            add(x);
      },
      [&](caf::error& e) { FAIL(describe(e)); });
    return {out, step};
  }
};

/// A TCP connection to the data plane, written by hand.
struct raw_peer {
  int fd = -1;
  explicit raw_peer(uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  }
  ~raw_peer() {
    if (fd >= 0)
      ::close(fd);
  }
  void send_all(const void* p, size_t n) {
    auto* c = static_cast<const char*>(p);
    while (n > 0) {
      auto k = ::send(fd, c, n, MSG_NOSIGNAL);
      REQUIRE(k > 0);
      c += k;
      n -= static_cast<size_t>(k);
    }
  }
  /// A streamed push's header, prefix and name (its floats to follow).
  void send_streamed_head(const std::string& name, const std::string& token, uint32_t worker,
                          uint64_t step, uint64_t seq, size_t floats) {
    wire::header h;
    wire::push_prefix pre;
    std::memcpy(pre.token, token.data(), sizeof(pre.token));
    pre.seq = seq;
    h.kind = static_cast<uint8_t>(wire::kind::push_streamed);
    h.name_len = static_cast<uint32_t>(sizeof(pre) + name.size());
    h.version = step;
    h.reserved = static_cast<uint16_t>(worker);
    h.has_tensor = 1;
    h.dtype = static_cast<uint8_t>(dtype::float32);
    h.rank = 1;
    h.dims[0] = static_cast<int64_t>(floats);
    h.payload_bytes = floats * sizeof(float);
    send_all(&h, sizeof(h));
    send_all(&pre, sizeof(pre));
    send_all(name.data(), name.size());
  }
  /// Reads `n` bytes; false if the connection ended first.
  bool recv_all(void* p, size_t n) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      auto k = ::recv(fd, c, n, 0);
      if (k <= 0)
        return false;
      c += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }
};

/// A streamed push's answer as a raw peer reads it: one error reply (the
/// push refused before its answer began), or the header, the parameters and
/// the trailer (its status: whether the push committed).
struct raw_answer {
  bool read = false; ///< the whole answer arrived
  uint8_t status = 0;
  std::string text;
  uint64_t version = 0;
  std::vector<float> values;
};

/// Reads `p`'s answer, each wait bounded by 30 s (SO_RCVTIMEO).
inline raw_answer read_answer(raw_peer& p) {
  timeval tv{30, 0};
  ::setsockopt(p.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  raw_answer a;
  wire::header h;
  if (!p.recv_all(&h, sizeof(h)))
    return a;
  if (h.status != 0) {
    a.status = h.status;
    a.text.resize(h.payload_bytes);
    a.read = p.recv_all(a.text.data(), a.text.size());
    return a;
  }
  a.values.resize(h.payload_bytes / sizeof(float));
  if (!p.recv_all(a.values.data(), h.payload_bytes))
    return a;
  wire::header t;
  if (!p.recv_all(&t, sizeof(t)))
    return a;
  a.status = t.status;
  a.version = t.version;
  a.text.resize(t.payload_bytes);
  a.read = p.recv_all(a.text.data(), a.text.size());
  return a;
}

/// An answer and its global step equal to another's, bit for bit.
inline void check_same(const push_result& got, const push_result& want) {
  REQUIRE(got);
  REQUIRE(want);
  CHECK(got->first == want->first);
  REQUIRE(got->second.nbytes() == want->second.nbytes());
  CHECK(std::memcmp(got->second.bytes(), want->second.bytes(), want->second.nbytes()) == 0);
}

/// What bed::saved gave: every value and slot byte, and the global step.
using saved_state = std::pair<std::vector<std::byte>, uint64_t>;

/// Two saved states equal, bit for bit.
inline void check_same_saved(const saved_state& got, const saved_state& want) {
  CHECK(got.second == want.second);
  REQUIRE(got.first.size() == want.first.size());
  CHECK(std::memcmp(got.first.data(), want.first.data(), want.first.size()) == 0);
}

/// The aggregator `got`'s variables, slots and global step equal `want`'s.
inline void check_same_state(bed& b, const twin& got, const twin& want) {
  check_same_saved(b.saved(got), b.saved(want));
}

} // namespace af::test
