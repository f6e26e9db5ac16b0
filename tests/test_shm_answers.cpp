// Answers read in place from a shared-memory answer slot (issue 24): the
// slots' hand-over between node and client (net/shm_ring.hpp's put_answer
// and take_answer), a client that holds answers while the next ones come
// (data_channel over a data_plane_server with a fake handler), and a
// segment of an older layout refused, saying so. Built into
// actorflow-net-tests (actorflow_net alone).
#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/wire_format.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "net/plane_handler.hpp"
#include "value_of.hpp"
#include "net/shm_ring.hpp"
#include "net/shm_segment.hpp"

using namespace af;
using af::testing::value_of;
using namespace std::chrono_literals;

namespace {

/// `n` floats, all `v`.
std::vector<float> all(size_t n, float v) {
  return std::vector<float>(n, v);
}

/// True if the `n` floats at `p` are all `v`.
bool all_are(const void* p, size_t n, float v) {
  const auto* f = static_cast<const float*>(p);
  for (size_t i = 0; i < n; ++i)
    if (f[i] != v)
      return false;
  return true;
}

/// Answers a pull of aggregator "f<N>" with N floats, all the request's
/// step: each answer differs from the one before.
class step_handler final : public plane_handler {
public:
  bool variable_op(plane_request& req) override {
    return req.refuse(af_error::invalid_argument, "no variables here");
  }
  bool edge(plane_request& req) override {
    return req.refuse(af_error::invalid_argument, "no executors here");
  }
  bool aggregate(plane_request& req) override {
    const auto& h = req.header();
    if (!req.skip_payload())
      return false;
    auto n = static_cast<int64_t>(std::stoll(req.name().substr(1)));
    auto answer = tensor::filled(dtype::float32, {n}, static_cast<float>(h.version));
    wire::header reply;
    wire::describe_tensor(answer, reply);
    return req.reply(reply, answer.bytes());
  }
};

} // namespace

// Bugs it catches: a node that writes an answer into a slot the client
// still holds (the held answer would change under it), a slot never given
// back (every later answer copied), a client that takes a slot the node did
// not hand over, or one it has lent already.
TEST_CASE("an answer slot is the client's until its last copy is dropped: with both held, answers "
          "go through the ring",
          "[shm][in_place]") {
  const size_t floats = 4096;
  const uint64_t bytes = floats * sizeof(float);
  auto client = value_of(shm_channel::create(64 << 10, 16384));
  auto node = value_of(shm_channel::open(client->name(), client->segment_bytes()));
  REQUIRE(node->slot_bytes() == 16384);
  auto one = all(floats, 1), two = all(floats, 2), three = all(floats, 3);
  REQUIRE(node->put_answer(one.data(), bytes) == 0);
  CHECK(client->take_answer(1, bytes) == nullptr); // not handed over
  CHECK(client->take_answer(0, 16385) == nullptr);  // more than the slot
  CHECK(client->take_answer(2, bytes) == nullptr);  // no such slot
  auto first = client->take_answer(0, bytes);
  REQUIRE(first != nullptr);
  CHECK(client->take_answer(0, bytes) == nullptr); // named again while lent
  auto copy = first; // a second holder (a slice of it, say)
  REQUIRE(node->put_answer(two.data(), bytes) == 1);
  auto second = client->take_answer(1, bytes);
  REQUIRE(second != nullptr);
  // Both held: no slot for a third (the ring carries it), nothing written.
  CHECK(node->put_answer(three.data(), bytes) == -1);
  CHECK(node->put_answer(three.data(), 16385) == -1);
  CHECK(all_are(first.get(), floats, 1));
  CHECK(all_are(second.get(), floats, 2));
  first.reset();
  CHECK(node->put_answer(three.data(), bytes) == -1); // `copy` still holds slot 0
  copy.reset();
  REQUIRE(node->put_answer(three.data(), bytes) == 0);
  CHECK(all_are(second.get(), floats, 2));
  auto third = client->take_answer(0, bytes);
  REQUIRE(third != nullptr);
  CHECK(all_are(third.get(), floats, 3));
  // A segment without slots takes none.
  auto plain = value_of(shm_channel::create(64 << 10));
  auto plain_node = value_of(shm_channel::open(plain->name(), plain->segment_bytes()));
  CHECK(plain_node->slot_bytes() == 0);
  CHECK(plain_node->put_answer(one.data(), 4) == -1);
}

// Bugs it catches: answers never put in a slot (answers_in_place stays 0),
// a slot written while the client holds its answer (the held values
// change), a slot the client never gives back, an answer larger than the
// slots not carried by the ring.
TEST_CASE("answers held in place by a client on shared memory do not change as the next come, a "
          "third, or a larger one, goes through the ring",
          "[shm][in_place][wire]") {
  auto srv = value_of(data_plane_server::start(std::make_shared<step_handler>(), "127.0.0.1", 0,
                                               "fake node"));
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "fake node", 5s));
  const int64_t n = 32768; // 128 KiB answers: slots of 128 KiB
  const std::string name = "f" + std::to_string(n);
  auto pull = [&](uint64_t step, const std::string& agg) {
    return value_of(ch->aggregate(wire::kind::pull, agg, 0, step, {}, 5s)).second;
  };
  CHECK(pull(0, name).num_elements() == static_cast<size_t>(n)); // on TCP: sizes the slots
  REQUIRE_FALSE(ch->settle());
  if (ch->transport() != "shared memory") {
    WARN("on " << ch->transport() << " (ACTORFLOW_DATA_SHM=off?): every answer is copied");
    srv->stop();
    return;
  }
  auto a1 = pull(1, name);
  CHECK(ch->answers_in_place() == 1);
  auto a2 = pull(2, name);
  CHECK(ch->answers_in_place() == 2);
  auto a3 = pull(3, name); // both slots held: through the ring
  CHECK(ch->answers_in_place() == 2);
  CHECK(all_are(a1.bytes(), n, 1));
  CHECK(all_are(a2.bytes(), n, 2));
  CHECK(all_are(a3.bytes(), n, 3));
  a1 = tensor{};
  auto a4 = pull(4, name);
  CHECK(ch->answers_in_place() == 3);
  CHECK(all_are(a2.bytes(), n, 2));
  CHECK(all_are(a4.bytes(), n, 4));
  // A slice keeps its answer's slot, and writing to it copies first.
  auto part = a4.slice(0, {16});
  a4 = tensor{};
  a2 = tensor{};
  auto a5 = pull(5, name);
  CHECK(ch->answers_in_place() == 4);
  part.mutable_data<float>()[0] = 9;
  auto a6 = pull(6, name); // slot of a4 is still held by `part` if the write did not copy
  CHECK(all_are(a5.bytes(), n, 5));
  CHECK(all_are(a6.bytes(), n, 6));
  CHECK(all_are(part.bytes() + sizeof(float), 15, 4));
  // Larger than a slot: through the ring, whole.
  auto before = ch->answers_in_place();
  auto big = pull(7, "f" + std::to_string(2 * n));
  CHECK(ch->answers_in_place() == before);
  CHECK(all_are(big.bytes(), static_cast<size_t>(2 * n), 7));
  srv->stop();
}

// Bug it catches: a node that maps a segment of an older layout (no answer
// slots, AFDPSHM3) and reads its header as its own, or refuses it with words
// that do not say why.
TEST_CASE("a shared-memory segment of an older actorflow version is refused, naming both layouts",
          "[shm]") {
  const uint64_t ring = 64 << 10;
  const uint64_t bytes = 4096 + 2 * ring; // AFDPSHM3: a header and two rings
  auto seg = value_of(shm_segment::create(shm_channel::name_prefix, bytes));
  auto* words = static_cast<uint64_t*>(seg.base);
  words[0] = 0x334d485350444641; // "AFDPSHM3"
  words[1] = ring;
  auto node = shm_channel::open(seg.name, bytes);
  ::munmap(seg.base, bytes);
  ::shm_unlink(seg.name.c_str());
  REQUIRE_FALSE(node);
  CHECK_THAT(describe(node.error()),
             Catch::Contains("another actorflow version") && Catch::Contains("AFDPSHM3")
               && Catch::Contains("AFDPSHM4") && Catch::Contains("stays on TCP"));
}
