#pragma once
/// Reading a whole file that a user named (a config, a PEM file, a data file,
/// a checkpoint's `latest`), with a bound on its size. Only a regular file is
/// read: a FIFO would block the program before it said anything (opening one
/// for reading waits for a writer), and /dev/zero or /dev/urandom would never
/// end. The file is opened with O_NONBLOCK and checked with fstat before the
/// first read, so neither waits.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace af {

/// The largest config file (cluster or training TOML/JSON) read: a config is
/// a few kilobytes; anything much larger is a mistake or an attack.
constexpr uint64_t max_config_file_bytes = uint64_t{16} << 20;

/// The largest PEM file ([security] ca, certificate, key) read: a CA bundle
/// of every public root is about 200 KiB.
constexpr uint64_t max_pem_file_bytes = uint64_t{4} << 20;

/// What kind of file `mode` is, for messages ("a FIFO", "a directory").
inline const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a FIFO (named pipe)";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISLNK(mode))
    return "a symbolic link (it could lead anywhere)";
  return "not a regular file";
}

/// Opens `path` for reading if it is a regular file of at most `max_bytes`
/// bytes: "" and the descriptor in `fd` (the caller closes it) and, if
/// `size` is given, its size there; else why not (strerror's text, or "it is
/// a FIFO (named pipe), not a regular file", "it is N bytes, more than the
/// limit of M"; the caller names the path and the key or option that named
/// it), and `fd` is -1. `follow_links` false: a symbolic link as the last
/// component is refused too. A path that is not a regular file when looked
/// at is not opened (a device's open may act: a watchdog arms, a tape
/// rewinds); then it is opened without blocking and must be the file looked
/// at. (One swapped for a device between the look and the open is opened,
/// then refused: whoever can swap it can write that directory.)
inline std::string open_regular_file(const std::string& path, uint64_t max_bytes, int& fd,
                                     bool follow_links = true, uint64_t* size = nullptr) {
  fd = -1;
  errno = 0; // a caller may look at errno (ENOENT) after a refusal
  struct stat before{};
  if ((follow_links ? ::stat(path.c_str(), &before) : ::lstat(path.c_str(), &before)) != 0)
    return std::strerror(errno);
  if (!S_ISREG(before.st_mode))
    return std::string{"it is "} + file_kind(before.st_mode) + ", not a regular file";
  fd = ::open(path.c_str(),
              O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | (follow_links ? 0 : O_NOFOLLOW));
  if (fd < 0)
    return errno == ELOOP && !follow_links
             ? "it is a symbolic link (it could lead anywhere), not a regular file"
             : std::strerror(errno);
  struct stat st{};
  std::string why;
  if (::fstat(fd, &st) != 0)
    why = std::strerror(errno);
  else if (!S_ISREG(st.st_mode))
    why = std::string{"it is "} + file_kind(st.st_mode) + ", not a regular file";
  else if (st.st_dev != before.st_dev || st.st_ino != before.st_ino)
    why = "it was replaced while it was opened";
  else if (static_cast<uint64_t>(st.st_size) > max_bytes)
    why = "it is " + std::to_string(st.st_size) + " bytes, more than the limit of "
          + std::to_string(max_bytes);
  if (!why.empty()) {
    ::close(fd);
    fd = -1;
    return why;
  }
  if (size)
    *size = static_cast<uint64_t>(st.st_size);
  // Regular files never block; the flag only mattered for the open itself.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return {};
}

/// The whole of `path` into `out` if it is a regular file of at most
/// `max_bytes` bytes (also if it grows while it is read): "", else why not,
/// as open_regular_file says it.
inline std::string read_regular_file(const std::string& path, uint64_t max_bytes,
                                     std::string& out) {
  out.clear();
  int fd = -1;
  if (auto why = open_regular_file(path, max_bytes, fd); !why.empty())
    return why;
  char buf[1 << 16];
  for (;;) {
    auto n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      std::string why = std::strerror(errno);
      ::close(fd);
      out.clear();
      return why;
    }
    if (n == 0)
      break;
    if (out.size() + static_cast<uint64_t>(n) > max_bytes) {
      ::close(fd);
      out.clear();
      return "it is more than the limit of " + std::to_string(max_bytes) + " bytes";
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return {};
}

} // namespace af
