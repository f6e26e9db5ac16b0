#include "train/config_model.hpp"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace af::train {

namespace {

std::optional<std::pair<std::string, std::string>> fail(std::string key, std::string what) {
  return std::pair<std::string, std::string>{std::move(key), std::move(what)};
}

} // namespace

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
  // The tables with up to two optimizer slots each, and the examples (two
  // ids and a label): refused before a byte is allocated.
  double bytes = 3.0 * static_cast<double>(c.users + c.items) * static_cast<double>(c.dim + 1) * 4
               + (c.data == "synthetic" ? 20.0 * static_cast<double>(c.synthetic_examples) : 0);
  if (bytes > static_cast<double>(c.max_data_bytes))
    return fail(c.users >= c.items ? "users" : "items",
                fmt::format("users = {} and items = {} at dim = {} (with their optimizer slots) "
                            "and synthetic_examples = {} need about {:.4g} bytes, more than "
                            "max_data_bytes = {}: lower them, or raise max_data_bytes on a "
                            "machine with the memory",
                            c.users, c.items, c.dim, c.synthetic_examples, bytes,
                            c.max_data_bytes));
  return std::nullopt;
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

} // namespace detail

} // namespace af::train
