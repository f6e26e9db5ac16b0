// The number checks of the bench programs' options (bench/cli_checks.hpp).
#include "bench/cli_checks.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace af::bench {

namespace {

/// `text` as a number when all of it is one (strtold: a sign, decimals,
/// exponents; one too large is infinite, and then above any bound), else
/// false ("nan" too: it compares with no bound).
bool parse_number(const std::string& text, long double& out) {
  if (text.empty())
    return false;
  char* end = nullptr;
  out = std::strtold(text.c_str(), &end);
  return end == text.c_str() + text.size() && !std::isnan(out);
}

/// `text` as a whole number when all of it is one in base 10 ("1e3" and
/// "0x10" are not: CLI11 would not convert them to an integer either).
bool parse_whole(const std::string& text, long long& out) {
  if (text.empty())
    return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtoll(text.c_str(), &end, 10);
  return end == text.c_str() + text.size() && errno != ERANGE;
}

/// A bound as people write it: 256, 1000000000, 0.5.
std::string show(long double x) {
  std::ostringstream out;
  if (x == std::floor(x))
    out << std::fixed; // 1000000000000000000, not 1e+18
  out.precision(x == std::floor(x) ? 0 : 18);
  out << x;
  return out.str();
}

} // namespace

CLI::Validator number_check(number_rule rule) {
  auto check = [rule](std::string& text) -> std::string {
    const std::string got = " (got " + text + ")";
    long double x = 0;
    if (!parse_number(text, x))
      return "'" + text + "' is not a number; pass " + rule.want;
    if (rule.whole) {
      long long n = 0;
      if (!parse_whole(text, n)) // 2.5, 1e3: `want` says "whole"; or beyond long long
        return "must be " + rule.want + (errno == ERANGE ? ", at most " + show(rule.max) : "")
               + got;
      x = static_cast<long double>(n);
    }
    if (x < rule.min || (rule.min_excluded && x == rule.min))
      return "must be " + rule.want + got;
    if (x > rule.max)
      return "must be " + rule.want + ", at most " + show(rule.max) + got;
    return "";
  };
  bool positive = rule.min > 0 || (rule.min == 0 && rule.min_excluded);
  return CLI::Validator(check, positive ? "POSITIVE" : "NONNEGATIVE");
}

CLI::Validator positive_whole(const std::string& unit, long double max) {
  return number_check({1, false, max, true, "a positive whole number of " + unit});
}

CLI::Validator positive_seconds() {
  return number_check({0, true, 1e9, false, "a positive number of seconds"});
}

} // namespace af::bench
