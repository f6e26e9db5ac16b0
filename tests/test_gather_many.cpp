// gather_many (core/wire_format.hpp kind 14, docs/wire.md "gather_many"):
// a sparse step's reads of one ps in one frame. Its answers must be the
// bytes gather_rows and read give, a refused part must name itself and
// leave the connection going, a forged frame must be refused without a
// crash or an allocation its payload does not back, and a sparse step must
// send each ps one frame of reads, not one per variable.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "actors/variable.hpp"
#include "actors/variable_directory.hpp"
#include "config/loopback.hpp"
#include "core/wire_format.hpp"
#include "dist/sparse_step.hpp"
#include "messages/error.hpp"
#include "net/data_plane.hpp"
#include "plane_fixtures.hpp"
#include "scenarios.hpp"

using namespace af;
using namespace af::testing;
using namespace std::chrono_literals;

namespace {

constexpr int64_t rows = 8, width = 3;

/// Element (r, j) of the table: every one distinct.
float at(int64_t r, int64_t j) {
  return 0.25f * static_cast<float>(r * width + j) + 1.0f;
}

/// A directory with the table "emb" [rows, width] and the scalar-ish "bias" [1].
std::shared_ptr<variable_directory> table_and_bias() {
  tensor t{dtype::float32, {rows, width}};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j)
      t.mutable_data<float>()[r * width + j] = at(r, j);
  auto dir = std::make_shared<variable_directory>();
  dir->put("emb", {variable_cell_actor{}, cell_of("emb", t)});
  dir->put("bias", {variable_cell_actor{}, cell_of("bias", tensor::filled(dtype::float32, {1}, 0.5f))});
  return dir;
}

bool same_bytes(const tensor& a, const tensor& b) {
  return a.type() == b.type() && a.shape() == b.shape()
         && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

} // namespace

TEST_CASE("gather_many answers each part with the bytes gather_rows and read give, in one "
          "request",
          "[plane][gather_many]") {
  // Catches: parts answered out of order or at the wrong offset, a value
  // part read as rows, versions lost, and a frame counted as one request
  // per part (no saving).
  auto srv = value_of(data_plane_server::start(table_and_bias(), "127.0.0.1", 0, "test node"));
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "test node", 5s));
  auto before = requests_of(*srv);
  std::vector<data_channel::gather_ask> asks{
    {"emb", int64s({4, 0, 4})}, {"bias", tensor{}}, {"emb", int64s({7})}};
  REQUIRE_FALSE(ch->send_gather_many(asks));
  auto a = value_of(ch->next_reply());
  CHECK(requests_of(*srv) == before + 1);
  auto parts = value_of(data_channel::split_gather_many(a.value, asks.size()));
  REQUIRE(parts.size() == 3);
  auto first = value_of(ch->gather_rows("emb", int64s({4, 0, 4})));
  auto bias = value_of(ch->call(var_op::read, "bias", nullptr, true));
  auto last = value_of(ch->gather_rows("emb", int64s({7})));
  CHECK(same_bytes(parts[0].value, first.first));
  CHECK(parts[0].version == first.second);
  CHECK(same_bytes(parts[1].value, bias.first));
  CHECK(parts[1].value.shape() == shape_type{1});
  CHECK(same_bytes(parts[2].value, last.first));
  CHECK(parts[2].value.data<float>()[2] == at(7, 2));
  // The parts are views of one answer: each starts on 64 bytes of it.
  for (const auto& p : parts)
    CHECK(reinterpret_cast<uintptr_t>(p.value.bytes()) % 64
          == reinterpret_cast<uintptr_t>(a.value.bytes()) % 64);
}

TEST_CASE("a refused gather_many part names itself and the connection goes on",
          "[plane][gather_many]") {
  // Catches: an error that does not say which part (a step asks for every
  // shard of a ps at once) and an error answer that leaves the stream out
  // of step.
  auto srv = value_of(data_plane_server::start(table_and_bias(), "127.0.0.1", 0, "test node"));
  auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "test node", 5s));
  REQUIRE_FALSE(ch->send_gather_many({{"emb", int64s({1})}, {"no_such", tensor{}}}));
  auto missing = ch->next_reply();
  REQUIRE_FALSE(missing);
  CHECK(is(missing.error(), af_error::not_found));
  CHECK_THAT(describe(missing.error()), Catch::Contains("part 1") && Catch::Contains("'no_such'"));
  REQUIRE_FALSE(ch->send_gather_many({{"emb", int64s({1, 99})}, {"bias", tensor{}}}));
  auto bad = ch->next_reply();
  REQUIRE_FALSE(bad);
  CHECK(is(bad.error(), af_error::invalid_argument));
  CHECK_THAT(describe(bad.error()), Catch::Contains("part 0") && Catch::Contains("ids[1] = 99"));
  REQUIRE_FALSE(ch->send_gather_many({{"bias", int64s({0})}, {"emb", int64s({2})}}));
  auto one_row = ch->next_reply(); // bias [1] has one row: its float
  REQUIRE(one_row);
  auto split = value_of(data_channel::split_gather_many(one_row->value, 2));
  CHECK(split[0].value.data<float>()[0] == 0.5f);
  CHECK(split[1].value.data<float>()[0] == at(2, 0));
  REQUIRE_FALSE(ch->broken());
  auto ok = value_of(ch->gather_rows("emb", int64s({5})));
  CHECK(ok.first.data<float>()[0] == at(5, 0));
}

namespace {

/// A gather_many frame as a forger could write it: `parts` described by
/// `desc`, then `rest` as the payload's remaining bytes; `payload_bytes`
/// as the header claims.
std::vector<char> forged(uint32_t parts, const std::vector<wire::gather_part>& desc,
                         const std::string& rest, uint64_t payload_bytes) {
  wire::header h;
  h.kind = static_cast<uint8_t>(wire::kind::gather_many);
  h.has_tensor = 1;
  h.dtype = static_cast<uint8_t>(dtype::int32);
  h.rank = 1;
  h.dims[0] = static_cast<int64_t>(payload_bytes / 4);
  h.payload_bytes = payload_bytes;
  std::vector<char> out(sizeof(h));
  std::memcpy(out.data(), &h, sizeof(h));
  uint32_t head[2] = {parts, 0};
  out.insert(out.end(), reinterpret_cast<char*>(head), reinterpret_cast<char*>(head) + 8);
  for (const auto& d : desc)
    out.insert(out.end(), reinterpret_cast<const char*>(&d),
               reinterpret_cast<const char*>(&d) + sizeof(d));
  out.insert(out.end(), rest.begin(), rest.end());
  // What the header claims and the bytes sent agree: the node reads the
  // payload whole, then finds what is wrong with it.
  out.resize(sizeof(h) + payload_bytes, 0);
  return out;
}

} // namespace

TEST_CASE("a forged gather_many is refused by what is wrong with it, and the node serves on",
          "[plane][gather_many][limits]") {
  // Catches: counts and name lengths trusted past the payload (a read out
  // of bounds), a part count that makes the node allocate, and a refusal
  // that drops the connection or the node.
  data_plane_limits limits;
  limits.max_message_bytes = 64 << 10;
  auto srv = value_of(data_plane_server::start(table_and_bias(), "127.0.0.1", 0, "test node",
                                               limits));
  struct bad_frame {
    std::vector<char> bytes;
    const char* says;
  };
  auto part = [](uint32_t name_len, uint32_t what, uint64_t count) {
    wire::gather_part d;
    d.name_len = name_len;
    d.what = what;
    d.count = count;
    return d;
  };
  std::string emb_ids = std::string("emb") + std::string(5, '\0') + std::string(8, '\0');
  std::vector<bad_frame> frames{
    {forged(0, {}, "", 8), "0 parts"},
    {forged(100000, {}, "", 8), "100000 parts"},
    {forged(2, {part(3, 0, 1)}, "", 24), "2 parts described in 24 bytes"},
    {forged(1, {part(3, 0, uint64_t{1} << 60)}, emb_ids, 40), "announces"},
    {forged(1, {part(3, 0, 2)}, emb_ids, 40), "where its parts need 48"},
    {forged(1, {part(0, 0, 1)}, emb_ids, 40), "a variable of 0 bytes"},
    {forged(1, {part(3, 7, 1)}, emb_ids, 40), "of kind 7"},
    {forged(1, {part(3, 1, 1)}, emb_ids, 40), "reads a value with 1 ids"},
    {forged(1, {part(3, 0, 0)}, emb_ids, 40), "asks for no rows"},
  };
  for (const auto& f : frames) {
    INFO(f.says);
    auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "test node", 5s));
    int fd = connect_loopback(srv->port());
    REQUIRE(fd >= 0);
    REQUIRE(send(fd, f.bytes.data(), f.bytes.size(), MSG_NOSIGNAL)
            == static_cast<ssize_t>(f.bytes.size()));
    wire::header r;
    REQUIRE(recv(fd, &r, sizeof(r), MSG_WAITALL) == static_cast<ssize_t>(sizeof(r)));
    CHECK(r.status == static_cast<uint8_t>(af_error::invalid_argument));
    std::string text(std::min<uint64_t>(r.payload_bytes, 4096), '\0');
    REQUIRE(recv(fd, text.data(), text.size(), MSG_WAITALL) == static_cast<ssize_t>(text.size()));
    CHECK_THAT(text, Catch::Contains(f.says));
    // The same connection goes on: a good gather_many on it is answered.
    auto good = forged(1, {part(3, 0, 1)}, emb_ids, 40);
    REQUIRE(send(fd, good.data(), good.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(good.size()));
    REQUIRE(recv(fd, &r, sizeof(r), MSG_WAITALL) == static_cast<ssize_t>(sizeof(r)));
    CHECK(r.status == 0);
    close(fd);
    // And the node serves others.
    CHECK(ch->gather_rows("emb", int64s({3})));
  }
}

TEST_CASE("a sparse step sends each ps one frame of reads, however many of its variables it "
          "reads",
          "[sparse_step][gather_many]") {
  // Catches: a read per variable (the cost gather_many removes: ps 0 holds
  // a table shard and the bias, so it was asked twice a step), and a batch
  // held back until after another ps's answer was awaited.
  auto dir0 = table_and_bias();
  auto srv0 = value_of(data_plane_server::start(dir0, "127.0.0.1", 0, "ps 0"));
  auto dir1 = table_and_bias();
  auto srv1 = value_of(data_plane_server::start(dir1, "127.0.0.1", 0, "ps 1"));
  std::vector<std::unique_ptr<data_plane_ps_link>> owned;
  std::vector<sparse_ps_link*> links;
  for (auto* srv : {srv0.get(), srv1.get()}) {
    auto ch = value_of(data_channel::connect("127.0.0.1", srv->port(), "ps", 5s));
    owned.push_back(std::make_unique<data_plane_ps_link>(std::move(ch), "agg", 0, "", 0, 10s));
    links.push_back(owned.back().get());
  }
  // Two reads of ps 0 (a shard's rows, the bias) and one of ps 1.
  REQUIRE_FALSE(links[0]->start_gather_rows("emb", int64s({6, 1})));
  REQUIRE_FALSE(links[0]->start_read("bias"));
  REQUIRE_FALSE(links[1]->start_gather_rows("emb", int64s({2})));
  auto r0 = requests_of(*srv0), r1 = requests_of(*srv1);
  for (auto* l : links)
    l->flush();
  auto rows0 = value_of(links[0]->finish());
  auto bias0 = value_of(links[0]->finish());
  auto rows1 = value_of(links[1]->finish());
  CHECK(requests_of(*srv0) == r0 + 1);
  CHECK(requests_of(*srv1) == r1 + 1);
  CHECK(rows0.value.shape() == shape_type{2, width});
  CHECK(rows0.value.data<float>()[0] == at(6, 0));
  CHECK(rows0.value.data<float>()[width] == at(1, 0));
  CHECK(bias0.value.data<float>()[0] == 0.5f);
  CHECK(rows1.value.data<float>()[1] == at(2, 1));
  // finish() sends what was held if no flush() came first.
  REQUIRE_FALSE(links[1]->start_read("bias"));
  REQUIRE_FALSE(links[1]->start_gather_rows("emb", int64s({0})));
  auto b1 = value_of(links[1]->finish());
  CHECK(b1.value.data<float>()[0] == 0.5f);
  auto e1 = value_of(links[1]->finish());
  CHECK(e1.value.data<float>()[2] == at(0, 2));
  CHECK(requests_of(*srv1) == r1 + 2);
}
