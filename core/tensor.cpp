#include "core/tensor.hpp"

#include "core/tensor_format.hpp"
#include "core/int_arith.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <unordered_map>

#include <sys/mman.h>

namespace af {

namespace {

constexpr size_t buffer_alignment = 64;

/// Tensors at least this big are 2 MiB-aligned in a mapping of their own
/// and ask for transparent huge pages; the pool maps (not mallocs) buffers
/// of this size, so that the advice is on memory that is theirs alone.
constexpr size_t huge_page_min = size_t{2} << 20;

/// Large buffers go back to a small cache, keyed by exact size, instead of to
/// malloc: a node that receives a 64 MiB tensor per step then reuses the same
/// resident memory. Through malloc alone, small allocations carve up the freed
/// block, the next 64 MiB request takes fresh memory, and every page of it is
/// faulted in again (measured: the node's RSS at 3x the tensor and assign at
/// 0.4 of the raw stream).
class buffer_pool {
public:
  static constexpr size_t min_pooled = size_t{1} << 20;  ///< smaller buffers: plain malloc
  static constexpr size_t max_per_size = 4;
  static constexpr size_t max_total = size_t{1} << 30;

  void* take(size_t bytes) {
    if (bytes >= min_pooled) {
      std::lock_guard<std::mutex> guard{mtx_};
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= bytes;
        return p;
      }
    }
    if (bytes >= huge_page_min) { // a mapping of its own: see advise_huge_pages
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      return p == MAP_FAILED ? nullptr : p;
    }
    return std::malloc(bytes);
  }

  void give(void* p, size_t bytes) {
    if (bytes >= min_pooled) {
      std::lock_guard<std::mutex> guard{mtx_};
      auto& list = free_[bytes];
      if (list.size() < max_per_size && cached_ + bytes <= max_total) {
        list.push_back(p);
        cached_ += bytes;
        return;
      }
    }
    if (bytes >= huge_page_min)
      ::munmap(p, bytes);
    else
      std::free(p);
  }

private:
  std::mutex mtx_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

buffer_pool& pool() {
  static auto* instance = new buffer_pool; // never destroyed: tensors may outlive statics
  return *instance;
}

/// A big table (an embedding shard of hundreds of MiB) is read and updated a
/// few hundred random rows at a time: on 4 KiB pages each row is a TLB miss
/// as well as a cache miss. madvise(MADV_HUGEPAGE) on the buffer's 2 MiB-
/// aligned interior, before its pages are first touched (a buffer the pool
/// hands out again is advised again: harmless), lets the kernel back it with
/// 2 MiB pages where transparent huge pages are "madvise" or "always"
/// (/sys/kernel/mm/transparent_hugepage/enabled); elsewhere it does nothing. On the 2-vCPU Xeon, 340
/// random rows of 64 floats out of 3.3 M: gather 40 -> 20 us, an SGD update
/// 50 -> 23 us (both with core/prefetch.hpp). Streamed through too: the 1 M
/// sync job's 4 MB tensors (its x, gradients, pushes and answers) on huge
/// pages ran it 17 - 25 % faster on the 2-vCPU EPYC, whose 4 MiB copies
/// at memory speed run at 9 - 10 GB/s on 4 KiB pages against 13 - 15 on
/// 2 MiB ones (docs/performance.md "Huge pages for every big tensor"). The
/// buffers are mapped (buffer_pool::take), so the advice never reaches
/// memory malloc hands out again for small blocks.
void advise_huge_pages(void* p, size_t bytes) {
  constexpr uintptr_t huge = uintptr_t{2} << 20;
  auto begin = (reinterpret_cast<uintptr_t>(p) + huge - 1) & ~(huge - 1);
  auto end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(huge - 1);
  if (end > begin)
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE); // a hint: failure is fine
}

std::shared_ptr<std::byte> allocate(size_t nbytes) {
  // malloc (or the pool) and align by hand: glibc's aligned_alloc asks for
  // more than the size, so equal-sized buffers would not reuse each other.
  // A big one 2 MiB-aligned in a mapping that reaches to its last 2 MiB
  // page's end, so that all of it can be on huge pages (its last page may
  // hold up to 2 MiB more than it needs).
  if (nbytes > std::numeric_limits<size_t>::max() - 2 * huge_page_min)
    throw std::bad_alloc{}; // (the sums below must not wrap)
  const bool huge = nbytes >= huge_page_min;
  const size_t align = huge ? huge_page_min : buffer_alignment;
  size_t bytes = huge ? ((nbytes + align - 1) & ~(align - 1)) + align : nbytes + align;
  void* raw = pool().take(bytes);
  if (raw == nullptr)
    throw std::bad_alloc{};
  if (huge)
    advise_huge_pages(raw, bytes);
  auto addr = reinterpret_cast<uintptr_t>(raw);
  auto aligned = (addr + align - 1) & ~(uintptr_t{align} - 1);
  return std::shared_ptr<std::byte>(reinterpret_cast<std::byte*>(aligned),
                                    [raw, bytes](std::byte*) { pool().give(raw, bytes); });
}

} // namespace

size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::float32: return 4;
    case dtype::float64: return 8;
    case dtype::int32: return 4;
    case dtype::int64: return 8;
  }
  return 0;
}

const char* dtype_name(dtype t) {
  switch (t) {
    case dtype::float32: return "float32";
    case dtype::float64: return "float64";
    case dtype::int32: return "int32";
    case dtype::int64: return "int64";
  }
  return "invalid";
}

std::optional<dtype> parse_dtype(std::string_view name) {
  if (name == "float32" || name == "float") return dtype::float32;
  if (name == "float64" || name == "double") return dtype::float64;
  if (name == "int32") return dtype::int32;
  if (name == "int64") return dtype::int64;
  return std::nullopt;
}

bool valid_dtype(uint8_t raw) {
  return raw <= static_cast<uint8_t>(dtype::int64);
}

int64_t num_elements(const shape_type& shape) {
  int64_t n = 1;
  bool zero = false;
  for (auto d : shape)
    if (d < 0)
      return -1;
    else if (d == 0)
      zero = true;
  if (zero)
    return 0; // [0, 2^40, 2^40] is empty, not an overflow
  for (auto d : shape) {
    if (__builtin_mul_overflow(n, d, &n))
      return -1;
  }
  return n;
}

namespace {

/// The running nodes' limits, and the cap they make: read by every decode,
/// so kept in an atomic that each change recomputes.
struct decoded_tensor_caps {
  std::mutex mtx;
  std::multiset<uint64_t> held; ///< one per running node
  uint64_t fallback = uint64_t{2} << 30;
  std::atomic<uint64_t> cap{uint64_t{2} << 30};

  void update() { // under mtx
    cap.store(held.empty() ? fallback : *held.rbegin(), std::memory_order_relaxed);
  }
};

decoded_tensor_caps& caps() {
  // Never destroyed: a node may stop during the process's exit.
  static auto* instance = new decoded_tensor_caps;
  return *instance;
}

} // namespace

void set_max_decoded_tensor_bytes(uint64_t bytes) {
  auto& c = caps();
  std::lock_guard<std::mutex> guard{c.mtx};
  c.fallback = bytes;
  c.update();
}

uint64_t max_decoded_tensor_bytes() {
  return caps().cap.load(std::memory_order_relaxed);
}

std::shared_ptr<void> hold_max_decoded_tensor_bytes(uint64_t bytes) {
  auto& c = caps();
  std::multiset<uint64_t>::iterator at;
  {
    std::lock_guard<std::mutex> guard{c.mtx};
    at = c.held.insert(bytes);
    c.update();
  }
  return std::shared_ptr<void>{nullptr, [&c, at](void*) {
                                 std::lock_guard<std::mutex> guard{c.mtx};
                                 c.held.erase(at);
                                 c.update();
                               }};
}

std::string check_decoded_tensor(uint8_t type, const shape_type& shape, uint64_t payload_bytes) {
  if (!valid_dtype(type))
    return "unknown dtype code " + std::to_string(type);
  for (auto d : shape)
    if (d < 0)
      return "negative dimension in shape " + shape_string(shape);
  auto count = num_elements(shape);
  auto size = dtype_size(static_cast<dtype>(type));
  auto cap = max_decoded_tensor_bytes();
  if (count < 0 || static_cast<uint64_t>(count) > cap / size)
    return "shape " + shape_string(shape) + " of " + dtype_name(static_cast<dtype>(type))
           + " is more than the " + std::to_string(cap)
           + " bytes a message may carry ([node] max_message_bytes)";
  auto expected = static_cast<uint64_t>(count) * size;
  if (payload_bytes != expected)
    return "shape " + shape_string(shape) + " with " + std::to_string(payload_bytes)
           + " bytes, expected " + std::to_string(expected);
  return {};
}

std::string shape_string(const shape_type& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      out += ',';
    out += std::to_string(shape[i]);
  }
  out += ']';
  return out;
}

tensor::tensor(dtype type, shape_type shape) {
  reset(type, std::move(shape));
}

void tensor::reset(dtype type, shape_type shape) {
  auto n = af::num_elements(shape);
  if (n < 0)
    throw std::invalid_argument("tensor shape " + shape_string(shape)
                                + " has a negative dimension or too many elements");
  if (static_cast<uint64_t>(n) > (std::numeric_limits<size_t>::max() - 4096) / dtype_size(type))
    throw std::invalid_argument("tensor shape " + shape_string(shape) + " has too many bytes");
  type_ = type;
  shape_ = std::move(shape);
  count_ = static_cast<size_t>(n);
  st_ = std::make_shared<storage>();
  st_->host = allocate(nbytes());
}

tensor tensor::reshaped(shape_type shape) const {
  auto n = af::num_elements(shape);
  if (n < 0 || static_cast<size_t>(n) != count_)
    return tensor{};
  tensor out = *this;
  out.shape_ = std::move(shape);
  return out;
}

tensor tensor::slice(size_t first, shape_type shape) const {
  auto n = af::num_elements(shape);
  if (st_ == nullptr || n < 0 || first > count_ || static_cast<size_t>(n) > count_ - first)
    return tensor{};
  const std::byte* base = bytes(); // a device tensor's host copy first
  tensor out;
  out.type_ = type_;
  out.shape_ = std::move(shape);
  out.count_ = static_cast<size_t>(n);
  out.st_ = std::make_shared<storage>();
  // Shares the owner of the whole buffer (shared_ptr's aliasing constructor):
  // mutable_bytes() sees the buffer as shared and copies before a write.
  out.st_->host = std::shared_ptr<std::byte>(st_->host, const_cast<std::byte*>(base)
                                                           + first * dtype_size(type_));
  return out;
}

tensor tensor::over(dtype type, shape_type shape, std::shared_ptr<std::byte> host) {
  tensor t;
  auto n = af::num_elements(shape);
  if (n < 0)
    throw std::invalid_argument("tensor shape " + shape_string(shape) + " has a negative dimension");
  t.type_ = type;
  t.shape_ = std::move(shape);
  t.count_ = static_cast<size_t>(n);
  t.st_ = std::make_shared<storage>();
  t.st_->host = std::move(host);
  t.st_->host_ready.store(true);
  return t;
}

tensor tensor::on_device(dtype type, shape_type shape, std::shared_ptr<const device_copy> dev) {
  tensor t;
  auto n = af::num_elements(shape);
  if (n < 0)
    throw std::invalid_argument("tensor shape " + shape_string(shape) + " has a negative dimension");
  t.type_ = type;
  t.shape_ = std::move(shape);
  t.count_ = static_cast<size_t>(n);
  t.st_ = std::make_shared<storage>();
  t.st_->device = std::move(dev);
  return t;
}

const std::byte* tensor::bytes() const {
  if (st_ == nullptr)
    return nullptr;
  if (st_->device) {
    // Every reader goes through the once_flag: the first downloads, the
    // others wait for it, later calls only check a flag.
    std::call_once(st_->downloaded, [this] {
      if (st_->host == nullptr) {
        auto host = allocate(nbytes());
        st_->device->download(host.get(), nbytes());
        st_->host = std::move(host);
      }
      st_->host_ready.store(true, std::memory_order_release);
    });
  }
  return st_->host.get();
}

bool tensor::on_host() const noexcept {
  return st_ == nullptr || !st_->device || st_->host_ready.load(std::memory_order_acquire);
}

tensor tensor::filled(dtype type, shape_type shape, double value) {
  tensor t{type, std::move(shape)};
  auto n = t.num_elements();
  switch (type) {
    case dtype::float32: std::fill_n(t.mutable_data<float>(), n, static_cast<float>(value)); break;
    case dtype::float64: std::fill_n(t.mutable_data<double>(), n, value); break;
    // Saturating: a plain cast of NaN or of a value out of range is undefined.
    case dtype::int32:
      std::fill_n(t.mutable_data<int32_t>(), n, int_arith::saturate_cast<int32_t>(value));
      break;
    case dtype::int64:
      std::fill_n(t.mutable_data<int64_t>(), n, int_arith::saturate_cast<int64_t>(value));
      break;
  }
  return t;
}

std::byte* tensor::mutable_bytes() {
  if (st_ == nullptr)
    return nullptr;
  const std::byte* current = bytes(); // downloads first if needed
  // Shared: by copies of this tensor (one storage), or by slices (one buffer
  // owned through several storages).
  if (buffer_shared()) {
    auto fresh = std::make_shared<storage>();
    fresh->host = allocate(nbytes());
    std::memcpy(fresh->host.get(), current, nbytes());
    st_ = std::move(fresh);
  } else if (st_->device) {
    // The only holder writes: the device copy goes stale, so drop it. A fresh
    // storage keeps the once_flag out of the picture.
    auto fresh = std::make_shared<storage>();
    fresh->host = std::move(st_->host);
    st_ = std::move(fresh);
  }
  return st_->host.get();
}

double tensor::at(size_t i) const {
  switch (type_) {
    case dtype::float32: return data<float>()[i];
    case dtype::float64: return data<double>()[i];
    case dtype::int32: return data<int32_t>()[i];
    case dtype::int64: return static_cast<double>(data<int64_t>()[i]);
  }
  return 0;
}

std::string tensor::summary() const {
  return std::string{dtype_name(type_)} + shape_string(shape_);
}

std::string tensor::to_string(size_t max_elements) const {
  // One printer for the whole project: the REPL's and this one agree.
  print_options o;
  o.threshold = max_elements;
  return format_numpy(*this, o);
}

bool operator==(const tensor& a, const tensor& b) {
  if (a.empty() || b.empty())
    return a.empty() && b.empty();
  return a.type() == b.type() && a.shape() == b.shape()
         && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

} // namespace af
