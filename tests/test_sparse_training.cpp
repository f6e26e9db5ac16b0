// Sparse optimizer updates at the variable (issue 25): a table trained
// through gather, its sparse gradient (graph/graph.hpp, sparse_gradients)
// applied by variable_cell::apply_sparse_gradient, against the same model
// through a dense one-hot matmul and apply_gradient; lazy momentum, Adagrad
// and Adam; duplicate ids; a bad id. On cells, without an actor system.
// Each case names the bug it catches.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "actors/variable.hpp"
#include "graph/evaluate.hpp"
#include "graph/graph.hpp"
#include "scenarios.hpp"

using namespace af;
using namespace af::testing;

namespace {

const char* ps0 = "/job:ps/replica:0/task:0/device:CPU:0";
constexpr int64_t rows = 6, dim = 3, batch = 8;

tensor random32(shape_type shape, uint64_t seed) {
  tensor t{dtype::float32, std::move(shape)};
  REQUIRE(kernels::fill_uniform(t, -1, 1, seed).ok());
  return t;
}

/// A [rows, dim] float32 cell named "emb" holding a fixed random table.
std::unique_ptr<variable_cell> table_cell() {
  auto cell =
    std::make_unique<variable_cell>(variable_spec{"emb", dtype::float32, {rows, dim}, ps0});
  REQUIRE(cell->apply(var_op::assign, random32({rows, dim}, 1), false));
  return cell;
}

tensor value(variable_cell& cell) {
  return value_of(cell.apply(var_op::read, tensor{}, true)).value;
}

train::optimizer_spec optimizer(const std::string& kind) {
  train::optimizer_spec o;
  o.kind = kind;
  o.lr = kind == "adam" ? 0.05 : kind == "momentum" ? 0.2 : 0.5;
  REQUIRE(train::validate(o).empty());
  return o;
}

/// One model, two ways: loss = mean((tanh(rows) U - t)^2), the rows looked
/// up by gather (sparse gradient) or by a one-hot matmul (dense gradient).
struct model {
  graph g;
  output table, ids, onehot, target, loss;
  bool sparse;
  explicit model(bool through_gather) : sparse(through_gather) {
    table = *g.variable("emb", {rows, dim}, initializer::zeros());
    ids = g.placeholder("ids");
    onehot = g.placeholder("onehot");
    target = g.placeholder("target");
    auto looked_up = sparse ? g.gather(table, ids) : g.matmul(onehot, table);
    auto pred = g.matmul(g.tanh(looked_up), g.constant(random32({dim, 1}, 2)));
    loss = g.reduce_mean(g.square(g.sub(pred, target)));
  }
};

/// Step `s`'s batch: ids with duplicates; every row each step when `all_rows`.
std::vector<int32_t> batch_ids(uint64_t s, bool all_rows) {
  if (all_rows) {
    std::vector<int32_t> out;
    for (int64_t r = 0; r < rows; ++r)
      out.push_back(static_cast<int32_t>((static_cast<int64_t>(s) + r) % rows));
    out.push_back(static_cast<int32_t>(s % rows));
    out.push_back(static_cast<int32_t>((s + 3) % rows));
    return out;
  }
  auto a = static_cast<int32_t>(s % 3), b = static_cast<int32_t>(s % 3 + 3);
  return {a, b, a, a, b, a, b, b}; // 4 of the 6 rows untouched each step
}

/// Trains one cell `steps` steps through `m` with `opt`, sparse or dense.
void train_cell(variable_cell& cell, model& m, const train::optimizer_spec& opt, uint64_t steps,
                bool all_rows) {
  auto cpu = kernels::make_cpu_backend();
  gradient_value grad;
  if (m.sparse) {
    auto sg = sparse_gradients(m.g, m.loss, {m.table});
    REQUIRE(sg);
    grad = (*sg)[0];
    REQUIRE(grad.is_sparse());
  } else {
    auto dg = gradients(m.g, m.loss, {m.table});
    REQUIRE(dg);
    grad = gradient_value::dense_value((*dg)[0]);
  }
  for (uint64_t s = 0; s < steps; ++s) {
    auto id_list = batch_ids(s, all_rows);
    tensor onehot = tensor::filled(dtype::float32, {batch, rows}, 0);
    for (size_t b = 0; b < id_list.size(); ++b)
      onehot.mutable_data<float>()[b * rows + static_cast<size_t>(id_list[b])] = 1;
    variable_values vars{{"emb", value(cell)}};
    std::vector<std::pair<output, tensor>> feeds = {
      {m.ids, tensor::from_values<int32_t>({batch}, id_list)},
      {m.onehot, onehot},
      {m.target, random32({batch, 1}, 100 + s)}};
    if (m.sparse) {
      auto r = evaluate(m.g, {grad.ids, grad.values}, feeds, vars, *cpu);
      REQUIRE(r);
      // The gradient is the batch's rows, never the table's shape.
      REQUIRE((*r)[1].shape() == shape_type{batch, dim});
      REQUIRE_FALSE(cell.apply_sparse_gradient(opt, (*r)[0], (*r)[1], s));
    } else {
      auto r = evaluate(m.g, {grad.dense}, feeds, vars, *cpu);
      REQUIRE(r);
      REQUIRE_FALSE(cell.apply_gradient(opt, (*r)[0].data<float>(), (*r)[0].num_elements(), s));
    }
  }
}

/// Bytes of row `r` of `t` ([rows, dim] float32).
std::vector<unsigned char> row_bytes(const tensor& t, int64_t r) {
  const auto* p = reinterpret_cast<const unsigned char*>(t.data<float>() + r * dim);
  return {p, p + dim * sizeof(float)};
}

} // namespace

TEST_CASE("a table trained through gather and sparse updates equals the one-hot matmul with "
          "dense updates, for every optimizer (catches a sparse update that differs from the "
          "dense formula, such as duplicates lost, a wrong row or Adam's bias correction per "
          "row)",
          "[variable][sparse][training]") {
  for (const char* kind : {"sgd", "adagrad", "momentum", "adam"}) {
    // Lazy momentum and Adam equal the dense ones only when every row is
    // touched every step; SGD and Adagrad also when rows are left out.
    for (bool all_rows : {true, false}) {
      std::string k{kind};
      if (!all_rows && (k == "momentum" || k == "adam"))
        continue;
      INFO(kind << (all_rows ? ", every row each step" : ", 4 rows of 6 untouched each step"));
      auto opt = optimizer(kind);
      model sparse_model{true}, dense_model{false};
      auto sparse_cell = table_cell(), dense_cell = table_cell();
      auto before = value(*sparse_cell).values<float>();
      train_cell(*sparse_cell, sparse_model, opt, 6, all_rows);
      train_cell(*dense_cell, dense_model, opt, 6, all_rows);
      auto got = value(*sparse_cell).values<float>(), want = value(*dense_cell).values<float>();
      double moved = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        CHECK(std::abs(got[i] - want[i]) <= 1e-5);
        moved = std::max(moved, std::abs(static_cast<double>(got[i]) - before[i]));
      }
      CHECK(moved > 1e-2); // it trained
      for (const auto& slot : train::slot_names(kind)) {
        auto s = sparse_cell->slot(slot), d = dense_cell->slot(slot);
        REQUIRE(s);
        REQUIRE(d);
        auto sv = s->values<float>(), dv = d->values<float>();
        for (size_t i = 0; i < sv.size(); ++i)
          CHECK(std::abs(sv[i] - dv[i]) <= 1e-5);
      }
    }
  }
}

TEST_CASE("lazy momentum, Adagrad and Adam leave untouched rows and their slots bit for bit "
          "(catches a sparse update applied densely, with momentum still moving untouched rows "
          "and Adam's m and v decaying)", "[variable][sparse][training]") {
  for (const char* kind : {"momentum", "adagrad", "adam"}) {
    INFO(kind);
    auto opt = optimizer(kind);
    auto cell = table_cell();
    // Every row once, so that every slot row holds a non-zero state.
    auto all = tensor::from_values<int64_t>({rows}, {0, 1, 2, 3, 4, 5});
    REQUIRE_FALSE(cell->apply_sparse_gradient(opt, all, random32({rows, dim}, 3), 0));
    auto names = train::slot_names(kind);
    auto value_before = value(*cell);
    std::vector<tensor> slots_before;
    for (const auto& n : names)
      slots_before.push_back(*cell->slot(n));
    for (uint64_t s = 1; s <= 3; ++s)
      REQUIRE_FALSE(cell->apply_sparse_gradient(opt, tensor::from_values<int64_t>({3}, {1, 3, 1}),
                                                random32({3, dim}, 10 + s), s));
    auto value_after = value(*cell);
    for (int64_t r = 0; r < rows; ++r) {
      INFO("row " << r);
      bool touched = r == 1 || r == 3;
      CHECK((row_bytes(value_after, r) == row_bytes(value_before, r)) == !touched);
      for (size_t k = 0; k < names.size(); ++k) {
        INFO("slot " << names[k]);
        CHECK((row_bytes(*cell->slot(names[k]), r) == row_bytes(slots_before[k], r)) == !touched);
      }
    }
  }
}

TEST_CASE("duplicate ids in one sparse update are summed, then applied once (catches each "
          "duplicate applied as its own update, or only the last one kept)",
          "[variable][sparse][training]") {
  for (const char* kind : {"sgd", "momentum", "adagrad", "adam"}) {
    INFO(kind);
    auto opt = optimizer(kind);
    auto with_duplicates = table_cell(), summed = table_cell();
    std::vector<float> r1{0.5f, -1, 2}, r2{0.25f, 3, -0.5f}, r3{1, 1, 1};
    std::vector<float> dup_rows, sum_rows;
    for (auto* r : {&r1, &r2, &r3})
      dup_rows.insert(dup_rows.end(), r->begin(), r->end());
    for (size_t k = 0; k < 3; ++k)
      sum_rows.push_back(r1[k] + r2[k]);
    sum_rows.insert(sum_rows.end(), r3.begin(), r3.end());
    for (uint64_t s = 0; s < 2; ++s) {
      REQUIRE_FALSE(with_duplicates->apply_sparse_gradient(
        opt, tensor::from_values<int32_t>({3}, {2, 2, 5}),
        tensor::from_values<float>({3, dim}, dup_rows), s));
      REQUIRE_FALSE(summed->apply_sparse_gradient(opt, tensor::from_values<int32_t>({2}, {2, 5}),
                                                  tensor::from_values<float>({2, dim}, sum_rows), s));
    }
    CHECK(value(*with_duplicates).values<float>() == value(*summed).values<float>());
    for (const auto& n : train::slot_names(kind))
      CHECK(with_duplicates->slot(n)->values<float>() == summed->slot(n)->values<float>());
    CHECK(with_duplicates->info().version == summed->info().version);
  }
}

TEST_CASE("a sparse update with an id out of range is refused by name, value and slots "
          "unchanged (catches rows before the bad id written, or slots made for a refused "
          "update)", "[variable][sparse][training][errors]") {
  auto opt = optimizer("adam");
  auto cell = table_cell();
  auto before = value(*cell);
  auto version = cell->info().version;
  auto err = cell->apply_sparse_gradient(opt, tensor::from_values<int64_t>({3}, {1, 0, 9}),
                                         random32({3, dim}, 4), 0);
  REQUIRE(err);
  CHECK(is(err, af_error::invalid_argument));
  auto what = describe(err);
  CHECK(what.find("'emb'") != std::string::npos);
  CHECK(what.find("indices[2] = 9 is not in [0, 6)") != std::string::npos);
  CHECK(value(*cell).values<float>() == before.values<float>());
  CHECK_FALSE(cell->slot("m"));
  CHECK_FALSE(cell->slot("v"));
  CHECK(cell->info().version == version);
  // With slots made by a good update, a negative id leaves them as they were.
  REQUIRE_FALSE(cell->apply_sparse_gradient(opt, tensor::from_values<int64_t>({1}, {4}),
                                            random32({1, dim}, 5), 0));
  auto value_now = value(*cell).values<float>();
  auto m_now = cell->slot("m")->values<float>(), v_now = cell->slot("v")->values<float>();
  version = cell->info().version;
  err = cell->apply_sparse_gradient(opt, tensor::from_values<int32_t>({2}, {3, -1}),
                                    random32({2, dim}, 6), 1);
  REQUIRE(err);
  CHECK(describe(err).find("indices[1] = -1 is not in [0, 6)") != std::string::npos);
  CHECK(value(*cell).values<float>() == value_now);
  CHECK(cell->slot("m")->values<float>() == m_now);
  CHECK(cell->slot("v")->values<float>() == v_now);
  CHECK(cell->info().version == version);
  // Rows that are not the ids' rows are refused too, naming both shapes.
  err = cell->apply_sparse_gradient(opt, tensor::from_values<int32_t>({2}, {3, 1}),
                                    random32({2, dim + 1}, 7), 1);
  REQUIRE(err);
  CHECK(is(err, af_error::shape_mismatch));
}
