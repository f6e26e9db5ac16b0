// The TensorBoard event files' pieces (summary/): CRC-32C against its check
// value, the TFRecord frame, TensorFlow's histogram buckets, the file name.
// What a whole job writes is read back by an independent reader in
// test_tensorboard.cpp.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cfloat>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
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
  // TensorFlow's crc32c::Mask (rotate right by 15, add 0xa282ead8), worked
  // out apart from the code (restating the expression here could not fail).
  CHECK(mask_crc(0xE3069283u) == 0xC78AB0E5u);
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

namespace {

/// One field of a protobuf message as the wire carries it: its number, its
/// wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32) and its
/// value (the integer, or the bytes of a length-delimited one).
struct wire_field {
  int number = 0;
  int type = 0;
  uint64_t integer = 0;
  std::string bytes;
};

/// The fields of `msg`, decoded by hand from the wire format, so that the
/// field numbers below are checked against TensorFlow's public ones and not
/// against summary/event.proto (the same .proto on both sides would hide a
/// wrong number).
std::vector<wire_field> decode(const std::string& msg) {
  std::vector<wire_field> out;
  size_t at = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0; at < msg.size(); shift += 7) {
      auto b = static_cast<unsigned char>(msg[at++]);
      v |= static_cast<uint64_t>(b & 0x7Fu) << shift;
      if (!(b & 0x80u))
        return v;
    }
    FAIL("a varint cut short");
    return v;
  };
  auto fixed = [&](int n) {
    REQUIRE(at + n <= msg.size());
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i)
      v = (v << 8) | static_cast<unsigned char>(msg[at + i]);
    at += n;
    return v;
  };
  while (at < msg.size()) {
    wire_field f;
    auto key = varint();
    f.number = static_cast<int>(key >> 3);
    f.type = static_cast<int>(key & 7);
    if (f.type == 0) {
      f.integer = varint();
    } else if (f.type == 1) {
      f.integer = fixed(8);
    } else if (f.type == 5) {
      f.integer = fixed(4);
    } else {
      REQUIRE(f.type == 2);
      auto n = varint();
      REQUIRE(at + n <= msg.size());
      f.bytes = msg.substr(at, n);
      at += n;
    }
    out.push_back(f);
  }
  return out;
}

const wire_field* field(const std::vector<wire_field>& fields, int number) {
  for (const auto& f : fields)
    if (f.number == number)
      return &f;
  return nullptr;
}

double as_double(uint64_t bits) {
  double d = 0;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

/// The records of the TFRecord file at `path` (framing checked in the case above).
std::vector<std::string> file_records(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  std::string all{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
  std::vector<std::string> out;
  for (size_t at = 0; at + 12 <= all.size();) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i)
      n = (n << 8) | static_cast<unsigned char>(all[at + i]);
    REQUIRE(at + 16 + n <= all.size());
    out.push_back(all.substr(at + 12, n));
    at += 16 + n;
  }
  return out;
}

} // namespace

TEST_CASE("event_file writes TensorFlow's field numbers of Event, Summary, HistogramProto and "
          "SessionLog",
          "[summary]") {
  // Catches: a wrong field number or type in summary/event.proto (the tests'
  // reader compiles the same .proto, so it would read such a file back and
  // TensorBoard would not). The numbers are those of TensorFlow's
  // core/util/event.proto and core/framework/summary.proto.
  auto dir = std::filesystem::temp_directory_path()
             / ("actorflow-summary-wire-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::string error;
  auto f = event_file::open(dir.string(), error);
  REQUIRE(f);
  f->scalars(7, {{"loss", 0.5}});
  std::vector<float> v = {1.0f, 2.0f};
  f->histograms(8, {{"values/w", make_histogram(v.data(), v.size())}});
  f->start_at(9);
  REQUIRE(f->flush());
  auto records = file_records(f->path());
  f.reset();
  std::filesystem::remove_all(dir);
  REQUIRE(records.size() == 4);

  // Event: wall_time = 1 (double), step = 2 (int64), file_version = 3.
  auto first = decode(records[0]);
  REQUIRE(field(first, 1));
  CHECK(field(first, 1)->type == 1);
  CHECK(as_double(field(first, 1)->integer) > 1.5e9); // seconds since the epoch
  REQUIRE(field(first, 3));
  CHECK(field(first, 3)->bytes == "brain.Event:2");

  // summary = 5; Summary.value = 1; Value.tag = 1, simple_value = 2 (float).
  auto scalar = decode(records[1]);
  REQUIRE(field(scalar, 2));
  CHECK(field(scalar, 2)->type == 0);
  CHECK(field(scalar, 2)->integer == 7);
  REQUIRE(field(scalar, 5));
  auto summary = decode(field(scalar, 5)->bytes);
  REQUIRE(field(summary, 1));
  auto value = decode(field(summary, 1)->bytes);
  REQUIRE(field(value, 1));
  CHECK(field(value, 1)->bytes == "loss");
  REQUIRE(field(value, 2));
  CHECK(field(value, 2)->type == 5);
  float simple = 0;
  auto bits = static_cast<uint32_t>(field(value, 2)->integer);
  std::memcpy(&simple, &bits, sizeof simple);
  CHECK(simple == 0.5f);

  // Value.histo = 5; HistogramProto: min 1, max 2, num 3, sum 4,
  // sum_squares 5 (doubles), bucket_limit 6 and bucket 7 (packed doubles).
  auto histo_event = decode(records[2]);
  REQUIRE(field(histo_event, 5));
  auto hv = decode(field(decode(field(histo_event, 5)->bytes), 1)->bytes);
  CHECK(field(hv, 1)->bytes == "values/w");
  REQUIRE(field(hv, 5));
  CHECK(field(hv, 5)->type == 2);
  auto h = decode(field(hv, 5)->bytes);
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    REQUIRE(field(h, n));
    CHECK(field(h, n)->type == 1);
  }
  CHECK(as_double(field(h, 1)->integer) == 1.0);
  CHECK(as_double(field(h, 2)->integer) == 2.0);
  CHECK(as_double(field(h, 3)->integer) == 2.0);
  CHECK(as_double(field(h, 4)->integer) == 3.0);
  CHECK(as_double(field(h, 5)->integer) == 5.0);
  REQUIRE(field(h, 6));
  REQUIRE(field(h, 7));
  CHECK(field(h, 6)->type == 2);
  CHECK(field(h, 7)->type == 2);
  CHECK(field(h, 6)->bytes.size() == field(h, 7)->bytes.size());
  CHECK(field(h, 6)->bytes.size() % 8 == 0);

  // session_log = 7; SessionLog.status = 1, START = 1.
  auto start = decode(records[3]);
  REQUIRE(field(start, 2));
  CHECK(field(start, 2)->integer == 9);
  REQUIRE(field(start, 7));
  auto log = decode(field(start, 7)->bytes);
  REQUIRE(field(log, 1));
  CHECK(field(log, 1)->type == 0);
  CHECK(field(log, 1)->integer == 1);
}

TEST_CASE("an event file removed while the job runs is started again at the next flush",
          "[summary]") {
  // Catches: a writer that goes on into a removed file (its run folder
  // cleaned while the job runs): nothing more of the job reaches TensorBoard;
  // and a restart that leaves stray empty event files behind.
  auto dir = std::filesystem::temp_directory_path()
             / ("actorflow-summary-removed-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::string error;
  auto f = event_file::open((dir / "train").string(), error);
  REQUIRE(f);
  f->scalars(1, {{"loss", 1.0}});
  REQUIRE(f->flush());
  std::filesystem::remove_all(dir);
  // The new file is named by a later second than the removed one (as in a
  // job that runs a while), so its name is not the removed file's: wait
  // for the clock's next second (a condition, at most a second).
  auto second = [] {
    return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
  };
  for (auto opened = second(); second() == opened;)
    std::this_thread::yield();
  f->scalars(2, {{"loss", 2.0}});
  CHECK(f->flush());
  CHECK(f->error().empty());
  REQUIRE(std::filesystem::exists(f->path()));
  CHECK(std::filesystem::path{f->path()}.parent_path() == dir / "train");
  f->scalars(3, {{"loss", 3.0}});
  REQUIRE(f->flush());
  auto records = file_records(f->path());
  f.reset();
  // One file in the run, the new one: the removed file's close started no
  // other (each such close found its file gone and began another, a
  // thousand empty event files in all).
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "train"))
    files += e.path().filename().string().find("tfevents") != std::string::npos ? 1 : 0;
  CHECK(files == 1);
  std::filesystem::remove_all(dir);
  // file_version, then step 3 (step 2 went with the removed file).
  REQUIRE(records.size() == 2);
  CHECK(field(decode(records[0]), 3)->bytes == "brain.Event:2");
  REQUIRE(field(decode(records[1]), 2));
  CHECK(field(decode(records[1]), 2)->integer == 3);
}

TEST_CASE("an event file closed leaves every event written before, readable, and drops later "
          "ones",
          "[summary]") {
  // Catches: a close that loses what is still buffered (the job's last
  // steps), and writes after it into a closed file. That the events reach
  // the disk (fsync) cannot be seen from here: the test would need the
  // machine to lose power; close() syncs the file and its folder.
  auto dir = std::filesystem::temp_directory_path()
             / ("actorflow-summary-closed-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::string error;
  auto f = event_file::open(dir.string(), error);
  REQUIRE(f);
  for (int step = 1; step <= 100; ++step)
    f->scalars(step, {{"loss", 1.0 / step}}); // buffered: no flush between them
  CHECK(f->sync());
  f->scalars(101, {{"loss", 0.5}});
  REQUIRE(f->close());
  CHECK(f->error().empty());
  CHECK(f->close()); // twice: nothing more to do
  f->scalars(102, {{"loss", 0.25}});
  CHECK(f->flush());
  auto records = file_records(f->path());
  f.reset();
  std::filesystem::remove_all(dir);
  // file_version, then steps 1..101, none after the close.
  REQUIRE(records.size() == 102);
  CHECK(field(decode(records[0]), 3)->bytes == "brain.Event:2");
  for (int step = 1; step <= 101; ++step) {
    CAPTURE(step);
    REQUIRE(field(decode(records[static_cast<size_t>(step)]), 2));
    CHECK(field(decode(records[static_cast<size_t>(step)]), 2)->integer
          == static_cast<uint64_t>(step));
  }
}
