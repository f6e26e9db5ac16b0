// The fuzz targets' inputs as regression cases (docs/fuzzing.md): every file
// of fuzz/corpus/<target>/ (the seeds and what the fuzzer kept) and of
// fuzz/regressions/<target>/ (each crash or hang a fuzzer found, after its
// fix) goes through the same function of fuzz/harness.hpp that the libFuzzer
// target calls, here in the normal g++ build. Plus the cases behind the fixes,
// with what the error must say.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "caf/binary_deserializer.hpp"
#include "caf/binary_serializer.hpp"

#include "config/cluster_spec.hpp"
#include "core/utf8.hpp"
#include "fuzz/harness.hpp"
#include "messages/error.hpp"
#include "messages/serialization.hpp"

namespace fs = std::filesystem;
using namespace af;

namespace {

using harness_fn = std::string (*)(const uint8_t*, size_t);

struct target {
  const char* name;
  harness_fn fn;
};

const std::vector<target>& targets() {
  static const std::vector<target> all{
    {"cluster_toml", fuzz::cluster_toml}, {"cluster_json", fuzz::cluster_json},
    {"train_config", fuzz::train_config}, {"device_name", fuzz::device_name},
    {"wire_header", fuzz::wire_header},   {"tensor_decode", fuzz::tensor_decode},
    {"repl_parser", fuzz::repl_parser},   {"data_plane", fuzz::data_plane}};
  return all;
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in{p, std::ios::binary};
  return {std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
}

/// Runs every file under fuzz/<kind>/<target>/; the number of files run.
size_t replay(const char* kind, const target& t) {
  auto dir = fs::path{ACTORFLOW_SOURCE_DIR} / "fuzz" / kind / t.name;
  size_t n = 0;
  if (!fs::is_directory(dir))
    return 0;
  for (const auto& entry : fs::directory_iterator{dir}) {
    if (!entry.is_regular_file())
      continue;
    auto bytes = read_bytes(entry.path());
    INFO(t.name << " input " << entry.path().string() << " (" << bytes.size() << " bytes)");
    CHECK(t.fn(bytes.data(), bytes.size()) == "");
    ++n;
  }
  return n;
}

/// A tensor's bytes as CAF's binary_serializer writes them (messages/types.cpp):
/// has_value, dtype, the shape, then the buffer's length and `raw` bytes of it.
std::vector<char> encoded_tensor(uint8_t type, const shape_type& shape, uint32_t announced,
                                 size_t raw) {
  std::vector<char> out;
  caf::binary_serializer sink{nullptr, out};
  uint8_t has_value = 1;
  auto copy = shape;
  REQUIRE(!sink(has_value, type, copy));
  size_t n = announced;
  REQUIRE(!sink.begin_sequence(n));
  out.resize(out.size() + raw, '\0');
  return out;
}

caf::error decode(const std::vector<char>& bytes, tensor& t) {
  caf::binary_deserializer source{nullptr, bytes.data(), bytes.size()};
  return inspect(source, t);
}

/// Sets the decoder's cap for one test and puts the old one back.
struct decode_cap {
  uint64_t before = max_decoded_tensor_bytes();
  explicit decode_cap(uint64_t bytes) { set_max_decoded_tensor_bytes(bytes); }
  ~decode_cap() { set_max_decoded_tensor_bytes(before); }
};

} // namespace

TEST_CASE("every fuzz corpus and crash input goes through its target's code without a problem",
          "[fuzz]") {
  for (const auto& t : targets()) {
    auto seeds = replay("corpus", t);
    // An empty corpus would make this test pass without running anything.
    CHECK(seeds > 0);
    replay("regressions", t);
  }
}

TEST_CASE("a tensor from the wire whose shape overflows is refused, not wrapped to 0 elements",
          "[fuzz][tensor]") {
  // [2^32, 2^32] float32: 2^64 elements wrap to 0 in int64, which matched an
  // announced length of 0 and made a tensor whose shape lies about its buffer.
  tensor t;
  auto err = decode(encoded_tensor(0, {int64_t{1} << 32, int64_t{1} << 32}, 0, 0), t);
  REQUIRE(err);
  CHECK_THAT(describe(err), Catch::Contains("[4294967296,4294967296]")
                               && Catch::Contains("max_message_bytes"));
  CHECK(t.empty());
  // and so is one whose element count fits but whose bytes do not
  err = decode(encoded_tensor(3, {int64_t{1} << 61}, 0, 0), t);
  REQUIRE(err);
  CHECK_THAT(describe(err), Catch::Contains("max_message_bytes"));
  CHECK(num_elements({int64_t{1} << 32, int64_t{1} << 32}) == -1);
  CHECK(num_elements({0, int64_t{1} << 62, int64_t{1} << 62}) == 0);
}

TEST_CASE("a tensor from the wire over max_message_bytes is refused before it is allocated",
          "[fuzz][tensor]") {
  decode_cap cap{1 << 20};
  tensor t;
  // exactly the cap: decoded
  REQUIRE_FALSE(decode(encoded_tensor(0, {512, 512}, 1 << 20, 1 << 20), t));
  CHECK(t.nbytes() == size_t{1} << 20);
  // one row more: refused, and the message names the limit
  auto err = decode(encoded_tensor(0, {513, 512}, 513 * 512 * 4, 0), t);
  REQUIRE(err);
  CHECK_THAT(describe(err), Catch::Contains("1048576") && Catch::Contains("max_message_bytes"));
}

TEST_CASE("a tensor announcing more bytes than its message holds is refused before allocating",
          "[fuzz][tensor]") {
  // 256 MiB announced in a message of a few bytes: before, the node allocated
  // (and the pool kept) the 256 MiB and only then found the bytes missing.
  tensor t;
  auto err = decode(encoded_tensor(0, {int64_t{1} << 26}, uint32_t{1} << 28, 16), t);
  REQUIRE(err);
  CHECK_THAT(describe(err), Catch::Contains("announcing 268435456 bytes")
                               && Catch::Contains("holds 16"));
}

TEST_CASE("TF_CONFIG with a number out of range is a config error, not an uncaught exception",
          "[fuzz][config]") {
  // nlohmann's parser throws out_of_range (not parse_error) for 1e400: the
  // node died in std::terminate before.
  auto cfg = parse_cluster_json(R"({"cluster": {"ps": ["a:1"]}, "task": {"index": 1e400}})",
                                "TF_CONFIG");
  REQUIRE_FALSE(cfg);
  CHECK_THAT(describe(cfg.error()), Catch::Contains("TF_CONFIG") && Catch::Contains("1e400"));
  // and a task index beyond int32 is refused instead of wrapping to task 0
  cfg = parse_cluster_json(
    R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 4294967296}})", "TF_CONFIG");
  REQUIRE_FALSE(cfg);
  CHECK_THAT(describe(cfg.error()), Catch::Contains("task.index"));
}

TEST_CASE("a config that is not UTF-8 is refused before toml11 reads it", "[fuzz][config]") {
  // toml11 3.7.1 read past its buffer reporting invalid UTF-8 in a literal
  // string key (ASan: heap-buffer-overflow); the file is refused first now.
  auto cfg = parse_cluster_toml("[cluster]\nps = [\"a:1\"]\n'k\xcc ' = 1\n", "c.toml");
  REQUIRE_FALSE(cfg);
  CHECK_THAT(describe(cfg.error()), Catch::Contains("c.toml") && Catch::Contains("line 3")
                                      && Catch::Contains("not UTF-8"));
  CHECK(utf8_problem("ps = \"h\xc3\xa9\" # \xf0\x9f\x98\x80").empty()); // é and an emoji are fine
  CHECK_FALSE(utf8_problem("\xc0\xaf").empty());                        // an overlong '/'
  CHECK_FALSE(utf8_problem("\xed\xa0\x80").empty());                    // a surrogate
}

TEST_CASE("a bracketed host must be an IPv6 address", "[fuzz][config]") {
  // "[[3]:2" parsed to host "[3", which printed as "[3:2" and no longer parsed
  CHECK_FALSE(parse_address("[[3]:2", "test"));
  CHECK_FALSE(parse_address("[localhost]:2", "test"));
  auto v6 = parse_address("[::1]:2", "test");
  REQUIRE(v6);
  CHECK(v6->host == "::1");
}
