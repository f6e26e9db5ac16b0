// The sparse ops of issue 25 (kernels/sparse.hpp, docs/ops.md "Sparse ops"):
// gather / embedding_lookup, unique, unsorted_segment_sum, the scatter
// updates and gather's gradient, with TensorFlow's semantics, on the CPU
// backend through the graph (no cluster); the CUDA kernels against the CPU
// under [.][gpu]. Each case says which bug it catches.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/evaluate.hpp"
#include "graph/graph.hpp"
#include "kernels/kernels.hpp"
#include "kernels/op_registry.hpp"
#include "kernels/sparse.hpp"

using namespace af;

namespace {

/// A [rows, cols] float64 table with value r * 10 + c at (r, c).
tensor table(int64_t rows, int64_t cols) {
  std::vector<double> v;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      v.push_back(static_cast<double>(r * 10 + c));
  return tensor::from_values<double>({rows, cols}, v);
}

/// t's elements are `want`, in order.
template <class T>
void check_values(const tensor& t, const std::vector<T>& want) {
  REQUIRE(t.num_elements() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    CHECK(t.data<T>()[i] == want[i]);
  }
}

/// Runs `y` of `g` on the CPU; the error's sentence if it fails.
outcome<tensor> run_one(const graph& g, output y) {
  variable_values vars;
  auto cpu = kernels::make_cpu_backend();
  auto r = evaluate(g, {y}, {}, vars, *cpu);
  if (!r)
    return r.error();
  return r->front();
}

} // namespace

// -- gather / embedding_lookup ------------------------------------------------------

TEST_CASE("gather of int64 ids of rank 2 takes the rows in the ids' order "
          "(catches ids read as int32, or rows taken in sorted order)", "[sparse][gather]") {
  graph g;
  auto params = g.constant(table(5, 3));
  // Read as int32 words, these ids would be 4, 0, 0, 0: the rows below differ.
  auto ids = g.constant(tensor::from_values<int64_t>({2, 2}, {4, 0, 4, 2}));
  auto y = run_one(g, g.embedding_lookup(params, ids));
  REQUIRE(y);
  CHECK(y->shape() == shape_type{2, 2, 3});
  std::vector<double> want = {40, 41, 42, 0, 1, 2, 40, 41, 42, 20, 21, 22};
  check_values(*y, want);
  CHECK(g.at(g.embedding_lookup(params, ids)).op == "gather"); // the TF alias builds gather
}

TEST_CASE("gather of an int32 table by int32 ids copies rows whatever the dtype "
          "(catches a float-only gather)", "[sparse][gather]") {
  graph g;
  auto params = g.constant(tensor::from_values<int32_t>({3, 2}, {1, 2, 3, 4, 5, 6}));
  auto ids = g.constant(tensor::from_values<int32_t>({3}, {2, 2, 0}));
  auto y = run_one(g, g.gather(params, ids));
  REQUIRE(y);
  CHECK(y->type() == dtype::int32);
  CHECK(y->shape() == shape_type{3, 2});
  std::vector<int32_t> want = {5, 6, 5, 6, 1, 2};
  check_values(*y, want);
}

TEST_CASE("gather refuses an id out of range (below 0 or at least rows) naming the id, its position and the op "
          "(catches a read out of bounds)", "[sparse][gather]") {
  graph g;
  auto params = g.constant(table(10, 2));
  auto ids = g.constant(tensor::from_values<int64_t>({5}, {1, 2, 3, 17, 0}));
  auto y = run_one(g, g.embedding_lookup(params, ids, "user_emb"));
  REQUIRE_FALSE(y);
  INFO(y.error().what);
  CHECK(y.error().what.find("'user_emb'") != std::string::npos);
  CHECK(y.error().what.find("indices[3] = 17 is not in [0, 10)") != std::string::npos);
  // Negative ids too (TF refuses them in gather), and float ids by their dtype.
  auto neg = g.constant(tensor::from_values<int32_t>({2}, {0, -1}));
  auto y2 = run_one(g, g.gather(params, neg));
  REQUIRE_FALSE(y2);
  CHECK(y2.error().what.find("indices[1] = -1 is not in [0, 10)") != std::string::npos);
  auto y3 = run_one(g, g.gather(params, g.constant(tensor::scalar(1))));
  REQUIRE_FALSE(y3);
  CHECK(y3.error().what.find("indices must be int32 or int64") != std::string::npos);
}

TEST_CASE("gather's shape rule takes ids or rows whose size is known only at run time "
          "(unique's output), bounding only a result it can size (catches an unknown dim read "
          "as a count past the bound)",
          "[sparse][gather][registry]") {
  using kernels::unknown_dim;
  kernels::value_info out;
  // gather(params, unique(ids).y): the ids' length is unknown_dim.
  auto st = kernels::infer_op("gather", {}, {{dtype::float32, {10, 3}}, {dtype::int64, {unknown_dim}}},
                              out);
  INFO(st.error);
  REQUIRE(st.ok());
  CHECK(out.shape == shape_type{unknown_dim, 3});
  // A row dim unknown too (params of an op whose output is sized at run time).
  st = kernels::infer_op("gather", {}, {{dtype::float32, {10, unknown_dim}}, {dtype::int64, {4}}},
                         out);
  INFO(st.error);
  REQUIRE(st.ok());
  CHECK(out.shape == shape_type{4, unknown_dim});
  kernels::value_info grad;
  st = kernels::infer_op("gather_grad", {},
                         {{dtype::float32, {unknown_dim, 3}}, {dtype::float32, {10, 3}},
                          {dtype::int64, {unknown_dim}}},
                         grad);
  INFO(st.error);
  REQUIRE(st.ok());
  CHECK(grad.shape == shape_type{10, 3});
  // Known dims past the bound are still refused by the rule.
  st = kernels::infer_op("gather", {}, {{dtype::float32, {2, int64_t{1} << 16}},
                                        {dtype::int64, {int64_t{1} << 14}}},
                         out);
  CHECK_FALSE(st.ok());
}

TEST_CASE("a scatter is not bounded as a gather's result: it allocates none (catches a scalar "
          "update of many rows refused as \"gather, ids = ...\")",
          "[sparse][scatter]") {
  // The bound lowered to 1 KiB (as a node with a small max_message_bytes
  // would set it): 256 ids of rows of 2 float64 name 4 KiB of rows, but a
  // scalar update allocates nothing of that size.
  struct cap {
    uint64_t before = max_decoded_tensor_bytes();
    cap() { set_max_decoded_tensor_bytes(1024); }
    ~cap() { set_max_decoded_tensor_bytes(before); }
  } small;
  graph g;
  variable_values vars;
  auto cpu = kernels::make_cpu_backend();
  auto emb = *g.variable("emb", {4, 2}, initializer::from_tensor(table(4, 2)), dtype::float64);
  REQUIRE(initialize_values(g, vars));
  std::vector<int64_t> ids(256);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int64_t>(i % 4);
  auto y = g.scatter_update(emb, g.constant(tensor::from_values<int64_t>({256}, ids)),
                            g.constant(tensor::from_values<double>({}, {7})));
  auto r = evaluate(g, {y}, {}, vars, *cpu);
  INFO((r ? std::string{} : r.error().what));
  REQUIRE(r);
  check_values(vars.at("emb"), std::vector<double>(8, 7.0));
}

// -- unique ------------------------------------------------------------------------

TEST_CASE("gather refuses ids whose rows would pass the bytes a tensor may have, before "
          "allocating, naming the op and the bound (a few bytes of ids sized gigabytes, also "
          "through a variable's gather over CAF)",
          "[sparse][gather]") {
  graph g;
  // 2 rows of 2^16 float32 (512 KiB); 2^14 ids of row 0 ask for 4 GiB of
  // rows, past the bound (2 GiB here).
  auto params = g.constant(tensor{dtype::float32, {2, int64_t{1} << 16}});
  auto many = g.constant(tensor::from_values<int64_t>({int64_t{1} << 14},
                                                     std::vector<int64_t>(size_t{1} << 14, 0)));
  auto y = run_one(g, g.gather(params, many));
  REQUIRE_FALSE(y);
  INFO(y.error().what);
  CHECK(y.error().what.find("gather: ids = 16384 makes a result of more than "
                            + std::to_string(max_decoded_tensor_bytes()) + " bytes")
        != std::string::npos);
  graph small;
  auto few = run_one(small, small.gather(small.constant(tensor{dtype::float32, {2, int64_t{1} << 16}}),
                                         small.constant(tensor::from_values<int64_t>({4}, {0, 1, 1, 0}))));
  REQUIRE(few);
  CHECK(few->shape() == shape_type{4, int64_t{1} << 16});
}

TEST_CASE("unique gives the distinct ids in first-occurrence order and the inverse indices "
          "(catches sorted output, or idx into the wrong order)", "[sparse][unique]") {
  graph g;
  auto x = g.constant(tensor::from_values<int64_t>({7}, {9, 2, 9, 5, 2, 2, -4}));
  auto u = g.unique(x);
  auto y = run_one(g, u.y);
  auto idx = run_one(g, u.idx);
  REQUIRE(y);
  REQUIRE(idx);
  CHECK(y->type() == dtype::int64);
  REQUIRE(y->shape() == shape_type{4});
  std::vector<int64_t> want_y = {9, 2, 5, -4};
  check_values(*y, want_y);
  CHECK(idx->type() == dtype::int32); // TF's default out_idx
  REQUIRE(idx->shape() == shape_type{7});
  std::vector<int32_t> want_idx = {0, 1, 0, 2, 1, 1, 3};
  check_values(*idx, want_idx);
  // x == y[idx], the property a lookup of the deduplicated ids relies on.
  auto back = run_one(g, g.gather(u.y, u.idx));
  REQUIRE(back);
  for (size_t i = 0; i < 7; ++i)
    CHECK(back->data<int64_t>()[i] == kernels::integer_at(*run_one(g, x), i));
  CHECK_FALSE(run_one(g, g.unique(g.constant(tensor::scalar(1))).y)); // floats refused
}

// -- unsorted_segment_sum -------------------------------------------------------------

TEST_CASE("unsorted_segment_sum sums rows with the same id, drops negative ids and zeroes "
          "segments no id names (catches a last-write-wins sum, or a negative id written)",
          "[sparse][segment_sum]") {
  graph g;
  auto data = g.constant(table(4, 2)); // rows (0, 1), (10, 11), (20, 21), (30, 31)
  auto ids = g.constant(tensor::from_values<int32_t>({4}, {2, -1, 0, 2}));
  auto n = g.constant(tensor::from_values<int64_t>({}, {3}));
  auto y = run_one(g, g.unsorted_segment_sum(data, ids, n));
  REQUIRE(y);
  REQUIRE(y->shape() == shape_type{3, 2});
  std::vector<double> want = {20, 21, 0, 0, 30, 32}; // row 2 = data[0] + data[3]; data[1] dropped
  check_values(*y, want);
  // segment_ids of rank 2, a prefix of data's shape [2, 2, 3].
  auto d3 = g.constant(tensor::from_values<double>({2, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  auto ids2 = g.constant(tensor::from_values<int64_t>({2, 2}, {1, 1, 0, 1}));
  auto y2 = run_one(g, g.unsorted_segment_sum(d3, ids2, g.constant(tensor::from_values<int32_t>({}, {2}))));
  REQUIRE(y2);
  REQUIRE(y2->shape() == shape_type{2, 3});
  std::vector<double> want2 = {7, 8, 9, 1 + 4 + 10, 2 + 5 + 11, 3 + 6 + 12};
  check_values(*y2, want2);
}

TEST_CASE("unsorted_segment_sum refuses an id >= num_segments naming it (catches a write out of "
          "bounds)", "[sparse][segment_sum]") {
  graph g;
  auto data = g.constant(table(3, 2));
  auto ids = g.constant(tensor::from_values<int64_t>({3}, {0, 5, 1}));
  auto n = g.constant(tensor::from_values<int32_t>({}, {3}));
  auto y = run_one(g, g.unsorted_segment_sum(data, ids, n));
  REQUIRE_FALSE(y);
  INFO(y.error().what);
  CHECK(y.error().what.find("segment_ids[1] = 5 is not in [0, 3)") != std::string::npos);
  auto bad_n = run_one(g, g.unsorted_segment_sum(data, ids, g.constant(tensor::scalar(3))));
  REQUIRE_FALSE(bad_n);
  CHECK(bad_n.error().what.find("num_segments must be one int32 or int64") != std::string::npos);
}

TEST_CASE("unsorted_segment_sum refuses a num_segments past the bound before allocating, naming "
          "it, its value and the bound (issue 25 F1/F2, a 1-element input sized a 2^63 or "
          "19.5 GB result)", "[sparse][segment_sum]") {
  graph g;
  auto data = g.constant(tensor::from_values<double>({1, 2}, {1.0, 2.0}));
  auto ids = g.constant(tensor::from_values<int64_t>({1}, {0}));
  auto sum_of = [&](int64_t n) {
    return run_one(g, g.unsorted_segment_sum(data, ids, g.constant(tensor::from_values<int64_t>({}, {n}))));
  };
  for (int64_t n : {INT64_MAX, int64_t{5000000000}, int64_t{INT32_MAX}}) {
    auto y = sum_of(n); // refused by the count's bound, so nothing is allocated
    REQUIRE_FALSE(y);
    INFO(y.error().what);
    CHECK(y.error().what.find("unsorted_segment_sum: num_segments = " + std::to_string(n)
                              + " is not in [0, 2^31 - 1)")
          != std::string::npos);
  }
  // Under the count's bound but 2^30 rows of 2 float64 (16 GiB) pass the
  // bytes a tensor may have (max_message_bytes, 2 GiB here): refused too.
  auto big = sum_of(int64_t{1} << 30);
  REQUIRE_FALSE(big);
  INFO(big.error().what);
  CHECK(big.error().what.find("num_segments = 1073741824 makes a result of more than "
                              + std::to_string(max_decoded_tensor_bytes()) + " bytes")
        != std::string::npos);
  auto fine = sum_of(3);
  REQUIRE(fine);
  CHECK(fine->shape() == shape_type{3, 2});
}

// -- scatter_add / scatter_sub / scatter_update (the one-process evaluator) ---------

namespace {

/// A graph with variable `emb` [rows, 2] set to table(rows, 2).
struct scatter_graph {
  graph g;
  variable_values vars;
  std::unique_ptr<kernels::backend> cpu = kernels::make_cpu_backend();
  output emb;

  explicit scatter_graph(int64_t rows) {
    emb = *g.variable("emb", {rows, 2}, initializer::from_tensor(table(rows, 2)), dtype::float64);
    REQUIRE(initialize_values(g, vars));
  }
  outcome<tensor> run(output y) {
    auto r = evaluate(g, {y}, {}, vars, *cpu);
    if (!r)
      return r.error();
    return r->front();
  }
  const tensor& value() { return vars.at("emb"); }
};

} // namespace

TEST_CASE("scatter_add sums duplicate ids, scatter_sub subtracts them, scatter_update keeps the "
          "last (catches duplicates overwritten, or an update order that is not the ids')",
          "[sparse][scatter]") {
  scatter_graph s{4};
  auto ids = s.g.constant(tensor::from_values<int64_t>({3}, {2, 0, 2}));
  auto ups = s.g.constant(tensor::from_values<double>({3, 2}, {1, 2, 100, 200, 3, 4}));
  auto added = s.run(s.g.scatter_add(s.emb, ids, ups));
  REQUIRE(added);
  // Row 2 gets 1 + 3 and 2 + 4: both updates of id 2, summed (TF).
  check_values(*added, std::vector<double>{100, 201, 10, 11, 24, 27, 30, 31});
  auto subbed = s.run(s.g.scatter_sub(s.emb, ids, ups));
  REQUIRE(subbed);
  check_values(*subbed, std::vector<double>{0, 1, 10, 11, 20, 21, 30, 31});
  auto updated = s.run(s.g.scatter_update(s.emb, ids, ups));
  REQUIRE(updated);
  check_values(*updated, std::vector<double>{100, 200, 10, 11, 3, 4, 30, 31}); // the last of id 2
  // int32 ids of rank 2 and a scalar update broadcast to every row named.
  auto ids2 = s.g.constant(tensor::from_values<int32_t>({1, 2}, {1, 1}));
  auto one = s.run(s.g.scatter_add(s.emb, ids2, s.g.constant(tensor::from_values<double>({}, {1}))));
  REQUIRE(one);
  check_values(*one, std::vector<double>{100, 200, 12, 13, 3, 4, 30, 31});
}

TEST_CASE("a scatter with an id out of range is refused naming the id and the variable, and the "
          "variable is unchanged (catches a partial write before the bad id)", "[sparse][scatter]") {
  scatter_graph s{3};
  auto before = std::vector<double>(s.value().data<double>(), s.value().data<double>() + 6);
  // Ids 0 and 1 are fine and come first: a scatter that wrote as it checked
  // would have changed rows 0 and 1 before refusing id 3.
  auto ids = s.g.constant(tensor::from_values<int64_t>({3}, {0, 1, 3}));
  auto ups = s.g.constant(tensor::filled(dtype::float64, {3, 2}, 5));
  for (auto y : {s.g.scatter_add(s.emb, ids, ups), s.g.scatter_sub(s.emb, ids, ups),
                 s.g.scatter_update(s.emb, ids, ups)}) {
    auto r = s.run(y);
    REQUIRE_FALSE(r);
    INFO(r.error().what);
    CHECK(r.error().what.find("variable 'emb'") != std::string::npos);
    CHECK(r.error().what.find("indices[2] = 3 is not in [0, 3)") != std::string::npos);
    check_values(s.value(), before);
  }
  // Updates of the wrong shape are refused by shape, before anything is written too.
  auto bad = s.run(s.g.scatter_add(s.emb, ids, s.g.constant(tensor::filled(dtype::float64, {3}, 1))));
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == af_error::shape_mismatch);
  check_values(s.value(), before);
}

// -- the CUDA kernels against the CPU (a GPU machine only) --------------------------

namespace {

std::unique_ptr<kernels::backend> gpu_or_skip() {
  std::string why;
  auto gpu = kernels::make_cuda_backend(0, &why);
  if (!gpu)
    FAIL("no CUDA backend: " << why);
  return gpu;
}

} // namespace

TEST_CASE("CUDA gather matches the CPU and refuses a bad id (catches a GPU read out of bounds)",
          "[.][gpu][sparse]") {
  auto gpu = gpu_or_skip();
  auto cpu = kernels::make_cpu_backend();
  for (auto type : {dtype::float32, dtype::float64}) {
    tensor params{type, {1000, 17}};
    REQUIRE(kernels::fill_uniform(params, -1, 1, 7).ok());
    std::vector<int64_t> idv;
    for (int i = 0; i < 300; ++i)
      idv.push_back((i * 7919) % 1000);
    auto ids = tensor::from_values<int64_t>({3, 100}, idv);
    tensor want, got;
    REQUIRE(cpu->gather(params, ids, want).ok());
    auto st = gpu->gather(params, ids, got);
    REQUIRE(st.ok());
    REQUIRE(got.shape() == want.shape());
    for (size_t i = 0; i < want.num_elements(); ++i)
      REQUIRE(got.at(i) == want.at(i)); // a copy: bit for bit
  }
  tensor params{dtype::float32, {4, 2}};
  REQUIRE(kernels::fill_uniform(params, -1, 1, 7).ok());
  tensor out;
  auto bad = gpu->gather(params, tensor::from_values<int32_t>({2}, {3, 4}), out);
  CHECK(bad.error.find("indices[1] = 4 is not in [0, 4)") != std::string::npos);
  // An integer table is not this kernel's: `unsupported`, so that the executor
  // runs it on the CPU rather than failing the step.
  auto ints = gpu->gather(tensor::from_values<int32_t>({2}, {1, 2}),
                          tensor::from_values<int32_t>({1}, {0}), out);
  CHECK(ints.what == kernels::status::kind::unsupported);
}
