#include "kernels/kernels.hpp"

#include <algorithm>
#include <random>

namespace af::kernels {

namespace {

template <class T>
T apply(binary_op op, T x, T y) {
  switch (op) {
    case binary_op::add: return x + y;
    case binary_op::sub: return x - y;
    case binary_op::mul: return x * y;
    case binary_op::div: return y == T{0} && std::is_integral<T>::value ? T{0} : x / y;
  }
  return T{};
}

// The hot cases get their own loops so that the compiler vectorizes them.
template <class T, class F>
void same_shape(const T* a, const T* b, T* out, size_t n, F f) {
  for (size_t i = 0; i < n; ++i)
    out[i] = f(a[i], b[i]);
}

template <class T>
void run_binary(binary_op op, const T* a, const T* b, T* out, size_t n) {
  switch (op) {
    case binary_op::add: same_shape(a, b, out, n, [](T x, T y) { return x + y; }); break;
    case binary_op::sub: same_shape(a, b, out, n, [](T x, T y) { return x - y; }); break;
    case binary_op::mul: same_shape(a, b, out, n, [](T x, T y) { return x * y; }); break;
    case binary_op::div: same_shape(a, b, out, n, [op](T x, T y) { return apply(op, x, y); }); break;
  }
}

/// Strides of `in` seen through `out_shape` (0 along broadcast dimensions).
std::vector<size_t> broadcast_strides(const shape_type& in, const shape_type& out_shape) {
  std::vector<size_t> strides(out_shape.size(), 0);
  size_t stride = 1;
  for (size_t k = 0; k < in.size(); ++k) {
    size_t din = in.size() - 1 - k;
    size_t dout = out_shape.size() - 1 - k;
    strides[dout] = in[din] == 1 ? 0 : stride;
    stride *= static_cast<size_t>(in[din]);
  }
  return strides;
}

template <class T>
void run_broadcast(binary_op op, const tensor& a, const tensor& b, T* out, const shape_type& shape) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  if (a.num_elements() == 1 || b.num_elements() == 1) {
    size_t n = static_cast<size_t>(num_elements(shape));
    if (b.num_elements() == 1) {
      T y = pb[0];
      for (size_t i = 0; i < n; ++i)
        out[i] = apply(op, pa[a.num_elements() == 1 ? 0 : i], y);
    } else {
      T x = pa[0];
      for (size_t i = 0; i < n; ++i)
        out[i] = apply(op, x, pb[i]);
    }
    return;
  }
  auto sa = broadcast_strides(a.shape(), shape);
  auto sb = broadcast_strides(b.shape(), shape);
  size_t rank = shape.size();
  std::vector<int64_t> idx(rank, 0);
  size_t n = static_cast<size_t>(num_elements(shape));
  size_t ia = 0, ib = 0;
  for (size_t i = 0; i < n; ++i) {
    out[i] = apply(op, pa[ia], pb[ib]);
    // odometer increment, keeping the input offsets in step
    for (size_t d = rank; d-- > 0;) {
      if (++idx[d] < shape[d]) {
        ia += sa[d];
        ib += sb[d];
        break;
      }
      ia -= sa[d] * static_cast<size_t>(shape[d] - 1);
      ib -= sb[d] * static_cast<size_t>(shape[d] - 1);
      idx[d] = 0;
    }
  }
}

template <class T>
void dispatch(binary_op op, const tensor& a, const tensor& b, T* out, const shape_type& shape) {
  if (a.shape() == b.shape())
    run_binary(op, a.data<T>(), b.data<T>(), out, a.num_elements());
  else
    run_broadcast(op, a, b, out, shape);
}

class cpu_backend : public backend {
public:
  std::string name() const override {
    return "cpu";
  }

  status binary(binary_op op, const tensor& a, const tensor& b, tensor& out) override {
    if (auto err = check(op, a, b); !err.ok())
      return err;
    auto shape = *broadcast_shapes(a.shape(), b.shape());
    tensor result{a.type(), shape};
    compute(op, a, b, result, shape);
    out = std::move(result);
    return status::success();
  }

  status binary_inplace(binary_op op, tensor& a, const tensor& b) override {
    if (auto err = check(op, a, b); !err.ok())
      return err;
    auto shape = *broadcast_shapes(a.shape(), b.shape());
    if (shape != a.shape())
      return status::failure("cannot update a tensor of shape " + shape_string(a.shape())
                             + " in place with one of shape " + shape_string(b.shape()));
    if (a.use_count() > 1) {
      // Someone (a reader's snapshot) still holds the buffer: never write under it.
      tensor result{a.type(), shape};
      compute(op, a, b, result, shape);
      a = std::move(result);
    } else {
      // Element i of the result depends on a[i] and b only, so aliasing is safe.
      compute(op, a, b, a, shape);
    }
    return status::success();
  }

private:
  static status check(binary_op op, const tensor& a, const tensor& b) {
    if (a.empty() || b.empty())
      return status::failure(std::string{to_string(op)} + ": an operand has no value");
    if (a.type() != b.type())
      return status::failure(std::string{to_string(op)} + ": dtypes differ: "
                             + dtype_name(a.type()) + " vs " + dtype_name(b.type()));
    if (!broadcast_shapes(a.shape(), b.shape()))
      return status::failure(std::string{to_string(op)} + ": shapes " + shape_string(a.shape())
                             + " and " + shape_string(b.shape()) + " do not broadcast");
    return status::success();
  }

  static void compute(binary_op op, const tensor& a, const tensor& b, tensor& out,
                      const shape_type& shape) {
    switch (a.type()) {
      case dtype::float32: dispatch(op, a, b, out.mutable_data<float>(), shape); break;
      case dtype::float64: dispatch(op, a, b, out.mutable_data<double>(), shape); break;
      case dtype::int32: dispatch(op, a, b, out.mutable_data<int32_t>(), shape); break;
      case dtype::int64: dispatch(op, a, b, out.mutable_data<int64_t>(), shape); break;
    }
  }
};

template <class Dist>
status fill_with(tensor& t, Dist dist, uint64_t seed) {
  std::mt19937_64 gen{seed};
  switch (t.type()) {
    case dtype::float32: {
      auto* p = t.mutable_data<float>();
      for (size_t i = 0; i < t.num_elements(); ++i)
        p[i] = static_cast<float>(dist(gen));
      return status::success();
    }
    case dtype::float64: {
      auto* p = t.mutable_data<double>();
      for (size_t i = 0; i < t.num_elements(); ++i)
        p[i] = dist(gen);
      return status::success();
    }
    default:
      return status::failure(std::string{"random initializers need a float dtype, not "}
                             + dtype_name(t.type()));
  }
}

} // namespace

std::optional<binary_op> parse_binary_op(std::string_view name) {
  if (name == "add") return binary_op::add;
  if (name == "sub") return binary_op::sub;
  if (name == "mul") return binary_op::mul;
  if (name == "div") return binary_op::div;
  return std::nullopt;
}

const char* to_string(binary_op op) {
  switch (op) {
    case binary_op::add: return "add";
    case binary_op::sub: return "sub";
    case binary_op::mul: return "mul";
    case binary_op::div: return "div";
  }
  return "?";
}

std::optional<shape_type> broadcast_shapes(const shape_type& a, const shape_type& b) {
  size_t rank = std::max(a.size(), b.size());
  shape_type out(rank, 1);
  for (size_t k = 0; k < rank; ++k) {
    int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1;
    int64_t db = k < b.size() ? b[b.size() - 1 - k] : 1;
    if (da != db && da != 1 && db != 1)
      return std::nullopt;
    out[rank - 1 - k] = da == 1 ? db : da;
  }
  return out;
}

std::unique_ptr<backend> make_cpu_backend() {
  return std::make_unique<cpu_backend>();
}

status fill_uniform(tensor& t, double low, double high, uint64_t seed) {
  if (!(low < high))
    return status::failure("uniform initializer needs low < high, got [" + std::to_string(low)
                           + ", " + std::to_string(high) + ")");
  return fill_with(t, std::uniform_real_distribution<double>{low, high}, seed);
}

status fill_normal(tensor& t, double mean, double stddev, uint64_t seed) {
  if (!(stddev > 0))
    return status::failure("normal initializer needs stddev > 0, got " + std::to_string(stddev));
  return fill_with(t, std::normal_distribution<double>{mean, stddev}, seed);
}

} // namespace af::kernels
