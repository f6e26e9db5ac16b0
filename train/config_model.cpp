#include "train/config_model.hpp"

#include <charconv>

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "train/optimizer.hpp"

namespace af::train {

namespace {

std::optional<std::pair<std::string, std::string>> fail(std::string key, std::string what) {
  return std::pair<std::string, std::string>{std::move(key), std::move(what)};
}

} // namespace

std::optional<std::pair<std::string, std::string>> wire_dtype_problem(const train_config& c,
                                                                      bool combinations) {
  const auto& w = c.wire_dtype;
  if (w == "fp16" || w == "float16" || w == "half")
    return fail("wire_dtype", fmt::format("wire_dtype = \"{}\": fp16 is not offered (its range "
                                          "ends at 65504: gradients would need loss scaling); "
                                          "use \"float32\" or \"bf16\"", w));
  if (w != "float32" && w != "bf16")
    return fail("wire_dtype", fmt::format("wire_dtype = \"{}\" is unknown: use \"float32\" "
                                          "(the default) or \"bf16\"", w.substr(0, 80)));
  if (!combinations || w != "bf16")
    return std::nullopt;
  auto only = [](const char* key, const std::string& what) {
    return fail(key, fmt::format("wire_dtype = \"bf16\" with {}: bf16 goes on dense gradient "
                                 "pushes store-and-forward only (mode sync, async or ssp); set "
                                 "wire_dtype = \"float32\" for it",
                                 what));
  };
  if (c.pipeline_sync || c.pipeline_async)
    return only(c.pipeline_sync ? "pipeline_sync" : "pipeline_async",
                std::string{c.pipeline_sync ? "pipeline_sync" : "pipeline_async"}
                  + (c.pipeline_sync_auto ? " = \"auto\"" : " = true")
                  + " (a streamed push stays float32; or set it to false)");
  if (c.mode == "average" || c.mode == "allreduce")
    return only("mode", fmt::format("mode = \"{}\" (it sends parameters or reduces "
                                    "gradients among the workers, not through a push)",
                                    c.mode));
  if (c.model == "recommender")
    return only("model", "model = \"recommender\" (its sparse tables' rows go as "
                         "push_sparse, float32)");
  return std::nullopt;
}

std::optional<std::pair<std::string, std::string>> recommender_problem(const train_config& c,
                                                                       bool combinations) {
  constexpr int64_t max_rows = int64_t{1} << 40; // far past any table one job can hold
  for (auto [key, value] : {std::pair<const char*, int64_t>{"users", c.users}, {"items", c.items}})
    if (value < 1 || value > max_rows)
      return fail(key, fmt::format("{} = {}: a table has from 1 to 2^40 rows", key, value));
  if (c.dim < 1 || c.dim > 65536)
    return fail("dim", fmt::format("dim = {}: the latent factors per id are from 1 to 65536",
                                   c.dim));
  if (!(c.zipf >= 0) || !std::isfinite(c.zipf))
    return fail("zipf", fmt::format("zipf = {}: the exponent of the ids' popularity is a number "
                                    ">= 0 (0: uniform, 1: Zipf's law)", c.zipf));
  if (c.partition_strategy != "mod" && c.partition_strategy != "div")
    return fail("partition_strategy",
                fmt::format("partition_strategy = \"{}\" is unknown: use mod (TF's default: id "
                            "p on shard p % n) or div (contiguous runs)",
                            c.partition_strategy.substr(0, 80)));
  if (!combinations || c.model != "recommender")
    return std::nullopt;
  if (c.data != "synthetic" && c.data.rfind("csv:", 0) != 0)
    return fail("data", fmt::format("data = \"{}\" with model = \"recommender\": its data is "
                                    "\"synthetic\" (clicks from a planted truth) or "
                                    "\"csv:PATH\" (user,item,label rows)", c.data.substr(0, 80)));
  // What every process of the job holds: the examples (two ids and a
  // label each) and the Zipf draws' cumulative weights (8 bytes an id);
  // refused before a byte is allocated. The tables are checked where they
  // are held: recommender_table_problem.
  double bytes = (c.data == "synthetic" ? 20.0 * static_cast<double>(c.synthetic_examples)
                                        + 8.0 * static_cast<double>(c.users + c.items)
                                        : 0);
  if (bytes > static_cast<double>(c.max_data_bytes))
    return fail("synthetic_examples",
                fmt::format("synthetic_examples = {} (with users = {} and items = {}) need about "
                            "{:.4g} bytes in every process, more than max_data_bytes = {}: "
                            "lower them, or raise max_data_bytes on a machine with the memory",
                            c.synthetic_examples, c.users, c.items, bytes, c.max_data_bytes));
  return std::nullopt;
}

std::string recommender_table_problem(const train_config& c, uint32_t parts) {
  parts = std::max<uint32_t>(parts, 1);
  double slots = static_cast<double>(slot_names(c.optimizer.kind).size());
  // A process holds 1 / parts of every table's rows (one more row at most),
  // each row with its optimizer slots.
  double rows = std::ceil(static_cast<double>(c.users) / parts)
                + std::ceil(static_cast<double>(c.items) / parts);
  double bytes = rows * static_cast<double>(c.dim + 1) * 4 * (1 + slots);
  if (bytes <= static_cast<double>(c.max_data_bytes))
    return {};
  return fmt::format("users = {} and items = {} at dim = {} with optimizer {} ({} slot(s) a row) "
                     "need about {:.4g} bytes in {}, more than max_data_bytes = {}: lower them, "
                     "spread the tables over more ps tasks, or raise max_data_bytes on machines "
                     "with the memory",
                     c.users, c.items, c.dim, c.optimizer.kind, slots, bytes,
                     parts == 1 ? std::string{"this one process"}
                                : fmt::format("each of the {} ps tasks", parts),
                     c.max_data_bytes);
}

namespace detail {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\u{:04X}", u);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string real(double x) {
  if (std::isnan(x))
    return "nan";
  if (std::isinf(x))
    return x > 0 ? "inf" : "-inf";
  auto s = fmt::format("{}", x); // shortest text that round-trips
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s;
}

/// A decimal number as C's strtod reads it in the "C" locale, whole text
/// only ("1e3", ".5", "+2", "inf"); nullopt if it is not one.
std::optional<double> read_number(std::string_view s) {
  if (!s.empty() && s.front() == '+')
    s.remove_prefix(1);
  double x = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (s.empty() || ec != std::errc{} || p != s.data() + s.size())
    return std::nullopt;
  return x;
}

/// An integer, also written as a number with an exponent ("1e3"); nullopt if
/// the text is not a whole number that fits in 64 signed bits.
std::optional<int64_t> read_integer(std::string_view s) {
  if (!s.empty() && s.front() == '+')
    s.remove_prefix(1);
  int64_t n = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (!s.empty() && ec == std::errc{} && p == s.data() + s.size())
    return n;
  auto x = read_number(s);
  // 2^63 is exactly representable; anything at or above it does not fit.
  if (!x || !std::isfinite(*x) || std::trunc(*x) != *x || std::fabs(*x) >= 0x1p63)
    return std::nullopt;
  return static_cast<int64_t>(*x);
}

} // namespace detail

} // namespace af::train
