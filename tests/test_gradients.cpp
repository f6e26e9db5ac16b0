// Every op's gradient, as gradients() builds it and evaluate() runs it on the
// CPU backend, against central finite differences (float64). No cluster.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <memory>

#include "graph/evaluate.hpp"
#include "graph/graph.hpp"
#include "kernels/kernels.hpp"

using namespace af;

namespace {

tensor random64(shape_type shape, uint64_t seed, double lo, double hi) {
  tensor t{dtype::float64, std::move(shape)};
  REQUIRE(kernels::fill_uniform(t, lo, hi, seed).ok());
  return t;
}

struct grad_check {
  graph g;
  variable_values vars;
  std::unique_ptr<kernels::backend> cpu = kernels::make_cpu_backend();
  int counter = 0;

  output var(const tensor& value) {
    auto name = "x" + std::to_string(counter++);
    auto v = g.variable(name, value.shape(), initializer::from_tensor(value), dtype::float64);
    REQUIRE(v);
    REQUIRE(initialize_values(g, vars));
    return *v;
  }

  std::vector<tensor> run(const std::vector<output>& fetches) {
    auto r = evaluate(g, fetches, {}, vars, *cpu);
    if (!r)
      FAIL(r.error().what);
    return *r;
  }

  /// loss = sum(f(inputs) * r) with random r, so every output element counts.
  void check(const std::string& what, std::vector<tensor> values,
             const std::function<output(graph&, const std::vector<output>&)>& f,
             double tol = 1e-6) {
    INFO(what);
    std::vector<output> xs;
    for (auto& v : values)
      xs.push_back(var(v));
    auto y = f(g, xs);
    auto y_value = run({y}).front();
    auto r = g.constant(random64(y_value.shape(), 99, -1, 1));
    auto loss = g.reduce_sum(g.mul(y, r));
    auto grads = gradients(g, loss, xs);
    if (!grads)
      FAIL(grads.error().what);
    auto analytic = run(*grads);
    const double eps = 1e-6;
    for (size_t k = 0; k < xs.size(); ++k) {
      const auto& name = g.at(xs[k]).name;
      REQUIRE(analytic[k].shape() == values[k].shape());
      for (size_t i = 0; i < values[k].num_elements(); ++i) {
        auto probe = [&](double delta) {
          auto x = tensor::from_values<double>(values[k].shape(), values[k].values<double>());
          x.mutable_data<double>()[i] += delta;
          vars[name] = x;
          return run({loss}).front().at(0);
        };
        double numeric = (probe(eps) - probe(-eps)) / (2 * eps);
        vars[name] = values[k];
        INFO("input " << k << " element " << i << ": analytic " << analytic[k].at(i) << " numeric "
                      << numeric);
        CHECK(std::abs(analytic[k].at(i) - numeric) <= tol + 1e-4 * std::abs(numeric));
      }
    }
  }
};

using G = graph;
using V = std::vector<output>;

} // namespace

TEST_CASE("gradients of elementwise ops match finite differences, with broadcasting", "[gradients]") {
  grad_check c;
  auto a = random64({2, 3}, 1, 0.5, 2), b = random64({3}, 2, 0.5, 2);
  c.check("add", {a, b}, [](G& g, const V& x) { return g.add(x[0], x[1]); });
  c.check("sub", {a, b}, [](G& g, const V& x) { return g.sub(x[0], x[1]); });
  c.check("mul", {a, b}, [](G& g, const V& x) { return g.mul(x[0], x[1]); });
  c.check("div", {a, b}, [](G& g, const V& x) { return g.div(x[0], x[1]); });
  c.check("sub, broadcast on the left", {b, a}, [](G& g, const V& x) { return g.sub(x[0], x[1]); });
  c.check("div, broadcast on the left", {b, a}, [](G& g, const V& x) { return g.div(x[0], x[1]); });
  c.check("add of a column [2,1]", {a, random64({2, 1}, 4, 0.5, 2)},
          [](G& g, const V& x) { return g.add(x[0], x[1]); });
  c.check("mul by a scalar", {a, tensor::from_values<double>({}, {1.5})},
          [](G& g, const V& x) { return g.mul(x[0], x[1]); });
  auto mixed = random64({2, 3}, 3, -2, 2);
  for (size_t i = 0; i < mixed.num_elements(); ++i) // keep relu away from its kink
    if (std::abs(mixed.at(i)) < 0.1)
      mixed.mutable_data<double>()[i] = 0.5;
  c.check("neg", {mixed}, [](G& g, const V& x) { return g.neg(x[0]); });
  c.check("exp", {mixed}, [](G& g, const V& x) { return g.exp(x[0]); });
  c.check("relu", {mixed}, [](G& g, const V& x) { return g.relu(x[0]); });
  c.check("sigmoid", {mixed}, [](G& g, const V& x) { return g.sigmoid(x[0]); });
  c.check("tanh", {mixed}, [](G& g, const V& x) { return g.tanh(x[0]); });
  c.check("square", {mixed}, [](G& g, const V& x) { return g.square(x[0]); });
  c.check("log", {a}, [](G& g, const V& x) { return g.log(x[0]); });
  c.check("sqrt", {a}, [](G& g, const V& x) { return g.sqrt(x[0]); });
  c.check("softplus", {mixed}, [](G& g, const V& x) { return g.softplus(x[0]); });
  c.check("x used twice: x * x + x", {mixed},
          [](G& g, const V& x) { return g.add(g.mul(x[0], x[0]), x[0]); });
}

TEST_CASE("gradients of matmul match finite differences for every transpose combination",
          "[gradients]") {
  grad_check c;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      auto a = random64(ta ? shape_type{4, 3} : shape_type{3, 4}, 5, -1, 1);
      auto b = random64(tb ? shape_type{2, 4} : shape_type{4, 2}, 6, -1, 1);
      c.check("matmul ta=" + std::to_string(ta) + " tb=" + std::to_string(tb), {a, b},
              [ta, tb](G& g, const V& x) { return g.matmul(x[0], x[1], ta, tb); });
    }
}

TEST_CASE("gradients of reductions, softmax and cross-entropy match finite differences",
          "[gradients]") {
  grad_check c;
  auto x = random64({3, 4}, 7, -2, 2);
  c.check("sum", {x}, [](G& g, const V& v) { return g.reduce_sum(v[0]); });
  c.check("mean", {x}, [](G& g, const V& v) { return g.reduce_mean(v[0]); });
  c.check("max", {x}, [](G& g, const V& v) { return g.reduce_max(v[0]); });
  c.check("sum over axis 0", {x}, [](G& g, const V& v) { return g.reduce_sum(v[0], 0); });
  c.check("mean over axis -1 keep_dims", {x}, [](G& g, const V& v) { return g.reduce_mean(v[0], -1, true); });
  c.check("max over axis 1", {x}, [](G& g, const V& v) { return g.reduce_max(v[0], 1); });
  c.check("softmax", {x}, [](G& g, const V& v) { return g.softmax(v[0]); });
  c.check("log_softmax", {x}, [](G& g, const V& v) { return g.log_softmax(v[0]); });
  auto labels = tensor::from_values<int32_t>({3}, {1, 3, 0});
  c.check("softmax_xent", {x}, [&](G& g, const V& v) { return g.softmax_xent(v[0], g.constant(labels)); });
  c.check("a two-layer network", {random64({3, 4}, 8, -1, 1), random64({4, 2}, 9, -1, 1), random64({2}, 10, -1, 1)},
          [&](G& g, const V& v) {
            auto h = g.tanh(g.add(g.matmul(v[0], v[1]), v[2]));
            return g.softmax_xent(h, g.constant(tensor::from_values<int32_t>({3}, {0, 1, 1})));
          });
}

// Bugs caught: a gather gradient that keeps one of two rows of a repeated id
// (written, not summed), that puts a row's gradient at the position in ids
// instead of the id, or that is not zero for rows no id names.
TEST_CASE("the gradient of gather w.r.t. params matches finite differences, repeated ids summed",
          "[gradients][sparse]") {
  grad_check c;
  auto params = random64({5, 3}, 11, -1, 1);
  auto ids = tensor::from_values<int64_t>({2, 3}, {3, 0, 3, 1, 3, 0}); // row 2 and row 4: no id
  c.check("gather", {params}, [&](G& g, const V& v) { return g.gather(v[0], g.constant(ids)); });
  c.check("embedding_lookup in a model", {params, random64({3, 2}, 12, -1, 1)},
          [&](G& g, const V& v) {
            auto rows = g.embedding_lookup(v[0], g.constant(tensor::from_values<int32_t>({4}, {4, 4, 2, 0})));
            return g.tanh(g.matmul(rows, v[1]));
          });
  // Two lookups of one table (their sparse gradients concatenated), one of
  // them of a table also read densely (densified and added), and a lookup
  // of a computed table (its sparse gradient densified for relu's rule).
  c.check("two lookups and a dense read of one table", {params, random64({3, 2}, 13, -1, 1)},
          [&](G& g, const V& v) {
            auto a = g.gather(v[0], g.constant(tensor::from_values<int32_t>({3}, {4, 1, 4})));
            auto b = g.gather(v[0], g.constant(ids));
            return g.add(g.reduce_sum(g.matmul(a, v[1])),
                         g.add(g.reduce_sum(g.tanh(b)), g.reduce_sum(g.square(v[0]))));
          });
  c.check("gather of a computed table", {params},
          [&](G& g, const V& v) { return g.gather(g.softplus(v[0]), g.constant(ids)); });
  // The ids get no gradient: they are integers (TF's None).
  grad_check d;
  auto p = d.var(params);
  auto id_node = d.g.constant(ids);
  auto loss = d.g.reduce_sum(d.g.gather(p, id_node));
  auto r = gradients(d.g, loss, {id_node});
  REQUIRE_FALSE(r);
  CHECK(r.error().what.find("does not depend on") != std::string::npos);
  // And the dense gradient is the shape of params, zero for rows no id names.
  auto dp = gradients(d.g, loss, {p});
  REQUIRE(dp);
  auto value = d.run({(*dp)[0]}).front();
  REQUIRE(value.shape() == shape_type{5, 3});
  std::vector<double> want = {2, 2, 2, 1, 1, 1, 0, 0, 0, 3, 3, 3, 0, 0, 0};
  CHECK(value.values<double>() == want);
}

TEST_CASE("has_gradient() agrees with the ops gradients() differentiates", "[gradients]") {
  for (const char* op : {"add", "sub", "mul", "div", "neg", "exp", "log", "relu", "sigmoid", "tanh",
                         "square", "sqrt", "softplus", "matmul", "sum", "mean", "max", "softmax", "log_softmax",
                         "softmax_xent", "gather"})
    CHECK(has_gradient(op));
  for (const char* op : {"relu_grad", "sum_to", "ones_like", "max_grad", "assign", "conv2d", "",
                         "gather_grad", "unique", "unsorted_segment_sum", "scatter_add"})
    CHECK_FALSE(has_gradient(op));
}

TEST_CASE("gradients() names what it cannot differentiate", "[gradients][errors]") {
  grad_check c;
  auto x = c.var(random64({2}, 1, 0, 1));
  auto unrelated = c.var(random64({2}, 2, 0, 1));
  auto loss = c.g.reduce_sum(c.g.square(x));
  auto r = gradients(c.g, loss, {x, unrelated});
  REQUIRE_FALSE(r);
  CHECK(r.error().code == af_error::invalid_argument);
  CHECK(r.error().what == "gradients(): the loss does not depend on 'x1'");

  auto later = c.g.add(x, x, "later"); // made after the loss: the loss cannot depend on it
  auto r_later = gradients(c.g, loss, {later});
  REQUIRE_FALSE(r_later);
  CHECK(r_later.error().what.find("does not depend on 'later'") != std::string::npos);

  auto no_grad = c.g.reduce_sum(c.g.op("relu_grad", {x, x}, {}, "rg"));
  auto r2 = gradients(c.g, no_grad, {x});
  REQUIRE_FALSE(r2);
  CHECK(r2.error().code == af_error::unsupported);
  CHECK(r2.error().what == "gradients(): op 'rg' (relu_grad) has no gradient");

  auto r3 = gradients(c.g, output{12345}, {x});
  REQUIRE_FALSE(r3);
  CHECK(r3.error().code == af_error::invalid_argument);
  CHECK(r3.error().what.find("loss is not an op of this graph") != std::string::npos);
}

TEST_CASE("backward ops go in their forward op's scope and the caller's scopes come back",
          "[gradients]") {
  graph g;
  auto w = *g.variable("w", {2}, initializer::ones(), dtype::float64);
  g.push_scope(*device_name::parse("/job:worker/task:1"));
  auto y = g.exp(w); // requested /job:worker/task:1
  g.push_scope(*device_name::parse("/gpu:0"));
  auto loss = g.reduce_sum(y); // requested /job:worker/task:1/device:GPU:0
  g.pop_scope();
  g.pop_scope();
  g.push_scope(*device_name::parse("/job:ps"));
  auto first_new = static_cast<int32_t>(g.size());
  auto grads = gradients(g, loss, {w});
  REQUIRE(grads);
  // The caller's scope is back.
  CHECK(g.current_scope().to_string() == "/job:ps");
  // sum's gradient on sum's device, exp's on exp's.
  bool saw_sum_grad = false, saw_exp_grad = false;
  for (auto id = first_new; id < static_cast<int32_t>(g.size()); ++id) {
    const auto& n = g.at(output{id});
    if (n.op == "sum_grad") {
      saw_sum_grad = true;
      CHECK(n.requested.to_string() == "/job:worker/task:1/device:GPU:0");
    }
    if (n.op == "mul") {
      saw_exp_grad = true;
      CHECK(n.requested.to_string() == "/job:worker/task:1");
    }
  }
  CHECK(saw_sum_grad);
  CHECK(saw_exp_grad);
  // A failing gradients() restores the scopes too.
  auto bad = g.reduce_sum(g.op("sum_to", {w, w}));
  REQUIRE_FALSE(gradients(g, bad, {w}));
  CHECK(g.current_scope().to_string() == "/job:ps");
}
