// A variable's one owner (variable_cell) without an actor system, then the
// variable actor's waiters and the node's registry through a real one.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>

#include "caf/all.hpp"

#include "net/data_plane.hpp"
#include "actors/node.hpp"
#include "actors/system.hpp"
#include "actors/variable.hpp"
#include "core/parallel_ranges.hpp"
#include "kernels/kernels.hpp"
#include "messages/error.hpp"
#include "train/optimizer.hpp"

using namespace af;
using namespace std::chrono_literals;

namespace {

const char* cpu0 = "/job:ps/replica:0/task:0/device:CPU:0";

variable_spec spec_of(shape_type shape, dtype type = dtype::float32, std::string name = "v") {
  return variable_spec{std::move(name), type, std::move(shape), cpu0};
}

variable_cell make(shape_type shape, dtype type = dtype::float32) {
  return variable_cell{spec_of(std::move(shape), type)};
}

bool contains(const caf::error& err, const std::string& text) {
  return describe(err).find(text) != std::string::npos;
}

/// Asks until `cond` holds, at most `limit`: each try is a request answered
/// by the actor, so a true answer is the state of the actor, not a guess.
bool eventually(const std::function<bool()>& cond, std::chrono::seconds limit = 10s) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  do {
    if (cond())
      return true;
  } while (std::chrono::steady_clock::now() < deadline);
  return cond();
}

variable_info info_of(caf::scoped_actor& self, const variable_actor& var) {
  variable_info out;
  out.waiters = std::numeric_limits<uint32_t>::max();
  self->request(var, 5s, info_atom::value)
    .receive([&](variable_info& i) { out = std::move(i); }, [&](caf::error& e) { FAIL(describe(e)); });
  return out;
}

} // namespace

// -- the cell ----------------------------------------------------------------------

TEST_CASE("reading an uninitialized variable is an error that names it", "[variable]") {
  auto cell = make({2});
  auto r = cell.apply(var_op::read, tensor{}, true);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), af_error::uninitialized));
  CHECK(contains(r.error(), "variable 'v' on /job:ps/replica:0/task:0/device:CPU:0"));
  auto add = cell.apply(var_op::assign_add, tensor::scalar(1), false);
  REQUIRE_FALSE(add);
  CHECK(is(add.error(), af_error::uninitialized));
  auto bad = cell.apply(static_cast<var_op>(9), tensor::scalar(1), false);
  REQUIRE_FALSE(bad);
  CHECK(is(bad.error(), af_error::invalid_argument));
  CHECK(contains(bad.error(), "unknown op code 9"));
}

TEST_CASE("initializers set the value and bump the version", "[variable]") {
  auto cell = make({2, 2});
  auto value = [](variable_cell& c) { return c.apply(var_op::read, tensor{}, true)->value; };
  REQUIRE(cell.initialize(initializer::constant(2), false, "") == 1u);
  CHECK(value(cell).values<float>() == std::vector<float>(4, 2));
  // only_if_uninitialized leaves a set value alone
  CHECK(cell.initialize(initializer::ones(), true, "") == 1u);
  CHECK(value(cell).values<float>() == std::vector<float>(4, 2));
  CHECK(cell.initialize(initializer::ones(), false, "") == 2u);
  CHECK(value(cell).values<float>() == std::vector<float>(4, 1));
  auto u1 = make({100}), u2 = make({100});
  REQUIRE(u1.initialize(initializer::uniform(0, 1, 5), false, ""));
  REQUIRE(u2.initialize(initializer::uniform(0, 1, 5), false, ""));
  CHECK(value(u1) == value(u2));
  REQUIRE(u1.initialize(initializer::normal(0, 1, 5), false, ""));
  CHECK(value(u1) != value(u2));
  auto from = make({3});
  REQUIRE(from.initialize(initializer::from_tensor(tensor::from_values<float>({3}, {1, 2, 3})), false, ""));
  CHECK(value(from).values<float>() == std::vector<float>{1, 2, 3});
  auto wrong = from.initialize(initializer::from_tensor(tensor::filled(dtype::float32, {4}, 0)), false, "");
  REQUIRE_FALSE(wrong);
  CHECK(is(wrong.error(), af_error::shape_mismatch));
  auto kind = from.initialize(initializer{"glorot", 0, 0, 1, 0, {}}, false, "");
  REQUIRE_FALSE(kind);
  CHECK(contains(kind.error(), "unknown kind 'glorot'"));
}

TEST_CASE("assign, assign_add and assign_sub check dtype and shape and keep readers' snapshots",
          "[variable]") {
  auto cell = make({2, 2});
  auto four = tensor::filled(dtype::float32, {2, 2}, 4);
  auto assigned = cell.apply(var_op::assign, four, true);
  REQUIRE(assigned);
  CHECK(assigned->version == 1u);
  CHECK(assigned->value.shares_buffer_with(four)); // assign keeps the sender's buffer
  auto snapshot = cell.apply(var_op::read, tensor{}, false)->value; // a read always has the value
  REQUIRE(cell.apply(var_op::assign_add, tensor::scalar(1), false)->version == 2u); // a scalar broadcasts
  auto sub = cell.apply(var_op::assign_sub, tensor::filled(dtype::float32, {2, 2}, 0.5), false);
  REQUIRE(sub);
  CHECK(sub->version == 3u);
  CHECK(sub->value.empty()); // not asked for
  CHECK(cell.apply(var_op::read, tensor{}, false)->value.values<float>() == std::vector<float>(4, 4.5));
  CHECK(snapshot.values<float>() == std::vector<float>(4, 4));
  CHECK(four.values<float>() == std::vector<float>(4, 4));
  auto shape = cell.apply(var_op::assign, tensor::filled(dtype::float32, {3}, 1), false);
  REQUIRE_FALSE(shape);
  CHECK(describe(shape.error()) == "shape_mismatch: assign to 'v': value has shape [3], variable has [2,2]");
  auto type = cell.apply(var_op::assign_add, tensor::filled(dtype::float64, {2, 2}, 1), false);
  REQUIRE_FALSE(type);
  CHECK(is(type.error(), af_error::dtype_mismatch));
  CHECK(cell.info().version == 3u); // failed updates change nothing
  CHECK(cell.apply(var_op::read, tensor{}, true)->value.values<float>() == std::vector<float>(4, 4.5));
}

TEST_CASE("only the op that gives a variable its first value says so", "[variable]") {
  // The data plane relies on this flag to wake the actor's waiters: a missed
  // first value leaves them waiting until their timeout.
  auto cell = make({});
  auto first = cell.apply(var_op::assign, tensor::scalar(1), false);
  REQUIRE(first);
  CHECK(first->first_value);
  CHECK_FALSE(cell.apply(var_op::assign, tensor::scalar(2), false)->first_value);
  CHECK_FALSE(cell.apply(var_op::assign_add, tensor::scalar(2), false)->first_value);
  CHECK_FALSE(cell.apply(var_op::read, tensor{}, true)->first_value);
  auto initialized = make({});
  REQUIRE(initialized.initialize(initializer::zeros(), false, "run-1"));
  CHECK_FALSE(initialized.apply(var_op::assign, tensor::scalar(1), false)->first_value);
  // a failed first assign is no first value
  auto still = make({2});
  REQUIRE_FALSE(still.apply(var_op::assign, tensor::scalar(1), false));
  CHECK_FALSE(still.info().initialized);
}

TEST_CASE("a variable remembers the run that initialized it", "[variable]") {
  auto cell = make({});
  CHECK(cell.info().run_id.empty());
  REQUIRE(cell.initialize(initializer::constant(1), false, "run-1") == 1u);
  CHECK(cell.info().run_id == "run-1");
  // another run's only-if-uninitialized leaves value and run alone
  REQUIRE(cell.initialize(initializer::constant(2), true, "run-2") == 1u);
  CHECK(cell.info().run_id == "run-1");
  REQUIRE(cell.apply(var_op::assign, tensor::scalar(5), false));
  CHECK(cell.info().run_id == "run-1"); // an assign is no initialization
  REQUIRE(cell.initialize(initializer::constant(2), false, "run-2") == 3u);
  CHECK(cell.info().run_id == "run-2");
}

TEST_CASE("optimizer slots live beside the value: kept by updates, reset by initialization",
          "[variable]") {
  auto cell = make({2});
  REQUIRE(cell.initialize(initializer::zeros(), false, ""));
  CHECK_FALSE(cell.slot("m"));
  auto wrong = cell.set_slot("m", tensor::filled(dtype::float32, {3}, 0));
  REQUIRE(wrong);
  CHECK(is(wrong, af_error::shape_mismatch));
  CHECK(contains(wrong, "slot 'm' of 'v'"));
  REQUIRE_FALSE(cell.set_slot("m", tensor::filled(dtype::float32, {2}, 0.25)));
  REQUIRE(cell.apply(var_op::assign, tensor::filled(dtype::float32, {2}, 3), false));
  REQUIRE(cell.apply(var_op::assign_add, tensor::scalar(1), false));
  REQUIRE(cell.slot("m"));
  CHECK(cell.slot("m")->values<float>() == std::vector<float>{0.25, 0.25});
  CHECK(cell.apply(var_op::read, tensor{}, true)->value.values<float>() == std::vector<float>{4, 4});
  REQUIRE(cell.initialize(initializer::zeros(), false, ""));
  CHECK_FALSE(cell.slot("m"));
}

TEST_CASE("an update applied block by block is the whole update, bit for bit, for every optimizer",
          "[variable]") {
  // Catches: apply_gradient_by (the sync round's fused release) giving other
  // values than apply_gradient of the whole gradient: a block's slots or
  // value offset wrong, the last short block dropped, a block applied twice.
  auto kind = GENERATE(as<std::string>{}, "sgd", "momentum", "adam");
  train::optimizer_spec opt;
  opt.kind = kind;
  opt.lr = 0.01;
  const int64_t n = 3 * variable_cell::apply_block + 123;
  std::vector<float> grad(static_cast<size_t>(n));
  for (size_t i = 0; i < grad.size(); ++i)
    grad[i] = std::sin(static_cast<float>(i)) * 3.0f;
  // the reference: train::apply over the whole arrays at once
  std::vector<float> value(static_cast<size_t>(n)), m(value.size(), 0.0f), v(value.size(), 0.0f);
  for (size_t i = 0; i < value.size(); ++i)
    value[i] = std::cos(static_cast<float>(i));
  variable_cell whole = make({n}), blocks = make({n});
  tensor start{dtype::float32, {n}};
  std::memcpy(start.mutable_data<float>(), value.data(), value.size() * sizeof(float));
  REQUIRE(whole.apply(var_op::assign, start, false));
  REQUIRE(blocks.apply(var_op::assign, start, false));
  size_t calls = 0;
  for (uint64_t step = 0; step < 3; ++step) {
    float* slots[2] = {m.data(), v.data()};
    train::apply(opt, value.data(), slots, grad.data(), grad.size(), step);
    REQUIRE_FALSE(whole.apply_gradient(opt, grad.data(), grad.size(), step));
    REQUIRE_FALSE(blocks.apply_gradient_by(
      opt,
      [&](size_t offset, size_t len, float* out) {
        ++calls;
        REQUIRE(len <= variable_cell::apply_block);
        std::memcpy(out, grad.data() + offset, len * sizeof(float));
      },
      grad.size(), step));
  }
  CHECK(calls == 3 * 4);
  for (auto* cell : {&whole, &blocks}) {
    auto got = cell->apply(var_op::read, tensor{}, true);
    REQUIRE(got);
    CHECK(std::memcmp(got->value.data<float>(), value.data(), n * sizeof(float)) == 0);
    auto names = train::slot_names(kind);
    for (size_t k = 0; k < names.size(); ++k) {
      auto slot = cell->slot(names[k]);
      REQUIRE(slot);
      CHECK(std::memcmp(slot->data<float>(), (k == 0 ? m : v).data(), n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("an update while a reader holds the value goes to a fresh buffer: the reader's bytes "
          "stay, and the update's bits are those of an update in place",
          "[variable]") {
  // Catches: the copy-on-write update (each block copied from the held
  // buffer just before it is updated) skipping a block or the short last
  // one, updating the held buffer itself, or reading a block already
  // updated. The reference is the same cell updated with no reader.
  auto kind = GENERATE(as<std::string>{}, "sgd", "momentum", "adam");
  train::optimizer_spec opt;
  opt.kind = kind;
  opt.lr = 0.01;
  const int64_t n = 2 * variable_cell::apply_block + 77;
  std::vector<float> grad(static_cast<size_t>(n));
  for (size_t i = 0; i < grad.size(); ++i)
    grad[i] = std::sin(static_cast<float>(i) * 0.7f) * 2.0f;
  variable_cell alone = make({n}), read = make({n});
  tensor start{dtype::float32, {n}};
  for (int64_t i = 0; i < n; ++i)
    start.mutable_data<float>()[i] = std::cos(static_cast<float>(i));
  REQUIRE(alone.apply(var_op::assign, start, false));
  REQUIRE(read.apply(var_op::assign, start, false));
  for (uint64_t step = 0; step < 4; ++step) {
    tensor held; // a reader's copy, as an answer being written holds it
    REQUIRE_FALSE(read.share_value(held, static_cast<size_t>(n)));
    std::vector<float> saved(held.data<float>(), held.data<float>() + n);
    REQUIRE_FALSE(alone.apply_gradient(opt, grad.data(), grad.size(), step));
    REQUIRE_FALSE(read.apply_gradient(opt, grad.data(), grad.size(), step));
    CHECK(std::memcmp(held.data<float>(), saved.data(), saved.size() * sizeof(float)) == 0);
  }
  auto a = alone.apply(var_op::read, tensor{}, true), b = read.apply(var_op::read, tensor{}, true);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(std::memcmp(a->value.data<float>(), b->value.data<float>(), n * sizeof(float)) == 0);
  for (const auto& name : train::slot_names(kind)) {
    auto x = alone.slot(name), y = read.slot(name);
    REQUIRE(x);
    REQUIRE(y);
    CHECK(std::memcmp(x->data<float>(), y->data<float>(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("a large variable's spread update (a sync round's) split across the cores has the "
          "bits of one pass over it, with or without a reader holding the value, and async's is "
          "not split",
          "[variable][parallel]") {
  // Catches: a split update (core/parallel_ranges, from 2 x split_floats)
  // skipping or doubling blocks at a range's edge, a range's short last
  // block, the slots or the copy on write taken per range wrongly, or the
  // fill and the block callback given another range's offsets. The
  // reference is train::apply over the whole array in one call.
  auto kind = GENERATE(as<std::string>{}, "sgd", "momentum", "adam");
  const bool held_by_reader = GENERATE(false, true);
  CAPTURE(kind, held_by_reader);
  train::optimizer_spec opt;
  opt.kind = kind;
  opt.lr = 0.01;
  const size_t n = 2 * variable_cell::split_floats + 3 * variable_cell::apply_block + 5;
  std::vector<float> grad(n), ref(n);
  for (size_t i = 0; i < n; ++i) {
    grad[i] = std::sin(static_cast<float>(i) * 0.3f);
    ref[i] = std::cos(static_cast<float>(i) * 0.1f);
  }
  variable_cell cell = make({static_cast<int64_t>(n)});
  tensor start{dtype::float32, {static_cast<int64_t>(n)}};
  std::memcpy(start.mutable_data<float>(), ref.data(), n * sizeof(float));
  REQUIRE(cell.apply(var_op::assign, start, false));
  auto names = train::slot_names(kind);
  std::vector<std::vector<float>> slots;
  for (size_t k = 0; k < names.size(); ++k)
    slots.emplace_back(n, train::slot_initial_value(opt, k));
  std::vector<float*> slot_ptrs;
  for (auto& s : slots)
    slot_ptrs.push_back(s.data());
  std::vector<float> copied(n, -1.0f); // what the block callback saw
  const size_t splits_before = parallel_splits();
  for (uint64_t step = 0; step < 3; ++step) {
    tensor held;
    if (held_by_reader)
      REQUIRE_FALSE(cell.share_value(held, n));
    REQUIRE_FALSE(cell.apply_gradient_by(
      opt, [&](size_t offset, size_t len, float* out) {
        std::memcpy(out, grad.data() + offset, len * sizeof(float));
      },
      n, step,
      [&](size_t offset, size_t len, const float* values) {
        std::memcpy(copied.data() + offset, values, len * sizeof(float));
      },
      true));
    train::apply(opt, ref.data(), slot_ptrs.data(), grad.data(), n, step);
  }
  auto after = cell.apply(var_op::read, tensor{}, true);
  REQUIRE(after);
  CHECK(std::memcmp(after->value.data<float>(), ref.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(copied.data(), ref.data(), n * sizeof(float)) == 0);
  for (size_t k = 0; k < names.size(); ++k) {
    auto s = cell.slot(names[k]);
    REQUIRE(s);
    CHECK(std::memcmp(s->data<float>(), slots[k].data(), n * sizeof(float)) == 0);
  }
  if (parallel_threads() > 1)
    CHECK(parallel_splits() == splits_before + 3); // each update was split
  // Not spread (async's apply_gradient, while the workers compute): one pass.
  const size_t splits_spread = parallel_splits();
  REQUIRE_FALSE(cell.apply_gradient(opt, grad.data(), n, 3));
  CHECK(parallel_splits() == splits_spread);
}

TEST_CASE("shapes that overflow or cannot be allocated are errors naming the variable, not crashes",
          "[variable][errors]") {
  auto negative = value_bytes(spec_of({2, -1}));
  REQUIRE_FALSE(negative);
  CHECK(is(negative.error(), af_error::invalid_argument));
  CHECK(contains(negative.error(), "variable 'v': shape [2,-1] has a negative dimension"));
  // 2^62 x 8 elements: the count wraps around 64 bits
  auto count = value_bytes(spec_of({int64_t{1} << 62, 8}));
  REQUIRE_FALSE(count);
  CHECK(is(count.error(), af_error::invalid_argument));
  CHECK(contains(count.error(), "more elements than fit in 64 bits"));
  // 2^61 float64s: the count fits, the byte size does not
  auto bytes = value_bytes(spec_of({int64_t{1} << 61}, dtype::float64));
  REQUIRE_FALSE(bytes);
  CHECK(contains(bytes.error(), "overflows the byte size"));
  CHECK(value_bytes(spec_of({0, int64_t{1} << 62, int64_t{1} << 62})) == size_t{0});
  CHECK(value_bytes(spec_of({3, 4}, dtype::float64)) == size_t{96});

  variable_cell wraps{spec_of({int64_t{1} << 62, 8})};
  auto init = wraps.initialize(initializer::ones(), false, "");
  REQUIRE_FALSE(init);
  CHECK(is(init.error(), af_error::invalid_argument));
  // 2^50 bytes (1 PiB) is more than any address space here: the allocation fails
  variable_cell huge{spec_of({int64_t{1} << 48})};
  auto alloc = huge.initialize(initializer::ones(), false, "");
  REQUIRE_FALSE(alloc);
  CHECK(is(alloc.error(), af_error::resource_exhausted));
  CHECK(contains(alloc.error(), "'v'"));
  CHECK_FALSE(huge.info().initialized);
}

// -- the actor -----------------------------------------------------------------------

namespace {

/// An actor system with one variable actor of a scalar "v" (or `spec`).
struct variable_fixture {
  system_config cfg;
  caf::actor_system sys{cfg};
  std::shared_ptr<variable_cell> cell;
  variable_cell_actor var;
  caf::scoped_actor self{sys, true};

  explicit variable_fixture(variable_spec spec = spec_of({})) {
    cell = std::make_shared<variable_cell>(std::move(spec));
    var = sys.spawn(variable_impl, cell);
  }

  ~variable_fixture() {
    caf::anon_send_exit(var, caf::exit_reason::user_shutdown);
  }

  uint32_t waiters() { return info_of(self, var).waiters; }

  uint64_t init(const std::string& run_id) {
    uint64_t version = 0;
    self->request(var, 5s, init_atom::value, initializer::constant(7), false, run_id)
      .receive([&](uint64_t v) { version = v; }, [&](caf::error& e) { FAIL(describe(e)); });
    return version;
  }
};

} // namespace

TEST_CASE("a wait_init waiter is released by an initialize of its own run, not another run's",
          "[variable][actor]") {
  variable_fixture f;
  caf::scoped_actor waiter{f.sys, true};
  auto pending = waiter->request(f.var, 20s, wait_init_atom::value, std::string{"run-2"}, uint32_t{60000});
  REQUIRE(eventually([&] { return f.waiters() == 1; }));
  REQUIRE(f.init("run-1") == 1u);
  auto info = info_of(f.self, f.var);
  CHECK(info.initialized);
  CHECK(info.run_id == "run-1");
  CHECK(info.waiters == 1); // a value left by another run does not release it
  REQUIRE(f.init("run-2") == 2u);
  uint64_t released = 0;
  pending.receive([&](uint64_t v) { released = v; }, [&](caf::error& e) { FAIL(describe(e)); });
  CHECK(released == 2u);
  CHECK(f.waiters() == 0);
  // initialized by run-2 now: its waiters (and run-less ones) are answered at once
  waiter->request(f.var, 5s, wait_init_atom::value, std::string{"run-2"}, uint32_t{1})
    .receive([&](uint64_t v) { CHECK(v == 2u); }, [&](caf::error& e) { FAIL(describe(e)); });
  waiter->request(f.var, 5s, wait_init_atom::value, std::string{}, uint32_t{1})
    .receive([&](uint64_t v) { CHECK(v == 2u); }, [&](caf::error& e) { FAIL(describe(e)); });
}

TEST_CASE("a run-less waiter is released by any first value: an assign, or one the data plane gave",
          "[variable][actor]") {
  SECTION("an assign through the actor") {
    variable_fixture f;
    caf::scoped_actor waiter{f.sys, true};
    auto pending = waiter->request(f.var, 20s, wait_init_atom::value, std::string{}, uint32_t{60000});
    REQUIRE(eventually([&] { return f.waiters() == 1; }));
    f.self->request(f.var, 5s, var_op_atom::value, var_op::assign, tensor::scalar(3), false)
      .receive([](tensor&, uint64_t) {}, [&](caf::error& e) { FAIL(describe(e)); });
    pending.receive([&](uint64_t v) { CHECK(v == 1u); }, [&](caf::error& e) { FAIL(describe(e)); });
    CHECK(f.waiters() == 0);
  }
  SECTION("a first value applied to the cell, announced by released") {
    variable_fixture f;
    caf::scoped_actor waiter{f.sys, true};
    auto pending = waiter->request(f.var, 20s, wait_init_atom::value, std::string{}, uint32_t{60000});
    REQUIRE(eventually([&] { return f.waiters() == 1; }));
    auto r = f.cell->apply(var_op::assign, tensor::scalar(3), false); // what a data-plane thread does
    REQUIRE(r);
    REQUIRE(r->first_value);
    caf::anon_send(f.var, released_atom::value);
    pending.receive([&](uint64_t v) { CHECK(v == 1u); }, [&](caf::error& e) { FAIL(describe(e)); });
    CHECK(f.waiters() == 0);
  }
}

TEST_CASE("a wait_init waiter is dropped after its timeout with an error naming the variable",
          "[variable][actor]") {
  variable_fixture f{spec_of({2}, dtype::float32, "lonely")};
  caf::scoped_actor waiter{f.sys, true};
  // The request itself would wait 20 s: the error must come from the variable.
  auto pending = waiter->request(f.var, 20s, wait_init_atom::value, std::string{"run-9"}, uint32_t{300});
  REQUIRE(eventually([&] { return f.waiters() == 1; }));
  caf::error err;
  auto start = std::chrono::steady_clock::now();
  pending.receive([](uint64_t) { FAIL("released without a value"); }, [&](caf::error& e) { err = e; });
  auto waited = std::chrono::steady_clock::now() - start;
  REQUIRE(err);
  CHECK(is(err, af_error::timeout));
  CHECK(contains(err, "variable 'lonely'"));
  CHECK(contains(err, "300 ms"));
  CHECK(contains(err, "run 'run-9'"));
  CHECK(waited < 10s);
  CHECK(f.waiters() == 0);
  // a timeout of 0 asks "now or never"
  waiter->request(f.var, 5s, wait_init_atom::value, std::string{}, uint32_t{0})
    .receive([](uint64_t) { FAIL("released without a value"); },
             [&](caf::error& e) { CHECK(is(e, af_error::timeout)); });
}

TEST_CASE("a wait_init waiter whose requester dies is dropped", "[variable][actor]") {
  variable_fixture f;
  auto var = f.var;
  auto requester = f.sys.spawn([var](caf::event_based_actor* self) -> caf::behavior {
    self->request(var, caf::infinite, wait_init_atom::value, std::string{}, uint32_t{600000})
      .then([](uint64_t) {}, [](caf::error&) {});
    return {[](int32_t) {}};
  });
  REQUIRE(eventually([&] { return f.waiters() == 1; }));
  caf::anon_send_exit(requester, caf::exit_reason::kill);
  // Without the monitor it would stay parked for its 10 minutes.
  CHECK(eventually([&] { return f.waiters() == 0; }));
}

TEST_CASE("a node forgets a variable whose actor ended and serves on", "[variable][node]") {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys, true};
  auto dir = std::make_shared<variable_directory>();
  auto node = sys.spawn(node_impl, std::string{"ps"}, int32_t{0}, node_options{}, dir, uint16_t{0},
                        aggregator_services{}, node_clock{});
  auto get_var = [&](variable_spec spec) {
    caf::expected<variable_actor> out{variable_actor{}};
    self->request(node, 5s, get_var_atom::value, std::move(spec))
      .receive([&](variable_actor& a) { out = a; }, [&](caf::error& e) { out = e; });
    return out;
  };
  auto lookup = [&](const std::string& name) {
    caf::expected<variable_actor> out{variable_actor{}};
    self->request(node, 5s, lookup_atom::value, name)
      .receive([&](variable_actor& a) { out = a; }, [&](caf::error& e) { out = e; });
    return out;
  };
  auto v = get_var(spec_of({2}));
  REQUIRE(v);
  REQUIRE(dir->get("v").cell);
  caf::anon_send_exit(*v, caf::exit_reason::kill);
  CHECK(eventually([&] {
    auto l = lookup("v");
    return !l && is(l.error(), af_error::not_found);
  }));
  CHECK_FALSE(dir->get("v").cell); // the data plane no longer serves it by name
  // the node lives on and makes a new one
  node_info info;
  self->request(node, 5s, caf::ping_atom::value)
    .receive([&](node_info& i) { info = std::move(i); }, [&](caf::error& e) { FAIL(describe(e)); });
  CHECK(info.job == "ps");
  auto again = get_var(spec_of({2}));
  REQUIRE(again);
  CHECK(*again != *v);
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
}

TEST_CASE("a node refuses a variable whose size overflows before allocating it", "[variable][node][errors]") {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys, true};
  auto node = sys.spawn(node_impl, std::string{"ps"}, int32_t{0}, node_options{},
                        std::make_shared<variable_directory>(), uint16_t{0}, aggregator_services{},
                        node_clock{});
  for (auto shape : {shape_type{int64_t{1} << 62, 8}, shape_type{3, -1}}) {
    caf::error err;
    self->request(node, 5s, get_var_atom::value, spec_of(shape, dtype::float32, "huge"))
      .receive([&](variable_actor&) { FAIL("a variable of shape " + shape_string(shape)); },
               [&](caf::error& e) { err = e; });
    CHECK(is(err, af_error::invalid_argument));
    CHECK(contains(err, "variable 'huge'"));
  }
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
}

TEST_CASE("a node tells its incarnation and its clock in every ping", "[node]") {
  system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys, true};
  auto ping = [&](const node_actor& n) {
    node_info info;
    self->request(n, 5s, caf::ping_atom::value)
      .receive([&](node_info& i) { info = std::move(i); }, [&](caf::error& e) { FAIL(describe(e)); });
    return info;
  };
  auto spawn = [&] {
    return sys.spawn(node_impl, std::string{"ps"}, int32_t{0}, node_options{},
                     std::make_shared<variable_directory>(), uint16_t{0}, aggregator_services{},
                     node_clock{});
  };
  auto a = spawn(), b = spawn();
  auto a1 = ping(a), a2 = ping(a), b1 = ping(b);
  CHECK(a1.incarnation != 0);
  CHECK(a1.incarnation == a2.incarnation);
  CHECK(a1.incarnation != b1.incarnation); // a restart looks different
  CHECK(a1.clock_ns > 0);
  CHECK(a2.clock_ns > a1.clock_ns);
  // every GPU the runtime reports is either a device or an error saying why
  CHECK(a1.devices.size() + a1.device_errors.size() == 1 + static_cast<size_t>(kernels::cuda_device_count()));
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(b, caf::exit_reason::user_shutdown);
}
