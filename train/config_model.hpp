#pragma once
/// Inside the training config (train/config.cpp): the keys of the sparse
/// models (model = "recommender": users, items, dim, zipf,
/// partition_strategy), checked here to keep config.cpp one job, and the
/// TOML text helpers both files write with. recommender_table_problem is
/// for the sparse job and the one-process trainer.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "train/config.hpp"

namespace af::train {

/// The first recommender key whose value makes no sense: {key, sentence
/// naming it, its value and what is allowed}. `combinations`: also keys
/// that are each fine but not together (the recommender's data, its size
/// against max_data_bytes), as config.cpp's check().
std::optional<std::pair<std::string, std::string>> recommender_problem(const train_config& c,
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

} // namespace detail

} // namespace af::train
