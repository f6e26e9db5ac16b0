// Every op's gradient, as gradients() builds it and the executors run it,
// against central finite differences (float64).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>

#include "scenarios.hpp"

using namespace af;
using namespace af::testing;

namespace {

tensor random64(shape_type shape, uint64_t seed, double lo, double hi) {
  tensor t{dtype::float64, std::move(shape)};
  REQUIRE(kernels::fill_uniform(t, lo, hi, seed).ok());
  return t;
}

struct grad_check {
  std::unique_ptr<embedded_cluster> cluster = value_of(embedded_cluster::start({{"local", 1}}));
  session s = value_of(cluster->session_for("local", 0));
  int counter = 0;

  output var(const tensor& value) {
    auto name = "x" + std::to_string(counter++);
    auto v = value_of(s.variable(name, value.shape(), initializer::from_tensor(value), dtype::float64));
    require_ok(s.initialize({v}));
    return v;
  }

  /// loss = sum(f(inputs) * r) with random r, so every output element counts.
  void check(const std::string& what, std::vector<tensor> values,
             const std::function<output(session&, const std::vector<output>&)>& f,
             double tol = 1e-6) {
    INFO(what);
    std::vector<output> xs;
    for (auto& v : values)
      xs.push_back(var(v));
    auto y = f(s, xs);
    auto y_value = value_of(s.run(y));
    auto r = s.constant(random64(y_value.shape(), 99, -1, 1));
    auto loss = s.reduce_sum(s.mul(y, r));
    auto grads = value_of(s.gradients(loss, xs));
    auto analytic = value_of(s.run(grads));
    const double eps = 1e-6;
    for (size_t k = 0; k < xs.size(); ++k) {
      REQUIRE(analytic[k].shape() == values[k].shape());
      for (size_t i = 0; i < values[k].num_elements(); ++i) {
        auto probe = [&](double delta) {
          auto x = tensor::from_values<double>(values[k].shape(), values[k].values<double>());
          x.mutable_data<double>()[i] += delta;
          value_of(s.run(s.assign(xs[k], s.constant(x))));
          return value_of(s.run(loss)).at(0);
        };
        double numeric = (probe(eps) - probe(-eps)) / (2 * eps);
        value_of(s.run(s.assign(xs[k], s.constant(values[k]))));
        INFO("input " << k << " element " << i << ": analytic " << analytic[k].at(i) << " numeric "
                      << numeric);
        CHECK(std::abs(analytic[k].at(i) - numeric) <= tol + 1e-4 * std::abs(numeric));
      }
    }
  }
};

} // namespace

TEST_CASE("gradients of elementwise ops match finite differences, with broadcasting", "[gradients]") {
  grad_check g;
  auto a = random64({2, 3}, 1, 0.5, 2), b = random64({3}, 2, 0.5, 2);
  using S = session;
  using V = std::vector<output>;
  g.check("add", {a, b}, [](S& s, const V& x) { return s.add(x[0], x[1]); });
  g.check("sub", {a, b}, [](S& s, const V& x) { return s.sub(x[0], x[1]); });
  g.check("mul", {a, b}, [](S& s, const V& x) { return s.mul(x[0], x[1]); });
  g.check("div", {a, b}, [](S& s, const V& x) { return s.div(x[0], x[1]); });
  g.check("mul by a scalar", {a, tensor::from_values<double>({}, {1.5})},
          [](S& s, const V& x) { return s.mul(x[0], x[1]); });
  auto mixed = random64({2, 3}, 3, -2, 2);
  for (size_t i = 0; i < mixed.num_elements(); ++i) // keep relu away from its kink
    if (std::abs(mixed.at(i)) < 0.1)
      mixed.mutable_data<double>()[i] = 0.5;
  g.check("neg", {mixed}, [](S& s, const V& x) { return s.neg(x[0]); });
  g.check("exp", {mixed}, [](S& s, const V& x) { return s.exp(x[0]); });
  g.check("relu", {mixed}, [](S& s, const V& x) { return s.relu(x[0]); });
  g.check("sigmoid", {mixed}, [](S& s, const V& x) { return s.sigmoid(x[0]); });
  g.check("tanh", {mixed}, [](S& s, const V& x) { return s.tanh(x[0]); });
  g.check("square", {mixed}, [](S& s, const V& x) { return s.square(x[0]); });
  g.check("log", {a}, [](S& s, const V& x) { return s.log(x[0]); });
  g.check("sqrt", {a}, [](S& s, const V& x) { return s.sqrt(x[0]); });
  g.check("x used twice: x * x + x", {mixed},
          [](S& s, const V& x) { return s.add(s.mul(x[0], x[0]), x[0]); });
}

TEST_CASE("gradients of matmul match finite differences for every transpose combination",
          "[gradients]") {
  grad_check g;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      auto a = random64(ta ? shape_type{4, 3} : shape_type{3, 4}, 5, -1, 1);
      auto b = random64(tb ? shape_type{2, 4} : shape_type{4, 2}, 6, -1, 1);
      g.check("matmul ta=" + std::to_string(ta) + " tb=" + std::to_string(tb), {a, b},
              [ta, tb](session& s, const std::vector<output>& x) { return s.matmul(x[0], x[1], ta, tb); });
    }
}

TEST_CASE("gradients of reductions, softmax and cross-entropy match finite differences",
          "[gradients]") {
  grad_check g;
  auto x = random64({3, 4}, 7, -2, 2);
  using S = session;
  using V = std::vector<output>;
  g.check("sum", {x}, [](S& s, const V& v) { return s.reduce_sum(v[0]); });
  g.check("mean", {x}, [](S& s, const V& v) { return s.reduce_mean(v[0]); });
  g.check("max", {x}, [](S& s, const V& v) { return s.reduce_max(v[0]); });
  g.check("sum over axis 0", {x}, [](S& s, const V& v) { return s.reduce_sum(v[0], 0); });
  g.check("mean over axis -1 keep_dims", {x}, [](S& s, const V& v) { return s.reduce_mean(v[0], -1, true); });
  g.check("max over axis 1", {x}, [](S& s, const V& v) { return s.reduce_max(v[0], 1); });
  g.check("softmax", {x}, [](S& s, const V& v) { return s.softmax(v[0]); });
  g.check("log_softmax", {x}, [](S& s, const V& v) { return s.log_softmax(v[0]); });
  auto labels = tensor::from_values<int32_t>({3}, {1, 3, 0});
  g.check("softmax_xent", {x}, [&](S& s, const V& v) { return s.softmax_xent(v[0], s.constant(labels)); });
}

TEST_CASE("gradients() names what it cannot differentiate", "[gradients][errors]") {
  grad_check g;
  auto x = g.var(random64({2}, 1, 0, 1));
  auto unrelated = g.var(random64({2}, 2, 0, 1));
  auto loss = g.s.reduce_sum(g.s.square(x));
  auto r = g.s.gradients(loss, {x, unrelated});
  REQUIRE_FALSE(r);
  CHECK(describe(r.error()).find("does not depend on 'x1'") != std::string::npos);
  auto no_grad = g.s.reduce_sum(g.s.op("relu_grad", {x, x}));
  auto r2 = g.s.gradients(no_grad, {x});
  REQUIRE_FALSE(r2);
  CHECK(is(r2.error(), af_error::unsupported));
  CHECK(describe(r2.error()).find("(relu_grad) has no gradient") != std::string::npos);
}
