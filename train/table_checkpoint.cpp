// Checkpoints of partitioned tables, shard by shard, streamed
// (train/table_checkpoint.hpp has the file layout).
#include "train/table_checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <openssl/crypto.h>

#include "train/digest.hpp"
#include "train/table_files.hpp"

namespace af::train {

namespace {

constexpr char shard_magic[] = "AFTAB002";
constexpr char old_shard_magic[] = "AFTAB001"; ///< FNV-1a checksums, before the digests
constexpr char trailer_magic[] = "AFTABEND";
constexpr size_t magic_size = 8;
constexpr uint32_t max_header_bytes = 64u << 20; ///< n shard sizes and names: far below this
constexpr char manifest_first_line[] = "actorflow table checkpoint 2";

graph_error invalid(std::string what, af_error code = af_error::invalid_argument) {
  return graph_error{code, std::move(what)};
}

graph_error io_error(const std::string& what, const std::string& path) {
  return invalid(fmt::format("cannot {} '{}': {}", what, path, std::strerror(errno)));
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

void put_string(std::string& out, const std::string& s) {
  put_le(out, s.size(), 4);
  out += s;
}

/// Reads the header's fields in order; `ok` false once one runs past the end.
struct header_reader {
  const std::string& in;
  size_t at = 0;
  bool ok = true;

  uint64_t u(int bytes) {
    if (!ok || in.size() - at < static_cast<size_t>(bytes)) {
      ok = false;
      return 0;
    }
    auto v = get_le(in.data() + at, bytes);
    at += static_cast<size_t>(bytes);
    return v;
  }
  std::string text() {
    auto n = u(4);
    if (!ok || in.size() - at < n) {
      ok = false;
      return {};
    }
    std::string s = in.substr(at, n);
    at += n;
    return s;
  }
};

/// What a shard file's header holds.
struct shard_header {
  table_checkpoint_layout layout;
  uint64_t shard = 0;
  uint64_t rows_per_chunk = 1;
  std::string header_digest; ///< SHA-256 of the header's bytes (raw)
  uint64_t data_offset = 0;  ///< where the first row starts

  uint64_t record_bytes() const {
    return static_cast<uint64_t>(layout.row_floats()) * 4 * (1 + layout.slots.size());
  }
  uint64_t rows() const { return static_cast<uint64_t>(layout.shard_rows[shard]); }
  uint64_t chunks() const { return (rows() + rows_per_chunk - 1) / rows_per_chunk; }
  /// Bytes of the trailer: a digest per chunk, the count, the end magic.
  uint64_t trailer_size() const { return chunks() * digest_size + 16; }
  /// The size a whole file of this header has.
  uint64_t file_size() const { return data_offset + rows() * record_bytes() + trailer_size(); }
};

std::string encode_header(const table_checkpoint_layout& l, size_t k, uint64_t rows_per_chunk) {
  std::string h;
  put_string(h, l.table);
  put_le(h, k, 8);
  put_le(h, l.shard_rows.size(), 8);
  put_le(h, static_cast<uint8_t>(l.strategy), 1);
  for (auto r : l.shard_rows)
    put_le(h, static_cast<uint64_t>(r), 8);
  put_le(h, l.row_shape.size(), 4);
  for (auto d : l.row_shape)
    put_le(h, static_cast<uint64_t>(d), 8);
  put_string(h, dtype_name(dtype::float32));
  put_le(h, l.slots.size(), 4);
  for (const auto& s : l.slots)
    put_string(h, s);
  put_le(h, l.global_step, 8);
  put_le(h, rows_per_chunk, 8);
  return h;
}

/// Checks what both the writer and the manifest need of a layout: a name,
/// sizes the strategy accepts, a row shape of non-negative dims.
graph_status check_layout(const table_checkpoint_layout& l, const std::string& where) {
  if (l.table.empty())
    return invalid(where + ": the table has no name");
  kernels::shard_router router;
  if (auto st = kernels::shard_router::make(l.strategy, l.shard_rows, router); !st.ok())
    return invalid(fmt::format("{}: table '{}': {}", where, l.table, st.error));
  for (auto d : l.row_shape)
    if (d < 0)
      return invalid(fmt::format("{}: table '{}' has a negative dimension in its row shape {}",
                                 where, l.table, shape_string(l.row_shape)));
  return ok();
}


/// The fields of a header's bytes `h` (without magic, length and checksum).
outcome<shard_header> decode_header(const std::string& h, const std::string& path) {
  header_reader r{h};
  shard_header out;
  auto& l = out.layout;
  l.table = r.text();
  out.shard = r.u(8);
  auto n = r.u(8);
  auto strategy = r.u(1);
  if (!r.ok || n == 0 || n > h.size() / 8 || out.shard >= n || strategy > 2)
    return invalid(fmt::format("table checkpoint file '{}' has a header that makes no sense "
                               "(shard {} of {}, strategy {}): the file is corrupt",
                               path, out.shard, n, strategy));
  l.strategy = static_cast<kernels::partition_strategy>(strategy);
  for (uint64_t i = 0; i < n; ++i)
    l.shard_rows.push_back(static_cast<int64_t>(r.u(8)));
  auto dims = r.u(4);
  for (uint64_t i = 0; r.ok && i < dims; ++i)
    l.row_shape.push_back(static_cast<int64_t>(r.u(8)));
  auto type = r.text();
  auto slots = r.u(4);
  for (uint64_t i = 0; r.ok && i < slots; ++i)
    l.slots.push_back(r.text());
  l.global_step = r.u(8);
  out.rows_per_chunk = r.u(8);
  if (!r.ok || r.at != h.size() || out.rows_per_chunk == 0)
    return invalid(fmt::format("table checkpoint file '{}' has a header of the wrong length: "
                               "the file is corrupt",
                               path));
  if (type != dtype_name(dtype::float32))
    return invalid(fmt::format("table checkpoint file '{}' holds {} rows; only float32 tables "
                               "are checkpointed this way",
                               path, type),
                   af_error::dtype_mismatch);
  if (auto st = check_layout(l, "table checkpoint file '" + path + "'"); !st)
    return st.error();
  return out;
}

/// Reads and checks the header of the shard file at `path` (magic, length,
/// checksum, fields); the file's size in `size`.
outcome<shard_header> read_header(int fd, const std::string& path, uint64_t size) {
  char head[magic_size + 4];
  if (size >= sizeof head && pread_exact(fd, head, sizeof head, 0)
      && std::memcmp(head, old_shard_magic, magic_size) == 0)
    return invalid(fmt::format("table checkpoint file '{}' is of the first format (\"{}\", "
                               "checksums without digests), which this build no longer "
                               "reads: restore it with the actorflow that wrote it, or train "
                               "afresh",
                               path, old_shard_magic),
                   af_error::unsupported);
  if (size < sizeof head || !pread_exact(fd, head, sizeof head, 0)
      || std::memcmp(head, shard_magic, magic_size) != 0)
    return invalid(fmt::format("'{}' is not a table checkpoint shard file (it does not start "
                               "with \"{}\"): a foreign file",
                               path, shard_magic));
  auto len = static_cast<uint32_t>(get_le(head + magic_size, 4));
  if (len > max_header_bytes || size < sizeof head + len + digest_size)
    return invalid(fmt::format("table checkpoint file '{}' is torn: {} bytes cannot hold its "
                               "header of {} bytes",
                               path, size, len));
  std::string h(len, '\0');
  std::string sum(digest_size, '\0');
  if (!pread_exact(fd, h.data(), len, sizeof head)
      || !pread_exact(fd, sum.data(), digest_size, sizeof head + len))
    return io_error("read the header of table checkpoint file", path);
  if (sum != sha256(h.data(), h.size()))
    return invalid(fmt::format("table checkpoint file '{}' fails its header digest: the file "
                               "is corrupt",
                               path));
  auto out = decode_header(h, path);
  if (!out)
    return out;
  out->header_digest = std::move(sum);
  out->data_offset = sizeof head + len + digest_size;
  return out;
}

/// The trailer of the shard file at `path` (whose header is `h`, whose
/// size is `size`, already checked to be h.file_size()): its bytes, checked
/// for the end magic and the chunk count.
outcome<std::string> read_trailer(int fd, const std::string& path, const shard_header& h,
                                  uint64_t size) {
  std::string tail(h.trailer_size(), '\0');
  if (!pread_exact(fd, tail.data(), tail.size(), size - tail.size()))
    return io_error("read the trailer of table checkpoint file", path);
  if (tail.compare(tail.size() - magic_size, magic_size, trailer_magic) != 0
      || get_le(tail.data() + h.chunks() * digest_size, 8) != h.chunks())
    return invalid(fmt::format("table checkpoint file '{}' is torn: its trailer is not there",
                               path));
  return tail;
}

/// What the manifest lists of a shard file: SHA-256 of its header's digest
/// and its trailer (every chunk's digest), so the manifest vouches for every
/// byte of the file through the chunks' digests.
std::string file_digest(const shard_header& h, const std::string& tail) {
  return sha256((h.header_digest + tail).data(), h.header_digest.size() + tail.size());
}

} // namespace

int64_t table_checkpoint_layout::rows() const {
  int64_t n = 0;
  for (auto r : shard_rows)
    n += r;
  return n;
}

int64_t table_checkpoint_layout::row_floats() const {
  int64_t n = 1;
  for (auto d : row_shape)
    n *= d;
  return n;
}

std::string table_shard_path(const std::string& dir, const std::string& table, size_t k,
                             size_t n) {
  std::string name;
  for (char c : table)
    name += c == '/' ? std::string{"%2F"} : c == '%' ? std::string{"%25"} : std::string(1, c);
  return fmt::format("{}/{}.shard-{}-of-{}.aftab", dir, name, k, n);
}

std::string table_manifest_path(const std::string& dir, const std::string& table) {
  auto shard = table_shard_path(dir, table, 0, 1);
  return shard.substr(0, shard.size() - std::string{".shard-0-of-1.aftab"}.size()) + ".manifest";
}

outcome<std::string> write_table_shard(const std::string& dir,
                                       const table_checkpoint_layout& layout,
                                       size_t k, const table_shard_view& shard,
                                       size_t chunk_bytes) {
  auto path = table_shard_path(dir, layout.table, k, layout.shard_rows.size());
  if (auto st = check_layout(layout, "table checkpoint '" + path + "'"); !st)
    return st.error();
  if (k >= layout.shard_rows.size() || shard.slots.size() != layout.slots.size()
      || shard.value == nullptr)
    return invalid(fmt::format("table checkpoint '{}': shard {} of {} with {} slot buffers for "
                               "the slots [{}]",
                               path, k, layout.shard_rows.size(), shard.slots.size(),
                               fmt::join(layout.slots, ", ")));
  auto floats = static_cast<size_t>(layout.row_floats());
  auto record = floats * 4 * (1 + layout.slots.size());
  uint64_t rows_per_chunk = std::max<size_t>(1, chunk_bytes / std::max<size_t>(record, 1));
  auto rows = static_cast<uint64_t>(layout.shard_rows[k]);
  auto header = encode_header(layout, k, rows_per_chunk);
  std::string head(shard_magic, magic_size);
  put_le(head, header.size(), 4);
  head += header;
  head += sha256(header.data(), header.size());

  durable_file file{path};
  if (auto st = file.open(); !st)
    return st.error();
  if (auto st = file.write(head.data(), head.size()); !st)
    return st.error();
  // One chunk of rows at a time: each row's value, then its slots' floats,
  // gathered from the holder's buffers into one chunk-sized buffer.
  std::vector<char> chunk(static_cast<size_t>(std::min(rows, rows_per_chunk)) * record);
  std::string trailer;
  for (uint64_t begin = 0; begin < rows; begin += rows_per_chunk) {
    auto n = std::min(rows_per_chunk, rows - begin);
    char* out = chunk.data();
    for (uint64_t r = begin; r < begin + n; ++r) {
      std::memcpy(out, shard.value + r * floats, floats * 4);
      out += floats * 4;
      for (const float* s : shard.slots) {
        std::memcpy(out, s + r * floats, floats * 4);
        out += floats * 4;
      }
    }
    auto bytes = static_cast<size_t>(n) * record;
    trailer += sha256(chunk.data(), bytes);
    if (auto st = file.write(chunk.data(), bytes); !st)
      return st.error();
  }
  put_le(trailer, (rows + rows_per_chunk - 1) / rows_per_chunk, 8);
  trailer.append(trailer_magic, magic_size);
  if (auto st = file.write(trailer.data(), trailer.size()); !st)
    return st.error();
  if (auto st = file.commit(dir); !st)
    return st.error();
  return path;
}

outcome<std::string> write_table_manifest(const std::string& dir,
                                          const table_checkpoint_layout& layout,
                                          const std::string& key) {
  auto path = table_manifest_path(dir, layout.table);
  if (auto st = check_layout(layout, "table manifest '" + path + "'"); !st)
    return st.error();
  std::string text = std::string{manifest_first_line} + "\n";
  text += fmt::format("table {}\nstrategy {}\nshard_rows {}\nrow_shape {}\ndtype float32\n"
                      "slots {}\nglobal_step {}\n",
                      layout.table, kernels::to_string(layout.strategy),
                      fmt::join(layout.shard_rows, " "), fmt::join(layout.row_shape, " "),
                      fmt::join(layout.slots, " "), layout.global_step);
  auto n = layout.shard_rows.size();
  for (size_t k = 0; k < n; ++k) {
    auto file = table_shard_path(dir, layout.table, k, n);
    uint64_t size = 0;
    auto fd = open_for_reading(file, "table checkpoint shard file", size);
    if (!fd)
      return fd.error();
    auto h = read_header(*fd, file, size);
    auto tail = h && size == h->file_size() ? read_trailer(*fd, file, *h, size)
                                            : outcome<std::string>{std::string{}};
    ::close(*fd);
    if (!h)
      return h.error();
    if (!tail)
      return tail.error();
    const auto& l = h->layout;
    if (l.table != layout.table || h->shard != k || l.strategy != layout.strategy
        || l.shard_rows != layout.shard_rows || l.row_shape != layout.row_shape
        || l.slots != layout.slots || l.global_step != layout.global_step)
      return invalid(fmt::format("table checkpoint file '{}' is not shard {} of this checkpoint "
                                 "of table '{}' (it holds shard {} of table '{}', step {}): a "
                                 "foreign file",
                                 file, k, layout.table, h->shard, l.table, l.global_step));
    if (size != h->file_size())
      return invalid(fmt::format("table checkpoint file '{}' is torn: it is {} bytes, its header "
                                 "gives {}",
                                 file, size, h->file_size()));
    auto slash = file.rfind('/');
    text += fmt::format("shard {} {} {} {}\n", k, file.substr(slash + 1), size,
                        to_hex(file_digest(*h, *tail)));
  }
  if (!key.empty()) {
    auto mac = hmac_sha256(key, text.data(), text.size());
    if (mac.empty())
      return invalid("table manifest '" + path + "': cannot compute its HMAC-SHA256 (OpenSSL "
                     "failed)", af_error::internal);
    text += "hmac " + to_hex(mac) + "\n";
  }
  text += "checksum " + to_hex(sha256(text.data(), text.size())) + "\n";
  durable_file out{path};
  if (auto st = out.open(); !st)
    return st.error();
  if (auto st = out.write(text.data(), text.size()); !st)
    return st.error();
  if (auto st = out.commit(dir); !st)
    return st.error();
  return path;
}

namespace {

/// Where manifest `path`'s checksum line starts, once its first line and
/// its checksum are checked (a torn or corrupt file is refused here, before
/// any of it is believed).
outcome<size_t> manifest_checksum_at(const std::string& text, const std::string& path) {
  auto bad = [&](const std::string& why) {
    return invalid(fmt::format("table manifest '{}' {}", path, why));
  };
  auto sum_at = text.rfind("checksum ");
  if (text.rfind("actorflow table checkpoint 1\n", 0) == 0)
    return invalid(fmt::format("table manifest '{}' is of the first format, which this build no "
                               "longer reads: restore it with the actorflow that wrote it, or "
                               "train afresh",
                               path),
                   af_error::unsupported);
  if (text.rfind(std::string{manifest_first_line} + "\n", 0) != 0 || sum_at == std::string::npos)
    return bad("is not a table manifest (or is torn: no first line or no checksum line)");
  auto want = to_hex(sha256(text.data(), sum_at));
  if (text.compare(sum_at, std::string::npos, "checksum " + want + "\n") != 0)
    return bad("fails its checksum: the file is torn or corrupt");
  return sum_at;
}

/// The fields of manifest `path`'s text, checked line by line.
outcome<table_checkpoint_layout> parse_manifest(const std::string& text, const std::string& path,
                                     const std::string& table) {
  auto bad = [&](const std::string& why) {
    return invalid(fmt::format("table manifest '{}' {}", path, why));
  };
  auto at = manifest_checksum_at(text, path);
  if (!at)
    return at.error();
  auto sum_at = *at;
  table_checkpoint_layout l;
  std::istringstream in{text.substr(0, sum_at)};
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream words{line};
    std::string key;
    words >> key;
    if (key == "table") {
      words >> l.table;
    } else if (key == "strategy") {
      std::string s;
      words >> s;
      auto parsed = kernels::parse_partition_strategy(s);
      if (!parsed)
        return bad("names an unknown strategy '" + s + "'");
      l.strategy = *parsed;
    } else if (key == "shard_rows") {
      for (int64_t r; words >> r;)
        l.shard_rows.push_back(r);
    } else if (key == "row_shape") {
      for (int64_t d; words >> d;)
        l.row_shape.push_back(d);
    } else if (key == "slots") {
      for (std::string s; words >> s;)
        l.slots.push_back(s);
    } else if (key == "global_step") {
      words >> l.global_step;
    } else if (key == "shard") {
      size_t k = 0;
      std::string file, digest;
      uint64_t bytes = 0;
      words >> k >> file >> bytes >> digest;
      if (k != l.shard_bytes.size())
        return bad(fmt::format("lists shard {} where shard {} belongs", k, l.shard_bytes.size()));
      l.shard_bytes.push_back(bytes);
      l.shard_digests.push_back(digest);
    } else if (key != "dtype" && key != "hmac") { // hmac: verify_table_manifest's
      return bad("has an unknown line '" + line + "'");
    }
  }
  if (l.table != table)
    return bad(fmt::format("is of table '{}', not '{}': a foreign file", l.table, table));
  if (l.shard_bytes.size() != l.shard_rows.size())
    return bad(fmt::format("lists {} shard files for {} shards", l.shard_bytes.size(),
                           l.shard_rows.size()));
  if (auto st = check_layout(l, "table manifest '" + path + "'"); !st)
    return st.error();
  return l;
}

/// One old shard file being read for a restore: its header, and the one
/// chunk of it in memory (checked against its checksum when read).
struct shard_source {
  std::string path;
  int fd = -1;
  shard_header header;
  std::string tail;          ///< the trailer: each chunk's digest first
  int64_t loaded = -1;        ///< the chunk in `chunk`
  std::vector<char> chunk;

  shard_source() = default;
  shard_source(const shard_source&) = delete;
  shard_source& operator=(const shard_source&) = delete;
  ~shard_source() {
    if (fd >= 0)
      ::close(fd);
  }

  /// Opens shard `k` of `saved` and checks it is the file the manifest lists.
  graph_status open(const std::string& dir, const table_checkpoint_layout& saved, size_t k) {
    path = table_shard_path(dir, saved.table, k, saved.shard_rows.size());
    uint64_t size = 0;
    auto opened = open_for_reading(path, "table checkpoint shard file", size);
    if (!opened)
      return opened.error();
    fd = *opened;
    auto h = read_header(fd, path, size);
    if (!h)
      return h.error();
    header = std::move(*h);
    const auto& l = header.layout;
    if (l.row_shape != saved.row_shape || l.slots != saved.slots)
      return invalid(fmt::format("table checkpoint file '{}' holds rows {} with slots [{}], the "
                                 "manifest's table rows {} with slots [{}]: mismatched dims",
                                 path, shape_string(l.row_shape), fmt::join(l.slots, ", "),
                                 shape_string(saved.row_shape), fmt::join(saved.slots, ", ")),
                     af_error::shape_mismatch);
    if (l.table != saved.table || header.shard != k || l.strategy != saved.strategy
        || l.shard_rows != saved.shard_rows || l.global_step != saved.global_step)
      return invalid(fmt::format("table checkpoint file '{}' is not shard {} of the manifest's "
                                 "checkpoint of table '{}' at step {} (it holds shard {} of "
                                 "table '{}' at step {}): a foreign file",
                                 path, k, saved.table, saved.global_step, header.shard, l.table,
                                 l.global_step));
    if (size != header.file_size() || size != saved.shard_bytes[k])
      return invalid(fmt::format("table checkpoint file '{}' is torn: it is {} bytes, its header "
                                 "gives {} (the manifest {})",
                                 path, size, header.file_size(), saved.shard_bytes[k]));
    auto t = read_trailer(fd, path, header, size);
    if (!t)
      return t.error();
    tail = std::move(*t);
    if (to_hex(file_digest(header, tail)) != saved.shard_digests[k])
      return invalid(fmt::format("table checkpoint file '{}' does not match the digest its "
                                 "manifest lists: its rows were altered or it was replaced "
                                 "after the manifest was written; restore an older checkpoint "
                                 "(move this tables-<step> directory and its ckpt-<step>.afck "
                                 "away)",
                                 path));
    return ok();
  }

  /// Every float of the `n` records loaded from local row `first` on is
  /// finite, an Adam `v` not negative and an Adagrad `accumulator` positive,
  /// as a job's checkpoint is checked (train/checkpoint_check.cpp): the
  /// checksums find accidents, not forgery, and a NaN restored would fail
  /// the job at every start, in a worker's push, naming no file.
  graph_status check_values(uint64_t first, uint64_t n) const {
    auto floats = static_cast<size_t>(header.layout.row_floats());
    const auto& slots = header.layout.slots;
    for (uint64_t r = 0; r < n; ++r)
      for (size_t part = 0; part <= slots.size(); ++part) {
        const char* at = chunk.data() + (r * (1 + slots.size()) + part) * floats * 4;
        const std::string field = part == 0 ? "value" : "slot '" + slots[part - 1] + "'";
        for (size_t e = 0; e < floats; ++e) {
          float x;
          std::memcpy(&x, at + e * 4, 4);
          bool bad = !std::isfinite(x) || (part > 0 && slots[part - 1] == "v" && x < 0)
                     || (part > 0 && slots[part - 1] == "accumulator" && !(x > 0));
          if (bad)
            return invalid(fmt::format("table checkpoint file '{}': the {} of row {} of shard {} "
                                       "holds {} at element {} (not finite, or a slot of the "
                                       "wrong sign): the file was altered; restore an older "
                                       "checkpoint (move this tables-<step> directory and its "
                                       "ckpt-<step>.afck away)",
                                       path, field, first + r, header.shard, x, e),
                           af_error::non_finite);
        }
      }
    return ok();
  }

  /// The record (value floats, then each slot's) of local row `r`.
  outcome<const char*> row(uint64_t r) {
    auto per = header.rows_per_chunk;
    auto c = static_cast<int64_t>(r / per);
    auto record = header.record_bytes();
    if (c != loaded) {
      auto first = static_cast<uint64_t>(c) * per;
      auto n = std::min(per, header.rows() - first);
      chunk.resize(n * record);
      if (!pread_exact(fd, chunk.data(), chunk.size(), header.data_offset + first * record))
        return io_error("read table checkpoint file", path);
      if (tail.compare(static_cast<size_t>(c) * digest_size, digest_size,
                       sha256(chunk.data(), chunk.size()))
          != 0)
        return invalid(fmt::format("table checkpoint file '{}' fails the digest of chunk {} "
                                   "(rows {} to {} of shard {}): the file is corrupt; restore "
                                   "an older checkpoint (move this tables-<step> directory and "
                                   "its ckpt-<step>.afck away)",
                                   path, c, first, first + n - 1, header.shard));
      if (auto st = check_values(first, n); !st)
        return st.error();
      loaded = c;
    }
    return chunk.data() + (r % per) * record;
  }
};

} // namespace

namespace {

/// The bytes of manifest `path`.
outcome<std::string> read_manifest_text(const std::string& path) {
  uint64_t size = 0;
  auto fd = open_for_reading(path, "table manifest", size);
  if (!fd)
    return fd.error();
  if (size > max_header_bytes) {
    ::close(*fd);
    return invalid(fmt::format("table manifest '{}' is {} bytes: not a manifest", path, size));
  }
  std::string text(size, '\0');
  bool read = pread_exact(*fd, text.data(), size, 0);
  ::close(*fd);
  if (!read)
    return io_error("read table manifest", path);
  return text;
}

} // namespace

outcome<table_checkpoint_layout> read_table_manifest(const std::string& dir,
                                                     const std::string& table,
                                                     const std::string& want_sha256) {
  auto path = table_manifest_path(dir, table);
  auto text = read_manifest_text(path);
  if (!text)
    return text.error();
  if (!want_sha256.empty() && to_hex(sha256(text->data(), text->size())) != want_sha256)
    return invalid(fmt::format("table manifest '{}' is not the one the chief checked (its "
                               "SHA-256 differs): it was replaced after the restore began, or "
                               "the chief and this node see different files at that path",
                               path));
  return parse_manifest(*text, path, table);
}

outcome<std::string> verify_table_manifest(const std::string& dir, const std::string& table,
                                           const std::string& key) {
  auto path = table_manifest_path(dir, table);
  auto text = read_manifest_text(path);
  if (!text)
    return text.error();
  // Its checksum, then (with a key) its HMAC, then its fields: under a key,
  // nothing of a forged manifest is read beyond the refusal.
  auto at = manifest_checksum_at(*text, path);
  if (!at)
    return at.error();
  if (!key.empty()) {
    // The line before the checksum's: "hmac " and 64 hex digits, the HMAC of
    // every byte before it.
    auto sum_at = *at;
    constexpr size_t line = 5 + 2 * digest_size + 1;
    bool has = sum_at > line && (*text)[sum_at - line - 1] == '\n'
               && text->compare(sum_at - line, 5, "hmac ") == 0 && (*text)[sum_at - 1] == '\n';
    if (!has)
      return invalid(fmt::format("table manifest '{}' has no HMAC, but checkpoint_key is set: "
                                 "it was written without the key (by a job without "
                                 "checkpoint_key, or by someone who does not hold the key), so "
                                 "its tables are not restored; restore an older checkpoint, or "
                                 "restore it by a job without checkpoint_key if you know who "
                                 "wrote it",
                                 path));
    auto want = to_hex(hmac_sha256(key, text->data(), sum_at - line));
    if (want.size() != 2 * digest_size
        || CRYPTO_memcmp(want.data(), text->data() + sum_at - line + 5, want.size()) != 0)
      return invalid(fmt::format("table manifest '{}' fails its HMAC: it was not written with "
                                 "this job's checkpoint_key (another key, or altered since); "
                                 "its tables are not restored. Check that every task's "
                                 "checkpoint_key names the same key file, or restore an older "
                                 "checkpoint (move this tables-<step> directory and its "
                                 "ckpt-<step>.afck away)",
                                 path));
  }
  if (auto l = parse_manifest(*text, path, table); !l)
    return l.error();
  return to_hex(sha256(text->data(), text->size()));
}

graph_status read_table_shard(const std::string& dir, const table_checkpoint_layout& saved,
                              const table_shard_target& target) {
  kernels::shard_router router, old_router;
  if (auto st = kernels::shard_router::make(target.strategy, target.shard_rows, router); !st.ok())
    return invalid("restoring table '" + saved.table + "': " + st.error);
  if (auto st = kernels::shard_router::make(saved.strategy, saved.shard_rows, old_router);
      !st.ok())
    return invalid("restoring table '" + saved.table + "': " + st.error);
  if (router.total_rows() != saved.rows() || target.row_shape != saved.row_shape)
    return invalid(fmt::format("restoring table '{}': the checkpoint's table is {} rows of {}, "
                               "the new shards cut {} rows of {}: mismatched dims",
                               saved.table, saved.rows(), shape_string(saved.row_shape),
                               router.total_rows(), shape_string(target.row_shape)),
                   af_error::shape_mismatch);
  if (target.k >= target.shard_rows.size() || target.value == nullptr
      || target.slots.size() != target.slot_names.size())
    return invalid(fmt::format("restoring table '{}': shard {} of {} with {} slot buffers for "
                               "{} slots",
                               saved.table, target.k, target.shard_rows.size(),
                               target.slots.size(), target.slot_names.size()));
  auto floats = static_cast<size_t>(saved.row_floats());
  // Where each wanted slot is in a saved record (-1: the checkpoint lacks it).
  std::vector<int64_t> slot_at;
  for (size_t i = 0; i < target.slot_names.size(); ++i) {
    auto it = std::find(saved.slots.begin(), saved.slots.end(), target.slot_names[i]);
    slot_at.push_back(it == saved.slots.end() ? -1 : it - saved.slots.begin());
    if (it == saved.slots.end())
      std::fill_n(target.slots[i], static_cast<size_t>(target.shard_rows[target.k]) * floats,
                  i < target.slot_starts.size() ? target.slot_starts[i] : 0.0f);
  }
  std::vector<std::unique_ptr<shard_source>> sources(saved.shard_rows.size());
  auto n_new = static_cast<int64_t>(target.shard_rows.size());
  int64_t first = 0;
  for (size_t i = 0; i < target.k; ++i)
    first += target.shard_rows[i];
  for (int64_t r = 0; r < target.shard_rows[target.k]; ++r) {
    int64_t id = target.strategy == kernels::partition_strategy::mod
                   ? r * n_new + static_cast<int64_t>(target.k)
                   : first + r;
    auto at = old_router.place(id);
    auto& src = sources[static_cast<size_t>(at.shard)];
    if (!src) {
      src = std::make_unique<shard_source>();
      if (auto st = src->open(dir, saved, static_cast<size_t>(at.shard)); !st)
        return st;
    }
    auto rec = src->row(static_cast<uint64_t>(at.row));
    if (!rec)
      return rec.error();
    auto dst = static_cast<size_t>(r) * floats;
    std::memcpy(target.value + dst, *rec, floats * 4);
    for (size_t i = 0; i < slot_at.size(); ++i)
      if (slot_at[i] >= 0)
        std::memcpy(target.slots[i] + dst, *rec + (1 + slot_at[i]) * floats * 4, floats * 4);
  }
  return ok();
}

} // namespace af::train
