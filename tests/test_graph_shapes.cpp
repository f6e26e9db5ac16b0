// Static shapes (graph/shapes.hpp) and per-thread device scopes: what the
// graph knows before it runs, and what each building thread sees.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "graph/graph.hpp"
#include "graph/shapes.hpp"

using namespace af;

namespace {

constexpr int64_t any = any_dim;

static_info f32(std::optional<shape_type> s) {
  return {dtype::float32, std::move(s)};
}

static_info inferred(const std::string& op, const std::vector<static_info>& in, op_attrs attrs = {}) {
  auto r = infer_static(op, attrs, in, op);
  if (!r)
    FAIL(r.error().what);
  return *r;
}

std::string refused(const std::string& op, const std::vector<static_info>& in, op_attrs attrs = {},
                    const std::string& name = "") {
  auto r = infer_static(op, attrs, in, name.empty() ? op : name);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == af_error::shape_mismatch);
  return r.error().what;
}

op_attrs along(int32_t axis, bool keep = false) {
  op_attrs a;
  a.all_axes = false;
  a.axis = axis;
  a.keep_dims = keep;
  return a;
}

} // namespace

TEST_CASE("static shapes: broadcasting keeps what is known and refuses what cannot fit") {
  CHECK(inferred("add", {f32(shape_type{any, 3}), f32(shape_type{3})}).shape == shape_type{any, 3});
  CHECK(inferred("mul", {f32(shape_type{any, 1}), f32(shape_type{2, 5})}).shape == shape_type{2, 5});
  CHECK(inferred("sub", {f32(shape_type{any}), f32(shape_type{4})}).shape == shape_type{4});
  CHECK_FALSE(inferred("div", {f32(std::nullopt), f32(shape_type{4})}).shape);
  CHECK(refused("add", {f32(shape_type{any, 3}), f32(shape_type{any, 4})}, {}, "plus")
        == "Dimensions must be equal, but are 3 and 4 for 'plus' (op: 'add') with input shapes: "
           "[?,3], [?,4].");
}

TEST_CASE("static shapes: matmul checks its inner dimensions at build time, as TF's") {
  CHECK(inferred("matmul", {f32(shape_type{any, 3}), f32(shape_type{3, 5})}).shape
        == shape_type{any, 5});
  op_attrs tb;
  tb.transpose_b = true;
  CHECK(inferred("matmul", {f32(shape_type{any, 3}), f32(shape_type{7, 3})}, tb).shape
        == shape_type{any, 7});
  CHECK(inferred("matmul", {f32(std::nullopt), f32(shape_type{3, 5})}).shape == shape_type{any, 5});
  auto why = refused("matmul", {f32(shape_type{any, 3}), f32(shape_type{4, 5})});
  CHECK(why == "Dimensions must be equal, but are 3 and 4 for 'matmul' (op: 'matmul') with input "
               "shapes: [?,3], [4,5].");
  CHECK(refused("matmul", {f32(shape_type{2, 3, 4}), f32(shape_type{4, 5})})
          .find("Shape must be rank 2 but is rank 3") == 0);
  // Everything known: the registry's rule decides, naming the op and the shapes.
  auto both = refused("matmul", {f32(shape_type{2, 3}), f32(shape_type{2, 3})});
  CHECK(both.find("[2,3], [2,3]") != std::string::npos);
}

TEST_CASE("static shapes: reductions, gather, concat, softmax_xent and the elementwise functions") {
  CHECK(inferred("sum", {f32(shape_type{any, 3})}, along(1)).shape == shape_type{any});
  CHECK(inferred("mean", {f32(shape_type{any, 3})}, along(-1, true)).shape == shape_type{any, 1});
  CHECK(inferred("max", {f32(std::nullopt)}).shape == shape_type{}); // all axes: a scalar
  CHECK_FALSE(inferred("sum", {f32(std::nullopt)}, along(0)).shape);
  CHECK(refused("sum", {f32(shape_type{any, 3})}, along(2)).find("Invalid reduction dimension 2")
        == 0);
  static_info ids{dtype::int32, shape_type{any, 2}};
  CHECK(inferred("gather", {f32(shape_type{10, 4}), ids}).shape == shape_type{any, 2, 4});
  CHECK(inferred("concat", {f32(shape_type{any, 4}), f32(shape_type{3, 4})}).shape
        == shape_type{any, 4});
  CHECK(inferred("concat", {f32(shape_type{2, 4}), f32(shape_type{3, 4})}).shape == shape_type{5, 4});
  CHECK(refused("concat", {f32(shape_type{2, 4}), f32(shape_type{any, 5})}).find("but are 4 and 5")
        != std::string::npos);
  static_info labels{dtype::int32, shape_type{any}};
  CHECK(inferred("softmax_xent", {f32(shape_type{8, 10}), labels}).shape == shape_type{8});
  CHECK(refused("softmax_xent", {f32(shape_type{8, 10}), {dtype::int32, shape_type{7}}})
          .find("but are 8 and 7") != std::string::npos);
  auto r = inferred("relu", {f32(shape_type{any, 3})});
  CHECK(r.shape == shape_type{any, 3});
  CHECK(r.type == dtype::float32);
  CHECK(inferred("unique", {labels}).shape == shape_type{any});
  CHECK(inferred("unique_idx", {labels}).shape == shape_type{any});
  CHECK(inferred("unsorted_segment_sum", {f32(shape_type{any, 4}), labels, {dtype::int32, shape_type{}}})
          .shape
        == shape_type{any, 4});
  // No partial rule: unknown, not an error.
  CHECK_FALSE(inferred("dynamic_partition", {f32(shape_type{any}), labels, labels, labels}).shape);
}

TEST_CASE("static shapes of a graph's nodes follow its placeholders, variables and constants") {
  graph g;
  auto x = g.placeholder("x", dtype::float32, shape_type{any, 3});
  auto w = *g.variable("w", {3, 2});
  auto b = g.constant(tensor::filled(dtype::float32, {2}, 0));
  auto y = g.add(g.matmul(x, w), b);
  auto loss = g.reduce_sum(y);
  auto free = g.placeholder("free");
  static_shapes shapes;
  CHECK(shapes.of(g, y).shape == shape_type{any, 2});
  CHECK(shapes.of(g, y).type == dtype::float32);
  CHECK(shapes.of(g, loss).shape == shape_type{});
  CHECK(shapes.of(g, x).shape == shape_type{any, 3});
  CHECK_FALSE(shapes.of(g, free).shape);
  CHECK_FALSE(shapes.of(g, free).type);
  CHECK(shapes.of(g, g.assign_add(w, g.constant(tensor::filled(dtype::float32, {3, 2}, 1)))).shape
        == shape_type{3, 2});
  CHECK(static_shape_string(shapes.of(g, x).shape) == "[?,3]");
  CHECK(static_shape_string(std::nullopt) == "?");
}

TEST_CASE("device scopes are each thread's own, as TF's thread-local device stack") {
  graph g;
  g.push_scope(*device_name::parse("/job:ps/task:0"));
  // The other thread opens its own scope while this one's is open, each
  // builds a node, then each closes its scope: a step at a time, in turn.
  std::mutex m;
  std::condition_variable cv;
  int turn = 0;
  auto wait_for = [&](int t) { // false after 10 s (Catch2's REQUIRE is for this thread only)
    std::unique_lock<std::mutex> lock(m);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return turn == t; });
  };
  auto next = [&] {
    std::lock_guard<std::mutex> lock(m);
    ++turn;
    cv.notify_all();
  };
  output theirs, theirs_after;
  bool saw_none = false;
  bool other_waited = false;
  std::thread other([&] {
    if (!wait_for(0))
      return;
    saw_none = g.scopes().empty();
    g.push_scope(*device_name::parse("/job:worker/task:1"));
    next();
    if (!wait_for(2))
      return;
    other_waited = true;
    theirs = g.constant(tensor::filled(dtype::float32, {}, 1), "theirs");
    g.pop_scope();
    theirs_after = g.constant(tensor::filled(dtype::float32, {}, 1), "theirs_after");
    next();
  });
  struct joiner { // a failed REQUIRE below still joins (the thread gives up after 10 s)
    std::thread& t;
    ~joiner() {
      if (t.joinable())
        t.join();
    }
  } join_other{other};
  REQUIRE(wait_for(1));
  auto mine = g.constant(tensor::filled(dtype::float32, {}, 1), "mine");
  next();
  bool other_done = wait_for(3);
  other.join();
  REQUIRE(other_done);
  REQUIRE(other_waited);
  auto mine_after = g.constant(tensor::filled(dtype::float32, {}, 1), "mine_after");
  g.pop_scope();
  auto outside = g.constant(tensor::filled(dtype::float32, {}, 1), "outside");
  CHECK(saw_none);
  CHECK(g.at(mine).requested.to_string() == "/job:ps/task:0");
  CHECK(g.at(mine_after).requested.to_string() == "/job:ps/task:0");
  CHECK(g.at(theirs).requested.to_string() == "/job:worker/task:1");
  CHECK(g.at(theirs_after).requested.to_string().empty());
  CHECK(g.at(outside).requested.to_string().empty());
  CHECK(g.scopes().empty());
}
