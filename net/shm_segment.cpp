#include "net/shm_segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "messages/error.hpp"

namespace af::shm_segment {

namespace {

/// Removes segments of ours whose creator (its pid is in the name) is gone:
/// one killed between creating its segment and its peer's open.
void remove_stale(const char* with_slash) {
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr)
    return;
  std::string prefix = with_slash + 1; // without the '/'
  while (auto* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0)
      continue;
    auto pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      ::shm_unlink(("/" + name).c_str());
  }
  ::closedir(d);
}

} // namespace

caf::expected<created> create(const char* prefix, uint64_t bytes) {
  remove_stale(prefix);
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  created seg;
  seg.name = fmt::format("{}{}-{}-{:08x}", prefix, ::getpid(), counter++, rd());
  int fd = ::shm_open(seg.name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return make_error(af_error::resource_exhausted,
                      fmt::format("cannot create shared memory {}: {}", seg.name, std::strerror(errno)));
  // Reserved now: a full /dev/shm is an error here, not a SIGBUS at the
  // first touch of a page that cannot be had.
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    ::close(fd);
    ::shm_unlink(seg.name.c_str());
    return make_error(af_error::resource_exhausted,
                      fmt::format("cannot reserve {} bytes of shared memory in /dev/shm: {}", bytes,
                                  std::strerror(rc)));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    int err = errno;
    ::shm_unlink(seg.name.c_str());
    return make_error(af_error::resource_exhausted,
                      fmt::format("cannot map {} bytes of shared memory: {}", bytes,
                                  std::strerror(err)));
  }
  seg.base = p;
  return seg;
}

bool plain_name(const std::string& name, const char* prefix) {
  std::string pre = prefix;
  bool plain = std::all_of(name.begin() + std::min(name.size(), pre.size()), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_' || c == '.';
  });
  return name.size() <= 200 && name.rfind(pre, 0) == 0 && plain;
}

caf::error refuse(const std::string& name, const std::string& why) {
  return make_error(af_error::invalid_argument, "shared memory '" + printable(name) + "': " + why);
}

caf::expected<void*> open(const std::string& name, uint64_t bytes, const words& w) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (fd < 0)
    return refuse(name, fmt::format("cannot open it ({}): {}", std::strerror(errno), w.unreachable));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()
      || static_cast<uint64_t>(st.st_size) != bytes) {
    ::close(fd); // (not unlinked: it may not be this user's; its creator removes it)
    return refuse(name, "not a segment of this user of the size offered");
  }
  // Its pages must be there (the creator reserves them with
  // posix_fallocate): a sparse segment on a full /dev/shm would fault at
  // the first touch of a page that cannot be had.
  if (static_cast<uint64_t>(st.st_blocks) * 512 < bytes) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return refuse(name, fmt::format("only {} of its {} bytes are reserved{}",
                                    static_cast<uint64_t>(st.st_blocks) * 512, bytes, w.unreserved));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  // Mapped (or not): the name goes now, so that nothing is left in /dev/shm.
  ::shm_unlink(name.c_str());
  // No other name may lead to it: a segment offered twice under two names
  // (a hard link) would have two readers (two node threads) on one ring.
  bool linked = ::fstat(fd, &st) != 0 || st.st_nlink != 0;
  ::close(fd);
  if (p == MAP_FAILED)
    return refuse(name, fmt::format("cannot map it: {}", std::strerror(errno)));
  if (linked) {
    ::munmap(p, bytes);
    return refuse(name, fmt::format("it has another name in /dev/shm (a hard link): one segment per {}",
                                    w.one_per));
  }
  return p;
}

std::string printable(const std::string& name) {
  std::string out;
  for (char c : name.substr(0, 80)) {
    auto u = static_cast<unsigned char>(c);
    out += u >= 0x20 && u < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", u);
  }
  return name.size() > 80 ? out + "..." : out;
}

} // namespace af::shm_segment
