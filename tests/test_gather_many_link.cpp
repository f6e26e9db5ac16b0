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
#include "scenarios.hpp"

using namespace af;
using namespace af::testing;
using namespace std::chrono_literals;

namespace {

/// A directory with "emb" float32 [4, 2] (row r: r, r) and "bias" [1] (0.5).
std::shared_ptr<variable_directory> small_ps() {
  auto cell_of = [](const std::string& name, tensor value) {
    auto cell = std::make_shared<variable_cell>(
      variable_spec{name, value.type(), value.shape(), "/job:ps/replica:0/task:0/device:CPU:0"});
    REQUIRE(cell->initialize(initializer::from_tensor(value), false, ""));
    return cell;
  };
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

uint64_t requests_of(const data_plane_server& srv) {
  uint64_t n = 0;
  for (const auto& t : srv.counters().transports)
    n += t.requests.load();
  return n;
}

uint64_t variable_ops_of(const data_plane_server& srv) {
  uint64_t n = 0;
  for (const auto& t : srv.counters().transports)
    n += t.variable_ops.load();
  return n;
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
