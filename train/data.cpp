#include "train/data.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <random>

#include <fmt/format.h>
#include <zlib.h>

#include "core/read_file.hpp"

namespace af::train {

namespace {

graph_error data_error(std::string msg) {
  return graph_error{af_error::invalid_argument, std::move(msg)};
}

// --- random numbers that are the same on every standard library: only
// std::mt19937_64's output is specified, so the rest is done here.

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Independent streams from one user seed: the teacher, the examples, the
/// held-out split and each epoch's order do not share random numbers.
enum class stream_tag : uint64_t { teacher = 1, examples = 2, holdout = 3, epoch = 4 };

std::mt19937_64 stream(uint64_t seed, stream_tag tag) {
  return std::mt19937_64{splitmix64(seed ^ splitmix64(static_cast<uint64_t>(tag)))};
}

/// Uniform in [0, n), without modulo bias.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit = std::numeric_limits<uint64_t>::max()
                         - std::numeric_limits<uint64_t>::max() % n;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % n;
}

/// N(0, 1) by Box-Muller, both values of each pair used.
class gaussian {
public:
  explicit gaussian(std::mt19937_64 rng) : rng_(std::move(rng)) {}
  float next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = 1.0 - static_cast<double>(rng_() >> 11) * 0x1.0p-53; // (0, 1]
    double u2 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;       // [0, 1)
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = static_cast<float>(r * std::sin(2.0 * M_PI * u2));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(2.0 * M_PI * u2));
  }

private:
  std::mt19937_64 rng_;
  bool has_spare_ = false;
  float spare_ = 0;
};

/// Fisher-Yates over 0..n-1 into `out` (resized once, then reused).
void permutation(std::vector<uint32_t>& out, size_t n, std::mt19937_64 rng) {
  out.resize(n);
  std::iota(out.begin(), out.end(), 0u);
  for (size_t i = n; i > 1; --i)
    std::swap(out[i - 1], out[uniform_below(rng, i)]);
}

// --- files

/// The whole file, gunzipped if it is gzip (zlib reads plain files as is),
/// if it is a regular file (a FIFO would block, /dev/zero never end) and at
/// most `max_bytes` long once gunzipped (a small gzip can inflate to
/// gigabytes): else an error naming the file and the limit.
outcome<std::string> read_file(const std::string& path, const char* what, uint64_t max_bytes) {
  int fd = -1;
  if (auto why = open_regular_file(path, max_bytes, fd); !why.empty())
    return graph_error{errno == ENOENT ? af_error::not_found : af_error::invalid_argument,
                       fmt::format("cannot open {} '{}': {} (check the path{})", what, path, why,
                                   why.find("limit") != std::string::npos
                                     ? "; max_data_bytes raises the limit" : "")};
  gzFile f = gzdopen(fd, "rb");
  if (f == nullptr) {
    ::close(fd);
    return data_error(fmt::format("cannot open {} '{}': out of memory", what, path));
  }
  gzbuffer(f, 1 << 17);
  std::string out;
  std::error_code ec;
  if (auto size = std::filesystem::file_size(path, ec); !ec)
    out.reserve(static_cast<size_t>(std::min<uint64_t>(size, max_bytes)));
  char buf[1 << 16];
  bool too_large = false;
  for (;;) {
    int n = gzread(f, buf, sizeof buf);
    if (n <= 0)
      break;
    if (out.size() + static_cast<uint64_t>(n) > max_bytes) {
      too_large = true;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  int errnum = Z_OK;
  const char* msg = gzerror(f, &errnum);
  std::string reason = errnum == Z_ERRNO ? std::strerror(errno) : (msg ? msg : "");
  gzclose(f);
  if (too_large)
    return data_error(fmt::format("{} '{}' holds more than max_data_bytes = {} bytes (once "
                                  "gunzipped); raise max_data_bytes on a machine with the memory, "
                                  "or use a smaller file",
                                  what, path, max_bytes));
  if (errnum != Z_OK)
    return data_error(fmt::format("cannot read {} '{}': {} (a truncated or corrupt gzip file?)",
                                  what, path, reason));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

/// Rows [0, n) of `all` picked by `rows`, in that order.
dataset subset(const dataset& all, const std::vector<uint32_t>& rows, const std::string& name) {
  dataset out;
  out.name = name;
  out.features = all.features;
  out.classes = all.classes;
  out.x.resize(rows.size() * all.features);
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy_n(all.x.data() + rows[i] * all.features, all.features,
                out.x.data() + i * all.features);
  if (!all.y.empty()) {
    out.y.resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      out.y[i] = all.y[rows[i]];
  }
  if (!all.targets.empty()) {
    out.targets.resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      out.targets[i] = all.targets[rows[i]];
  }
  return out;
}

/// The labels (or targets) of examples `rows` as a [rows] tensor; empty if
/// the data has neither.
template <class Index>
tensor labels_of(const dataset& data, const Index* rows, size_t n) {
  if (!data.y.empty()) {
    tensor y{dtype::int32, {static_cast<int64_t>(n)}};
    auto* dst = y.mutable_data<int32_t>();
    for (size_t i = 0; i < n; ++i)
      dst[i] = data.y[rows ? rows[i] : i];
    return y;
  }
  if (!data.targets.empty()) {
    tensor y{dtype::float32, {static_cast<int64_t>(n)}};
    auto* dst = y.mutable_data<float>();
    for (size_t i = 0; i < n; ++i)
      dst[i] = data.targets[rows ? rows[i] : i];
    return y;
  }
  return {};
}

// --- IDX

struct idx_file {
  std::string bytes;
  std::vector<uint32_t> dims;
  size_t header = 0;
};

uint32_t big_endian_u32(const std::string& s, size_t at) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(s[at + i])); };
  return (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
}

/// Reads an IDX file of unsigned bytes with `dims` dimensions and checks its
/// header against its size.
outcome<idx_file> read_idx_file(const std::string& path, uint32_t dims, const char* what,
                                uint64_t max_bytes) {
  auto bytes = read_file(path, fmt::format("IDX {} file", what).c_str(), max_bytes);
  if (!bytes)
    return bytes.error();
  idx_file f;
  f.bytes = std::move(*bytes);
  const uint32_t expected_magic = 0x800u | dims;
  if (f.bytes.size() < 4 || big_endian_u32(f.bytes, 0) != expected_magic)
    return data_error(fmt::format(
      "'{}' is not an IDX {} file: its magic number is {}, expected 0x{:08x} (unsigned bytes, "
      "{} dimension{}); check that images and labels are not swapped",
      path, what,
      f.bytes.size() < 4 ? std::string("missing (the file has fewer than 4 bytes)")
                         : fmt::format("0x{:08x}", big_endian_u32(f.bytes, 0)),
      expected_magic, dims, dims == 1 ? "" : "s"));
  f.header = 4 + 4 * size_t{dims};
  if (f.bytes.size() < f.header)
    return data_error(fmt::format("IDX {} file '{}' is truncated: {} bytes, shorter than its "
                                  "{}-byte header",
                                  what, path, f.bytes.size(), f.header));
  uint64_t payload = 1;
  std::string shape;
  for (uint32_t d = 0; d < dims; ++d) {
    uint32_t n = big_endian_u32(f.bytes, 4 + 4 * size_t{d});
    f.dims.push_back(n);
    shape += fmt::format("{}{}", d ? " x " : "", n);
    if (__builtin_mul_overflow(payload, uint64_t{n}, &payload))
      return data_error(fmt::format("IDX {} file '{}' claims dimensions {} that overflow",
                                    what, path, shape));
  }
  if (f.bytes.size() - f.header != payload)
    return data_error(fmt::format(
      "IDX {} file '{}' has {} data bytes but its header ({}) says {}: the file is {}", what,
      path, f.bytes.size() - f.header, shape, payload,
      f.bytes.size() - f.header < payload ? "truncated" : "longer than its header says"));
  return f;
}

} // namespace

// --- readers

namespace {

/// A field for an error message: a huge one (a 50 MB line) is cut.
std::string shown(std::string_view field) {
  return field.size() <= 40 ? std::string{field} : std::string{field.substr(0, 40)} + "...";
}

} // namespace

outcome<dataset> read_csv(const std::string& path, bool has_header, float scale,
                          uint32_t max_classes, uint64_t max_bytes) {
  auto text = read_file(path, "CSV file", max_bytes);
  if (!text)
    return text.error();
  dataset out;
  out.name = path;
  const std::string& s = *text;
  size_t columns = 0;
  size_t first_line = 0;
  int64_t max_label = -1;
  size_t line_no = 0;
  bool header_pending = has_header;
  for (size_t pos = 0; pos < s.size();) {
    size_t end = s.find('\n', pos);
    if (end == std::string::npos)
      end = s.size();
    std::string_view line{s.data() + pos, end - pos};
    pos = end + 1;
    ++line_no;
    if (trim(line).empty())
      continue;
    if (header_pending) {
      header_pending = false;
      continue;
    }
    size_t fields = static_cast<size_t>(std::count(line.begin(), line.end(), ',')) + 1;
    if (columns == 0) {
      if (fields < 2)
        return data_error(fmt::format("{} line {}: {} column; a CSV example needs at least one "
                                      "feature and the label (the last column)",
                                      path, line_no, fields));
      columns = fields;
      first_line = line_no;
      out.features = columns - 1;
      // A good guess of the row count from the first line saves regrowing x.
      out.x.reserve(std::min<uint64_t>(s.size() / (line.size() + 1) * out.features
                                         + out.features,
                                       max_bytes / sizeof(float)));
    } else if (fields != columns) {
      return data_error(fmt::format("{} line {}: {} columns, but line {} has {}; every example "
                                    "needs the same features and a label",
                                    path, line_no, fields, first_line, columns));
    }
    // "0,0\n" is 4 bytes of text but 8 of float32 and label: bound the set too.
    if ((out.x.size() + out.features) * sizeof(float) > max_bytes)
      return data_error(fmt::format("{} line {}: the examples so far take more than "
                                    "max_data_bytes = {} bytes in memory; raise max_data_bytes on "
                                    "a machine with the memory, or use a smaller file",
                                    path, line_no, max_bytes));
    size_t column = 0;
    for (size_t at = 0; column < columns; ++column) {
      size_t comma = line.find(',', at);
      if (comma == std::string_view::npos)
        comma = line.size();
      auto field = trim(line.substr(at, comma - at));
      at = comma + 1;
      const char* b = field.data();
      const char* e = b + field.size();
      if (column + 1 < columns) {
        float v = 0;
        auto [p, ec] = std::from_chars(b, e, v);
        if (field.empty() || ec != std::errc{} || p != e || !std::isfinite(v))
          return data_error(fmt::format(
            "{} line {}, column {}: '{}' is not a finite number{}", path, line_no, column + 1,
            shown(field),
            line_no == 1 ? " (a header line? data = \"csv:PATH\" reads none: remove it)" : ""));
        out.x.push_back(v * scale);
      } else {
        int64_t label = -1;
        auto [p, ec] = std::from_chars(b, e, label);
        bool integer = !field.empty() && p == e && (ec == std::errc{}
                                                    || ec == std::errc::result_out_of_range);
        if (!integer || label < 0)
          return data_error(fmt::format("{} line {}, column {}: label '{}' must be a "
                                        "non-negative integer (the class, last column)",
                                        path, line_no, column + 1, shown(field)));
        if (ec != std::errc{} || label >= int64_t{max_classes})
          return data_error(fmt::format("{} line {}, column {}: label {} is out of range: "
                                        "labels are class numbers in [0, {}) (a model has a "
                                        "weight row per class); is the last column really the "
                                        "class?",
                                        path, line_no, column + 1, shown(field), max_classes));
        out.y.push_back(static_cast<int32_t>(label));
        max_label = std::max(max_label, label);
      }
    }
  }
  if (out.y.empty())
    return data_error(fmt::format("CSV file '{}' holds no examples", path));
  out.classes = static_cast<uint32_t>(max_label + 1);
  return out;
}

outcome<dataset> read_idx(const std::string& images, const std::string& labels,
                          uint64_t max_bytes) {
  auto img = read_idx_file(images, 3, "images", max_bytes);
  if (!img)
    return img.error();
  auto lab = read_idx_file(labels, 1, "labels", max_bytes);
  if (!lab)
    return lab.error();
  const size_t n = img->dims[0];
  if (lab->dims[0] != n)
    return data_error(fmt::format("IDX images '{}' hold {} examples but labels '{}' hold {}; "
                                  "use the labels file of that images file",
                                  images, n, labels, lab->dims[0]));
  if (n == 0)
    return data_error(fmt::format("IDX images '{}' hold no examples", images));
  dataset out;
  out.name = images;
  out.features = size_t{img->dims[1]} * img->dims[2];
  // Each byte of the file becomes a float32.
  if ((img->bytes.size() - img->header) > max_bytes / sizeof(float))
    return data_error(fmt::format("IDX images '{}' ({} x {} bytes) take {} bytes as float32, more "
                                  "than max_data_bytes = {}; raise max_data_bytes on a machine "
                                  "with the memory",
                                  images, n, out.features,
                                  (img->bytes.size() - img->header) * sizeof(float), max_bytes));
  out.x.resize(n * out.features);
  const auto* px = reinterpret_cast<const unsigned char*>(img->bytes.data() + img->header);
  for (size_t i = 0; i < out.x.size(); ++i)
    out.x[i] = static_cast<float>(px[i]) * (1.0f / 255.0f);
  out.y.resize(n);
  const auto* lb = reinterpret_cast<const unsigned char*>(lab->bytes.data() + lab->header);
  int max_label = 0;
  for (size_t i = 0; i < n; ++i) {
    out.y[i] = lb[i];
    max_label = std::max<int>(max_label, lb[i]);
  }
  out.classes = static_cast<uint32_t>(max_label + 1);
  return out;
}

std::vector<std::string> data_search_path(const std::string& env_dir,
                                          const std::string& exe_path) {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs;
  if (!env_dir.empty())
    dirs.push_back(env_dir);
  if (!exe_path.empty()) {
    auto bin = fs::path{exe_path}.parent_path();
    for (const char* rel : {"../share/actorflow/data", "../data", "data"})
      dirs.push_back((bin / rel).lexically_normal().string());
  }
#ifdef ACTORFLOW_DATA_DIR
  dirs.emplace_back(ACTORFLOW_DATA_DIR);
#endif
  dirs.emplace_back("./data");
  // The build folder's ../data is the source tree's: look there once.
  std::vector<std::string> unique;
  for (auto& d : dirs)
    if (std::find(unique.begin(), unique.end(), d) == unique.end())
      unique.push_back(std::move(d));
  return unique;
}

outcome<dataset> load_digits(const std::string& data_dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs;
  if (!data_dir.empty()) {
    dirs.push_back(data_dir);
  } else {
    const char* env = std::getenv("ACTORFLOW_DATA_DIR");
    std::error_code ec;
    auto exe = fs::read_symlink("/proc/self/exe", ec);
    dirs = data_search_path(env ? env : "", ec ? std::string{} : exe.string());
  }
  std::string looked;
  for (const auto& dir : dirs) {
    auto path = (fs::path{dir} / "digits.csv.gz").string();
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      looked += (looked.empty() ? "" : ", ") + path;
      continue;
    }
    auto d = read_csv(path, false, 1.0f / 16.0f);
    if (!d)
      return d.error();
    if (d->features != 64 || d->classes > 10 || d->size() == 0)
      return data_error(fmt::format("'{}' is not the UCI digits set: {} examples of {} features "
                                    "and {} classes, expected 64 features and labels 0..9",
                                    path, d->size(), d->features, d->classes));
    d->classes = 10;
    return d;
  }
  return graph_error{af_error::not_found,
                     fmt::format("the digits data set (digits.csv.gz) is in none of the places "
                                 "looked: {}; set ACTORFLOW_DATA_DIR to the folder that holds it "
                                 "(the repository's data/), or install it beside the binary",
                                 looked)};
}

// --- synthetic data

linear_teacher synthetic_teacher(size_t features, size_t outputs, uint64_t seed) {
  linear_teacher t;
  t.features = features;
  t.outputs = outputs;
  t.w.resize(features * outputs);
  t.b.resize(outputs);
  gaussian g{stream(seed, stream_tag::teacher)};
  // x . w then has unit variance whatever the feature count.
  const float scale = features ? 1.0f / std::sqrt(static_cast<float>(features)) : 0.0f;
  for (auto& v : t.w)
    v = g.next() * scale;
  for (auto& v : t.b)
    v = 0.1f * g.next();
  return t;
}

dataset synthetic_classification(size_t examples, size_t features, uint32_t classes,
                                 uint64_t seed) {
  dataset out;
  out.name = fmt::format("synthetic classification ({} examples, {} features, {} classes, "
                         "seed {})",
                         examples, features, classes, seed);
  out.features = features;
  out.classes = classes;
  if (features == 0)
    return out;
  auto t = synthetic_teacher(features, classes, seed);
  gaussian g{stream(seed, stream_tag::examples)};
  out.x.resize(examples * features);
  out.y.resize(examples);
  std::vector<double> logits(classes);
  for (size_t i = 0; i < examples; ++i) {
    float* x = out.x.data() + i * features;
    for (size_t f = 0; f < features; ++f)
      x[f] = g.next();
    std::copy(t.b.begin(), t.b.end(), logits.begin());
    for (size_t f = 0; f < features; ++f)
      for (uint32_t c = 0; c < classes; ++c)
        logits[c] += static_cast<double>(x[f]) * t.w[f * classes + c];
    out.y[i] = classes ? static_cast<int32_t>(std::max_element(logits.begin(), logits.end())
                                              - logits.begin())
                       : 0;
  }
  return out;
}

dataset synthetic_linear(size_t examples, size_t features, uint64_t seed) {
  dataset out;
  out.name = fmt::format("synthetic linear regression ({} examples, {} features, seed {})",
                         examples, features, seed);
  out.features = features;
  if (features == 0)
    return out;
  auto t = synthetic_teacher(features, 1, seed);
  gaussian g{stream(seed, stream_tag::examples)};
  out.x.resize(examples * features);
  out.targets.resize(examples);
  for (size_t i = 0; i < examples; ++i) {
    float* x = out.x.data() + i * features;
    double sum = 0;
    for (size_t f = 0; f < features; ++f) {
      x[f] = g.next();
      sum += static_cast<double>(x[f]) * t.w[f];
    }
    out.targets[i] = static_cast<float>(sum);
  }
  return out;
}

dataset per_worker_linear(size_t workers, size_t features, uint64_t seed) {
  dataset out;
  out.name = fmt::format("per-worker linear regression ({} workers, {} features, seed {})",
                         workers, features, seed);
  out.features = features;
  out.fixed_order = true;
  if (features == 0)
    return out;
  auto rng = stream(seed, stream_tag::examples);
  // Uniform in [-1, 1] has variance 1/3: this scale makes E|x|^2 = 1.
  const double scale = std::sqrt(3.0 / static_cast<double>(features));
  out.x.resize(workers * features);
  out.targets.resize(workers);
  for (size_t i = 0; i < workers; ++i) {
    float* x = out.x.data() + i * features;
    for (size_t f = 0; f < features; ++f)
      x[f] = static_cast<float>((static_cast<double>(rng() >> 11) * 0x1.0p-52 - 1.0) * scale);
    out.targets[i] = static_cast<float>(1 + i);
  }
  return out;
}

// --- splitting and batching

split holdout(const dataset& all, double fraction, uint64_t seed) {
  const size_t n = all.size();
  std::vector<uint32_t> order;
  permutation(order, n, stream(seed, stream_tag::holdout));
  double want = std::isfinite(fraction) ? std::round(fraction * static_cast<double>(n)) : 0.0;
  size_t n_test = static_cast<size_t>(std::clamp(want, 0.0, static_cast<double>(n)));
  // A fraction strictly inside (0, 1) leaves something on both sides.
  if (fraction > 0 && fraction < 1 && n >= 2)
    n_test = std::clamp<size_t>(n_test, 1, n - 1);
  std::vector<uint32_t> train_rows(order.begin(), order.end() - static_cast<ptrdiff_t>(n_test));
  std::vector<uint32_t> test_rows(order.end() - static_cast<ptrdiff_t>(n_test), order.end());
  // Each side keeps the examples' original order (the batcher shuffles).
  std::sort(train_rows.begin(), train_rows.end());
  std::sort(test_rows.begin(), test_rows.end());
  return {subset(all, train_rows, all.name + " [train]"),
          subset(all, test_rows, all.name + " [held out]")};
}

batcher::batcher(const dataset& data, size_t batch_size, uint32_t shard, uint32_t shards,
                 uint64_t seed, bool shuffle)
  : data_(&data),
    batch_size_(batch_size),
    shard_(shard),
    shards_(shards),
    seed_(seed),
    shuffle_(shuffle) {
  // nop
}

std::string batcher::check(const dataset& data, size_t batch_size, uint32_t shard,
                           uint32_t shards) {
  if (batch_size == 0)
    return "the batch size is 0: it must be at least 1";
  if (shards == 0 || shard >= shards)
    return fmt::format("shard {} of {} does not exist: shards are 0..shards-1", shard, shards);
  if (data.size() > std::numeric_limits<uint32_t>::max())
    return fmt::format("{} holds {} examples; the batcher handles up to 2^32 - 1", data.name,
                       data.size());
  if (data.size() < batch_size * shards)
    return fmt::format("{} holds {} examples, fewer than one global batch of {} ({} x {} "
                       "workers): lower batch_size or use more data",
                       data.name, data.size(), batch_size * shards, batch_size, shards);
  return {};
}

uint64_t batcher::steps_per_epoch() const {
  if (!check(*data_, batch_size_, shard_, shards_).empty())
    return 0;
  return data_->size() / (batch_size_ * shards_);
}

batch batcher::at(uint64_t step) const {
  const uint64_t per_epoch = steps_per_epoch();
  if (per_epoch == 0)
    return {};
  const uint64_t epoch = step / per_epoch;
  const uint64_t within = step % per_epoch;
  const bool ordered = !shuffle_ || data_->fixed_order;
  const bool same_every_step = data_->fixed_order && per_epoch == 1;
  if (same_every_step && same_.x.num_elements() > 0)
    return same_;
  if (ordered) {
    if (order_.size() != data_->size()) {
      order_.resize(data_->size());
      std::iota(order_.begin(), order_.end(), 0u);
    }
  } else if (epoch != cached_epoch_ || order_.size() != data_->size()) {
    permutation(order_, data_->size(), stream(seed_ + epoch, stream_tag::epoch));
    cached_epoch_ = epoch;
  }
  batch out;
  out.first_example = within * batch_size_ * shards_ + uint64_t{shard_} * batch_size_;
  const uint32_t* rows = order_.data() + out.first_example;
  const size_t f = data_->features;
  out.x = tensor{dtype::float32, {static_cast<int64_t>(batch_size_), static_cast<int64_t>(f)}};
  float* x = out.x.mutable_data<float>();
  for (size_t i = 0; i < batch_size_; ++i)
    std::memcpy(x + i * f, data_->x.data() + size_t{rows[i]} * f, f * sizeof(float));
  out.y = labels_of(*data_, rows, batch_size_);
  if (same_every_step)
    same_ = out;
  return out;
}

batch whole(const dataset& data) {
  batch out;
  const size_t n = data.size();
  out.x = tensor{dtype::float32,
                 {static_cast<int64_t>(n), static_cast<int64_t>(data.features)}};
  if (!data.x.empty())
    std::memcpy(out.x.mutable_data<float>(), data.x.data(), n * data.features * sizeof(float));
  out.y = labels_of<uint32_t>(data, nullptr, n);
  return out;
}

} // namespace af::train
