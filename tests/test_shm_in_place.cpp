// Payloads read in place from the shared-memory ring (issue 24): the ring's
// peek, release and lend (net/shm_ring.hpp), and the server's
// plane_request::payload_in_place (net/plane_handler.hpp) with a fake
// handler. Built into actorflow-net-tests (actorflow_net alone).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/wire_format.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "net/plane_handler.hpp"
#include "value_of.hpp"
#include "net/shm_ring.hpp"

using namespace af;
using af::testing::value_of;
using namespace std::chrono_literals;

namespace {

/// `n` bytes that differ from frame to frame (`frame`) and byte to byte.
std::vector<char> pattern(size_t n, int frame) {
  std::vector<char> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<char>(i * 131 + static_cast<size_t>(frame) * 7 + i / 251);
  return out;
}

/// A client's segment and the node's mapping of it, on a socket pair.
struct ring_pair {
  int sv[2] = {-1, -1};
  std::unique_ptr<shm_channel> client, node;
  shm_channel::bound b;

  explicit ring_pair(uint64_t ring) {
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    client = value_of(shm_channel::create(ring));
    node = value_of(shm_channel::open(client->name(), client->segment_bytes()));
    b.deadline = std::chrono::steady_clock::now() + 10s; // a bound on the test
  }
  ~ring_pair() {
    ::close(sv[0]);
    ::close(sv[1]);
  }

  shm_channel::status send(const std::vector<char>& bytes, std::chrono::milliseconds within = 10s) {
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    auto wb = b;
    wb.deadline = std::chrono::steady_clock::now() + within;
    return client->write(&iov, 1, sv[0], wb);
  }
};

} // namespace

TEST_CASE("a frame that wraps around the ring's end is read in place whole, its room goes back to "
          "the writer only at release, and a lent buffer outlives the channel",
          "[shm][in_place]") {
  const uint64_t ring = 64 << 10;
  ring_pair p{ring};
  REQUIRE(p.node->peekable());
  REQUIRE(p.node->ring_bytes() == ring);
  const size_t frame = 40000;
  uint64_t start = 0; // where each frame begins, counted from the ring's first byte
  bool wrapped = false;
  std::shared_ptr<std::byte> lent;
  for (int k = 0; k < 6; ++k) {
    auto bytes = pattern(frame, k);
    REQUIRE(p.send(bytes) == shm_channel::status::done);
    const std::byte* at = nullptr;
    REQUIRE(p.node->peek(frame, p.sv[1], p.b, &at) == shm_channel::status::done);
    wrapped = wrapped || (start % ring) + frame > ring;
    // Byte for byte, across the ring's end: the second mapping continues it.
    CHECK(std::memcmp(at, bytes.data(), frame) == 0);
    // A second peek of the same bytes (piece by piece) sees the same place.
    const std::byte* again = nullptr;
    REQUIRE(p.node->peek(frame / 2, p.sv[1], p.b, &again) == shm_channel::status::done);
    CHECK(again == at);
    if (k == 3) {
      // Held: the writer has the rest of the ring and not one byte more.
      REQUIRE(p.send(std::vector<char>(ring - frame, 'f')) == shm_channel::status::done);
      CHECK(p.send(std::vector<char>(1, 'x'), 50ms) == shm_channel::status::timeout);
      p.node->release(frame, p.sv[1]);
      std::vector<char> filler(ring - frame);
      REQUIRE(p.node->read(filler.data(), filler.size(), p.sv[1], p.b) == shm_channel::status::done);
      CHECK(filler == std::vector<char>(ring - frame, 'f'));
      start += frame + (ring - frame);
      continue;
    }
    if (k == 5)
      lent = p.node->lend(at);
    else
      p.node->release(frame, p.sv[1]);
    start += frame;
  }
  CHECK(wrapped);
  // Both ends gone: the lent bytes are still mapped (a holder never reads
  // unmapped memory) and still the frame's.
  p.node.reset();
  p.client.reset();
  auto last = pattern(frame, 5);
  CHECK(std::memcmp(lent.get(), last.data(), frame) == 0);
}

TEST_CASE("a torn frame is not shown in place: a peer that stalls or closes before its last byte "
          "fails the peek",
          "[shm][in_place]") {
  ring_pair p{64 << 10};
  auto bytes = pattern(30000, 1);
  REQUIRE(p.send(bytes) == shm_channel::status::done);
  auto b = p.b;
  b.stall_ms = 100;
  b.spin = 0us;
  const std::byte* at = nullptr;
  CHECK(p.node->peek(40000, p.sv[1], b, &at) == shm_channel::status::timeout);
  CHECK(at == nullptr);
  ::shutdown(p.sv[0], SHUT_RDWR); // the peer dies
  b.stall_ms = 10000;
  CHECK(p.node->peek(40000, p.sv[1], b, &at) == shm_channel::status::closed);
  CHECK(at == nullptr);
  // More than the ring can never be shown whole.
  CHECK(p.node->peek((64 << 10) + 1, p.sv[1], b, &at) == shm_channel::status::corrupt);
}

namespace {

/// Reads each push in place where it can: answers the sum of its floats
/// (version 1 if it was read in place, 0 if copied); keeps the buffer of a
/// push to "hold" (held()), as an aggregator that has not finished with it.
class in_place_handler : public plane_handler {
public:
  bool variable_op(plane_request& req) override {
    return req.refuse(af_error::invalid_argument, "no variables");
  }
  bool edge(plane_request& req) override {
    return req.refuse(af_error::invalid_argument, "no edges");
  }
  bool aggregate(plane_request& req) override {
    const auto& h = req.header();
    double sum = 0;
    size_t pieces = 0;
    auto add = [&](const void* piece, size_t n) {
      const auto* f = static_cast<const float*>(piece);
      for (size_t i = 0; i < n / sizeof(float); ++i)
        sum += f[i];
      ++pieces;
    };
    bool ok = true;
    auto in_place = req.payload_in_place(false, sizeof(float), 256 << 10, add, ok);
    if (!ok)
      return false;
    if (!in_place && h.payload_bytes > 0) {
      std::vector<char> copy(h.payload_bytes);
      if (!req.read_payload(copy.data()))
        return false;
      add(copy.data(), copy.size());
    }
    bool hold = req.name().size() >= sizeof(wire::push_prefix)
                && req.name().substr(sizeof(wire::push_prefix)) == "hold";
    if (hold && in_place) {
      std::lock_guard<std::mutex> guard{mtx_};
      held_ = in_place;
    }
    auto answer = tensor::from_values<float>({1}, {static_cast<float>(sum)});
    wire::header reply;
    reply.version = in_place ? 1 : 0;
    wire::describe_tensor(answer, reply);
    return req.reply(reply, answer.bytes());
  }

  std::shared_ptr<std::byte> take_held() {
    std::lock_guard<std::mutex> guard{mtx_};
    return std::move(held_);
  }

private:
  std::mutex mtx_;
  std::shared_ptr<std::byte> held_;
};

/// `n` floats, small integers (their sums are exact), different for `k`.
tensor push_values(size_t n, int k) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((i * 7 + static_cast<size_t>(k)) % 13) - 6.0f;
  return tensor::from_values<float>({static_cast<int64_t>(n)}, v);
}

double sum_of(const tensor& t) {
  double s = 0;
  for (auto x : t.values<float>())
    s += x;
  return s;
}

} // namespace

TEST_CASE("pushes on shared memory reach the handler in place, whole across the ring's end, and a "
          "payload still held after the frame timeout closes its connection, its bytes intact",
          "[shm][in_place][wire]") {
  auto handler = std::make_shared<in_place_handler>();
  data_plane_limits limits;
  limits.frame = 300ms;
  auto srv = value_of(data_plane_server::start(handler, "127.0.0.1", 0, "fake node", limits));
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "fake node", 5s));
  REQUIRE_FALSE(ch->settle());
  const bool shm = ch->transport() == "shared memory";
  if (!shm)
    WARN("on " << ch->transport() << " (ACTORFLOW_DATA_SHM=off?): every push is copied");
  const std::string token(16, 't');
  // 1.2 MB a push: more than one 256 KiB piece, and the 4 MiB ring's end
  // falls inside the fourth push.
  const size_t floats = 300001;
  for (int k = 0; k < 8; ++k) {
    auto values = push_values(floats, k);
    bool late = false;
    auto r = value_of(ch->aggregate(wire::kind::push, "sum", 0, static_cast<uint64_t>(k), {values},
                                    5s, token, static_cast<uint64_t>(k + 1), &late));
    INFO("push " << k);
    CHECK(r.first == (shm ? 1u : 0u));
    CHECK(static_cast<double>(r.second.values<float>()[0]) == sum_of(values));
  }
  if (!shm) {
    srv->stop();
    return;
  }
  // Held past its answer: the connection waits for it for the frame
  // timeout, then closes; the holder's bytes stay mapped and the push's.
  auto held_values = push_values(floats, 42);
  auto r = ch->aggregate(wire::kind::push, "hold", 0, 9, {held_values}, 5s, token, 9);
  REQUIRE(r);
  CHECK(r->first == 1u);
  auto next = ch->aggregate(wire::kind::push, "sum", 0, 10, {push_values(floats, 1)}, 5s, token, 10);
  CHECK_FALSE(next);
  // (Had its room gone back, these would have written over the held push.)
  for (uint64_t k = 11; k < 15; ++k)
    (void)ch->aggregate(wire::kind::push, "sum", 0, k, {push_values(floats, 2)}, 5s, token, k);
  auto held = handler->take_held();
  REQUIRE(held != nullptr);
  CHECK(std::memcmp(held.get(), held_values.bytes(), held_values.nbytes()) == 0);
  held.reset();
  // A fresh connection is served as before.
  auto again = value_of(data_channel::connect("127.0.0.1", srv->port(), "fake node", 5s));
  auto values = push_values(floats, 3);
  auto fresh = value_of(again->aggregate(wire::kind::push, "sum", 0, 11, {values}, 5s, token, 11));
  CHECK(static_cast<double>(fresh.second.values<float>()[0]) == sum_of(values));
  srv->stop();
}

TEST_CASE("a padding frame is skipped without an answer, and one that is not padding is refused",
          "[shm][in_place][wire]") {
  // Catches: a node that answers padding (the client reads an answer it
  // never asked for), reads past it wrong (the next frame misread), or
  // takes a large "padding" frame (a peer's way to make it skip megabytes).
  auto handler = std::make_shared<in_place_handler>();
  auto srv = value_of(data_plane_server::start(handler, "127.0.0.1", 0, "fake node"));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(srv->port());
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  timeval bound{10, 0}; // a bound on the test, not the behaviour's timing
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound));
  auto reply = [&](std::string& text) {
    wire::header r;
    REQUIRE(::recv(fd, &r, sizeof(r), MSG_WAITALL) == static_cast<ssize_t>(sizeof(r)));
    text.assign(r.payload_bytes, '\0');
    if (!text.empty())
      REQUIRE(::recv(fd, text.data(), text.size(), MSG_WAITALL) == static_cast<ssize_t>(text.size()));
    return r;
  };
  // 37 bytes of padding, then a pull: the one answer is the pull's.
  wire::header pad;
  pad.kind = static_cast<uint8_t>(wire::kind::shm_pad);
  pad.payload_bytes = 37;
  std::vector<char> frames(sizeof(pad) + 37, '\0');
  std::memcpy(frames.data(), &pad, sizeof(pad));
  wire::header pull;
  pull.kind = static_cast<uint8_t>(wire::kind::pull);
  pull.name_len = 3;
  frames.insert(frames.end(), reinterpret_cast<char*>(&pull),
                reinterpret_cast<char*>(&pull) + sizeof(pull));
  frames.insert(frames.end(), {'a', 'g', 'g'});
  REQUIRE(::send(fd, frames.data(), frames.size(), MSG_NOSIGNAL)
          == static_cast<ssize_t>(frames.size()));
  std::string text;
  auto r = reply(text);
  CHECK(r.status == 0);
  CHECK(r.kind == static_cast<uint8_t>(wire::kind::reply));
  CHECK(r.version == 0); // the handler's answer: no payload read in place
  // 64 bytes or more of "padding": refused, and the connection closed.
  pad.payload_bytes = 64;
  REQUIRE(::send(fd, &pad, sizeof(pad), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(pad)));
  r = reply(text);
  CHECK(r.status != 0);
  CHECK_THAT(text, Catch::Contains("padding of 64 bytes"));
  char byte;
  CHECK(::recv(fd, &byte, 1, 0) == 0);
  ::close(fd);
  srv->stop();
}
