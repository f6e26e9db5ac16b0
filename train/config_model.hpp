#pragma once
/// Inside the training config (train/config.cpp): the keys of the sparse
/// models (model = "recommender": users, items, dim, zipf,
/// partition_strategy), checked here to keep config.cpp one job, and the
/// TOML text helpers both files write with. Not for other callers.

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

namespace detail {

/// A TOML basic string.
std::string quoted(const std::string& s);

/// A TOML float that reads back as the same double.
std::string real(double x);

} // namespace detail

} // namespace af::train
