// Counter-based initial values of a table (kernels/table_init.hpp).
#include "kernels/table_init.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

namespace af::kernels {

namespace {

/// splitmix64's finalizer: a bijection of 64 bits that mixes every input
/// bit into every output bit.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// The key of one row: a hash of (seed, row), computed once per row.
inline uint64_t row_key(uint64_t seed, uint64_t row) {
  return mix64(seed ^ mix64(row * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull));
}

/// 64 random bits of column `c` of the row keyed `key`.
inline uint64_t element_bits(uint64_t key, uint64_t c) {
  return mix64(key + (c + 1) * 0xd1b54a32d192ed03ull);
}

/// [0, 1) from the high 53 bits.
inline double unit(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

/// The normals of columns 2p and 2p + 1 of the row keyed `key`: Box-Muller
/// on two uniforms of (key, p) alone (the second from its bits mixed again),
/// its cosine and sine branches. A pair shares one log and one sincos; no
/// pair depends on another, so any row is still computed by itself.
inline void normal_pair(double mean, double stddev, uint64_t key, uint64_t p, double& z0,
                        double& z1) {
  uint64_t bits = element_bits(key, p);
  double u1 = static_cast<double>((bits >> 11) + 1) * 0x1.0p-53; // (0, 1]: log is finite
  double u2 = unit(mix64(bits ^ 0xa0761d6478bd642full));
  double radius = stddev * std::sqrt(-2.0 * std::log(u1));
  double angle = 6.283185307179586 * u2;
  z0 = mean + radius * std::cos(angle);
  z1 = mean + radius * std::sin(angle);
}

template <class T>
void fill_rows(T* out, int64_t row_begin, int64_t row_end, int64_t cols, table_distribution dist,
               double a, double b, uint64_t seed, table_rows rows) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    auto key = row_key(seed, static_cast<uint64_t>(rows.start + r * rows.stride));
    T* row = out + r * cols;
    if (dist == table_distribution::uniform) {
      for (int64_t c = 0; c < cols; ++c)
        row[c] = static_cast<T>(a + (b - a) * unit(element_bits(key, static_cast<uint64_t>(c))));
      continue;
    }
    for (int64_t c = 0; c < cols; c += 2) {
      double z0 = 0, z1 = 0;
      normal_pair(a, b, key, static_cast<uint64_t>(c / 2), z0, z1);
      row[c] = static_cast<T>(z0);
      if (c + 1 < cols)
        row[c + 1] = static_cast<T>(z1);
    }
  }
}

/// Fills every row, on several threads when there are enough elements to
/// pay for starting them (about 1M elements a thread).
template <class T>
void fill_all(T* out, int64_t n_rows, int64_t cols, table_distribution dist, double a, double b,
              uint64_t seed, table_rows rows) {
  constexpr int64_t per_thread = int64_t{1} << 20;
  int64_t total = n_rows * cols;
  auto hw = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  int64_t threads = std::min({hw, std::max<int64_t>(1, total / per_thread), n_rows});
  if (threads <= 1) {
    fill_rows(out, 0, n_rows, cols, dist, a, b, seed, rows);
    return;
  }
  std::vector<std::thread> pool;
  int64_t chunk = (n_rows + threads - 1) / threads;
  for (int64_t begin = chunk; begin < n_rows; begin += chunk)
    pool.emplace_back(fill_rows<T>, out, begin, std::min(n_rows, begin + chunk), cols, dist, a, b,
                      seed, rows);
  fill_rows(out, 0, std::min(n_rows, chunk), cols, dist, a, b, seed, rows);
  for (auto& t : pool)
    t.join();
}

} // namespace

status fill_table(tensor& t, table_distribution dist, double a, double b, uint64_t seed,
                  table_rows rows) {
  if (dist == table_distribution::uniform && !(a < b))
    return status::failure("uniform initializer needs low < high, got [" + std::to_string(a)
                           + ", " + std::to_string(b) + ")");
  if (dist == table_distribution::normal && !(b > 0))
    return status::failure("normal initializer needs stddev > 0, got " + std::to_string(b));
  if (t.shape().empty())
    return status::failure("a table initializer needs a shape [rows, ...], got a scalar");
  int64_t n_rows = t.shape()[0];
  if (rows.start < 0 || rows.stride < 1)
    return status::failure("a table initializer's rows start at " + std::to_string(rows.start)
                           + " with stride " + std::to_string(rows.stride)
                           + ": the start must be >= 0 and the stride >= 1");
  int64_t last = 0;
  if (n_rows > 0 && (__builtin_mul_overflow(n_rows - 1, rows.stride, &last)
                     || __builtin_add_overflow(last, rows.start, &last)))
    return status::failure("a table initializer's global rows pass 2^63");
  int64_t cols = n_rows == 0 ? 0 : static_cast<int64_t>(t.num_elements()) / n_rows;
  switch (t.type()) {
    case dtype::float32:
      fill_all(t.mutable_data<float>(), n_rows, cols, dist, a, b, seed, rows);
      return status::success();
    case dtype::float64:
      fill_all(t.mutable_data<double>(), n_rows, cols, dist, a, b, seed, rows);
      return status::success();
    default:
      return status::failure(std::string{"random initializers need a float dtype, not "}
                             + dtype_name(t.type()));
  }
}

} // namespace af::kernels
