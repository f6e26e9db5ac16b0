#pragma once
/// Data sets held in memory by the process itself (a Python program's NumPy
/// arrays, python/train_job.cpp), named so that a training config can use
/// one as its data: data = "memory:NAME". load_data (train/local.hpp) takes
/// the registered set as it is, like a file it has read: the arrays were
/// copied once into it, and nothing copies it again but the held-out split
/// that every data set gets. Thread-safe; no CAF.

#include <memory>
#include <string>

#include "train/data.hpp"

namespace af::train {

/// The prefix of a config's data value that names a registered set.
constexpr const char* memory_data_prefix = "memory:";

/// Registers `data` under `name` (replacing one of that name); the config's
/// data is then "memory:" + name.
void put_memory_dataset(const std::string& name, std::shared_ptr<const dataset> data);

/// Forgets `name` (a job that has loaded it keeps its own split).
void drop_memory_dataset(const std::string& name);

/// The set registered under `name` (without the prefix), or null.
std::shared_ptr<const dataset> find_memory_dataset(const std::string& name);

} // namespace af::train
