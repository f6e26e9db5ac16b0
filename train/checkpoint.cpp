#include "train/checkpoint.hpp"

#include <charconv>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>

#include <cereal/archives/portable_binary.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/crypto.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/read_file.hpp"
#include "core/fnv1a.hpp"
#include "train/digest.hpp"

namespace af::train {

namespace {

namespace fs = std::filesystem;

constexpr char magic[8] = {'A', 'F', 'C', 'K', 'P', 'T', '0', '1'};
constexpr size_t header_size = 32;
constexpr size_t mac_size = digest_size; ///< HMAC-SHA256, after the body (checkpoint_flag_hmac)
constexpr size_t min_key_bytes = 16;
constexpr size_t max_key_bytes = 4096;

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out += static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t get_le(const std::string& in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= uint64_t{static_cast<unsigned char>(in[at + i])} << (8 * i);
  return v;
}

// --- the body

struct decode_error {
  std::string what;
};

void save_string(cereal::PortableBinaryOutputArchive& ar, const std::string& s) {
  ar(static_cast<uint64_t>(s.size()));
  ar(cereal::binary_data(s.data(), s.size()));
}

void save_tensor(cereal::PortableBinaryOutputArchive& ar, const tensor& t) {
  ar(static_cast<uint8_t>(t.empty() ? 0 : 1));
  if (t.empty())
    return;
  ar(static_cast<uint8_t>(t.type()), static_cast<uint64_t>(t.shape().size()));
  for (auto d : t.shape())
    ar(static_cast<int64_t>(d));
  ar(static_cast<uint64_t>(t.nbytes()));
  ar(cereal::binary_data(reinterpret_cast<const char*>(t.bytes()), t.nbytes()));
}

std::string encode(const checkpoint& c) {
  std::ostringstream out;
  {
    cereal::PortableBinaryOutputArchive ar{out};
    ar(c.global_step, c.data_position);
    save_string(ar, c.config);
    ar(static_cast<uint64_t>(c.variables.size()));
    for (const auto& v : c.variables) {
      save_string(ar, v.name);
      save_tensor(ar, v.value);
      ar(static_cast<uint64_t>(v.slots.size()));
      for (const auto& [slot, t] : v.slots) {
        save_string(ar, slot);
        save_tensor(ar, t);
      }
    }
    ar(static_cast<uint64_t>(c.push_seqs.size()));
    for (const auto& [agg, seqs] : c.push_seqs) {
      save_string(ar, agg);
      ar(static_cast<uint64_t>(seqs.size()));
      for (const auto& [worker, seq] : seqs)
        ar(worker, seq);
    }
  }
  return out.str();
}

/// Reads a body with every length checked against what is left of it, so a
/// corrupt length is an error, not a giant allocation.
class body_reader {
public:
  explicit body_reader(const std::string& body)
    : in_(body), size_(body.size()), ar_(in_) {
    // nop
  }

  template <class T>
  T pod() {
    T v{};
    ar_(v);
    return v;
  }

  size_t remaining() {
    auto at = in_.tellg();
    return at < 0 ? 0 : size_ - static_cast<size_t>(at);
  }

  /// A count of things of at least `min_bytes` each.
  uint64_t count(const std::string& what, size_t min_bytes) {
    auto n = pod<uint64_t>();
    if (n > remaining() / std::max<size_t>(min_bytes, 1))
      throw decode_error{fmt::format("{} claims {} entries, more than the {} bytes left could "
                                     "hold", what, n, remaining())};
    return n;
  }

  std::string text(const std::string& what) {
    auto n = count(what, 1);
    std::string s(n, '\0');
    ar_(cereal::binary_data(s.data(), n));
    return s;
  }

  tensor value(const std::string& what) {
    auto present = pod<uint8_t>();
    if (present == 0)
      return {};
    if (present != 1)
      throw decode_error{fmt::format("{}: bad presence flag {}", what, present)};
    auto raw_type = pod<uint8_t>();
    if (!valid_dtype(raw_type))
      throw decode_error{fmt::format("{}: unknown dtype {}", what, raw_type)};
    auto type = static_cast<dtype>(raw_type);
    auto rank = count(what + "'s shape", sizeof(int64_t));
    shape_type shape(rank);
    uint64_t elements = 1;
    bool overflow = false;
    for (auto& d : shape) {
      d = pod<int64_t>();
      if (d < 0)
        throw decode_error{fmt::format("{}: negative dimension {}", what, d)};
      overflow = overflow || __builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements);
    }
    auto nbytes = pod<uint64_t>();
    uint64_t expected = 0;
    overflow = overflow || __builtin_mul_overflow(elements, dtype_size(type), &expected);
    if (overflow || expected != nbytes)
      throw decode_error{fmt::format("{}: shape {} of {} needs {} bytes, the file stores {}",
                                     what, shape_string(shape), dtype_name(type),
                                     overflow ? std::string("more than 2^64")
                                              : std::to_string(expected),
                                     nbytes)};
    if (nbytes > remaining())
      throw decode_error{fmt::format("{}: {} bytes of values, only {} left in the body", what,
                                     nbytes, remaining())};
    tensor t{type, std::move(shape)};
    if (nbytes > 0)
      ar_(cereal::binary_data(reinterpret_cast<char*>(t.mutable_bytes()), nbytes));
    return t;
  }

private:
  std::istringstream in_;
  size_t size_;
  cereal::PortableBinaryInputArchive ar_;
};

checkpoint decode(const std::string& body, uint32_t version) {
  body_reader r{body};
  checkpoint c;
  c.global_step = r.pod<uint64_t>();
  c.data_position = r.pod<uint64_t>();
  c.config = r.text("the config");
  auto n = r.count("the variable list", 2);
  c.variables.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    saved_variable v;
    v.name = r.text(fmt::format("variable {}'s name", i));
    v.value = r.value(fmt::format("variable '{}'", v.name));
    auto slots = r.count(fmt::format("variable '{}''s slots", v.name), 2);
    for (uint64_t j = 0; j < slots; ++j) {
      auto slot = r.text(fmt::format("variable '{}''s slot name", v.name));
      v.slots[slot] = r.value(fmt::format("variable '{}' slot '{}'", v.name, slot));
    }
    c.variables.push_back(std::move(v));
  }
  if (version >= 2) {
    auto aggs = r.count("the push numbers' aggregators", 9);
    for (uint64_t i = 0; i < aggs; ++i) {
      auto agg = r.text(fmt::format("aggregator {}'s name", i));
      auto& seqs = c.push_seqs[agg];
      auto n = r.count(fmt::format("aggregator '{}''s push numbers", agg), 12);
      for (uint64_t j = 0; j < n; ++j) {
        auto worker = r.pod<uint32_t>();
        seqs[worker] = r.pod<uint64_t>();
      }
    }
  }
  if (r.remaining() != 0)
    throw decode_error{fmt::format("{} bytes follow the last variable", r.remaining())};
  return c;
}

// --- files

graph_error io_error(const std::string& what, const std::string& path) {
  return graph_error{af_error::invalid_argument,
                     fmt::format("cannot {} '{}': {}", what, path, std::strerror(errno))};
}

/// A file descriptor that closes itself.
class owned_fd {
public:
  explicit owned_fd(int fd) : fd_(fd) {}
  owned_fd(owned_fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  owned_fd& operator=(owned_fd&&) = delete;
  ~owned_fd() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  int get() const { return fd_; }

private:
  int fd_;
};

struct opened_file {
  owned_fd fd;
  uint64_t size = 0;
};

/// Opens `path` to read it, as long as it is a regular file
/// (open_regular_file: never a FIFO, which would block, nor a device) and,
/// with `no_link`, not a symbolic link as its last component (it could lead
/// anywhere). `what` names the file in errors ("checkpoint"); `hint` ends
/// the error for a file that is not a regular one.
outcome<opened_file> open_regular(const std::string& path, const std::string& what,
                                  const std::string& hint, bool no_link) {
  int fd = -1;
  uint64_t size = 0;
  auto why = open_regular_file(path, std::numeric_limits<uint64_t>::max(), fd, !no_link, &size);
  auto err = errno;
  if (!why.empty())
    return graph_error{err == ENOENT ? af_error::not_found : af_error::invalid_argument,
                       fmt::format("cannot read {} '{}': {}; {}", what, path, why, hint)};
  return opened_file{owned_fd{fd}, size};
}

/// Reads `n` bytes into `out`; false if the file ends first or fails.
bool read_exact(int fd, char* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    auto got = ::read(fd, out + done, n - done);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

/// Reads at most `n` bytes (fewer if the file ends first).
std::string read_up_to(int fd, size_t n) {
  std::string out(n, '\0');
  size_t done = 0;
  while (done < n) {
    auto got = ::read(fd, out.data() + done, n - done);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      break;
    done += static_cast<size_t>(got);
  }
  out.resize(done);
  return out;
}

/// set_checkpoint_write_hook(): none unless a test installs one. Atomic: a
/// test may install it while another thread saves.
std::atomic<checkpoint_write_hook> write_hook{nullptr};

/// Writes `path` through `path`.tmp: write, fsync, rename. The directory is
/// fsynced by the caller. With a `hook` (write_hook above), the first half is
/// written and fsynced, then the hook called with `global_step`.
graph_status write_durably(const std::string& path, const std::string& data,
                           checkpoint_write_hook hook = nullptr, uint64_t global_step = 0) {
  auto tmp = path + ".tmp";
  // A fresh file, never one that is there: a leftover of a crash goes, and
  // a symbolic link planted under that name (by someone else who can write
  // the directory) is removed, not followed into the file it names.
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
    return io_error("remove the leftover temporary file", tmp);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    return io_error("create checkpoint file", tmp);
  size_t done = 0;
  while (done < data.size()) {
    if (hook && done >= data.size() / 2) {
      ::fsync(fd);
      std::exchange(hook, nullptr)(global_step, tmp, done, data.size());
    }
    auto chunk = hook ? data.size() / 2 - done : data.size() - done;
    auto n = ::write(fd, data.data() + done, chunk);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      auto err = io_error("write checkpoint file", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return err;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    auto err = io_error("fsync checkpoint file", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return err;
  }
  if (::close(fd) != 0) {
    auto err = io_error("close checkpoint file", tmp);
    ::unlink(tmp.c_str());
    return err;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    auto err = io_error("rename the checkpoint into", path);
    ::unlink(tmp.c_str());
    return err;
  }
  return ok();
}

graph_status fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return io_error("open checkpoint directory", dir);
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0)
    return io_error("fsync checkpoint directory", dir);
  return ok();
}

/// The step of "ckpt-<step>.afck", or nullopt for any other name.
std::optional<uint64_t> checkpoint_step(const std::string& name) {
  constexpr std::string_view prefix = "ckpt-", suffix = ".afck";
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0
      || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  auto digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  // Up to 2^64 - 1 (20 digits): a file of a step past it is no checkpoint's.
  uint64_t step = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (digits.find_first_not_of("0123456789") != std::string::npos || ec != std::errc{}
      || end != digits.data() + digits.size())
    return std::nullopt;
  return step;
}

/// Removes checkpoints beyond the newest `keep` (by step), never `written`,
/// and temporary files a crash left behind. A file that cannot be removed
/// stays: the new checkpoint is safe either way.
void prune(const std::string& dir, const std::string& written, size_t keep) {
  std::vector<std::pair<uint64_t, fs::path>> others;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    auto name = entry.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0
        && (checkpoint_step(name.substr(0, name.size() - 4)) || name == "latest.tmp")) {
      fs::remove(entry.path(), ec);
      continue;
    }
    if (auto step = checkpoint_step(name); step && name != written)
      others.emplace_back(*step, entry.path());
  }
  if (keep == 0 || others.size() < keep)
    return;
  std::sort(others.begin(), others.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = keep - 1; i < others.size(); ++i)
    fs::remove(others[i].second, ec);
}

} // namespace

outcome<checkpoint_key> load_checkpoint_key(const std::string& path) {
  auto refuse = [&](const std::string& why) {
    return graph_error{af_error::invalid_argument,
                       fmt::format("checkpoint_key '{}': {}; make a key with `openssl rand -hex "
                                   "32 > FILE; chmod 600 FILE`, and give every task of the job "
                                   "the same one",
                                   path, why)};
  };
  auto file = open_regular(path, "key file", "name a regular file holding the key", false);
  if (!file)
    return refuse(file.error().what);
  if (file->size > max_key_bytes)
    return refuse(fmt::format("the file holds {} bytes, more than a key's {} at most",
                              file->size, max_key_bytes));
  auto key = read_up_to(file->fd.get(), max_key_bytes + 1);
  if (key.size() > max_key_bytes)
    return refuse(fmt::format("the file holds more than a key's {} bytes at most", max_key_bytes));
  if (key.size() < min_key_bytes)
    return refuse(fmt::format("the file holds {} bytes, fewer than a key's {} at least",
                              key.size(), min_key_bytes));
  return key;
}

outcome<std::string> save(const std::string& dir, const checkpoint& ckpt, size_t keep,
                          const checkpoint_key& key) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    return graph_error{af_error::invalid_argument,
                       fmt::format("cannot create checkpoint directory '{}': {}", dir,
                                   ec ? ec.message() : "a file of that name is in the way")};
  auto body = encode(ckpt);
  std::string file;
  file.reserve(header_size + body.size() + mac_size);
  file.append(magic, sizeof magic);
  put_le(file, checkpoint_format_version, 4);
  put_le(file, key.empty() ? 0 : checkpoint_flag_hmac, 4);
  put_le(file, body.size(), 8);
  put_le(file, fnv1a64(body.data(), body.size()), 8);
  file += body;
  if (!key.empty()) {
    auto mac = hmac_sha256(key, file.data(), file.size());
    if (mac.empty())
      return graph_error{af_error::internal,
                         "cannot compute the checkpoint's HMAC-SHA256 (OpenSSL failed)"};
    file += mac;
  }
  auto name = fmt::format("ckpt-{}.afck", ckpt.global_step);
  auto path = (fs::path{dir} / name).string();
  // The checkpoint is durable before `latest` names it.
  if (auto st = write_durably(path, file, write_hook.load(std::memory_order_acquire), ckpt.global_step); !st)
    return st.error();
  if (auto st = fsync_dir(dir); !st)
    return st.error();
  if (auto st = write_durably((fs::path{dir} / "latest").string(), name + "\n"); !st)
    return st.error();
  if (auto st = fsync_dir(dir); !st)
    return st.error();
  prune(dir, name, keep);
  return path;
}

checkpoint_write_hook set_checkpoint_write_hook(checkpoint_write_hook hook) {
  return write_hook.exchange(hook, std::memory_order_acq_rel);
}

std::string check_checkpoint_dir(const std::string& dir) {
  auto refuse = [&](const std::string& what, int err) {
    return fmt::format("checkpoint_dir '{}': {}: {}; make it writable by this user, or choose "
                       "another directory (checkpoint_dir in [train], or --set "
                       "checkpoint_dir=DIR)",
                       dir, what, std::strerror(err));
  };
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return refuse("cannot create it", ec.value());
  if (!fs::is_directory(dir, ec))
    return refuse("it is not a directory", ENOTDIR);
  auto probe = (fs::path{dir} / fmt::format(".actorflow-probe-{}", ::getpid())).string();
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return refuse("cannot create a file in it", errno);
  int err = 0;
  if (::write(fd, "probe\n", 6) != 6 || ::fsync(fd) != 0)
    err = errno ? errno : EIO;
  if (::close(fd) != 0 && err == 0)
    err = errno;
  if (::unlink(probe.c_str()) != 0 && err == 0)
    err = errno;
  if (err != 0)
    return refuse("cannot write and remove a file in it", err);
  return {};
}

outcome<checkpoint> load(const std::string& path, const checkpoint_key& key) {
  auto opened = open_regular(path, "checkpoint",
                             "remove it, or point 'latest' in its folder at a checkpoint file",
                             true);
  if (!opened)
    return opened.error();
  int fd = opened->fd.get();
  auto size = opened->size;
  // The header first: a file whose size disagrees with it is refused
  // before its body is read (a huge foreign file is not loaded whole).
  std::string file(static_cast<size_t>(std::min<uint64_t>(size, header_size)), '\0');
  if (!read_exact(fd, file.data(), file.size()))
    return graph_error{af_error::invalid_argument,
                       fmt::format("cannot read checkpoint '{}'", path)};
  auto refuse = [&](const std::string& why, af_error code = af_error::invalid_argument) {
    return graph_error{code, fmt::format("checkpoint '{}' {}", path, why)};
  };
  if (file.empty())
    return refuse("is empty: not a checkpoint (or one whose write never finished)");
  size_t head = std::min(file.size(), sizeof magic);
  if (std::memcmp(file.data(), magic, head) != 0)
    return refuse("is not an actorflow checkpoint (it does not start with \"AFCKPT01\")");
  if (file.size() < header_size)
    return refuse(fmt::format("is truncated: {} bytes, shorter than the {}-byte header",
                              file.size(), header_size));
  auto version = static_cast<uint32_t>(get_le(file, 8, 4));
  if (version > checkpoint_format_version)
    return refuse(fmt::format("is in checkpoint format {}, newer than this build reads ({}); "
                              "load it with a newer actorflow",
                              version, checkpoint_format_version),
                  af_error::unsupported);
  if (version == 0)
    return refuse("has format version 0, which no actorflow writes: the file is corrupt");
  auto flags = static_cast<uint32_t>(get_le(file, 12, 4));
  if ((flags & ~checkpoint_flag_hmac) != 0)
    return refuse(fmt::format("has header flags {:#x}, which this build does not know (it knows "
                              "{:#x}, an HMAC); load it with a newer actorflow",
                              flags, checkpoint_flag_hmac),
                  af_error::unsupported);
  bool has_mac = (flags & checkpoint_flag_hmac) != 0;
  if (!key.empty() && !has_mac)
    return refuse("has no HMAC, but checkpoint_key is set: it was written without the key (by "
                  "a job without checkpoint_key, or by someone who does not hold the key), so "
                  "it is not restored; move it (and 'latest') out of the directory to start "
                  "afresh, or restore it by a job without checkpoint_key if you know who wrote "
                  "it");
  auto body_len = get_le(file, 16, 8);
  auto stored = size - header_size;
  auto trailer = has_mac ? mac_size : 0;
  if (stored < trailer || stored - trailer < body_len)
    return refuse(fmt::format("is truncated: its header says {} body bytes{}, the file holds {}",
                              body_len, has_mac ? " and a 32-byte HMAC" : "", stored));
  if (stored - trailer > body_len)
    return refuse(fmt::format("has {} bytes after its {}-byte body{}: not one checkpoint",
                              stored - trailer - body_len, body_len,
                              has_mac ? " and HMAC" : ""));
  auto sum = get_le(file, 24, 8);
  try {
    file.resize(header_size + static_cast<size_t>(body_len) + trailer);
  } catch (const std::bad_alloc&) {
    return refuse(fmt::format("has a body of {} bytes, more than this process can hold", body_len),
                  af_error::resource_exhausted);
  }
  if (!read_exact(fd, file.data() + header_size, static_cast<size_t>(body_len) + trailer))
    return refuse("could not be read to its end (it changed while being read?)");
  if (fnv1a64(file.data() + header_size, body_len) != sum)
    return refuse("fails its checksum: the file is corrupt (a torn write or a flipped byte); "
                  "use an older checkpoint");
  if (has_mac && !key.empty()) {
    auto want = hmac_sha256(key, file.data(), header_size + static_cast<size_t>(body_len));
    if (want.empty()
        || CRYPTO_memcmp(want.data(), file.data() + header_size + body_len, mac_size) != 0)
      return refuse("fails its HMAC: it was not written with this job's checkpoint_key (another "
                    "key, or someone who does not hold the key changed it), so it is not "
                    "restored; check that every task has the same key file, or move the file "
                    "(and 'latest') away to start afresh");
  }
  try {
    return decode(file.substr(header_size, static_cast<size_t>(body_len)), version);
  } catch (const decode_error& e) {
    return refuse("has a body that does not decode: " + e.what);
  } catch (const std::exception& e) {
    return refuse(std::string{"has a body that does not decode: "} + e.what());
  }
}

outcome<std::string> latest(const std::string& dir) {
  auto index = (fs::path{dir} / "latest").string();
  struct stat st {};
  if (::lstat(index.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      return std::string{};
    return io_error("read", index);
  }
  auto opened = open_regular(index, "checkpoint index",
                             "delete it to start afresh, or write the name of a checkpoint file "
                             "of its folder in it",
                             true);
  if (!opened)
    return opened.error();
  // A file name, one line: read no more than a name can be, and never
  // echo what is not one (a garbage 'latest' would print binary).
  constexpr size_t most = 4096;
  auto name = read_up_to(opened->fd.get(), most + 1);
  if (auto nl = name.find('\n'); nl != std::string::npos)
    name.resize(nl);
  while (!name.empty() && (name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  bool printable = name.size() <= most
                   && std::all_of(name.begin(), name.end(),
                                  [](char ch) { return ch >= 0x20 && ch != 0x7f; });
  if (!printable)
    return graph_error{af_error::invalid_argument,
                       fmt::format("'{}' does not hold a checkpoint's file name (binary or over "
                                   "{} bytes); delete it to start afresh, or write the name of "
                                   "a checkpoint file in it",
                                   index, most)};
  if (name.empty())
    return graph_error{af_error::invalid_argument,
                       fmt::format("'{}' names no checkpoint; delete it to start afresh", index)};
  // Only a file of this directory: not a path out of it ("../x", "/x"), to
  // another job's checkpoints or to any file this user can read.
  // And only a checkpoint's name (ckpt-N.afck): not 'latest' itself, a
  // '.tmp' being written, or any other file of the directory.
  if (name.find('/') != std::string::npos || !checkpoint_step(name))
    return graph_error{af_error::invalid_argument,
                       fmt::format("'{}' names '{}', which is not a checkpoint's file name: only "
                                   "a checkpoint file in {} itself (ckpt-N.afck, no '/') is "
                                   "restored; write the name of a checkpoint file of that "
                                   "directory in it (e.g. ckpt-200.afck), or delete it to start "
                                   "afresh",
                                   index, name.size() > 200 ? name.substr(0, 200) + "..." : name,
                                   dir)};
  auto path = (fs::path{dir} / name).string();
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT)
      return io_error("read", path);
    return graph_error{af_error::not_found,
                       fmt::format("'{}' names {}, which is missing; restore it or delete "
                                   "'{}' to start afresh",
                                   index, path, index)};
  }
  if (!S_ISREG(st.st_mode))
    return graph_error{af_error::invalid_argument,
                       fmt::format("'{}' names {}, which is {}, not a regular file: only a "
                                   "checkpoint file is restored; write the name of one in "
                                   "'{}', or delete it to start afresh",
                                   index, path,
                                   S_ISLNK(st.st_mode) ? "a symbolic link (it could lead anywhere)"
                                   : S_ISDIR(st.st_mode) ? "a directory"
                                   : S_ISFIFO(st.st_mode) ? "a FIFO"
                                                          : "a special file",
                                   index)};
  return path;
}

} // namespace af::train
