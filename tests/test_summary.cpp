// The TensorBoard event files' pieces (summary/): CRC-32C against its check
// value, the TFRecord frame, TensorFlow's histogram buckets, the file name.
// What a whole job writes is read back by an independent reader in
// test_tensorboard.cpp.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cstring>
#include <string>
#include <vector>

#include "summary/crc32c.hpp"
#include "summary/event_file.hpp"
#include "summary/histogram.hpp"

using namespace af::summary;

TEST_CASE("crc32c gives CRC-32C's check values and masks as TFRecord does", "[summary]") {
  // Catches: another polynomial (plain CRC-32's crc("123456789") is 0xCBF43926),
  // a missing final inversion, a mask rotated the wrong way.
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  std::string zeros(32, '\0');
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu); // RFC 3720 B.4
  std::string ones(32, '\xff');
  CHECK(crc32c(ones.data(), ones.size()) == 0x62A8AB43u);
  // Continuing a CRC over a second part is the CRC of the whole.
  CHECK(crc32c("56789", 5, crc32c("1234", 4)) == 0xE3069283u);
  CHECK(mask_crc(0xE3069283u) == (((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u));
  CHECK(mask_crc(0) == 0xa282ead8u);
}

TEST_CASE("frame_record writes the length, its masked CRC, the data and its masked CRC",
          "[summary]") {
  std::string data = "an event";
  auto rec = frame_record(data);
  REQUIRE(rec.size() == 8 + 4 + data.size() + 4);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i)
    length = (length << 8) | static_cast<unsigned char>(rec[i]);
  CHECK(length == data.size());
  auto le32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i)
      v = (v << 8) | static_cast<unsigned char>(rec[at + i]);
    return v;
  };
  CHECK(le32(8) == mask_crc(crc32c(rec.data(), 8)));
  CHECK(rec.substr(12, data.size()) == data);
  CHECK(le32(12 + data.size()) == mask_crc(crc32c(data.data(), data.size())));
}

TEST_CASE("make_histogram counts each finite value in TensorFlow's default buckets",
          "[summary]") {
  const auto& limits = default_limits();
  // TensorFlow's: 774 positive limits from 1e-12 (x1.1) below 1e20, DBL_MAX,
  // their negatives and 0.
  REQUIRE(limits.size() == 2 * 775 + 1);
  CHECK(limits.front() == -DBL_MAX);
  CHECK(limits.back() == DBL_MAX);
  CHECK(limits[775] == 0.0);
  std::vector<float> v = {-2.0f, -2.0f, 0.0f, 0.5f, 3.0f, NAN, INFINITY};
  auto h = make_histogram(v.data(), v.size());
  CHECK(h.num == 5);
  CHECK(h.min == -2.0);
  CHECK(h.max == 3.0);
  CHECK(h.sum == Approx(-0.5));
  CHECK(h.sum_squares == Approx(4 + 4 + 0.25 + 9));
  REQUIRE(h.limits.size() == h.counts.size());
  double total = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    total += h.counts[i];
    if (i > 0)
      CHECK(h.limits[i] > h.limits[i - 1]);
  }
  CHECK(total == 5);
  // Each value is in the bucket whose limit is the first above it: -2 twice
  // in one, 0 in the one up to the smallest positive limit.
  auto count_at = [&](double x) {
    for (size_t i = 0; i < h.limits.size(); ++i)
      if (x < h.limits[i])
        return h.counts[i];
    return -1.0;
  };
  CHECK(count_at(-2.0) == 2);
  CHECK(count_at(0.0) == 1);
  CHECK(count_at(0.5) == 1);
  CHECK(count_at(3.0) == 1);
  // Runs of empty buckets are one: far fewer buckets than limits.
  CHECK(h.counts.size() < 20);
}

TEST_CASE("event_file_name follows TensorFlow's events.out.tfevents.<seconds>.<host>",
          "[summary]") {
  CHECK(event_file_name(1733450000, "node-1") == "events.out.tfevents.1733450000.node-1");
  CHECK(event_file_name(42, "h") == "events.out.tfevents.0000000042.h");
}
