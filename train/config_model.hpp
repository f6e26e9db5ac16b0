#pragma once
/// Inside the training config (train/config.cpp): the keys of the sparse
/// models (model = "recommender": users, items, dim, zipf,
/// partition_strategy), checked here to keep config.cpp one job, and the
/// TOML text helpers both files write with. recommender_table_problem is
/// for the sparse job and the one-process trainer.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "train/config.hpp"

namespace af::train {

/// The first recommender key whose value makes no sense: {key, sentence
/// naming it, its value and what is allowed}. `combinations`: also keys
/// that are each fine but not together (the recommender's data, its size
/// against max_data_bytes), as config.cpp's check().
std::optional<std::pair<std::string, std::string>> recommender_problem(const train_config& c,
                                                                       bool combinations);

/// [train] wire_dtype: {key, sentence} if its value is not "float32" or
/// "bf16" (fp16 is named as not offered); with `combinations`, if it is
/// "bf16" where it cannot apply (pipeline_sync, pipeline_async, mode
/// average or allreduce, model recommender: the key that conflicts named).
std::optional<std::pair<std::string, std::string>> wire_dtype_problem(const train_config& c,
                                                                      bool combinations);

/// Empty if the recommender's tables of `c`, cut into `parts` pieces (the
/// ps tasks; 1: one process), fit max_data_bytes with their optimizer
/// slots, a piece per process; else a sentence naming the keys and what to
/// do. The job checks it over its ps tasks, --local over one.
std::string recommender_table_problem(const train_config& c, uint32_t parts);

namespace detail {

/// A TOML basic string.
std::string quoted(const std::string& s);

/// A TOML float that reads back as the same double.
std::string real(double x);

/// A decimal number as C's strtod reads it in the "C" locale, whole text
/// only ("1e3", ".5", "+2", "inf"); nullopt if it is not one.
std::optional<double> read_number(std::string_view s);

/// An integer, also written as a number with an exponent ("1e3"); nullopt if
/// the text is not a whole number that fits in 64 signed bits.
std::optional<int64_t> read_integer(std::string_view s);

} // namespace detail

} // namespace af::train
