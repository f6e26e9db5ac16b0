// Checks of the bench programs' number options (actorflow-bench,
// actorflow-soak), run by CLI11 when it parses them: a bad value stops the
// program at once with what to pass, not minutes later with a consequence
// ("ratio=-nan", "the ps node did not come up") or CLI11's own range text.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace af::bench {

/// The values a number option takes.
struct number_rule {
  long double min = 1;       ///< the least value allowed
  bool min_excluded = false; ///< true: only values above `min` (a positive real)
  long double max = 1e18;    ///< the greatest (the option's type's range, or less)
  bool whole = true;         ///< an integer, else any finite number
  /// What to pass, as it reads after "must be": "a positive number of
  /// seconds", "0 (one per core) or a positive whole number of threads".
  std::string want;
};

/// A CLI11 check that the option's text is a number within `rule`. CLI11
/// prints its message after the option's name:
/// "--seconds: must be a positive number of seconds (got -5)",
/// "--seconds: 'abc' is not a number; pass a positive number of seconds".
CLI::Validator number_check(number_rule rule);

/// A positive whole number of `unit` ("round trips"), at most `max` (the
/// option's type's greatest value).
CLI::Validator positive_whole(const std::string& unit, long double max);

/// A positive number of seconds (fractions allowed).
CLI::Validator positive_seconds();

} // namespace af::bench
