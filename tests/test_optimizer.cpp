// Optimizers on plain buffers (train/optimizer.hpp) against the kernels'
// apply_* ops, schedules, flat packing, and one-process training.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/kernels.hpp"
#include "train/local.hpp"
#include "train/elementwise.hpp"
#include "train/optimizer.hpp"
#include "train/optimizer_into.hpp"

using namespace af;

namespace {

tensor ramp(size_t n, float scale, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = offset + scale * static_cast<float>(i % 7) - 0.3f * static_cast<float>(i % 3);
  return tensor::from_values<float>({static_cast<int64_t>(n)}, v);
}

} // namespace

TEST_CASE("optimizers on buffers match the kernels' apply ops step by step", "[optimizer]") {
  // Catches: a wrong formula (momentum order, Adam's bias correction at step
  // t vs t + 1, epsilon placement) in either copy of the update.
  auto backend = kernels::make_cpu_backend();
  for (std::string kind : {"sgd", "momentum", "adam"}) {
    CAPTURE(kind);
    train::optimizer_spec opt;
    opt.kind = kind;
    opt.lr = 0.05;
    tensor var = ramp(33, 0.1f, -0.2f);
    tensor ref = var;
    ref.mutable_bytes(); // own copy
    std::vector<float> s0(33, 0), s1(33, 0);
    tensor k0 = tensor::filled(dtype::float32, {33}, 0), k1 = k0;
    k1.mutable_bytes();
    for (uint64_t step = 0; step < 5; ++step) {
      tensor grad = ramp(33, 0.03f * static_cast<float>(step + 1), 0.01f);
      float* slots[2] = {s0.data(), s1.data()};
      train::apply(opt, var.mutable_data<float>(), slots, grad.data<float>(), 33, step);
      kernels::status st;
      if (kind == "sgd")
        st = backend->apply_sgd(ref, grad, opt.lr);
      else if (kind == "momentum")
        st = backend->apply_momentum(ref, k0, grad, opt.lr, opt.momentum);
      else
        st = backend->apply_adam(ref, k0, k1, grad, opt.lr, opt.beta1, opt.beta2, opt.epsilon,
                                 static_cast<int64_t>(step + 1));
      REQUIRE(st.ok());
    }
    for (size_t i = 0; i < 33; ++i)
      REQUIRE(var.data<float>()[i] == Approx(ref.data<float>()[i]).epsilon(1e-5).margin(1e-5));
    // and it moved: an update that does nothing would pass the comparison above
    // only if the kernel did nothing too
    REQUIRE(var.data<float>()[3] != Approx(ramp(33, 0.1f, -0.2f).data<float>()[3]));
  }
}

TEST_CASE("adagrad follows TF's ApplyAdagrad, its accumulator starting at initial_accumulator",
          "[optimizer]") {
  // Catches: a wrong Adagrad formula (the square root left out, the
  // accumulator updated after the step, or started at 0 instead of TF's
  // 0.1); the sparse path runs this same formula, so only this checks it.
  train::optimizer_spec opt;
  opt.kind = "adagrad";
  opt.lr = 0.5;
  REQUIRE(train::validate(opt).empty());
  REQUIRE(train::slot_names("adagrad") == std::vector<std::string>{"accumulator"});
  REQUIRE(train::slot_initial_value(opt, 0) == 0.1f);
  std::vector<float> var{1, -2, 0.5f}, acc(3, train::slot_initial_value(opt, 0));
  std::vector<double> want_var{1, -2, 0.5}, want_acc(3, 0.1);
  for (uint64_t step = 0; step < 3; ++step) {
    std::vector<float> grad{0.3f * static_cast<float>(step + 1), -1, 0};
    float* slots[2] = {acc.data(), nullptr};
    train::apply(opt, var.data(), slots, grad.data(), 3, step);
    for (size_t i = 0; i < 3; ++i) {
      want_acc[i] += static_cast<double>(grad[i]) * grad[i];
      want_var[i] -= 0.5 * grad[i] / std::sqrt(want_acc[i]);
    }
  }
  for (size_t i = 0; i < 3; ++i) {
    CHECK(acc[i] == Approx(want_acc[i]).epsilon(1e-6));
    CHECK(var[i] == Approx(want_var[i]).epsilon(1e-6));
  }
  CHECK(var[2] == 0.5f); // a zero gradient moves nothing
  opt.initial_accumulator = 0;
  CHECK(train::validate(opt).find("initial_accumulator") != std::string::npos);
}

TEST_CASE("apply_rows gives each named row apply()'s update and leaves the others bit for bit",
          "[optimizer][sparse]") {
  // Catches: a row offset that ignores the row size, slots indexed by the
  // gradient's row instead of the variable's, or other rows touched.
  for (std::string kind : {"sgd", "momentum", "adagrad", "adam"}) {
    CAPTURE(kind);
    train::optimizer_spec opt;
    opt.kind = kind;
    std::vector<float> var = ramp(8, 0.1f, -0.2f).values<float>(); // 4 rows of 2
    std::vector<float> s0(8, train::slot_initial_value(opt, 0)), s1(8, 0.5f);
    auto var_ref = var, s0_ref = s0, s1_ref = s1;
    std::vector<float> grads{1, 2, -3, 4}; // rows 2 and 0
    std::vector<int64_t> rows{2, 0};
    float* slots[2] = {s0.data(), s1.data()};
    train::apply_rows(opt, var.data(), slots, 2, rows.data(), grads.data(), 2, 7);
    for (size_t j = 0; j < 2; ++j) {
      size_t off = static_cast<size_t>(rows[j]) * 2;
      float* ref_slots[2] = {s0_ref.data() + off, s1_ref.data() + off};
      train::apply(opt, var_ref.data() + off, ref_slots, grads.data() + j * 2, 2, 7);
    }
    CHECK(var == var_ref);
    CHECK(s0 == s0_ref);
    CHECK(s1 == s1_ref);
    auto untouched = ramp(8, 0.1f, -0.2f).values<float>();
    for (size_t i : {2u, 3u, 6u, 7u})
      CHECK(var[i] == untouched[i]);
  }
}

TEST_CASE("learning-rate schedules", "[optimizer]") {
  train::optimizer_spec opt;
  opt.lr = 1.0;
  REQUIRE(train::learning_rate(opt, 12345) == 1.0);
  opt.schedule.kind = "step";
  opt.schedule.decay_steps = 10;
  opt.schedule.decay_rate = 0.5;
  REQUIRE(train::learning_rate(opt, 9) == 1.0);
  REQUIRE(train::learning_rate(opt, 10) == 0.5);
  REQUIRE(train::learning_rate(opt, 25) == 0.25);
  opt.schedule.kind = "cosine";
  opt.schedule.total_steps = 100;
  opt.schedule.min_lr = 0.1;
  REQUIRE(train::learning_rate(opt, 0) == Approx(1.0));
  REQUIRE(train::learning_rate(opt, 50) == Approx(0.55));
  REQUIRE(train::learning_rate(opt, 100) == Approx(0.1));
  REQUIRE(train::learning_rate(opt, 1000) == Approx(0.1));
  opt.schedule.kind = "linear";
  REQUIRE_THAT(train::validate(opt), Catch::Contains("linear"));
  opt.schedule.kind = "constant";
  opt.kind = "rmsprop"; // (adagrad was the unknown one until issue 25 added it)
  REQUIRE_THAT(train::validate(opt), Catch::Contains("rmsprop"));
  opt.kind = "sgd";
  opt.lr = -1;
  REQUIRE_THAT(train::validate(opt), Catch::Contains("-1"));
}

TEST_CASE("first_non_finite finds NaN and Inf, and nothing in finite data", "[optimizer]") {
  std::vector<float> v(1000, 1e30f); // large but finite: a sum would overflow
  REQUIRE(train::first_non_finite(v.data(), v.size()) == v.size());
  v[617] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE(train::first_non_finite(v.data(), v.size()) == 617);
  v[617] = 1;
  v[3] = -std::numeric_limits<float>::infinity();
  REQUIRE(train::first_non_finite(v.data(), v.size()) == 3);
  // the largest finite values and the smallest denormals are finite; an
  // infinity in the tail (past any vector width) is found
  v.assign(1003, std::numeric_limits<float>::max());
  v[1] = -std::numeric_limits<float>::max();
  v[2] = std::numeric_limits<float>::denorm_min();
  REQUIRE(train::first_non_finite(v.data(), v.size()) == v.size());
  v[1002] = std::numeric_limits<float>::infinity();
  REQUIRE(train::first_non_finite(v.data(), v.size()) == 1002);
  // Every position of short arrays at every start alignment: the version
  // the CPU runs (AVX2 or SSE2, chosen at load time) has a vector body and a
  // tail, and a NaN at their seam or in a 1-float tail must be found.
  std::vector<float> w(80, 0.5f);
  for (size_t start = 0; start < 8; ++start)
    for (size_t n = 1; n + start <= 72; ++n)
      for (size_t bad = 0; bad < n; bad += (n > 20 ? 7 : 1)) {
        w[start + bad] = std::numeric_limits<float>::quiet_NaN();
        CHECK(train::first_non_finite(w.data() + start, n) == bad);
        w[start + bad] = 0.5f;
      }
}

namespace {

/// One float at a time, out of the compiler's reach to vectorize or fuse
/// (volatile), the formulas of train/optimizer.cpp's apply_into.
void reference_update(const train::step_constants& c, std::vector<float>& var,
                      std::vector<std::vector<float>>& slots, const std::vector<float>& grad) {
  using m = train::step_constants::method;
  for (size_t i = 0; i < var.size(); ++i) {
    volatile float g = grad[i], lr = c.lr;
    switch (c.kind) {
      case m::sgd: {
        volatile float step = lr * g;
        var[i] = var[i] - step;
        break;
      }
      case m::momentum: {
        volatile float acc = c.momentum * slots[0][i];
        acc = acc + g;
        slots[0][i] = acc;
        volatile float step = lr * acc;
        var[i] = var[i] - step;
        break;
      }
      case m::adagrad: {
        volatile float sq = g * g;
        volatile float acc = slots[0][i] + sq;
        slots[0][i] = acc;
        volatile float num = lr * g;
        var[i] = var[i] - num / std::sqrt(static_cast<float>(acc));
        break;
      }
      case m::adam: {
        volatile float m1 = c.beta1 * slots[0][i], m2 = (1 - c.beta1) * g;
        volatile float mm = m1 + m2;
        volatile float v1 = c.beta2 * slots[1][i], v2 = (1 - c.beta2) * g;
        v2 = v2 * g;
        volatile float vv = v1 + v2;
        slots[0][i] = mm;
        slots[1][i] = vv;
        volatile float num = c.adam_lr * mm;
        volatile float den = std::sqrt(static_cast<float>(vv)) + c.epsilon;
        var[i] = var[i] - num / den;
        break;
      }
    }
  }
}

} // namespace

TEST_CASE("the optimizers' and the round's mean's vector loops give the bits of their formulas "
          "computed one float at a time, on whichever version the CPU runs",
          "[optimizer]") {
  // Catches: a vector version (AVX2, core/simd_clones.hpp) built with fused
  // multiply-add (a * b + c rounded once: x86-64-v3 and later), which would
  // make a job's parameters depend on the ps's CPU; a tail or seam bug in
  // either version. Sizes past every vector width, odd tails.
  auto kind = GENERATE(as<std::string>{}, "sgd", "momentum", "adagrad", "adam");
  CAPTURE(kind);
  train::optimizer_spec opt;
  opt.kind = kind;
  opt.lr = 0.037;
  const size_t n = 1037;
  std::vector<float> var(n), grad(n);
  for (size_t i = 0; i < n; ++i) {
    var[i] = std::sin(static_cast<float>(i) * 0.37f) * 3.1f;
    grad[i] = std::cos(static_cast<float>(i) * 0.91f) * 1.7f + 0.013f;
  }
  auto names = train::slot_names(kind);
  std::vector<std::vector<float>> slots, ref_slots;
  for (size_t k = 0; k < names.size(); ++k)
    slots.emplace_back(n, train::slot_initial_value(opt, k));
  ref_slots = slots;
  std::vector<float> ref = var;
  std::vector<float*> ptrs;
  for (auto& s : slots)
    ptrs.push_back(s.data());
  for (uint64_t step = 0; step < 3; ++step) {
    auto c = train::constants_at(opt, step);
    train::apply(c, var.data(), ptrs.data(), grad.data(), n);
    reference_update(c, ref, ref_slots, grad);
  }
  CHECK(std::memcmp(var.data(), ref.data(), n * sizeof(float)) == 0);
  for (size_t k = 0; k < names.size(); ++k)
    CHECK(std::memcmp(slots[k].data(), ref_slots[k].data(), n * sizeof(float)) == 0);
  // The round's mean: (a + b) * scale and a + b, in place too.
  std::vector<float> a = var, b = grad, out(n), want(n);
  train::add_scaled_into(a.data(), b.data(), 1.0f / 3, out.data(), n);
  for (size_t i = 0; i < n; ++i) {
    volatile float sum = a[i] + b[i];
    want[i] = sum * (1.0f / 3);
  }
  CHECK(std::memcmp(out.data(), want.data(), n * sizeof(float)) == 0);
  train::add_into(a.data(), b.data(), a.data(), n);
  for (size_t i = 0; i < n; ++i) {
    volatile float sum = var[i] + grad[i];
    want[i] = sum;
  }
  CHECK(std::memcmp(a.data(), want.data(), n * sizeof(float)) == 0);
}

TEST_CASE("flatten and unflatten round trip, one part is not copied", "[optimizer]") {
  auto a = ramp(6, 1, 0).reshaped({2, 3});
  auto b = ramp(4, 2, 1);
  auto flat = train::flatten({a, b});
  REQUIRE(flat.shape() == shape_type{10});
  auto back = train::unflatten(flat, {{2, 3}, {4}});
  REQUIRE(back);
  REQUIRE((*back)[0] == a);
  REQUIRE((*back)[1] == b);
  auto single = train::flatten({a});
  REQUIRE(single.shares_buffer_with(a));
  auto again = train::unflatten(single, {{2, 3}});
  REQUIRE((*again)[0].shares_buffer_with(a));
  REQUIRE_FALSE(train::unflatten(flat, {{2, 3}}));
}

TEST_CASE("a replica's state updates with its slots", "[optimizer]") {
  train::optimizer_spec opt;
  opt.kind = "momentum";
  opt.lr = 0.5;
  opt.momentum = 0.5;
  auto st = train::replica_state::make({tensor::filled(dtype::float32, {2}, 1)}, opt);
  REQUIRE(st);
  REQUIRE(st->slots[0].size() == 1);
  auto g = tensor::filled(dtype::float32, {2}, 1);
  REQUIRE(st->apply(opt, {g}, 0));
  REQUIRE(st->values[0].at(0) == Approx(0.5));  // accum 1
  REQUIRE(st->apply(opt, {g}, 1));
  REQUIRE(st->values[0].at(0) == Approx(-0.25)); // accum 1.5
  REQUIRE_FALSE(st->apply(opt, {tensor::filled(dtype::float32, {3}, 1)}, 2));
}

TEST_CASE("apply_into writes apply's bits out of place and in place", "[optimizer]") {
  // Catches: an update out of place (the pipelined round's) that differs
  // from the same update in place (apply(), the store-and-forward round's):
  // a formula that reads a value it has already written (the new
  // accumulator where the old one belongs) gives other bits out of place,
  // and a pipelined round would no longer give the store-and-forward
  // round's bits.
  const size_t n = 1001;
  for (std::string kind : {"sgd", "momentum", "adagrad", "adam"}) {
    CAPTURE(kind);
    train::optimizer_spec opt;
    opt.kind = kind;
    opt.lr = 0.037;
    const size_t nslots = train::slot_names(kind).size();
    auto values = [&](float scale, float offset) {
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i)
        v[i] = offset + scale * std::sin(0.37f * static_cast<float>(i)) + 1e-7f * static_cast<float>(i);
      return v;
    };
    // apply()'s reference in place; apply_into from the old buffers into
    // new ones, and in place on a third copy.
    std::vector<float> ref = values(0.7f, 0.1f), into_old = ref, in_place = ref;
    std::vector<std::vector<float>> ref_slots, old_slots, place_slots;
    for (size_t k = 0; k < nslots; ++k) {
      ref_slots.push_back(values(0.2f, 0.5f + static_cast<float>(k))); // positive: adagrad's sqrt
      old_slots.push_back(ref_slots.back());
      place_slots.push_back(ref_slots.back());
    }
    for (uint64_t step = 0; step < 4; ++step) {
      CAPTURE(step);
      auto grad = values(0.3f + 0.1f * static_cast<float>(step), -0.05f);
      auto c = train::constants_at(opt, step);
      float* rs[2] = {nullptr, nullptr};
      float* ps[2] = {nullptr, nullptr};
      float* ns[2] = {nullptr, nullptr};
      const float* os[2] = {nullptr, nullptr};
      std::vector<std::vector<float>> new_slots(nslots, std::vector<float>(n, -1.0f));
      for (size_t k = 0; k < nslots; ++k) {
        rs[k] = ref_slots[k].data();
        ps[k] = place_slots[k].data();
        ns[k] = new_slots[k].data();
        os[k] = old_slots[k].data();
      }
      std::vector<float> out(n, -1.0f);
      train::apply(opt, ref.data(), rs, grad.data(), n, step);
      train::apply_into(c, into_old.data(), os, out.data(), ns, grad.data(), n);
      const float* pos[2] = {ps[0], ps[1]};
      train::apply_into(c, in_place.data(), pos, in_place.data(), ps, grad.data(), n);
      CHECK(std::memcmp(out.data(), ref.data(), n * sizeof(float)) == 0);
      CHECK(std::memcmp(in_place.data(), ref.data(), n * sizeof(float)) == 0);
      for (size_t k = 0; k < nslots; ++k) {
        CHECK(std::memcmp(new_slots[k].data(), ref_slots[k].data(), n * sizeof(float)) == 0);
        CHECK(std::memcmp(place_slots[k].data(), ref_slots[k].data(), n * sizeof(float)) == 0);
      }
      into_old = out;
      old_slots = new_slots;
    }
  }
}
