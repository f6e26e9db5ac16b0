#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "core/tensor_format.hpp"

// Every expected string here is what numpy 2.4 printed for the same array:
// str(np.array(...)), with np.printoptions where a case sets options.

using af::dtype;
using af::format_numpy;
using af::print_options;
using af::tensor;

namespace {

tensor f64(af::shape_type shape, std::vector<double> values) {
  return tensor::from_values<double>(std::move(shape), values);
}

tensor f32(af::shape_type shape, std::vector<float> values) {
  return tensor::from_values<float>(std::move(shape), values);
}

print_options with_precision(int precision) {
  print_options o;
  o.precision = precision;
  return o;
}

constexpr double nan_value = std::numeric_limits<double>::quiet_NaN();
constexpr double inf_value = std::numeric_limits<double>::infinity();

} // namespace

TEST_CASE("floats of mixed widths line up on the point, each with its own digits",
          "[tensor_format]") {
  CHECK(format_numpy(f64({2}, {1.5, 2.25})) == "[1.5  2.25]");
  CHECK(format_numpy(f64({2, 2}, {1.5, -22.25, 100, 0.125}))
        == "[[  1.5   -22.25 ]\n"
           " [100.      0.125]]");
  CHECK(format_numpy(f32({2, 2}, {0.5f, -0.5f, 1, -1})) == "[[ 0.5 -0.5]\n [ 1.  -1. ]]");
}

TEST_CASE("precision caps the digits after the point and rounds the last one",
          "[tensor_format]") {
  CHECK(format_numpy(f64({2}, {1.0 / 3, 2}), with_precision(4)) == "[0.3333 2.    ]");
  CHECK(format_numpy(f32({2}, {1.0f / 3, 2}), with_precision(4)) == "[0.3333 2.    ]");
  CHECK(format_numpy(f64({3}, {1.0 / 3, 2.0 / 3, 10})) == "[ 0.33333333  0.66666667 10.        ]");
  // 0.125 and 0.375 are exact binary ties: half to even, as numpy's Dragon4
  CHECK(format_numpy(f64({3}, {0.125, 0.375, 1}), with_precision(2)) == "[0.12 0.38 1.  ]");
  // rounding that carries into the whole part
  CHECK(format_numpy(f64({2}, {9.99999999999, 1}), with_precision(4)) == "[10.  1.]");
}

TEST_CASE("integral floats print with a bare point", "[tensor_format]") {
  CHECK(format_numpy(f32({3}, {1, -2, 30})) == "[ 1. -2. 30.]");
  CHECK(format_numpy(tensor::filled(dtype::float32, {2, 2}, 7)) == "[[7. 7.]\n [7. 7.]]");
}

TEST_CASE("float32 values print as the float they are, not as their double", "[tensor_format]") {
  CHECK(format_numpy(f32({3}, {0.1f, 0.2f, 0.3f})) == "[0.1 0.2 0.3]");
  CHECK(format_numpy(tensor::from_values<float>({}, {1.0f / 3})) == "0.33333334");
  // in scientific notation a shorter mantissa goes on with the float's exact
  // digits, not zeros: float32 0.1 is 0.100000001490116...
  CHECK(format_numpy(f32({2}, {0.1f, 85.0f / 7000000.0f})) == "[1.00000001e-01 1.21428575e-05]");
}

TEST_CASE("scientific notation when values are large, tiny or far apart", "[tensor_format]") {
  CHECK(format_numpy(f64({2}, {1e8, 1.5})) == "[1.0e+08 1.5e+00]");
  CHECK(format_numpy(f64({2}, {1e-5, 1})) == "[1.e-05 1.e+00]");
  CHECK(format_numpy(f64({2}, {1, 1001})) == "[1.000e+00 1.001e+03]");
  CHECK(format_numpy(f64({2}, {1, 1000})) == "[   1. 1000.]");
  CHECK(format_numpy(f64({2}, {1e10, -2e10})) == "[ 1.e+10 -2.e+10]");
  // one three-digit exponent widens them all
  CHECK(format_numpy(f64({2}, {1e-300, 1})) == "[1.e-300 1.e+000]");
  // numpy >= 2.2: float32 switches at 1e6, past its ~7 significant digits
  CHECK(format_numpy(f32({2}, {1e6f, 2.5f})) == "[1.0e+06 2.5e+00]");
}

TEST_CASE("nan and inf take the column's width, -0. keeps its sign", "[tensor_format]") {
  CHECK(format_numpy(f64({3}, {nan_value, 1.5, -inf_value})) == "[ nan  1.5 -inf]");
  CHECK(format_numpy(f64({2}, {nan_value, inf_value})) == "[nan inf]");
  CHECK(format_numpy(f64({3}, {nan_value, 1e-5, -inf_value})) == "[   nan 1.e-05   -inf]");
  CHECK(format_numpy(f64({2}, {-0.0, 1})) == "[-0.  1.]");
  CHECK(format_numpy(f64({2}, {-0.0, 1e-5})) == "[-0.e+00  1.e-05]");
}

TEST_CASE("integers are right-aligned to the widest, int64 without a trip through double",
          "[tensor_format]") {
  CHECK(format_numpy(tensor::from_values<int32_t>({3}, {-10, 2, 300})) == "[-10   2 300]");
  CHECK(format_numpy(tensor::from_values<int64_t>({2}, {9007199254740993, -1}))
        == "[9007199254740993               -1]");
  CHECK(format_numpy(tensor::from_values<int32_t>({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7}))
        == "[[[0 1]\n"
           "  [2 3]]\n"
           "\n"
           " [[4 5]\n"
           "  [6 7]]]");
}

TEST_CASE("0-d tensors print as numpy's scalars do", "[tensor_format]") {
  auto f32_scalar = [](float v) { return format_numpy(tensor::from_values<float>({}, {v})); };
  auto f64_scalar = [](double v) { return format_numpy(tensor::from_values<double>({}, {v})); };
  CHECK(f32_scalar(10) == "10.0");
  CHECK(f32_scalar(0.1f) == "0.1");
  CHECK(f64_scalar(0.1) == "0.1");
  CHECK(f64_scalar(1.0 / 3) == "0.3333333333333333"); // precision does not apply
  CHECK(f64_scalar(1e16) == "1e+16");
  CHECK(f32_scalar(1e6f) == "1e+06");
  CHECK(f32_scalar(1.5e-5f) == "1.5e-05");
  CHECK(f64_scalar(-0.0) == "-0.0");
  CHECK(f64_scalar(nan_value) == "nan");
  CHECK(f32_scalar(-std::numeric_limits<float>::infinity()) == "-inf");
  CHECK(format_numpy(tensor::from_values<int32_t>({}, {3})) == "3");
  CHECK(format_numpy(tensor::from_values<int64_t>({}, {-7})) == "-7");
}

TEST_CASE("a tensor with a zero dimension prints [] and an empty one has no value",
          "[tensor_format]") {
  CHECK(format_numpy(tensor{dtype::float64, {0}}) == "[]");
  CHECK(format_numpy(tensor{dtype::int32, {2, 0, 3}}) == "[]");
  CHECK(format_numpy(tensor{}) == "<no value>");
}

TEST_CASE("rows wrap at the line width under the opening bracket", "[tensor_format]") {
  std::vector<double> counting(30);
  for (size_t i = 0; i < counting.size(); ++i)
    counting[i] = static_cast<double>(i);
  CHECK(format_numpy(f64({30}, counting))
        == "[ 0.  1.  2.  3.  4.  5.  6.  7.  8.  9. 10. 11. 12. 13. 14. 15. 16. 17.\n"
           " 18. 19. 20. 21. 22. 23. 24. 25. 26. 27. 28. 29.]");
  std::vector<int64_t> thousands(40);
  for (size_t i = 0; i < thousands.size(); ++i)
    thousands[i] = static_cast<int64_t>(i) * 1000;
  CHECK(format_numpy(tensor::from_values<int64_t>({2, 20}, thousands))
        == "[[    0  1000  2000  3000  4000  5000  6000  7000  8000  9000 10000 11000\n"
           "  12000 13000 14000 15000 16000 17000 18000 19000]\n"
           " [20000 21000 22000 23000 24000 25000 26000 27000 28000 29000 30000 31000\n"
           "  32000 33000 34000 35000 36000 37000 38000 39000]]");
}

TEST_CASE("a 2000x3 tensor shows its first and last three rows", "[tensor_format]") {
  std::vector<float> sevenths(6000);
  for (size_t i = 0; i < sevenths.size(); ++i)
    sevenths[i] = static_cast<float>(i) / 7.0f;
  CHECK(format_numpy(f32({2000, 3}, sevenths)) == R"([[0.0000000e+00 1.4285715e-01 2.8571430e-01]
 [4.2857143e-01 5.7142860e-01 7.1428573e-01]
 [8.5714287e-01 1.0000000e+00 1.1428572e+00]
 ...
 [8.5585712e+02 8.5600000e+02 8.5614288e+02]
 [8.5628571e+02 8.5642859e+02 8.5657141e+02]
 [8.5671429e+02 8.5685712e+02 8.5700000e+02]])");
}

TEST_CASE("a 10x10x20 tensor is elided on every axis, its layout from the shown values only",
          "[tensor_format]") {
  std::vector<double> values(2000);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<double>(i) * 0.5 + 100;
  values[(5 * 10 + 5) * 20 + 10] = 1e9; // hidden: must not switch to scientific notation
  CHECK(format_numpy(f64({10, 10, 20}, values)) == R"([[[ 100.   100.5  101.  ...  108.5  109.   109.5]
  [ 110.   110.5  111.  ...  118.5  119.   119.5]
  [ 120.   120.5  121.  ...  128.5  129.   129.5]
  ...
  [ 170.   170.5  171.  ...  178.5  179.   179.5]
  [ 180.   180.5  181.  ...  188.5  189.   189.5]
  [ 190.   190.5  191.  ...  198.5  199.   199.5]]

 [[ 200.   200.5  201.  ...  208.5  209.   209.5]
  [ 210.   210.5  211.  ...  218.5  219.   219.5]
  [ 220.   220.5  221.  ...  228.5  229.   229.5]
  ...
  [ 270.   270.5  271.  ...  278.5  279.   279.5]
  [ 280.   280.5  281.  ...  288.5  289.   289.5]
  [ 290.   290.5  291.  ...  298.5  299.   299.5]]

 [[ 300.   300.5  301.  ...  308.5  309.   309.5]
  [ 310.   310.5  311.  ...  318.5  319.   319.5]
  [ 320.   320.5  321.  ...  328.5  329.   329.5]
  ...
  [ 370.   370.5  371.  ...  378.5  379.   379.5]
  [ 380.   380.5  381.  ...  388.5  389.   389.5]
  [ 390.   390.5  391.  ...  398.5  399.   399.5]]

 ...

 [[ 800.   800.5  801.  ...  808.5  809.   809.5]
  [ 810.   810.5  811.  ...  818.5  819.   819.5]
  [ 820.   820.5  821.  ...  828.5  829.   829.5]
  ...
  [ 870.   870.5  871.  ...  878.5  879.   879.5]
  [ 880.   880.5  881.  ...  888.5  889.   889.5]
  [ 890.   890.5  891.  ...  898.5  899.   899.5]]

 [[ 900.   900.5  901.  ...  908.5  909.   909.5]
  [ 910.   910.5  911.  ...  918.5  919.   919.5]
  [ 920.   920.5  921.  ...  928.5  929.   929.5]
  ...
  [ 970.   970.5  971.  ...  978.5  979.   979.5]
  [ 980.   980.5  981.  ...  988.5  989.   989.5]
  [ 990.   990.5  991.  ...  998.5  999.   999.5]]

 [[1000.  1000.5 1001.  ... 1008.5 1009.  1009.5]
  [1010.  1010.5 1011.  ... 1018.5 1019.  1019.5]
  [1020.  1020.5 1021.  ... 1028.5 1029.  1029.5]
  ...
  [1070.  1070.5 1071.  ... 1078.5 1079.  1079.5]
  [1080.  1080.5 1081.  ... 1088.5 1089.  1089.5]
  [1090.  1090.5 1091.  ... 1098.5 1099.  1099.5]]])");
}

TEST_CASE("the threshold decides when to elide, tensor::to_string passes its limit as it",
          "[tensor_format][tensor]") {
  auto zeros = tensor::filled(dtype::float32, {100}, 0);
  CHECK(format_numpy(zeros).find("...") == std::string::npos);
  print_options o;
  o.threshold = 4;
  CHECK(format_numpy(zeros, o) == "[0. 0. 0. ... 0. 0. 0.]");
  CHECK(zeros.to_string(4) == "[0. 0. 0. ... 0. 0. 0.]");
  CHECK(tensor::scalar(10).to_string() == "10.0");
  CHECK(tensor{}.to_string() == "<no value>");
}

TEST_CASE("describe_shape writes the shape as a Python tuple, then the dtype", "[tensor_format]") {
  CHECK(af::describe_shape(tensor::filled(dtype::float32, {2, 2}, 0)) == "(2, 2) float32");
  CHECK(af::describe_shape(tensor::filled(dtype::int64, {3}, 0)) == "(3,) int64");
  CHECK(af::describe_shape(tensor::from_values<int32_t>({}, {1})) == "() int32");
  CHECK(af::describe_shape(tensor{}) == "<no value>");
}
