#include "summary/event_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "summary/crc32c.hpp"
#include "summary/event.pb.h"

namespace af::summary {

namespace {

namespace fs = std::filesystem;

void put_le32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

void put_le64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
    .count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0')
    return "localhost";
  // A file name: no separators (a host name has none, but be sure).
  std::string host = name;
  for (auto& ch : host)
    if (ch == '/')
      ch = '_';
  return host;
}

pb::Event event_at(int64_t step) {
  pb::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  return e;
}

} // namespace

std::string frame_record(const std::string& data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le64(out, data.size());
  put_le32(out, mask_crc(crc32c(out.data(), 8)));
  out += data;
  put_le32(out, mask_crc(crc32c(data.data(), data.size())));
  return out;
}

std::string event_file_name(int64_t seconds, const std::string& host) {
  return fmt::format("events.out.tfevents.{:010d}.{}", seconds, host);
}

std::unique_ptr<event_file> event_file::open(const std::string& dir, std::string& error) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    error = fmt::format("cannot create the TensorBoard run folder '{}': {}", dir, ec.message());
    return nullptr;
  }
  auto base = (fs::path{dir} / event_file_name(static_cast<int64_t>(now_seconds()), host_name()))
                .string();
  // "x": never over a file of the run (a resumed job in the same second).
  std::FILE* f = nullptr;
  std::string path;
  for (int n = 0; n < 1000 && !f; ++n) {
    path = n == 0 ? base : fmt::format("{}.{}", base, n);
    f = std::fopen(path.c_str(), "wbx");
    if (!f && errno != EEXIST)
      break;
  }
  if (!f) {
    error = fmt::format("cannot write the TensorBoard event file '{}': {}", path,
                        std::strerror(errno));
    return nullptr;
  }
  std::unique_ptr<event_file> out{new event_file{f, path}};
  auto e = event_at(0);
  e.set_file_version("brain.Event:2");
  out->write(e.SerializeAsString());
  if (!out->flush()) {
    error = out->error();
    return nullptr;
  }
  return out;
}

event_file::~event_file() {
  close();
}

void event_file::write(const std::string& event) {
  if (!f_)
    return; // closed
  auto record = frame_record(event);
  if (std::fwrite(record.data(), 1, record.size(), f_) != record.size() && error_.empty())
    error_ = fmt::format("cannot write to '{}': {}", path_, std::strerror(errno));
}

void event_file::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  auto e = event_at(step);
  auto* s = e.mutable_summary();
  for (const auto& [tag, v] : values) {
    auto* value = s->add_value();
    value->set_tag(tag);
    value->set_simple_value(static_cast<float>(v));
  }
  write(e.SerializeAsString());
}

void event_file::histograms(int64_t step,
                            const std::vector<std::pair<std::string, histogram>>& values) {
  auto e = event_at(step);
  auto* s = e.mutable_summary();
  for (const auto& [tag, h] : values) {
    auto* value = s->add_value();
    value->set_tag(tag);
    auto* p = value->mutable_histo();
    p->set_min(h.min);
    p->set_max(h.max);
    p->set_num(h.num);
    p->set_sum(h.sum);
    p->set_sum_squares(h.sum_squares);
    for (size_t i = 0; i < h.limits.size() && i < h.counts.size(); ++i) {
      p->add_bucket_limit(h.limits[i]);
      p->add_bucket(h.counts[i]);
    }
  }
  write(e.SerializeAsString());
}

void event_file::start_at(int64_t step) {
  auto e = event_at(step);
  e.mutable_session_log()->set_status(pb::SessionLog::START);
  write(e.SerializeAsString());
}

bool event_file::sync() {
  if (!f_ || !flush())
    return false;
  if (::fsync(::fileno(f_)) != 0 && error_.empty())
    error_ = fmt::format("cannot sync '{}' to its disk: {}", path_, std::strerror(errno));
  return error_.empty();
}

bool event_file::close() {
  if (!f_)
    return error_.empty();
  sync();
  if (std::fclose(f_) != 0 && error_.empty())
    error_ = fmt::format("cannot close '{}': {}", path_, std::strerror(errno));
  f_ = nullptr;
  // The file's name in its folder: durable once the folder is synced too.
  int dir = ::open(fs::path{path_}.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir); // best effort: some file systems refuse a folder's fsync
    ::close(dir);
  }
  return error_.empty();
}

bool event_file::flush() {
  if (!f_)
    return error_.empty();
  if (std::fflush(f_) != 0 && error_.empty())
    error_ = fmt::format("cannot write to '{}': {}", path_, std::strerror(errno));
  // As TensorFlow's EventsWriter: a file removed while the job runs (its
  // run folder cleaned for a fresh look in TensorBoard) is started again in
  // its folder, else the rest of the job would go to a file no one can
  // read. What was written since the last flush went with the old one.
  struct stat st {};
  if (error_.empty() && ::stat(path_.c_str(), &st) != 0 && errno == ENOENT) {
    std::string why;
    auto fresh = open(fs::path{path_}.parent_path().string(), why);
    if (!fresh) {
      error_ = fmt::format("'{}' was removed, and {}", path_, why);
      return false;
    }
    // The removed file is closed here, not handed to `fresh` to close: its
    // close() would flush, find the file gone and start yet another one,
    // whose own close would do the same (a thousand empty event files and
    // as many fsyncs, until the names of that second ran out).
    std::fclose(f_);
    f_ = std::exchange(fresh->f_, nullptr);
    path_ = fresh->path_;
  }
  return error_.empty();
}

} // namespace af::summary
