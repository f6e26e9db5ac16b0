// The op registry (kernels/op_registry.hpp) walked entry by entry: every op
// is complete (help, inputs, a shape rule, a backend entry, a gradient or a
// mark that it has none), the graph builds and runs each one on the CPU,
// and its shape rule says what the kernel then returns. An op added to the
// registry without one of these, or without an example here, fails.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "graph/evaluate.hpp"
#include "graph/graph.hpp"
#include "kernels/op_registry.hpp"

using namespace af;
using kernels::op_def;
using kernels::op_registry;

namespace {

tensor random(shape_type shape, uint64_t seed, double lo, double hi, dtype type = dtype::float64) {
  tensor t{type, std::move(shape)};
  REQUIRE(kernels::fill_uniform(t, lo, hi, seed).ok());
  return t;
}

struct example {
  std::vector<tensor> inputs;
  op_attrs attrs;
};

op_attrs along(int32_t axis) {
  op_attrs a;
  a.all_axes = false;
  a.axis = axis;
  return a;
}

/// Valid inputs for every op, by name: a new op needs one here.
std::map<std::string, example> examples() {
  auto x = random({2, 3}, 1, 0.5, 2), b = random({3}, 2, 0.5, 2), dy = random({2, 3}, 3, -1, 1);
  auto row = random({2}, 4, -1, 1);
  auto labels = tensor::from_values<int32_t>({2}, {2, 0});
  op_attrs transposed;
  transposed.transpose_b = true;
  std::map<std::string, example> out = {
    {"matmul", {{x, random({4, 3}, 6, -1, 1)}, transposed}},
    {"sum", {{x}, along(1)}},
    {"mean", {{x}, along(-1)}},
    {"max", {{x}, {}}},
    {"softmax_xent", {{x, labels}, {}}},
    {"correct_count", {{random({2, 3}, 7, -1, 1, dtype::float32), labels}, {}}},
    {"gather", {{x, tensor::from_values<int64_t>({2, 2}, {1, 0, 1, 1})}, {}}},
    {"gather_grad", {{random({3, 3}, 8, -1, 1), x, tensor::from_values<int32_t>({3}, {1, 1, 0})}, {}}},
    {"unique", {{tensor::from_values<int64_t>({4}, {7, 3, 7, 1})}, {}}},
    {"unique_idx", {{tensor::from_values<int32_t>({4}, {7, 3, 7, 1})}, {}}},
    {"unsorted_segment_sum",
     {{x, tensor::from_values<int64_t>({2}, {3, -1}), tensor::from_values<int32_t>({}, {4})}, {}}},
    {"concat", {{x, random({1, 3}, 9, -1, 1)}, {}}},
    {"flatten_rows", {{random({2, 2, 3}, 10, -1, 1), tensor::from_values<int32_t>({2, 2}, {0, 1, 1, 0})}, {}}},
    // Partitioned tables (h/part).
    {"dynamic_partition", {{x, tensor::from_values<int32_t>({2}, {1, 0}),
                            tensor::from_values<int32_t>({}, {2}),
                            tensor::from_values<int64_t>({}, {0})}, {}}},
    {"dynamic_stitch", {{tensor::from_values<int64_t>({2}, {1, 0}), x}, {}}},
    {"shard_of", {{tensor::from_values<int64_t>({3}, {4, 0, 6}),
                   tensor::from_values<int64_t>({3}, {3, 2, 2}),
                   tensor::from_values<int32_t>({}, {1})}, {}}},
    {"row_in_shard", {{tensor::from_values<int32_t>({3}, {4, 0, 6}),
                       tensor::from_values<int32_t>({3}, {3, 2, 2}),
                       tensor::from_values<int32_t>({}, {0})}, {}}},
    {"size", {{x}, {}}},
    {"range", {{tensor::from_values<int64_t>({}, {3})}, {}}},
    {"sum_to", {{dy, b}, {}}},
    {"softmax_xent_grad", {{row, x, labels}, {}}},
    {"sum_grad", {{row, x}, along(1)}},
    {"mean_grad", {{row, x}, along(1)}},
    {"max_grad", {{row, x, row}, along(1)}},
  };
  for (const char* op : {"add", "sub", "mul", "div"})
    out[op] = {{x, b}, {}};
  for (const char* op : {"neg", "exp", "log", "relu", "sigmoid", "tanh", "square", "sqrt", "softplus",
                         "softmax", "log_softmax", "ones_like"})
    out[op] = {{x}, {}};
  for (const char* op : {"relu_grad", "sigmoid_grad", "tanh_grad", "softmax_grad",
                         "log_softmax_grad"})
    out[op] = {{dy, x}, {}};
  return out;
}

} // namespace

TEST_CASE("every registered op is complete: help, inputs, shape rule, kernel, gradient or none",
          "[registry]") {
  std::set<std::string> names;
  for (const auto& def : op_registry()) {
    std::string name{def.name};
    INFO(name);
    CHECK(names.insert(name).second); // one entry per name
    if (!def.function.empty())
      CHECK(names.insert(std::string{def.function}).second); // nor a name taken twice
    CHECK_FALSE(def.help.empty());
    CHECK(def.arity() >= 1);
    CHECK(def.shape != nullptr);
    CHECK(def.run != nullptr);
    CHECK(kernels::known_op(name));
    CHECK(kernels::find_op_def(def.call_name()) == &def);
    // The gradient part lives in graph/: a rule exactly for the ops marked so.
    CHECK(has_gradient(name) == (def.gradient == kernels::op_gradient::rule));
  }
  for (const auto& op : gradient_ops()) {
    INFO("gradient rule for " << op);
    const auto* def = kernels::find_op_def(op);
    REQUIRE(def != nullptr);
    CHECK(def->name == op);
    CHECK(def->gradient == kernels::op_gradient::rule);
  }
}

TEST_CASE("the graph builds and runs every registered op, and its shape rule says what comes out",
          "[registry]") {
  auto cases = examples();
  auto cpu = kernels::make_cpu_backend();
  for (const auto& def : op_registry()) {
    std::string name{def.name};
    INFO(name);
    auto it = cases.find(name);
    REQUIRE(it != cases.end()); // an op without an example above
    const auto& ex = it->second;
    REQUIRE(static_cast<int>(ex.inputs.size()) == def.arity());
    graph g;
    std::vector<output> in;
    std::vector<kernels::value_info> infos;
    for (const auto& t : ex.inputs) {
      in.push_back(g.constant(t));
      infos.push_back({t.type(), t.shape()});
    }
    auto y = g.op(name, in, ex.attrs);
    variable_values vars;
    auto got = evaluate(g, {y}, {}, vars, *cpu);
    if (!got)
      FAIL(got.error().what);
    kernels::value_info want;
    auto st = kernels::infer_op(name, ex.attrs, infos, want);
    REQUIRE(st.ok());
    CHECK(got->front().type() == want.type);
    // A dimension known only at run time (unique's length) matches any.
    auto shape = got->front().shape();
    REQUIRE(shape.size() == want.shape.size());
    for (size_t d = 0; d < shape.size(); ++d)
      CHECK((want.shape[d] == kernels::unknown_dim || want.shape[d] == shape[d]));
    cases.erase(it);
  }
  for (const auto& [name, ex] : cases)
    FAIL_CHECK("an example for '" << name << "', which the registry does not have");
}

TEST_CASE("shape rules refuse what the kernels refuse, naming the op", "[registry]") {
  using kernels::value_info;
  value_info out;
  auto f32 = [](shape_type s) { return value_info{dtype::float32, std::move(s)}; };
  auto st = kernels::infer_op("matmul", {}, {f32({2, 3}), f32({2, 3})}, out);
  CHECK(st.what == kernels::status::kind::shape);
  CHECK(st.error.rfind("matmul", 0) == 0);
  CHECK(kernels::infer_op("add", {}, {f32({2, 3}), f32({4})}, out).what
        == kernels::status::kind::shape);
  CHECK(kernels::infer_op("add", {}, {f32({2}), value_info{dtype::int32, {2}}}, out).what
        == kernels::status::kind::dtype);
  CHECK(kernels::infer_op("sum", along(2), {f32({2, 3})}, out).what == kernels::status::kind::shape);
  CHECK(kernels::infer_op("softmax_xent", {}, {f32({2, 3}), f32({2})}, out).what
        == kernels::status::kind::shape);
  CHECK(kernels::infer_op("relu", {}, {f32({2}), f32({2})}, out).error
        == "relu takes 1 input(s), got 2");
  CHECK(kernels::infer_op("reduce_sum", {}, {f32({2})}, out).error == "unknown op 'reduce_sum'");
  op_attrs transpose_a;
  transpose_a.transpose_a = true;
  REQUIRE(kernels::infer_op("matmul", transpose_a, {f32({3, 2}), f32({3, 5})}, out).ok());
  CHECK(out.shape == shape_type{2, 5});
}
