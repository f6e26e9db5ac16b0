#include "fuzz/harness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "caf/all.hpp"

#include "actors/session.hpp"
#include "config/loopback.hpp"
#include "core/wire_format.hpp"
#include "dist/embedded_cluster.hpp"
#include "messages/aggregator.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"

// The data plane's harness, apart from the parsers' (harness.cpp): it needs
// the whole actorflow library, they do not.
namespace af::fuzz {

namespace {

using clock_type = std::chrono::steady_clock;

/// An aggregator the inputs push to: its name, and its two workers' tokens.
struct fuzz_aggregator {
  std::string name;
  aggregator_actor actor;
  std::vector<std::string> tokens;
};

/// One ps node for the process, with a scalar variable "v" to read and two
/// aggregators of two workers each over w [4] and b [1] of their own, sync
/// ("agg_sync", pipelined rounds) and async ("agg_async", the line of
/// streamed pushes), whose workers joined: so that push frames, streamed
/// (kind 15) ones above all, reach their paths and not only "no
/// aggregator" (the harness writes the joined workers' tokens into them).
struct plane_fixture {
  std::unique_ptr<embedded_cluster> cluster;
  std::optional<session> s;
  std::unique_ptr<caf::scoped_actor> self;
  std::vector<fuzz_aggregator> aggs;
  uint16_t port = 0;
  std::string problem;

  plane_fixture() {
    auto opts = embedded_cluster::defaults();
    opts.data_frame_timeout_ms = 1000;
    opts.data_idle_timeout_ms = 5000;
    auto c = embedded_cluster::start({{"ps", 1}}, opts);
    if (!c) {
      problem = "cannot start the ps: " + describe(c.error());
      return;
    }
    cluster = std::move(*c);
    auto ss = cluster->session_for("ps", 0);
    if (!ss) {
      problem = "no session: " + describe(ss.error());
      return;
    }
    s.emplace(std::move(*ss));
    self = std::make_unique<caf::scoped_actor>(s->system());
    auto info = s->ping("ps", 0);
    if (!info) {
      problem = "the ps does not answer: " + describe(info.error());
      return;
    }
    port = info->data_port;
    auto scope = s->device("/job:ps/task:0");
    bool made = static_cast<bool>(s->variable("v", {}, initializer::constant(5)));
    for (std::string mode : {"sync", "async"})
      made = made && s->variable("w_" + mode, {4}, initializer::constant(0.25f))
             && s->variable("b_" + mode, {1}, initializer::constant(-0.5f));
    if (!made || s->initialize()) {
      problem = "cannot make the fuzz variables";
      return;
    }
    for (std::string mode : {"sync", "async"}) {
      aggregator_spec spec;
      spec.name = "agg_" + mode;
      spec.mode = mode;
      spec.variables = {"w_" + mode, "b_" + mode};
      spec.workers = 2;
      spec.optimizer.kind = "momentum";
      spec.optimizer.lr = 0.1;
      spec.step_timeout_ms = 1000; // a round or a line that waits ends well within 5 s
      auto agg = s->aggregator("ps", 0, spec);
      if (!agg) {
        problem = "cannot make aggregator " + spec.name + ": " + describe(agg.error());
        return;
      }
      fuzz_aggregator a{spec.name, *agg, {}};
      for (uint32_t w = 0; w < 2; ++w) {
        (*self)
          ->request(*agg, std::chrono::seconds(10), join_atom::value, w,
                    "/job:worker/task:" + std::to_string(w), std::string{"127.0.0.1:1"},
                    uint32_t{1}, caf::actor{})
          .receive([&](uint64_t, std::string& t, uint64_t) { a.tokens.push_back(std::move(t)); },
                   [&](caf::error& e) { problem = "join refused: " + describe(e); });
        if (!problem.empty())
          return;
      }
      aggs.push_back(std::move(a));
    }
  }

  /// The global step of `a` now; nothing if it did not answer within 5 s.
  std::optional<uint64_t> global_step(const fuzz_aggregator& a) {
    std::optional<uint64_t> out;
    (*self)->request(a.actor, std::chrono::seconds(5), stats_atom::value).receive(
      [&](aggregator_stats& st) { out = st.global_step; }, [&](caf::error&) {});
    return out;
  }
};

plane_fixture& fixture() {
  static auto* f = new plane_fixture; // lives as long as the process
  return *f;
}

/// Whether `kind` is a push (its name starts with a wire::push_prefix).
bool is_push(uint8_t k) {
  using wire::kind;
  return k == static_cast<uint8_t>(kind::push) || k == static_cast<uint8_t>(kind::push_params)
         || k == static_cast<uint8_t>(kind::push_sparse)
         || k == static_cast<uint8_t>(kind::push_streamed);
}

/// The input with each push frame to a fuzz aggregator, by a worker index
/// it has (0 or 1), made its worker's: its token written in, and a step of
/// 0 made the aggregator's global step now (`steps`), so that the frame
/// reaches the common case (a pipelined round, the async line) and not
/// only a refusal. Frames are walked by their headers' lengths; one that
/// does not fit is left as it is.
std::vector<uint8_t> with_tokens(const uint8_t* data, size_t size,
                                 const std::vector<fuzz_aggregator>& aggs,
                                 const std::vector<uint64_t>& steps) {
  std::vector<uint8_t> out(data, data + size);
  const size_t head = sizeof(wire::header), pre = sizeof(wire::push_prefix);
  for (size_t at = 0; size - at >= head;) {
    wire::header h;
    std::memcpy(&h, out.data() + at, head);
    if (is_push(h.kind) && h.name_len >= pre && h.name_len - pre < 256
        && size - at - head >= h.name_len) {
      std::string name(reinterpret_cast<const char*>(out.data() + at + head + pre),
                       h.name_len - pre);
      for (size_t k = 0; k < aggs.size(); ++k)
        if (aggs[k].name == name && h.reserved < aggs[k].tokens.size()) {
          const auto& token = aggs[k].tokens[h.reserved];
          std::memcpy(out.data() + at + head, token.data(),
                      std::min(token.size(), sizeof(wire::push_prefix::token)));
          if (h.version == 0 && k < steps.size()) {
            h.version = steps[k];
            std::memcpy(out.data() + at, &h, head);
          }
        }
    }
    uint64_t len = uint64_t{h.name_len} + h.payload_bytes;
    if (h.payload_bytes > size || len > size - at - head)
      break;
    at += head + static_cast<size_t>(len);
  }
  return out;
}

} // namespace

std::string data_plane(const uint8_t* data, size_t size) {
  auto& f = fixture();
  if (!f.problem.empty())
    return f.problem;
  std::vector<uint64_t> steps;
  for (const auto& a : f.aggs) {
    auto step = f.global_step(a);
    if (!step)
      return "aggregator " + a.name + " did not answer its stats within 5 s before the input";
    steps.push_back(*step);
  }
  auto input = with_tokens(data, size, f.aggs, steps);
  data = input.data();
  int fd = connect_loopback(f.port);
  if (fd < 0)
    return "the data plane refused a connection: " + std::string{std::strerror(errno)};
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  // Send everything while reading what comes back (a reply must not fill
  // the socket while we write), then close for writing: the server must see
  // the end and close its side within the frame timeout and then some.
  size_t sent = 0;
  bool write_open = true;
  bool closed = false;
  auto deadline = clock_type::now() + std::chrono::seconds{5};
  char buf[65536];
  while (!closed && clock_type::now() < deadline) {
    if (write_open && sent == size) {
      shutdown(fd, SHUT_WR);
      write_open = false;
    }
    pollfd p{fd, static_cast<short>(POLLIN | (write_open ? POLLOUT : 0)), 0};
    if (poll(&p, 1, 100) < 0 && errno != EINTR)
      break;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      auto got = recv(fd, buf, sizeof(buf), 0);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR))
        closed = true;
    }
    if (write_open && (p.revents & POLLOUT)) {
      auto put = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (put > 0)
        sent += static_cast<size_t>(put);
      else if (put < 0 && errno != EAGAIN && errno != EINTR)
        write_open = false; // the server closed on us: fine, it refused the input
    }
  }
  close(fd);
  if (!closed)
    return "the data plane kept a connection open 5 s after its peer stopped sending";
  // It still serves. (libFuzzer's SIGALRM timer interrupts connects now
  // and then: both connects here must wait through EINTR, not report it.)
  auto ch = data_channel::connect("127.0.0.1", f.port, "fuzz node",
                                  std::chrono::seconds{5});
  if (!ch)
    return "the data plane no longer accepts after the input: " + describe(ch.error());
  auto r = (*ch)->call(var_op::read, "v", nullptr, false);
  if (!r)
    return "the data plane no longer serves a read after the input: " + describe(r.error());
  if (r->first.type() != dtype::float32 || !r->first.shape().empty())
    return "the variable read back is " + r->first.summary() + ", not a float32 scalar";
  // Its aggregators still answer (none holds its lock, or waits forever).
  for (const auto& a : f.aggs)
    if (!f.global_step(a))
      return "aggregator " + a.name + " did not answer its stats within 5 s after the input";
  return {};
}

} // namespace af::fuzz
