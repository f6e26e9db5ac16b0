#pragma once
/// A dense tensor: dtype + shape + one contiguous buffer (64-byte aligned,
/// except a slice(), which starts where its elements do in the buffer it shares).
///
/// The buffer is shared and treated as immutable once a tensor has been sent:
/// copying a tensor copies a pointer, so tensors move between actors of one node
/// without copying bytes. Writers go through `mutable_data()`, which clones the
/// buffer first if anyone else still holds it (copy on write). This header has no
/// CAF dependency; the wire format lives in messages/serialization.hpp.

#include <cstddef>
#include <cstdint>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace af {

enum class dtype : uint8_t { float32 = 0, float64 = 1, int32 = 2, int64 = 3 };

/// Bytes per element of `t`.
size_t dtype_size(dtype t);

/// "float32", "float64", "int32", "int64".
const char* dtype_name(dtype t);

/// Parses a dtype name (also accepts "float" and "double"); nullopt if unknown.
std::optional<dtype> parse_dtype(std::string_view name);

/// True if `raw` is the numeric value of a known dtype (used when decoding).
bool valid_dtype(uint8_t raw);

using shape_type = std::vector<int64_t>;

/// Number of elements of `shape` (1 for a scalar); -1 if a dimension is
/// negative or the count does not fit an int64 (a forged shape must not wrap
/// around to a small count).
int64_t num_elements(const shape_type& shape);

/// The most bytes a tensor decoded from a peer (CAF's wire) may hold: the
/// largest [node] max_message_bytes of the nodes running in this process
/// (each holds its limit from start to stop: hold_max_decoded_tensor_bytes);
/// with none running, what set_max_decoded_tensor_bytes said (2 GiB unless
/// told). Process-wide, because CAF decodes a message before any actor of
/// a node sees it, and does not say for which node. So in one process with
/// several nodes (an embedded cluster, tests) no node refuses a tensor its
/// own limit allows, but a node with a smaller limit accepts, through CAF,
/// tensors up to the largest (its CAF port still refuses a message over its
/// own limit, and its data plane checks its own).
void set_max_decoded_tensor_bytes(uint64_t bytes);
uint64_t max_decoded_tensor_bytes();

/// Counts `bytes` among the limits of the running nodes until the returned
/// handle is released (the node stopped).
std::shared_ptr<void> hold_max_decoded_tensor_bytes(uint64_t bytes);

/// Empty if a tensor of dtype code `type` and `shape` whose payload is
/// `payload_bytes` long may be decoded (known dtype, shape valid, payload
/// exactly its size, within max_decoded_tensor_bytes()); else what is wrong,
/// checked before anything is allocated.
std::string check_decoded_tensor(uint8_t type, const shape_type& shape, uint64_t payload_bytes);

/// "[2,2]", "[]" for a scalar.
std::string shape_string(const shape_type& shape);

/// A tensor's bytes held in a device's memory (a GPU's), made by a kernels
/// backend. A tensor that has one makes its host copy only when something
/// reads it on the host (crossing a node, a CPU op, the client fetching it),
/// so values stay on the device between ops of a step.
class device_copy {
public:
  virtual ~device_copy() = default;

  /// The backend that made it and can read `device_pointer()` directly.
  virtual const void* owner() const noexcept = 0;

  virtual void* device_pointer() const noexcept = 0;

  /// Copies the bytes into host memory; blocks until they are there.
  virtual void download(void* host, size_t bytes) const = 0;
};

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr dtype value = dtype::float32; };
template <> struct dtype_of<double> { static constexpr dtype value = dtype::float64; };
template <> struct dtype_of<int32_t> { static constexpr dtype value = dtype::int32; };
template <> struct dtype_of<int64_t> { static constexpr dtype value = dtype::int64; };

class tensor {
public:
  /// An empty tensor: holds no value (`empty()` is true).
  tensor() = default;

  /// A tensor of `shape` with uninitialized contents.
  tensor(dtype type, shape_type shape);

  /// A tensor of `shape` with every element equal to `value` (for an integer
  /// dtype: truncated, NaN as 0, saturated at its limits; core/int_arith.hpp).
  static tensor filled(dtype type, shape_type shape, double value);

  /// A scalar.
  static tensor scalar(float value) { return filled(dtype::float32, {}, value); }

  /// A tensor holding a copy of `values`; `shape` must match their count.
  template <class T>
  static tensor from_values(shape_type shape, const std::vector<T>& values);

  /// A tensor over `host`'s bytes, which another owner shares (a payload
  /// read in place from a shared-memory ring: net/plane_handler.hpp): no
  /// copy. While that owner keeps its copy of `host`, a write copies first,
  /// as for any shared buffer.
  static tensor over(dtype type, shape_type shape, std::shared_ptr<std::byte> host);

  /// A tensor whose bytes are on a device; the host copy is made on first use.
  static tensor on_device(dtype type, shape_type shape, std::shared_ptr<const device_copy> dev);

  bool empty() const noexcept { return st_ == nullptr; }
  dtype type() const noexcept { return type_; }
  const shape_type& shape() const noexcept { return shape_; }
  size_t num_elements() const noexcept { return count_; }
  size_t nbytes() const noexcept { return count_ * dtype_size(type_); }

  /// The host bytes (downloaded once from the device if they live there).
  const std::byte* bytes() const;

  /// Writable bytes; clones the buffer first if it is shared. A device copy
  /// is dropped, since it no longer matches.
  std::byte* mutable_bytes();

  /// The device copy, if the bytes are (also) on a device; else nullptr.
  const device_copy* device() const noexcept { return st_ ? st_->device.get() : nullptr; }

  /// True if the host copy exists (always, unless the tensor is on a device
  /// and nobody read it on the host yet).
  bool on_host() const noexcept;

  template <class T>
  const T* data() const {
    return reinterpret_cast<const T*>(bytes());
  }

  template <class T>
  T* mutable_data() {
    return reinterpret_cast<T*>(mutable_bytes());
  }

  /// Element `i` converted to double, whatever the dtype.
  double at(size_t i) const;

  /// All elements converted to T (for tests and printing).
  template <class T>
  std::vector<T> values() const {
    std::vector<T> out(count_);
    for (size_t i = 0; i < count_; ++i)
      out[i] = static_cast<T>(at(i));
    return out;
  }

  /// True if both share one buffer (no copy was made between them).
  bool shares_buffer_with(const tensor& other) const noexcept {
    return st_ != nullptr && st_ == other.st_;
  }

  /// How many copies of this tensor hold its storage (slices of the same
  /// buffer are not counted: mutable_bytes() counts them itself).
  long use_count() const noexcept { return st_.use_count(); }

  /// Keeps this tensor's buffer alive as a copy of it would (and counts as
  /// one for buffer_shared()), without copying the shape; null if empty.
  std::shared_ptr<const void> buffer_owner() const noexcept { return st_; }

  /// True if mutable_bytes() would copy the buffer first: another tensor
  /// or a slice shares it (copy on write).
  bool buffer_shared() const noexcept {
    return st_ != nullptr && (st_.use_count() > 1 || st_->host.use_count() > 1);
  }

  /// NumPy's text (core/tensor_format.hpp): "[[7. 7.]\n [7. 7.]]"; elides the middle of
  /// tensors of more than `max_elements`.
  std::string to_string(size_t max_elements = 64) const;

  /// "float32[2,2]".
  std::string summary() const;

  /// The same buffer seen with another shape of as many elements (no copy;
  /// like every copy of a tensor, an update of either writes a copy). Empty
  /// if the element counts differ.
  tensor reshaped(shape_type shape) const;

  /// Elements [first, first + elements of `shape`) of this tensor as a
  /// tensor of `shape` that shares its bytes (no copy; the whole buffer stays
  /// alive while the slice does). Writing to either copies first, as for any
  /// shared buffer. Empty if the range is not inside this tensor.
  tensor slice(size_t first, shape_type shape) const;

  /// Decoding support: allocates an uninitialized buffer for `shape`.
  void reset(dtype type, shape_type shape);

private:
  dtype type_ = dtype::float32;
  shape_type shape_;
  size_t count_ = 0;
  /// Shared by copies of a tensor: the host bytes (made lazily when the
  /// tensor lives on a device) and the device copy.
  struct storage {
    std::shared_ptr<std::byte> host;
    std::shared_ptr<const device_copy> device;
    std::once_flag downloaded;
    std::atomic<bool> host_ready{false}; ///< set once `host` holds the bytes
  };
  std::shared_ptr<storage> st_;
};

/// Exact equality of dtype, shape and bytes.
bool operator==(const tensor& a, const tensor& b);
inline bool operator!=(const tensor& a, const tensor& b) { return !(a == b); }

template <class T>
tensor tensor::from_values(shape_type shape, const std::vector<T>& values) {
  tensor t{dtype_of<T>::value, std::move(shape)};
  if (t.num_elements() != values.size())
    return tensor{};
  auto* dst = t.mutable_data<T>();
  for (size_t i = 0; i < values.size(); ++i)
    dst[i] = values[i];
  return t;
}

} // namespace af
