// Tensors to and from NumPy. A fetched tensor becomes an array over the
// tensor's own buffer (no copy: the array's base holds the tensor); a value
// given to the library (a constant, a feed) is copied once into a tensor,
// since the library may keep that buffer (a variable assigned from a feed)
// and a NumPy array stays writable by its owner.
#include "python/bindings.hpp"

#include <cstdint>
#include <cstring>

namespace af::python {

namespace {

const char* mapped_names = "float32, float64, int32, int64";

/// NumPy's name for a dtype object (for errors).
std::string numpy_name(const py::dtype& dt) {
  return py::str(static_cast<const py::handle&>(dt)).cast<std::string>();
}

std::optional<dtype> from_numpy_dtype(const py::dtype& dt) {
  // kind + itemsize, so that every spelling of a type (np.intc, "<i4",
  // np.int_) maps; byte order other than native is refused below.
  auto kind = dt.kind();
  auto size = dt.itemsize();
  if (kind == 'f' && size == 4)
    return dtype::float32;
  if (kind == 'f' && size == 8)
    return dtype::float64;
  if (kind == 'i' && size == 4)
    return dtype::int32;
  if (kind == 'i' && size == 8)
    return dtype::int64;
  return std::nullopt;
}

[[noreturn]] void unmappable(const py::dtype& dt) {
  throw py::type_error("actorflow has no dtype for NumPy's " + numpy_name(dt) + " (its dtypes: "
                       + mapped_names + "); convert the value first, e.g. with .astype(np.float32)");
}

/// Whether every value of the int64 array `a` fits an int32.
bool fits_int32(const py::array& a) {
  auto c = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
  const auto* v = c.data();
  for (py::ssize_t i = 0; i < c.size(); ++i)
    if (v[i] < INT32_MIN || v[i] > INT32_MAX)
      return false;
  return true;
}

} // namespace

dtype to_dtype(py::handle spec) {
  py::dtype dt;
  try {
    dt = py::dtype::from_args(py::reinterpret_borrow<py::object>(spec));
  } catch (py::error_already_set&) {
    throw py::type_error("'" + py::repr(spec).cast<std::string>() + "' is not a dtype; use one of "
                         + mapped_names + " (af.float32, np.int64, \"float64\", ...)");
  }
  auto t = from_numpy_dtype(dt);
  if (!t)
    unmappable(dt);
  return *t;
}

py::dtype numpy_dtype(dtype t) {
  switch (t) {
    case dtype::float32: return py::dtype::of<float>();
    case dtype::float64: return py::dtype::of<double>();
    case dtype::int32: return py::dtype::of<int32_t>();
    case dtype::int64: return py::dtype::of<int64_t>();
  }
  throw py::type_error("unknown actorflow dtype " + std::to_string(static_cast<int>(t)));
}

py::object to_numpy(tensor&& t) {
  if (t.empty())
    return py::none();
  auto* held = new tensor(std::move(t));
  py::capsule base(held, [](void* p) { delete static_cast<tensor*>(p); });
  const auto elem = static_cast<py::ssize_t>(dtype_size(held->type()));
  std::vector<py::ssize_t> shape(held->shape().begin(), held->shape().end());
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = elem;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  // bytes() fetches a device copy to the host once; the array then points at
  // the buffer the tensor owns, and `base` keeps it alive.
  const void* data = held->bytes();
  bool sole_owner = held->use_count() == 1;
  py::array array(numpy_dtype(held->type()), std::move(shape), std::move(strides), data, base);
  if (!sole_owner) // another holder (a variable of this process) must not see writes
    py::detail::array_proxy(array.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return std::move(array);
}

namespace {

/// NumPy's cast to an integer dtype wraps what does not fit (2**40 as int32
/// was 0) and makes NaN and inf the lowest integer, in silence: a feed of
/// ids or labels then ran on other values than the caller's. Refused, as TF
/// refuses such a constant; a fraction still truncates, as in NumPy and TF.
void check_fits_integer(const py::module_& np, py::handle value, dtype want) {
  py::object src;
  try {
    src = np.attr("asarray")(value);
  } catch (py::error_already_set&) {
    return; // from_python's own conversion says what is wrong
  }
  py::object dt = src.attr("dtype");
  auto kind = dt.attr("kind").cast<std::string>();
  if ((kind != "f" && kind != "i" && kind != "u") || dt.equal(py::object(numpy_dtype(want)))
      || src.attr("size").cast<int64_t>() == 0)
    return;
  auto info = np.attr("iinfo")(numpy_dtype(want));
  py::object lo = info.attr("min"), end = -lo; // [min, -min): max + 1 is exact in a float
  std::string what = "cannot convert " + py::repr(value).cast<std::string>().substr(0, 80)
                     + " to a tensor of " + dtype_name(want) + ": ";
  if (kind == "f" && !np.attr("isfinite")(src).attr("all")().cast<bool>())
    throw py::value_error(what + "it holds NaN or inf, which " + dtype_name(want)
                          + " has no value for; clean the array first (np.nan_to_num, a mask)");
  py::object min = src.attr("min")(), max = src.attr("max")();
  if (kind == "u")
    min = py::int_(min), max = py::int_(max); // uint64 against a Python int, exactly
  if (min < lo || !(max < end))
    throw py::value_error(what + "it holds " + py::str(min < lo ? min : max).cast<std::string>()
                          + ", outside " + dtype_name(want) + "'s range ["
                          + py::str(lo).cast<std::string>() + ", "
                          + py::str(info.attr("max")).cast<std::string>()
                          + "]; feed a wider dtype's placeholder, or wrap it yourself (.astype)");
}

} // namespace

tensor from_python(py::handle value, std::optional<dtype> want) {
  // np.asarray(None, float32) is NaN: a feed of None ran on a NaN.
  if (value.is_none())
    throw py::type_error(std::string("cannot convert None to a tensor")
                         + (want ? std::string(" of ") + dtype_name(*want) : "")
                         + "; give a number or an array (a feed_dict's value, a constant)");
  auto np = py::module_::import("numpy");
  bool is_array = py::isinstance<py::array>(value) || py::isinstance(value, np.attr("generic"));
  if (want && (*want == dtype::int32 || *want == dtype::int64))
    check_fits_integer(np, value, *want);
  py::object arr;
  try {
    arr = want ? np.attr("asarray")(value, numpy_dtype(*want)) : np.attr("asarray")(value);
  } catch (py::error_already_set& e) {
    throw py::type_error("cannot convert " + py::repr(value).cast<std::string>().substr(0, 80)
                         + " to a tensor" + (want ? std::string(" of ") + dtype_name(*want) : "")
                         + ": " + e.what());
  }
  auto a = py::reinterpret_borrow<py::array>(arr);
  auto dt = a.dtype();
  std::optional<dtype> type = from_numpy_dtype(dt);
  if (!want && !is_array && type) {
    // TF's conversion of Python numbers: floats to float32, ints to int32
    // unless one does not fit (TF's make_tensor_proto keeps int64 then:
    // 2**40 as int32 was 0).
    if (*type == dtype::float64)
      type = dtype::float32;
    else if (*type == dtype::int64 && fits_int32(a))
      type = dtype::int32;
  }
  if (!type)
    unmappable(dt);
  if (!dt.equal(numpy_dtype(*type)) || !(a.flags() & py::array::c_style))
    a = np.attr("asarray")(a, numpy_dtype(*type), "C"); // (ascontiguousarray makes 0-d 1-d)
  shape_type shape(a.shape(), a.shape() + a.ndim());
  tensor t{*type, std::move(shape)};
  if (t.nbytes() > 0)
    std::memcpy(t.mutable_bytes(), a.data(), t.nbytes());
  return t;
}

void register_tensors(py::module_& m) {
  auto np = py::module_::import("numpy");
  // af.float32 is NumPy's, so `dtype=` takes either spelling.
  for (const char* name : {"float32", "float64", "int32", "int64"})
    m.attr(name) = np.attr(name);
  m.attr("float") = np.attr("float32");
  m.attr("double") = np.attr("float64");
}

} // namespace af::python
