// gather_many as a sparse step's ps link uses it (dist/sparse_step.hpp's
// data_plane_ps_link) and as a worker reads its answer
// (data_channel::split_gather_many): reads held back and sent as frames of
// at most wire::max_gather_parts, answered in the order they were started
// even when a frame fails to go, counted only when sent, sent again once
// each through a ps's recovery; an answer whose parts claim more than it
// holds refused before any part is cut; and a node that answers or refuses
// a payload changed at random and stays in step.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "actors/variable.hpp"
#include "actors/variable_directory.hpp"
#include "config/loopback.hpp"
#include "core/wire_format.hpp"
#include "dist/sparse_recovery.hpp"
#include "dist/sparse_step.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "plane_fixtures.hpp"
#include "scenarios.hpp"

using namespace af;
using namespace af::testing;
using namespace std::chrono_literals;

namespace {

/// A directory with "emb" float32 [4, 2] (row r: r, r) and "bias" [1] (0.5).
std::shared_ptr<variable_directory> small_ps() {
  tensor t{dtype::float32, {4, 2}};
  for (int64_t i = 0; i < 8; ++i)
    t.mutable_data<float>()[i] = static_cast<float>(i / 2);
  auto dir = std::make_shared<variable_directory>();
  dir->put("emb", {variable_cell_actor{}, cell_of("emb", t)});
  dir->put("bias",
           {variable_cell_actor{}, cell_of("bias", tensor::filled(dtype::float32, {1}, 0.5f))});
  return dir;
}

tensor one_id(int64_t id) {
  tensor t{dtype::int64, {1}};
  t.mutable_data<int64_t>()[0] = id;
  return t;
}

} // namespace

TEST_CASE("a ps link's read whose frame fails to go answers in its own turn, after the frames "
          "sent before it",
          "[sparse_step][gather_many]") {
  // Catches: a failed send's errors queued ahead of the answer of a frame
  // already out (the first read got the second's error, and the next
  // finish() took the first's answer for the second: every later answer
  // one off), and a frame that never went counted as sent.
  auto srv = value_of(data_plane_server::start(small_ps(), "127.0.0.1", 0, "ps 0"));
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "ps", 5s));
  data_plane_ps_link link{std::move(ch), "agg", 0, "", 0, 10s};
  REQUIRE_FALSE(link.start_read("bias"));
  link.flush();
  auto sent = link.bytes().first;
  // A name the channel refuses before anything goes out: the connection
  // stays good.
  REQUIRE_FALSE(link.start_read(std::string(wire::max_name + 1, 'x')));
  link.flush();
  CHECK(link.bytes().first == sent);
  auto bias = link.finish();
  REQUIRE(bias);
  CHECK(bias->value.data<float>()[0] == 0.5f);
  auto refused = link.finish();
  REQUIRE_FALSE(refused);
  CHECK(is(refused.error(), af_error::invalid_argument));
  // And the link goes on in step.
  REQUIRE_FALSE(link.start_gather_rows("emb", one_id(3)));
  auto row = value_of(link.finish());
  CHECK(row.value.data<float>()[0] == 3.0f);
}

TEST_CASE("a ps link sends a phase of more reads than a gather_many's parts as several frames",
          "[sparse_step][gather_many]") {
  // Catches: one gather_many of every read held (refused by the channel
  // past wire::max_gather_parts: a ps holding that many dense variables
  // could no longer be read at all).
  auto srv = value_of(data_plane_server::start(small_ps(), "127.0.0.1", 0, "ps 0"));
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "ps", 5s));
  data_plane_ps_link link{std::move(ch), "agg", 0, "", 0, 10s};
  const size_t n = wire::max_gather_parts + 3;
  for (size_t i = 0; i < n; ++i) {
    if (i % 2 == 0)
      REQUIRE_FALSE(link.start_read("bias"));
    else
      REQUIRE_FALSE(link.start_gather_rows("emb", one_id(static_cast<int64_t>(i % 4))));
  }
  auto before = requests_of(*srv);
  link.flush();
  for (size_t i = 0; i < n; ++i) {
    INFO("read " << i);
    auto a = value_of(link.finish());
    CHECK(a.value.data<float>()[0] == (i % 2 == 0 ? 0.5f : static_cast<float>(i % 4)));
  }
  CHECK(requests_of(*srv) == before + 2);
}

TEST_CASE("a gather_many answer whose parts claim more bytes than it holds is refused",
          "[plane][gather_many][limits]") {
  // Catches: part sizes near 2^64 summed into offsets that wrap back onto
  // the payload's end, so that the parts become tensors far past its
  // buffer (a ps's answer is read as untrusted as a request).
  tensor payload{dtype::int32, {64}}; // 256 bytes: 8 + 2 * 88, up to 192, then 64
  std::memset(payload.mutable_data<int32_t>(), 0, payload.nbytes());
  auto* p = reinterpret_cast<std::byte*>(payload.mutable_data<int32_t>());
  uint32_t parts = 2;
  std::memcpy(p, &parts, sizeof(parts));
  wire::gathered_part d[2];
  d[0].dtype = d[1].dtype = static_cast<uint8_t>(dtype::float32);
  d[0].rank = 1;
  d[0].dims[0] = int64_t{1} << 61; // 2^63 bytes
  d[0].bytes = uint64_t{1} << 63;
  // The second at 2^63 + 192; 2^63 + 64 bytes end it at 256, mod 2^64.
  d[1].rank = 2;
  d[1].dims[0] = 2;
  d[1].dims[1] = (int64_t{1} << 60) + 8;
  d[1].bytes = (uint64_t{1} << 63) + 64;
  REQUIRE(wire::gather_many_offsets({d[0].bytes, d[1].bytes}).back() == payload.nbytes());
  std::memcpy(p + 8, d, sizeof(d));
  auto split = data_channel::split_gather_many(payload, 2);
  REQUIRE_FALSE(split);
  CHECK(is(split.error(), af_error::internal));
}

TEST_CASE("reads held for one gather_many on a ps that dies are sent again to the ps as it runs "
          "now, each answered once",
          "[sparse_step][sparse_recovery][gather_many]") {
  // Catches: reads held back (or out in one frame) lost with the old
  // connection and never sent again, or sent again twice (the recovery's
  // re-send and a stale held copy): a read answered with another's value,
  // or a wait for an answer that never comes.
  auto dir = small_ps();
  auto first = value_of(data_plane_server::start(dir, "127.0.0.1", 0, "ps 0"));
  auto second = value_of(data_plane_server::start(dir, "127.0.0.1", 0, "ps 0 again"));
  param_shard shard;
  shard.task = "/job:ps/task:0";
  int recoveries = 0;
  sparse_recovery rec{
    [&](size_t, uint64_t, const std::string&, bool) -> caf::expected<recovered_shard> {
      ++recoveries;
      return recovered_shard{shard, 0}; // the same actor: nothing to join
    },
    [](size_t, const aggregator_actor&) -> caf::expected<std::pair<std::string, uint64_t>> {
      return make_error(af_error::internal, "no join expected");
    },
    [&](const param_shard&) -> caf::expected<std::unique_ptr<data_channel>> {
      return data_channel::connect("127.0.0.1", second->port(), "ps 0 again", 5s);
    },
    {shard}};
  data_plane_ps_link inner{value_of(data_channel::connect("127.0.0.1", first->port(), "ps 0", 5s)),
                           "agg", 0, "", 0, 10s};
  recovering_ps_link link{inner, 0, rec};
  REQUIRE_FALSE(link.start_gather_rows("emb", one_id(2)));
  REQUIRE_FALSE(link.start_read("bias"));
  REQUIRE_FALSE(link.start_gather_rows("emb", one_id(1)));
  first->stop(); // the ps dies with the reads held
  link.flush();
  auto before = variable_ops_of(*second);
  auto a = link.finish();
  INFO((a ? std::string{} : describe(a.error())));
  REQUIRE(a);
  CHECK(recoveries == 1);
  CHECK(a->value.data<float>()[0] == 2.0f);
  auto b = value_of(link.finish());
  CHECK(b.value.data<float>()[0] == 0.5f);
  auto c = value_of(link.finish());
  CHECK(c.value.data<float>()[1] == 1.0f);
  CHECK(variable_ops_of(*second) == before + 1); // the three again, in one frame
  // And the link goes on in step on the new connection.
  REQUIRE_FALSE(link.start_read("bias"));
  REQUIRE_FALSE(link.start_gather_rows("emb", one_id(3)));
  link.flush();
  CHECK(value_of(link.finish()).value.data<float>()[0] == 0.5f);
  CHECK(value_of(link.finish()).value.data<float>()[0] == 3.0f);
}

namespace {

/// A well-formed gather_many frame (header and payload) of "emb" rows 3, 0
/// and "bias"'s value, as data_channel::send_gather_many lays it out.
std::vector<unsigned char> good_frame() {
  const std::string names = "embbias";
  std::vector<wire::gather_part> d(2);
  d[0] = {3, static_cast<uint32_t>(wire::gather_part_kind::rows), 2};
  d[1] = {4, static_cast<uint32_t>(wire::gather_part_kind::value), 0};
  const uint64_t payload = 8 + sizeof(wire::gather_part) * 2 + 8 + 2 * 8;
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::gather_many);
  h.has_tensor = 1;
  h.dtype = static_cast<uint8_t>(dtype::int32);
  h.rank = 1;
  h.dims[0] = static_cast<int64_t>(payload / 4);
  h.payload_bytes = payload;
  std::vector<unsigned char> out(sizeof(h) + payload, 0);
  std::memcpy(out.data(), &h, sizeof(h));
  auto* p = out.data() + sizeof(h);
  const uint32_t head[2] = {2, 0};
  std::memcpy(p, head, 8);
  std::memcpy(p + 8, d.data(), sizeof(wire::gather_part) * 2);
  std::memcpy(p + 40, names.data(), names.size());
  const int64_t id[2] = {3, 0};
  std::memcpy(p + 48, id, sizeof(id));
  return out;
}

/// One reply frame off `fd`: its header, and its payload read whole.
wire::header reply_of(int fd, std::vector<unsigned char>& payload) {
  wire::header r;
  REQUIRE(recv(fd, &r, sizeof(r), MSG_WAITALL) == static_cast<ssize_t>(sizeof(r)));
  REQUIRE(r.payload_bytes < (1u << 20));
  payload.resize(r.payload_bytes);
  if (!payload.empty())
    REQUIRE(recv(fd, payload.data(), payload.size(), MSG_WAITALL)
            == static_cast<ssize_t>(payload.size()));
  return r;
}

} // namespace

TEST_CASE("a gather_many payload with bytes changed at random is answered or refused, and the "
          "connection stays in step",
          "[plane][gather_many][limits]") {
  // Catches: a payload the parser trusts past what it checked (a count, a
  // length or a kind changed by a byte) that crashes the node, answers with
  // more or fewer bytes than the reply's header says, or leaves the next
  // frame read from the middle of this one. (fuzz/ data_plane does this
  // with sanitizers; this is its g++ regression, seeded.)
  auto srv = value_of(data_plane_server::start(small_ps(), "127.0.0.1", 0, "ps 0"));
  int fd = connect_loopback(srv->port());
  REQUIRE(fd >= 0);
  const auto good = good_frame();
  std::vector<unsigned char> payload;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int answered = 0, refused = 0;
  for (int round = 0; round < 400; ++round) {
    auto frame = good;
    const size_t payload_at = sizeof(wire::header);
    const int changes = 1 + static_cast<int>(next() % 3);
    for (int c = 0; c < changes; ++c) {
      auto at = payload_at + next() % (frame.size() - payload_at);
      frame[at] = static_cast<unsigned char>(next());
    }
    INFO("round " << round);
    REQUIRE(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL)
            == static_cast<ssize_t>(frame.size()));
    auto r = reply_of(fd, payload);
    (r.status == 0 ? answered : refused) += 1;
    // The good frame right after it is answered, with the right bytes.
    REQUIRE(send(fd, good.data(), good.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(good.size()));
    auto ok = reply_of(fd, payload);
    REQUIRE(ok.status == 0);
    tensor t{dtype::int32, {static_cast<int64_t>(payload.size() / 4)}};
    std::memcpy(t.mutable_data<int32_t>(), payload.data(), payload.size());
    auto parts = value_of(data_channel::split_gather_many(t, 2));
    CHECK(parts[0].value.data<float>()[0] == 3.0f);
    CHECK(parts[0].value.data<float>()[2] == 0.0f);
    CHECK(parts[1].value.data<float>()[0] == 0.5f);
  }
  CHECK(refused > 0);
  close(fd);
}

TEST_CASE("a ps link's gather_many answers on shared memory stay whole while the next come",
          "[sparse_step][gather_many][shm]") {
  // Catches: parts cut from an answer in a shared-memory slot that do not
  // hold the slot (the node writes the next answer over them), or cut at
  // offsets of the ring's copy rather than the slot's.
  constexpr int64_t rows = 64, width = 256; // 64 KiB a gather of every row: slot answers
  tensor t{dtype::float32, {rows, width}};
  for (int64_t i = 0; i < rows * width; ++i)
    t.mutable_data<float>()[i] = static_cast<float>(i);
  auto dir = small_ps();
  auto cell = std::make_shared<variable_cell>(
    variable_spec{"wide", dtype::float32, {rows, width}, "/job:ps/replica:0/task:0/device:CPU:0"});
  REQUIRE(cell->initialize(initializer::from_tensor(t), false, ""));
  dir->put("wide", {variable_cell_actor{}, cell});
  auto srv = value_of(data_plane_server::start(dir, "127.0.0.1", 0, "ps 0"));
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "ps", 5s));
  tensor every{dtype::int64, {rows}};
  for (int64_t i = 0; i < rows; ++i)
    every.mutable_data<int64_t>()[i] = rows - 1 - i; // reversed
  REQUIRE(ch->gather_rows("wide", every)); // on TCP: sizes the slots
  REQUIRE_FALSE(ch->settle());
  const bool shm = ch->transport() == "shared memory";
  if (!shm)
    WARN("on " << ch->transport() << " (ACTORFLOW_DATA_SHM=off?): no answer slots");
  data_plane_ps_link link{std::move(ch), "agg", 0, "", 0, 10s};
  std::vector<sparse_ps_link::answer> held;
  for (int round = 0; round < 4; ++round) {
    REQUIRE_FALSE(link.start_gather_rows("wide", every));
    REQUIRE_FALSE(link.start_read("bias"));
    link.flush();
    held.push_back(value_of(link.finish()));
    held.push_back(value_of(link.finish()));
    REQUIRE(cell->apply(var_op::assign_add, tensor::filled(dtype::float32, {rows, width}, 1.0),
                        false, 0));
  }
  for (size_t round = 0; round < 4; ++round) {
    INFO("round " << round);
    const auto& a = held[2 * round].value;
    REQUIRE(a.shape() == shape_type{rows, width});
    for (int64_t r : {int64_t{0}, rows - 1})
      for (int64_t j : {int64_t{0}, width - 1})
        CHECK(a.data<float>()[r * width + j]
              == static_cast<float>((rows - 1 - r) * width + j) + static_cast<float>(round));
    CHECK(held[2 * round + 1].value.data<float>()[0] == 0.5f);
  }
}

TEST_CASE("a gather_many answer over the node's max_message_bytes with its descriptions is "
          "refused, not only one whose parts' bytes are",
          "[plane][gather_many][limits]") {
  // Catches: the answer checked by its parts' bytes alone (20 here), then
  // sent with its 88-byte descriptions and 64-byte alignment (264 bytes)
  // past a limit of 200.
  data_plane_limits limits;
  limits.max_message_bytes = 200;
  auto srv = value_of(data_plane_server::start(small_ps(), "127.0.0.1", 0, "ps 0", limits));
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "ps", 5s));
  tensor two{dtype::int64, {2}};
  two.mutable_data<int64_t>()[0] = 1;
  two.mutable_data<int64_t>()[1] = 2;
  REQUIRE_FALSE(ch->send_gather_many({{"emb", two}, {"bias", tensor{}}}));
  auto r = ch->next_reply();
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::resource_exhausted));
  CHECK_THAT(describe(r.error()), Catch::Contains("264 bytes"));
  // A smaller one (one part: 136 bytes) still goes.
  REQUIRE_FALSE(ch->send_gather_many({{"bias", tensor{}}}));
  CHECK(ch->next_reply());
}
