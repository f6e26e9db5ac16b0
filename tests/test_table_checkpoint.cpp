// Checkpoints of partitioned tables, shard by shard (train/table_checkpoint.hpp,
// issue 25): saved by 3 shards, restored onto 2 and 4 shards of mod and div,
// values and slots bit-identical to a one-piece reference; torn, corrupt,
// foreign and mismatched files refused naming the file. Each case says which
// bug it catches.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "kernels/shard_routing.hpp"
#include "train/digest.hpp"
#include "train/table_checkpoint.hpp"
#include "temp_dir.hpp"

using namespace af;
using kernels::partition_strategy;
using train::table_checkpoint_layout;

namespace {

constexpr int64_t rows = 13, dim = 5;

/// A one-piece table and its two slots: distinct, non-integer floats, so a
/// row, column or slot read from the wrong place is seen.
struct reference {
  std::vector<float> value, m, v;
  reference() {
    for (int64_t i = 0; i < rows * dim; ++i) {
      value.push_back(static_cast<float>(i) * 0.37f + 0.011f);
      m.push_back(-static_cast<float>(i) * 1.13f - 0.5f);
      v.push_back(static_cast<float>(i * i) * 0.017f + 0.25f);
    }
  }
};

/// The global ids of shard k's rows, written out (mod: k, k + n, ...; else runs).
std::vector<int64_t> ids_of(partition_strategy s, const std::vector<int64_t>& sizes, size_t k) {
  std::vector<int64_t> out;
  int64_t first = 0;
  for (size_t i = 0; i < k; ++i)
    first += sizes[i];
  for (int64_t r = 0; r < sizes[k]; ++r)
    out.push_back(s == partition_strategy::mod ? r * static_cast<int64_t>(sizes.size())
                                                   + static_cast<int64_t>(k)
                                               : first + r);
  return out;
}

std::vector<float> rows_of(const std::vector<float>& full, const std::vector<int64_t>& ids) {
  std::vector<float> out;
  for (auto id : ids)
    out.insert(out.end(), full.begin() + id * dim, full.begin() + (id + 1) * dim);
  return out;
}

/// Saves `ref` as `n` shards of `s` in `dir` (chunks of 2 rows: several per
/// shard), each shard written from its own buffers, then the manifest.
table_checkpoint_layout save(const std::string& dir, const reference& ref, partition_strategy s,
                             size_t n, const std::string& key = {}) {
  table_checkpoint_layout l;
  l.table = "emb/w";
  l.strategy = s;
  l.shard_rows = kernels::balanced_shard_rows(rows, static_cast<int64_t>(n));
  l.row_shape = {dim};
  l.slots = {"m", "v"};
  l.global_step = 17;
  for (size_t k = 0; k < n; ++k) {
    auto ids = ids_of(s, l.shard_rows, k);
    auto value = rows_of(ref.value, ids), m = rows_of(ref.m, ids), v = rows_of(ref.v, ids);
    auto path = train::write_table_shard(dir, l, k, {value.data(), {m.data(), v.data()}},
                                         2 * dim * 4 * 3);
    INFO((path ? std::string{} : path.error().what));
    REQUIRE(path);
  }
  auto manifest = train::write_table_manifest(dir, l, key);
  INFO((manifest ? std::string{} : manifest.error().what));
  REQUIRE(manifest);
  return l;
}

/// Restores shard k of `sizes` by `s`, slots {"m", "v"}, or an error's text.
/// With a `key`, as a job with checkpoint_key does: the chief's check of the
/// manifest (verify_table_manifest), then the ps's read against its SHA-256.
std::string restore(const std::string& dir, partition_strategy s, const std::vector<int64_t>& sizes,
                    size_t k, std::vector<float>& value, std::vector<float>& m,
                    std::vector<float>& v, shape_type row_shape = {dim},
                    const std::string& key = {}) {
  std::string digest;
  if (!key.empty()) {
    auto d = train::verify_table_manifest(dir, "emb/w", key);
    if (!d)
      return d.error().what;
    digest = *d;
  }
  auto saved = train::read_table_manifest(dir, "emb/w", digest);
  if (!saved)
    return saved.error().what;
  value.assign(static_cast<size_t>(sizes[k] * dim), 0);
  m = value;
  v = value;
  train::table_shard_target t;
  t.strategy = s;
  t.shard_rows = sizes;
  t.k = k;
  t.row_shape = row_shape;
  t.slot_names = {"m", "v"};
  t.value = value.data();
  t.slots = {m.data(), v.data()};
  auto st = train::read_table_shard(dir, *saved, t);
  return st ? std::string{} : st.error().what;
}

/// What a forger without the key can do to shard file `path`: write `x` as
/// float `float_in_chunk0` of its first chunk (chunks of 2 rows) and put
/// that chunk's new SHA-256 in the trailer, so the file's own digests hold.
void forge_chunk0(const std::string& path, size_t float_in_chunk0, float x) {
  std::ifstream in{path, std::ios::binary};
  std::string bytes{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
  in.close();
  uint32_t header_len = 0;
  std::memcpy(&header_len, bytes.data() + 8, 4);
  size_t data = 8 + 4 + header_len + train::digest_size, chunk = 2 * dim * 4 * 3;
  uint64_t chunks = 0;
  std::memcpy(&chunks, bytes.data() + bytes.size() - 16, 8);
  std::memcpy(bytes.data() + data + float_in_chunk0 * 4, &x, 4);
  auto digest = train::sha256(bytes.data() + data, chunk);
  bytes.replace(bytes.size() - 16 - train::digest_size * chunks, train::digest_size, digest);
  std::ofstream{path, std::ios::binary | std::ios::trunc} << bytes;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

} // namespace

TEST_CASE("a table saved as 3 mod shards restores as 2 and 4 shards of mod and div, values and "
          "slots bit-identical to the one-piece table",
          "[table_checkpoint]") {
  // Catches: a new shard reading another old shard's rows (the old or the new
  // router wrong), a row's slots read at the value's place or another slot's,
  // a chunk boundary off by one (chunks of 2 rows), the last short chunk lost.
  testing::temp_dir dir;
  reference ref;
  save(dir.path, ref, partition_strategy::mod, 3);
  for (auto s : {partition_strategy::mod, partition_strategy::div}) {
    for (size_t n : {2, 4, 1}) {
      auto sizes = kernels::balanced_shard_rows(rows, static_cast<int64_t>(n));
      for (size_t k = 0; k < n; ++k) {
        CAPTURE(kernels::to_string(s), n, k);
        std::vector<float> value, m, v;
        REQUIRE(restore(dir.path, s, sizes, k, value, m, v).empty());
        auto ids = ids_of(s, sizes, k);
        CHECK(same_bits(value, rows_of(ref.value, ids)));
        CHECK(same_bits(m, rows_of(ref.m, ids)));
        CHECK(same_bits(v, rows_of(ref.v, ids)));
      }
    }
  }
  // contiguous pieces of any sizes too
  std::vector<int64_t> uneven{1, 10, 2};
  for (size_t k = 0; k < uneven.size(); ++k) {
    std::vector<float> value, m, v;
    REQUIRE(restore(dir.path, partition_strategy::contiguous, uneven, k, value, m, v).empty());
    CHECK(same_bits(value, rows_of(ref.value, ids_of(partition_strategy::contiguous, uneven, k))));
  }
}

TEST_CASE("a restored shard reads only the old shard files that hold its rows",
          "[table_checkpoint]") {
  // Catches: a restore that reads (or needs) the whole table: a new div shard
  // whose rows all sit in old shard 0 restores with the other files gone.
  testing::temp_dir dir;
  reference ref;
  auto saved = save(dir.path, ref, partition_strategy::div, 3); // rows [0,5) [5,9) [9,13)
  REQUIRE(::unlink(train::table_shard_path(dir.path, "emb/w", 1, 3).c_str()) == 0);
  REQUIRE(::unlink(train::table_shard_path(dir.path, "emb/w", 2, 3).c_str()) == 0);
  auto sizes = kernels::balanced_shard_rows(rows, 4); // shard 0: rows [0, 4)
  std::vector<float> value, m, v;
  REQUIRE(restore(dir.path, partition_strategy::div, sizes, 0, value, m, v).empty());
  CHECK(same_bits(value, rows_of(ref.value, ids_of(partition_strategy::div, sizes, 0))));
  // shard 1 ([4, 7)) needs old shard 1: refused, naming the file
  auto why = restore(dir.path, partition_strategy::div, sizes, 1, value, m, v);
  CHECK_THAT(why, Catch::Contains(train::table_shard_path(dir.path, "emb/w", 1, 3)));
}

TEST_CASE("a slot the table checkpoint lacks starts at its initial value", "[table_checkpoint]") {
  // Catches: an adagrad accumulator restored at 0 from a checkpoint of
  // another optimizer (the update would divide by zero).
  testing::temp_dir dir;
  reference ref;
  auto saved = save(dir.path, ref, partition_strategy::mod, 3);
  std::vector<float> value(static_cast<size_t>(7 * dim)), acc(value.size()), m(value.size());
  train::table_shard_target t;
  t.strategy = partition_strategy::mod;
  t.shard_rows = kernels::balanced_shard_rows(rows, 2);
  t.row_shape = {dim};
  t.slot_names = {"accumulator", "m"};
  t.slot_starts = {0.1f, 0.0f};
  t.value = value.data();
  t.slots = {acc.data(), m.data()};
  REQUIRE(train::read_table_shard(dir.path, *train::read_table_manifest(dir.path, "emb/w"), t));
  CHECK(acc == std::vector<float>(acc.size(), 0.1f));
  CHECK(same_bits(m, rows_of(ref.m, ids_of(partition_strategy::mod, t.shard_rows, 0))));
}

TEST_CASE("torn, corrupt, foreign and mismatched table checkpoint files are refused naming the "
          "file and what is wrong",
          "[table_checkpoint]") {
  // Catches: a restore that takes a cut-short file (a crash mid-write by
  // hand, a full disk) or another table's or step's file as its rows.
  testing::temp_dir dir;
  reference ref;
  save(dir.path, ref, partition_strategy::mod, 3);
  auto sizes = kernels::balanced_shard_rows(rows, 2);
  auto shard1 = train::table_shard_path(dir.path, "emb/w", 1, 3);
  std::vector<float> value, m, v;
  SECTION("torn") {
    auto size = std::filesystem::file_size(shard1);
    std::filesystem::resize_file(shard1, size - 3);
    auto why = restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v);
    CHECK_THAT(why, Catch::Contains("'" + shard1 + "' is torn"));
  }
  SECTION("a flipped byte in a chunk") {
    auto size = std::filesystem::file_size(shard1);
    std::fstream f{shard1, std::ios::in | std::ios::out | std::ios::binary};
    // into the last of its 2 chunks' data, before the trailer (2 digests,
    // the count, the end magic)
    f.seekp(static_cast<std::streamoff>(size - 16 - 2 * train::digest_size - 4 * 8));
    f.put('\x7f');
    f.close();
    auto why = restore(dir.path, partition_strategy::mod, sizes, 1, value, m, v);
    CHECK_THAT(why, Catch::Contains("'" + shard1 + "' fails the digest of chunk 1"));
  }
  SECTION("foreign: another shard's file in its place") {
    std::filesystem::copy_file(train::table_shard_path(dir.path, "emb/w", 2, 3), shard1,
                               std::filesystem::copy_options::overwrite_existing);
    auto why = restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v);
    CHECK_THAT(why, Catch::Contains("'" + shard1 + "' is not shard 1")
                      && Catch::Contains("foreign"));
  }
  SECTION("foreign: not a shard file at all") {
    testing::write_file(shard1, "hello, not a table");
    auto why = restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v);
    CHECK_THAT(why, Catch::Contains("'" + shard1 + "' is not a table checkpoint shard file"));
  }
  SECTION("forged: a value with its chunk's digest recomputed") {
    // Catches: a restore that trusts a chunk's digest without the file's
    // digest in the manifest (the trailer is the forger's to rewrite).
    forge_chunk0(shard1, 1, 123.0f);
    auto why = restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v);
    CHECK_THAT(why, Catch::Contains("'" + shard1 + "' does not match the digest its manifest"));
  }
  // Without a key, a forger who rewrites the manifest too passes every
  // digest: the values are still checked.
  auto forge_all = [&](size_t float_in_chunk0, float x) {
    forge_chunk0(shard1, float_in_chunk0, x);
    REQUIRE(train::write_table_manifest(dir.path, *train::read_table_manifest(dir.path, "emb/w")));
  };
  SECTION("forged with its manifest: a NaN value") {
    // Catches: a NaN restored (the job then fails at every start, in a
    // worker's push, naming no file).
    forge_all(1, std::numeric_limits<float>::quiet_NaN());
    auto why = restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v);
    CHECK_THAT(why, Catch::Contains("'" + shard1 + "'") && Catch::Contains("the value of row 0")
                      && Catch::Contains("nan at element 1"));
  }
  SECTION("forged with its manifest: a negative Adam second moment") {
    forge_all(2 * dim + 3, -1.0f);
    auto why = restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v);
    CHECK_THAT(why, Catch::Contains("'" + shard1 + "'") && Catch::Contains("slot 'v' of row 0"));
  }
  SECTION("the first format's files are refused by name") {
    std::fstream f{shard1, std::ios::in | std::ios::out | std::ios::binary};
    f.write("AFTAB001", 8);
    f.close();
    auto why = restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v);
    CHECK_THAT(why, Catch::Contains("'" + shard1 + "' is of the first format"));
  }
  SECTION("the first format's manifest is refused by name, as unsupported") {
    // Catches: a first-format manifest (FNV-1a checksum line) reported as
    // "not a table manifest (or is torn)", which tells its owner nothing.
    auto manifest = train::table_manifest_path(dir.path, "emb/w");
    std::ofstream{manifest, std::ios::binary | std::ios::trunc}
      << "actorflow table checkpoint 1\ntable emb/w\nchecksum 12345\n";
    auto read = train::read_table_manifest(dir.path, "emb/w");
    REQUIRE_FALSE(read);
    CHECK(read.error().code == af_error::unsupported);
    CHECK_THAT(read.error().what, Catch::Contains("'" + manifest + "' is of the first format"));
    auto checked = train::verify_table_manifest(dir.path, "emb/w", "0123456789abcdef");
    REQUIRE_FALSE(checked);
    CHECK_THAT(checked.error().what, Catch::Contains("is of the first format"));
  }
  SECTION("mismatched dims") {
    auto why = restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v, {dim + 1});
    CHECK_THAT(why, Catch::Contains("mismatched dims") && Catch::Contains("[5]"));
  }
  SECTION("a torn manifest") {
    auto manifest = train::table_manifest_path(dir.path, "emb/w");
    std::filesystem::resize_file(manifest, std::filesystem::file_size(manifest) - 2);
    auto why = restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v);
    CHECK_THAT(why, Catch::Contains("'" + manifest + "'") && Catch::Contains("torn"));
  }
  SECTION("a manifest over a torn shard is not written") {
    table_checkpoint_layout l = *train::read_table_manifest(dir.path, "emb/w");
    std::filesystem::resize_file(shard1, std::filesystem::file_size(shard1) - 1);
    auto manifest = train::write_table_manifest(dir.path, l);
    REQUIRE_FALSE(manifest);
    CHECK_THAT(manifest.error().what, Catch::Contains("'" + shard1 + "' is torn"));
  }
}

TEST_CASE("with a checkpoint_key, a table's manifest carries its HMAC and a forger who rewrites "
          "a shard and its manifest without the key is refused",
          "[table_checkpoint]") {
  // Catches: the HMAC covering only the job's state file, so that finite
  // forged rows (which no value check can tell) were restored; and a ps
  // reading another manifest than the one the chief checked.
  testing::temp_dir dir;
  reference ref;
  const std::string key = "0123456789abcdef0123456789abcdef";
  auto layout = save(dir.path, ref, partition_strategy::mod, 3, key);
  auto sizes = kernels::balanced_shard_rows(rows, 2);
  auto shard1 = train::table_shard_path(dir.path, "emb/w", 1, 3);
  auto manifest = train::table_manifest_path(dir.path, "emb/w");
  std::vector<float> value, m, v;
  SECTION("as written, it restores") {
    CHECK(restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v, {dim}, key).empty());
    auto ids = ids_of(partition_strategy::mod, sizes, 0);
    CHECK(same_bits(value, rows_of(ref.value, ids)));
  }
  SECTION("a finite forged row with the manifest rewritten without the key") {
    forge_chunk0(shard1, 1, 123.0f);
    REQUIRE(train::write_table_manifest(dir.path, layout));
    auto why = restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v, {dim}, key);
    CHECK_THAT(why, Catch::Contains("'" + manifest + "' has no HMAC"));
  }
  SECTION("the manifest rewritten under another key") {
    forge_chunk0(shard1, 1, 123.0f);
    REQUIRE(train::write_table_manifest(dir.path, layout, "another key, 32 bytes long......"));
    auto why = restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v, {dim}, key);
    CHECK_THAT(why, Catch::Contains("'" + manifest + "' fails its HMAC"));
  }
  SECTION("a finite forged row with only its digest changed in the keyed manifest") {
    // Catches: an HMAC over less than every line before it (the shard lines
    // with their digests): the forger keeps the genuine HMAC line, puts the
    // forged file's digest in shard 1's line and recomputes the checksum.
    auto read_text = [&]() {
      std::ifstream in{manifest, std::ios::binary};
      return std::string{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
    };
    auto genuine = read_text();
    auto before = train::read_table_manifest(dir.path, "emb/w")->shard_digests.at(1);
    forge_chunk0(shard1, 1, 123.0f);
    REQUIRE(train::write_table_manifest(dir.path, layout)); // the forged file's digest, keyless
    auto forged = train::read_table_manifest(dir.path, "emb/w")->shard_digests.at(1);
    REQUIRE(forged != before);
    auto text = genuine.substr(0, genuine.rfind("checksum "));
    REQUIRE(text.find(before) != std::string::npos);
    text.replace(text.find(before), before.size(), forged);
    text += "checksum " + train::to_hex(train::sha256(text.data(), text.size())) + "\n";
    std::ofstream{manifest, std::ios::binary | std::ios::trunc} << text;
    auto why = restore(dir.path, partition_strategy::mod, sizes, 0, value, m, v, {dim}, key);
    CHECK_THAT(why, Catch::Contains("'" + manifest + "' fails its HMAC"));
  }
  SECTION("the manifest replaced after the chief checked it") {
    auto digest = train::verify_table_manifest(dir.path, "emb/w", key);
    REQUIRE(digest);
    forge_chunk0(shard1, 1, 123.0f);
    REQUIRE(train::write_table_manifest(dir.path, layout));
    auto read = train::read_table_manifest(dir.path, "emb/w", *digest);
    REQUIRE_FALSE(read);
    CHECK_THAT(read.error().what, Catch::Contains("'" + manifest + "' is not the one the chief "
                                                  "checked"));
  }
}
