// The files of table checkpoints (train/table_files.hpp).
#include "train/table_files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "core/read_file.hpp"

namespace af::train {

namespace {

graph_error invalid(std::string what, af_error code = af_error::invalid_argument) {
  return graph_error{code, std::move(what)};
}

graph_error io_error(const std::string& what, const std::string& path) {
  return invalid(fmt::format("cannot {} '{}': {}", what, path, std::strerror(errno)));
}

} // namespace

durable_file::~durable_file() {
  if (fd_ >= 0)
    ::close(fd_);
  if (!committed_)
    ::unlink(tmp_.c_str());
}

graph_status durable_file::open() {
  if (::unlink(tmp_.c_str()) != 0 && errno != ENOENT)
    return io_error("remove the leftover temporary file", tmp_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0)
    return io_error("create table checkpoint file", tmp_);
  return ok();
}

graph_status durable_file::write(const char* data, size_t n) {
  while (n > 0) {
    auto got = ::write(fd_, data, n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return io_error("write table checkpoint file", tmp_);
    data += got;
    n -= static_cast<size_t>(got);
  }
  return ok();
}

graph_status durable_file::commit(const std::string& dir) {
  if (::fsync(fd_) != 0)
    return io_error("fsync table checkpoint file", tmp_);
  int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0)
    return io_error("close table checkpoint file", tmp_);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    return io_error("rename the table checkpoint into", path_);
  committed_ = true;
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return io_error("open checkpoint directory", dir);
  int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0)
    return io_error("fsync checkpoint directory", dir);
  return ok();
}

bool pread_exact(int fd, char* out, size_t n, uint64_t offset) {
  while (n > 0) {
    auto got = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return false;
    out += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

outcome<int> open_for_reading(const std::string& path, const std::string& what,
                              uint64_t& size) {
  int fd = -1;
  auto why = open_regular_file(path, std::numeric_limits<uint64_t>::max(), fd, false, &size);
  auto code = errno == ENOENT ? af_error::not_found : af_error::invalid_argument;
  if (!why.empty())
    return invalid(fmt::format("cannot read {} '{}': {}", what, path, why), code);
  return fd;
}

} // namespace af::train
