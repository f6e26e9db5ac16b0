#pragma once
// The small sparse jobs the sparse tests train (test_sparse_job.cpp,
// test_sparse_in_graph.cpp, test_sparse_status.cpp): one config each, so that
// the between-graph and in-graph cases compare the same job; and how two
// runs' tables are compared.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.hpp"

namespace af::testing {

inline train::train_config small_job(const std::string& mode, uint32_t steps) {
  train::train_config c;
  c.model = "recommender";
  c.mode = mode;
  c.data = "synthetic";
  c.users = 203; // not a multiple of the ps count: uneven shards
  c.items = 101;
  c.dim = 4;
  c.synthetic_examples = 4000;
  c.batch_size = 64;
  c.steps = steps;
  c.epochs = 0;
  c.log_every = 0;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.5;
  c.init_timeout_ms = 20000;
  c.step_timeout_ms = 20000;
  return c;
}

/// A job that learns the planted truth in about 1,000 steps of 2 x 256
/// (the one-process trainer reaches 0.768 against the truth's 0.781).
inline train::train_config planted_job(const std::string& mode) {
  auto c = small_job(mode, 0);
  c.users = 300;
  c.items = 200;
  c.zipf = 0.8;
  c.synthetic_examples = 150000;
  c.batch_size = 256;
  c.epochs = 4;
  c.optimizer.kind = "adam";
  c.optimizer.lr = 0.02;
  return c;
}

/// Values that differ, bit for bit, between two runs' tables read back
/// whole ([table][row * width + col]).
inline size_t table_differences(const std::vector<std::vector<float>>& a,
                                const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  size_t differ = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    REQUIRE(a[t].size() == b[t].size());
    for (size_t i = 0; i < a[t].size(); ++i)
      differ += a[t][i] != b[t][i];
  }
  return differ;
}

} // namespace af::testing
