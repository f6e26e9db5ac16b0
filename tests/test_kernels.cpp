// Every CPU kernel against a plain reference loop written here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <unordered_map>

#include <cblas.h>

#include "core/parallel_ranges.hpp"
#include "kernels/id_dedup.hpp"
#include "kernels/kernels.hpp"

using namespace af;
using namespace af::kernels;

namespace {

tensor random(shape_type shape, uint64_t seed, double lo = -2, double hi = 2,
              dtype type = dtype::float64) {
  tensor t{type, std::move(shape)};
  REQUIRE(fill_uniform(t, lo, hi, seed).ok());
  return t;
}

void require_close(const tensor& got, const std::vector<double>& want, double tol = 1e-9) {
  REQUIRE(got.num_elements() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    CHECK(std::abs(got.at(i) - want[i]) <= tol + tol * std::abs(want[i]));
  }
}

tensor run(const std::string& op, std::vector<tensor> in, op_attrs attrs = {}) {
  auto cpu = make_cpu_backend();
  tensor out;
  auto st = run_op(*cpu, op, attrs, in, out);
  if (!st.ok())
    FAIL(op << ": " << st.error);
  return out;
}

} // namespace

TEST_CASE("unary kernels match std:: math", "[kernels]") {
  auto x = random({3, 4}, 1, 0.1, 3);
  std::vector<std::pair<const char*, double (*)(double)>> cases = {
    {"neg", [](double v) { return -v; }},
    {"exp", [](double v) { return std::exp(v); }},
    {"log", [](double v) { return std::log(v); }},
    {"relu", [](double v) { return v > 0 ? v : 0.0; }},
    {"sigmoid", [](double v) { return 1 / (1 + std::exp(-v)); }},
    {"tanh", [](double v) { return std::tanh(v); }},
    {"square", [](double v) { return v * v; }},
    {"sqrt", [](double v) { return std::sqrt(v); }},
    {"softplus", [](double v) { return std::log1p(std::exp(v)); }},
  };
  for (auto& [name, f] : cases) {
    INFO(name);
    std::vector<double> want;
    for (size_t i = 0; i < x.num_elements(); ++i)
      want.push_back(f(x.at(i)));
    require_close(run(name, {x}), want);
    // float32 too, to float precision
    auto xf = tensor::from_values<float>(x.shape(), x.values<float>());
    require_close(run(name, {xf}), want, 1e-5);
  }
  auto cpu = make_cpu_backend();
  tensor out;
  CHECK(cpu->unary(unary_op::exp, tensor::from_values<int32_t>({2}, {1, 2}), out).error.find("int32")
        != std::string::npos);
}

TEST_CASE("softplus does not overflow where e^x would", "[kernels]") {
  // log(1 + e^x) computed as written is inf from x = 89 in float32 and 0
  // below x = -37 in float64; softplus is x there, and e^x.
  auto x = tensor::from_values<double>({4}, {-800, -40, 800, 1e300});
  require_close(run("softplus", {x}), {0, std::exp(-40.0), 800, 1e300}, 1e-12);
  auto xf = tensor::from_values<float>({2}, {-80, 120});
  auto got = run("softplus", {xf});
  CHECK(got.at(0) == Approx(std::exp(-80.0)).epsilon(1e-5));
  CHECK(got.at(1) == 120);
}

TEST_CASE("matmul matches the triple loop for every transpose combination", "[kernels]") {
  // 5x7x3 takes sgemm; the others the vector paths (a dot product, a matrix
  // times a vector from either side, an outer product), which pick their
  // strides by the transposes; 1x300x1 the single dot (sdot), 4x300x1 and
  // 1x300x3 beside it (sgemv).
  struct dims {
    int64_t m, k, n;
  };
  for (auto [m, k, n] : {dims{5, 7, 3}, dims{1, 7, 1}, dims{5, 7, 1}, dims{1, 7, 3}, dims{5, 1, 3},
                         dims{1, 1, 1}, dims{1, 300, 1}, dims{4, 300, 1}, dims{1, 300, 3}})
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("m=" << m << " k=" << k << " n=" << n << " ta=" << ta << " tb=" << tb);
      auto a = random(ta ? shape_type{k, m} : shape_type{m, k}, 2);
      auto b = random(tb ? shape_type{n, k} : shape_type{k, n}, 3);
      std::vector<double> want(m * n, 0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          for (int64_t p = 0; p < k; ++p)
            want[i * n + j] += a.at(ta ? p * m + i : i * k + p) * b.at(tb ? j * k + p : p * n + j);
      op_attrs attrs;
      attrs.transpose_a = ta;
      attrs.transpose_b = tb;
      auto c = run("matmul", {a, b}, attrs);
      CHECK(c.shape() == shape_type{m, n});
      require_close(c, want);
      auto cf = run("matmul", {tensor::from_values<float>(a.shape(), a.values<float>()),
                               tensor::from_values<float>(b.shape(), b.values<float>())}, attrs);
      require_close(cf, want, 1e-5);
    }
  auto cpu = make_cpu_backend();
  tensor out;
  CHECK(cpu->matmul(random({2, 3}, 1), random({4, 2}, 1), false, false, out).error.find("inner dimensions")
        != std::string::npos);
}

TEST_CASE("a long dot product and a long column times a scalar give the same bits however the "
          "cores split them",
          "[kernels][parallel]") {
  // Catches: a split dot whose partial sums are added as the threads end
  // (its bits would depend on the cores and the run), a block lost or run
  // twice at a split's edges, and a column times a scalar whose split
  // leaves elements unwritten.
  const int64_t k = (int64_t{1} << 20) + 5; // 17 blocks of 64 Ki floats, the last of 5
  auto x = random({1, k}, 11, -2, 2, dtype::float32);
  auto y = random({k, 1}, 12, -2, 2, dtype::float32);
  const float* px = x.data<float>();
  const float* py = y.data<float>();
  float want = 0.0f; // the partial dots of 64 Ki floats, added in order
  double exact = 0.0;
  for (int64_t at = 0; at < k; at += int64_t{1} << 16) {
    auto len = std::min<int64_t>(int64_t{1} << 16, k - at);
    want += cblas_sdot(static_cast<int>(len), px + at, 1, py + at, 1);
  }
  for (int64_t i = 0; i < k; ++i)
    exact += static_cast<double>(px[i]) * py[i];
  const size_t splits_before = parallel_splits();
  for (int round = 0; round < 3; ++round) {
    auto c = run("matmul", {x, y});
    REQUIRE(c.shape() == shape_type{1, 1});
    CHECK(c.data<float>()[0] == want);
  }
  CHECK(std::abs(want - exact) <= 1e-4 * std::sqrt(static_cast<double>(k)) * 2);

  const int64_t m = (int64_t{1} << 20) + 3;
  auto col = random({m, 1}, 13, -2, 2, dtype::float32);
  auto scalar = tensor::from_values<float>({1, 1}, {0.37f});
  auto c = run("matmul", {col, scalar});
  REQUIRE(c.shape() == shape_type{m, 1});
  size_t wrong = 0;
  for (int64_t i = 0; i < m; ++i)
    wrong += c.data<float>()[i] != col.data<float>()[i] * 0.37f;
  CHECK(wrong == 0);
  if (parallel_threads() > 1)
    CHECK(parallel_splits() == splits_before + 4); // three dots and the column were split
}

TEST_CASE("reductions over all axes or one, with and without keep_dims", "[kernels]") {
  auto x = random({2, 3, 4}, 4);
  auto at = [&](int64_t i, int64_t j, int64_t l) { return x.at((i * 3 + j) * 4 + l); };
  double total = 0, mx = -1e300;
  for (size_t i = 0; i < x.num_elements(); ++i) {
    total += x.at(i);
    mx = std::max(mx, x.at(i));
  }
  require_close(run("sum", {x}), {total});
  require_close(run("mean", {x}), {total / 24});
  require_close(run("max", {x}), {mx});
  op_attrs axis1;
  axis1.all_axes = false;
  axis1.axis = 1;
  std::vector<double> sum1, max1;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t l = 0; l < 4; ++l) {
      double s = 0, m = -1e300;
      for (int64_t j = 0; j < 3; ++j) {
        s += at(i, j, l);
        m = std::max(m, at(i, j, l));
      }
      sum1.push_back(s);
      max1.push_back(m);
    }
  auto s1 = run("sum", {x}, axis1);
  CHECK(s1.shape() == shape_type{2, 4});
  require_close(s1, sum1);
  require_close(run("max", {x}, axis1), max1);
  axis1.keep_dims = true;
  CHECK(run("mean", {x}, axis1).shape() == shape_type{2, 1, 4});
  op_attrs last;
  last.all_axes = false;
  last.axis = -1;
  CHECK(run("sum", {x}, last).shape() == shape_type{2, 3});
  op_attrs bad;
  bad.all_axes = false;
  bad.axis = 3;
  auto cpu = make_cpu_backend();
  tensor out;
  CHECK(cpu->reduce(reduce_op::sum, bad, x, out).error.find("axis 3 is out of range") != std::string::npos);
}

TEST_CASE("sum_to undoes broadcasting by summing", "[kernels]") {
  auto g = random({2, 3}, 5);
  require_close(run("sum_to", {g, tensor::filled(dtype::float64, {3}, 0)}),
                {g.at(0) + g.at(3), g.at(1) + g.at(4), g.at(2) + g.at(5)});
  require_close(run("sum_to", {g, tensor::filled(dtype::float64, {2, 1}, 0)}),
                {g.at(0) + g.at(1) + g.at(2), g.at(3) + g.at(4) + g.at(5)});
  double all = 0;
  for (size_t i = 0; i < 6; ++i)
    all += g.at(i);
  require_close(run("sum_to", {g, tensor::scalar(0)}), {all});
  auto same = run("sum_to", {g, g});
  CHECK(same.shares_buffer_with(g));
}

TEST_CASE("softmax, log-softmax and sparse softmax cross-entropy", "[kernels]") {
  auto logits = random({3, 4}, 6, -5, 5);
  auto labels = tensor::from_values<int32_t>({3}, {2, 0, 3});
  std::vector<double> sm, lsm, loss, grad;
  for (int r = 0; r < 3; ++r) {
    double z = 0;
    for (int c = 0; c < 4; ++c)
      z += std::exp(logits.at(r * 4 + c));
    for (int c = 0; c < 4; ++c) {
      sm.push_back(std::exp(logits.at(r * 4 + c)) / z);
      lsm.push_back(logits.at(r * 4 + c) - std::log(z));
      grad.push_back(0.5 * (sm.back() - (c == labels.at(r) ? 1 : 0)));
    }
    loss.push_back(std::log(z) - logits.at(r * 4 + static_cast<int>(labels.at(r))));
  }
  require_close(run("softmax", {logits}), sm);
  require_close(run("log_softmax", {logits}), lsm);
  require_close(run("softmax_xent", {logits, labels}), loss);
  require_close(run("softmax_xent_grad", {tensor::filled(dtype::float64, {3}, 0.5), logits, labels}), grad);
  auto cpu = make_cpu_backend();
  tensor out;
  auto bad = cpu->softmax_xent(logits, tensor::from_values<int32_t>({3}, {2, 4, 0}), out);
  CHECK(bad.error.find("label 4 of example 1 is out of range [0, 4)") != std::string::npos);
  // large logits stay finite
  auto big = tensor::from_values<double>({1, 2}, {1000, 0});
  CHECK(std::isfinite(run("log_softmax", {big}).at(1)));
}

TEST_CASE("SGD, momentum and Adam updates follow TensorFlow's formulas", "[kernels]") {
  auto cpu = make_cpu_backend();
  auto w0 = random({4}, 7), g = random({4}, 8);
  auto w = tensor::from_values<double>({4}, w0.values<double>());
  REQUIRE(cpu->apply_sgd(w, g, 0.1).ok());
  std::vector<double> want;
  for (size_t i = 0; i < 4; ++i)
    want.push_back(w0.at(i) - 0.1 * g.at(i));
  require_close(w, want);

  w = tensor::from_values<double>({4}, w0.values<double>());
  auto acc = tensor::filled(dtype::float64, {4}, 0);
  REQUIRE(cpu->apply_momentum(w, acc, g, 0.1, 0.9).ok());
  REQUIRE(cpu->apply_momentum(w, acc, g, 0.1, 0.9).ok());
  want.clear();
  for (size_t i = 0; i < 4; ++i) // acc1 = g, acc2 = 0.9 g + g
    want.push_back(w0.at(i) - 0.1 * g.at(i) - 0.1 * 1.9 * g.at(i));
  require_close(w, want);

  w = tensor::from_values<double>({4}, w0.values<double>());
  auto m = tensor::filled(dtype::float64, {4}, 0), v = tensor::filled(dtype::float64, {4}, 0);
  REQUIRE(cpu->apply_adam(w, m, v, g, 0.01, 0.9, 0.999, 1e-8, 1).ok());
  want.clear();
  for (size_t i = 0; i < 4; ++i) {
    double mm = 0.1 * g.at(i), vv = 0.001 * g.at(i) * g.at(i);
    double lr_t = 0.01 * std::sqrt(1 - 0.999) / (1 - 0.9);
    want.push_back(w0.at(i) - lr_t * mm / (std::sqrt(vv) + 1e-8));
  }
  require_close(w, want);
  CHECK(cpu->apply_adam(w, m, v, g, 0.01, 0.9, 0.999, 1e-8, 0).error.find("starts at 1") != std::string::npos);
  CHECK_FALSE(cpu->apply_sgd(w, random({3}, 1), 0.1).ok());
}

namespace {

/// An op run through run_op and what a plain loop here says it computes.
struct op_case {
  std::string name;
  std::vector<tensor> inputs;
  op_attrs attrs;
  std::vector<double> want;
};

op_attrs along(int32_t axis) {
  op_attrs a;
  a.all_axes = false;
  a.axis = axis;
  return a;
}

/// Every op name run_op knows, each with valid inputs and its reference.
std::vector<op_case> every_op() {
  auto a = random({2, 3}, 11, 0.5, 2), b = random({3}, 12, 0.5, 2);
  auto x = random({2, 3}, 13, -2, 2), dy = random({2, 3}, 14, -1, 1);
  auto row_dy = random({2}, 15, -1, 1);
  auto y01 = random({2, 3}, 16, 0.1, 0.9); // a sigmoid-like output
  auto labels = tensor::from_values<int32_t>({2}, {2, 0});
  std::vector<op_case> cases;
  auto elementwise = [&](const std::string& name, const tensor& l, const tensor& r,
                         double (*f)(double, double)) {
    std::vector<double> want;
    for (size_t i = 0; i < l.num_elements(); ++i) // r is [3] or [2,3]: NumPy broadcasting
      want.push_back(f(l.at(i), r.at(r.num_elements() == 3 ? i % 3 : i)));
    cases.push_back({name, {l, r}, {}, want});
  };
  elementwise("add", a, b, [](double p, double q) { return p + q; });
  elementwise("sub", a, b, [](double p, double q) { return p - q; });
  elementwise("mul", a, b, [](double p, double q) { return p * q; });
  elementwise("div", a, b, [](double p, double q) { return p / q; });
  elementwise("relu_grad", dy, x, [](double g, double v) { return v > 0 ? g : 0.0; });
  elementwise("sigmoid_grad", dy, y01, [](double g, double v) { return g * v * (1 - v); });
  elementwise("tanh_grad", dy, y01, [](double g, double v) { return g * (1 - v * v); });
  auto unary = [&](const std::string& name, double (*f)(double)) {
    std::vector<double> want;
    for (size_t i = 0; i < a.num_elements(); ++i)
      want.push_back(f(a.at(i)));
    cases.push_back({name, {a}, {}, want});
  };
  unary("neg", [](double v) { return -v; });
  unary("exp", [](double v) { return std::exp(v); });
  unary("log", [](double v) { return std::log(v); });
  unary("relu", [](double v) { return v > 0 ? v : 0.0; });
  unary("sigmoid", [](double v) { return 1 / (1 + std::exp(-v)); });
  unary("tanh", [](double v) { return std::tanh(v); });
  unary("square", [](double v) { return v * v; });
  unary("sqrt", [](double v) { return std::sqrt(v); });
  unary("softplus", [](double v) { return std::log1p(std::exp(v)); });
  unary("ones_like", [](double) { return 1.0; });

  auto m = random({3, 2}, 17);
  std::vector<double> mm(4, 0);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k)
        mm[i * 2 + j] += x.at(i * 3 + k) * m.at(k * 2 + j);
  cases.push_back({"matmul", {x, m}, {}, mm});

  double total = 0, mx = -1e300;
  for (size_t i = 0; i < x.num_elements(); ++i) {
    total += x.at(i);
    mx = std::max(mx, x.at(i));
  }
  cases.push_back({"sum", {x}, {}, {total}});
  cases.push_back({"mean", {x}, {}, {total / 6}});
  cases.push_back({"max", {x}, {}, {mx}});
  cases.push_back({"sum_to", {dy, b}, {}, {dy.at(0) + dy.at(3), dy.at(1) + dy.at(4), dy.at(2) + dy.at(5)}});

  // Gradients of reductions over axis 1 of x [2,3]: dy [2] spread over each row.
  std::vector<double> sum_g, mean_g, max_g;
  std::vector<double> row_max;
  for (int r = 0; r < 2; ++r)
    row_max.push_back(std::max({x.at(r * 3), x.at(r * 3 + 1), x.at(r * 3 + 2)}));
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 3; ++c) {
      sum_g.push_back(row_dy.at(r));
      mean_g.push_back(row_dy.at(r) / 3);
      max_g.push_back(x.at(r * 3 + c) == row_max[r] ? row_dy.at(r) : 0.0);
    }
  cases.push_back({"sum_grad", {row_dy, x}, along(1), sum_g});
  cases.push_back({"mean_grad", {row_dy, x}, along(1), mean_g});
  cases.push_back({"max_grad", {row_dy, x, tensor::from_values<double>({2}, row_max)}, along(1), max_g});

  std::vector<double> sm, lsm, sm_grad, lsm_grad, loss, xent_grad;
  for (int r = 0; r < 2; ++r) {
    double z = 0;
    for (int c = 0; c < 3; ++c)
      z += std::exp(x.at(r * 3 + c));
    double dot = 0, dsum = 0;
    for (int c = 0; c < 3; ++c) {
      auto p = std::exp(x.at(r * 3 + c)) / z;
      sm.push_back(p);
      lsm.push_back(std::log(p));
      dot += dy.at(r * 3 + c) * p;
      dsum += dy.at(r * 3 + c);
    }
    for (int c = 0; c < 3; ++c) {
      auto p = sm[static_cast<size_t>(r * 3 + c)];
      sm_grad.push_back(p * (dy.at(r * 3 + c) - dot));
      lsm_grad.push_back(dy.at(r * 3 + c) - p * dsum);
      xent_grad.push_back(row_dy.at(r) * (p - (c == labels.at(r) ? 1 : 0)));
    }
    loss.push_back(-std::log(sm[static_cast<size_t>(r * 3) + static_cast<size_t>(labels.at(r))]));
  }
  auto sm_t = tensor::from_values<double>({2, 3}, sm), lsm_t = tensor::from_values<double>({2, 3}, lsm);
  cases.push_back({"softmax", {x}, {}, sm});
  cases.push_back({"log_softmax", {x}, {}, lsm});
  cases.push_back({"softmax_grad", {dy, sm_t}, {}, sm_grad});
  cases.push_back({"log_softmax_grad", {dy, lsm_t}, {}, lsm_grad});
  cases.push_back({"softmax_xent", {x, labels}, {}, loss});
  cases.push_back({"softmax_xent_grad", {row_dy, x, labels}, {}, xent_grad});
  return cases;
}

} // namespace

TEST_CASE("run_op runs every op it knows and each matches a plain loop", "[kernels]") {
  // The list the graph's gradients and executors rely on: each is run here.
  const std::vector<std::string> names = {
    "add", "sub", "mul", "div", "neg", "exp", "log", "relu", "sigmoid", "tanh", "square", "sqrt", "softplus",
    "matmul", "sum", "mean", "max", "softmax", "log_softmax", "softmax_xent", "relu_grad",
    "sigmoid_grad", "tanh_grad", "sum_to", "sum_grad", "mean_grad", "max_grad", "softmax_grad",
    "log_softmax_grad", "softmax_xent_grad", "ones_like"};
  auto cases = every_op();
  for (const auto& name : names) {
    INFO(name);
    CHECK(known_op(name));
    auto it = std::find_if(cases.begin(), cases.end(), [&](const op_case& c) { return c.name == name; });
    REQUIRE(it != cases.end()); // every listed op has a case below
    require_close(run(it->name, it->inputs, it->attrs), it->want, 1e-12);
  }
  CHECK(cases.size() == names.size()); // and no case runs an op missing from the list
}

TEST_CASE("run_op rejects unknown ops whatever their input count, and wrong arity", "[kernels]") {
  auto cpu = make_cpu_backend();
  tensor out;
  auto x = random({2, 3}, 1);
  CHECK(run_op(*cpu, "conv2d", {}, {tensor::scalar(1)}, out).error == "unknown op 'conv2d'");
  // Three inputs, like max_grad: once sent to max_grad's kernel; now an error.
  auto three = run_op(*cpu, "min_grad", {}, {x, x, x}, out);
  CHECK(three.error == "unknown op 'min_grad'");
  CHECK(three.what == status::kind::invalid);
  CHECK(out.empty());
  CHECK(run_op(*cpu, "matmul", {}, {tensor::scalar(1)}, out).error.find("takes 2 input(s), got 1")
        != std::string::npos);
  CHECK(run_op(*cpu, "add", {}, {x, tensor{}}, out).error == "add: input 1 has no value");
  for (const char* name : {"", "Add", "max_grad ", "max_gra", "assign", "assign_add", "sum_to_"})
    CHECK_FALSE(known_op(name));
}

// -- integers: every op total, never a trap nor undefined behaviour (issue 22) --

namespace {

template <class T>
void check_total_integer_ops() {
  using lim = std::numeric_limits<T>;
  const T mn = lim::min(), mx = lim::max();
  auto cpu = make_cpu_backend();
  auto vec = [](std::vector<T> v) {
    return tensor::from_values<T>({static_cast<int64_t>(v.size())}, v);
  };
  auto as_vector = [](const tensor& t) {
    return std::vector<T>(t.data<T>(), t.data<T>() + t.num_elements());
  };
  auto binary = [&](binary_op op, const tensor& a, const tensor& b) {
    tensor out;
    auto st = cpu->binary(op, a, b, out);
    REQUIRE(st.ok());
    return as_vector(out);
  };
  // MIN / -1 (x86's idiv raises SIGFPE) wraps to MIN; x / 0 is 0. Each path
  // of the binary kernel: equal shapes, a scalar on either side, broadcast.
  auto lhs = vec({mn, mn, 7, -7, mx, 0});
  auto rhs = vec({-1, 0, -1, 2, -1, -1});
  CHECK(binary(binary_op::div, lhs, rhs) == std::vector<T>{mn, 0, -7, -3, static_cast<T>(-mx), 0});
  auto minus_one = tensor::from_values<T>({}, {-1});
  CHECK(binary(binary_op::div, vec({mn, 5}), minus_one) == std::vector<T>{mn, -5});
  CHECK(binary(binary_op::div, tensor::from_values<T>({}, {mn}), vec({-1, 1}))
        == std::vector<T>{mn, mn});
  auto column = tensor::from_values<T>({2, 1}, {mn, 6});
  auto row = tensor::from_values<T>({1, 2}, {-1, 0});
  CHECK(binary(binary_op::div, column, row) == std::vector<T>{mn, 0, -6, 0});
  // In place, as a variable's update would run it.
  tensor var = vec({mn, 3});
  REQUIRE(cpu->binary_inplace(binary_op::div, var, minus_one).ok());
  CHECK(as_vector(var) == std::vector<T>{mn, -3});
  // add, sub, mul wrap as two's complement (computed unsigned: no UB).
  CHECK(binary(binary_op::add, vec({mx, mn}), vec({1, -1})) == std::vector<T>{mn, mx});
  CHECK(binary(binary_op::sub, vec({mn, mx}), vec({1, -1})) == std::vector<T>{mx, mn});
  CHECK(binary(binary_op::mul, vec({mx, mn, mn}), vec({2, -1, mn})) == std::vector<T>{-2, mn, 0});
  CHECK(binary(binary_op::add, vec({mx, 1}), tensor::from_values<T>({}, {1}))
        == std::vector<T>{mn, 2});
  // The gradient ops on integers wrap too.
  CHECK(binary(binary_op::sigmoid_grad, vec({mx}), vec({mx})).size() == 1);
  CHECK(binary(binary_op::tanh_grad, vec({mn}), vec({mx})).size() == 1);
  // Float-only kernels refuse integers with an error, never compute them.
  tensor out;
  for (auto op : {unary_op::neg, unary_op::square, unary_op::sqrt}) {
    auto st = cpu->unary(op, vec({mn}), out);
    CHECK(st.what == status::kind::dtype);
  }
  for (auto op : {reduce_op::sum, reduce_op::mean, reduce_op::max}) {
    op_attrs all;
    all.all_axes = true;
    CHECK(cpu->reduce(op, all, vec({mx, mx}), out).what == status::kind::dtype);
  }
  CHECK(cpu->matmul(tensor::from_values<T>({1, 1}, {mn}), tensor::from_values<T>({1, 1}, {-1}),
                    false, false, out)
          .what == status::kind::dtype);
}

} // namespace

TEST_CASE("int32 kernels are total: MIN / -1, x / 0 and overflow have defined results",
          "[kernels][int]") {
  check_total_integer_ops<int32_t>();
}

TEST_CASE("int64 kernels are total: MIN / -1, x / 0 and overflow have defined results",
          "[kernels][int]") {
  check_total_integer_ops<int64_t>();
}

TEST_CASE("a float made an integer saturates, NaN is 0 (never an undefined cast)",
          "[kernels][int]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  using i32 = std::numeric_limits<int32_t>;
  using i64 = std::numeric_limits<int64_t>;
  struct cast_case {
    double in;
    int32_t want32;
    int64_t want64;
  };
  for (auto c : std::vector<cast_case>{{nan, 0, 0},
                                       {inf, i32::max(), i64::max()},
                                       {-inf, i32::min(), i64::min()},
                                       {1e30, i32::max(), i64::max()},
                                       {-1e30, i32::min(), i64::min()},
                                       {9223372036854775808.0, i32::max(), i64::max()},
                                       {-9223372036854775808.0, i32::min(), i64::min()},
                                       {2147483648.0, i32::max(), 2147483648LL},
                                       {-2147483649.0, i32::min(), -2147483649LL},
                                       {-2.9, -2, -2},
                                       {2.9, 2, 2}}) {
    INFO(c.in);
    CHECK(tensor::filled(dtype::int32, {2}, c.in).data<int32_t>()[1] == c.want32);
    CHECK(tensor::filled(dtype::int64, {2}, c.in).data<int64_t>()[1] == c.want64);
  }
}

TEST_CASE("an int64 label near 2^63 is refused as out of range, exactly", "[kernels][int]") {
  auto cpu = make_cpu_backend();
  auto logits = tensor::from_values<double>({2, 3}, {1, 2, 3, 4, 5, 6});
  tensor out;
  for (int64_t bad : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
                      int64_t{3}}) {
    INFO(bad);
    auto labels = tensor::from_values<int64_t>({2}, {0, bad});
    auto st = cpu->softmax_xent(logits, labels, out);
    CHECK(st.error.find("label " + std::to_string(bad) + " of example 1 is out of range")
          != std::string::npos);
  }
}

// Catches a dedup that loses or merges ids: two ids that share a slot (ids
// of a stride, as a mod-sharded table's rows are; negative ones), a reset()
// that still remembers the last batch's ids, or buffers that do not grow
// with a larger batch. Against std::unordered_map over the same batches.
TEST_CASE("id_dedup gives each id its index of first occurrence, as a hash map does, across "
          "resets and batch sizes",
          "[kernels][sparse]") {
  kernels::id_dedup dedup;
  std::mt19937_64 rng{7};
  for (size_t n : {size_t{1}, size_t{5}, size_t{512}, size_t{64}, size_t{4096}, size_t{512}}) {
    std::vector<int64_t> ids(n);
    for (auto& id : ids) {
      auto r = static_cast<int64_t>(rng() % (n / 2 + 1));
      id = (r % 3 == 0 ? -r : r) * 1024; // a stride of 1024, some negative
    }
    dedup.reset(n);
    std::unordered_map<int64_t, int32_t> want;
    for (size_t e = 0; e < n; ++e) {
      auto [it, fresh_want] = want.emplace(ids[e], static_cast<int32_t>(want.size()));
      auto [at, fresh] = dedup.insert(ids[e]);
      INFO("batch of " << n << ", ids[" << e << "] = " << ids[e]);
      REQUIRE(fresh == fresh_want);
      REQUIRE(at == it->second);
    }
    CHECK(dedup.size() == want.size());
  }
}
