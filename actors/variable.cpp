#include "actors/variable.hpp"

#include <algorithm>
#include <cstring>
#include <cstddef>
#include <limits>
#include <new>
#include <utility>

#include <fmt/format.h>

#include "caf/all.hpp"

#include "actors/node_watch.hpp"
#include "core/parallel_ranges.hpp"
#include "graph/evaluate.hpp"
#include "kernels/kernels.hpp"
#include "kernels/sparse.hpp"
#include "messages/error.hpp"

namespace af {

namespace {

std::string quoted(const variable_spec& spec) {
  return "'" + spec.name + "'";
}

kernels::backend& host_backend() {
  static auto backend = kernels::make_cpu_backend();
  return *backend;
}

caf::error out_of_memory(const variable_spec& spec, const std::string& what) {
  auto bytes = value_bytes(spec);
  return make_error(af_error::resource_exhausted,
                    what + " of " + quoted(spec) + " on " + spec.device + ": cannot allocate "
                      + (bytes ? std::to_string(*bytes) + " bytes" : std::string{"its value"})
                      + " (out of memory)");
}

} // namespace

caf::expected<size_t> value_bytes(const variable_spec& spec) {
  // A tensor's size is a size_t and its allocation adds alignment: stay well
  // below the largest object size so that nothing downstream wraps around.
  constexpr uint64_t max_bytes = static_cast<uint64_t>(std::numeric_limits<std::ptrdiff_t>::max()) / 2;
  for (auto d : spec.shape)
    if (d < 0)
      return make_error(af_error::invalid_argument,
                        "variable " + quoted(spec) + ": shape " + shape_string(spec.shape)
                          + " has a negative dimension");
  int64_t count = std::count(spec.shape.begin(), spec.shape.end(), 0) > 0 ? 0 : 1;
  for (auto d : spec.shape) {
    if (__builtin_mul_overflow(count, d, &count))
      return make_error(af_error::invalid_argument,
                        "variable " + quoted(spec) + ": shape " + shape_string(spec.shape)
                          + " has more elements than fit in 64 bits");
  }
  if (!valid_dtype(static_cast<uint8_t>(spec.type)))
    return make_error(af_error::invalid_argument,
                      "variable " + quoted(spec) + ": unknown dtype code "
                        + std::to_string(static_cast<int>(spec.type)));
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(count), dtype_size(spec.type), &bytes)
      || bytes > max_bytes)
    return make_error(af_error::invalid_argument,
                      "variable " + quoted(spec) + ": shape " + shape_string(spec.shape) + " of "
                        + dtype_name(spec.type) + " overflows the byte size of a tensor");
  return static_cast<size_t>(bytes);
}

// -- variable_cell ---------------------------------------------------------------

variable_cell::variable_cell(variable_spec spec) : spec_(std::move(spec)) {
  // nop
}

caf::expected<variable_cell::applied>
variable_cell::apply(var_op op, const tensor& operand, bool want_value, uint64_t request_id) {
  auto what = [&] { return std::string{to_string(op)} + " to " + quoted(spec_); };
  if (!valid_var_op(static_cast<uint8_t>(op)))
    return make_error(af_error::invalid_argument,
                      "variable " + quoted(spec_) + ": unknown op code "
                        + std::to_string(static_cast<int>(op)));
  std::lock_guard<std::mutex> guard{mtx_};
  bool deduplicate = request_id != 0 && op != var_op::read;
  if (deduplicate)
    if (auto r = replay(request_id, want_value, what))
      return std::move(*r);
  if (op == var_op::read) {
    if (!initialized_)
      return make_error(af_error::uninitialized,
                        "variable " + quoted(spec_) + " on " + spec_.device
                          + " is read before it was initialized; run initialize() (the chief "
                            "does) or wait_initialized() first");
    return applied{value_, version_, false};
  }
  if (operand.empty())
    return make_error(af_error::invalid_argument, what() + ": no value given");
  if (operand.type() != spec_.type)
    return make_error(af_error::dtype_mismatch,
                      what() + ": value has dtype " + dtype_name(operand.type()) + ", variable has "
                        + dtype_name(spec_.type));
  bool scalar = operand.num_elements() == 1 && operand.shape().size() <= spec_.shape.size();
  if (operand.shape() != spec_.shape && !(scalar && op != var_op::assign))
    return make_error(af_error::shape_mismatch,
                      what() + ": value has shape " + shape_string(operand.shape())
                        + ", variable has " + shape_string(spec_.shape));
  applied out;
  if (op == var_op::assign) {
    value_ = operand; // shares the sender's buffer: no copy within a node
    out.first_value = !initialized_;
    initialized_ = true;
  } else {
    if (!initialized_)
      return make_error(af_error::uninitialized,
                        what() + " before it was initialized; run initialize() first");
    try {
      auto st = host_backend().binary_inplace(
        op == var_op::assign_add ? kernels::binary_op::add : kernels::binary_op::sub, value_, operand);
      if (!st.ok())
        return make_error(af_error::invalid_argument, what() + ": " + st.error);
    } catch (const std::bad_alloc&) {
      // binary_inplace copies a value that readers still hold: that copy failed.
      return out_of_memory(spec_, to_string(op));
    }
  }
  out.version = ++version_;
  if (want_value)
    out.value = value_;
  if (deduplicate)
    remember(request_id, out, want_value);
  return out;
}

std::optional<caf::expected<variable_cell::applied>>
variable_cell::replay(uint64_t request_id, bool want_value,
                      const std::function<std::string()>& what) const {
  // Checked under the same lock as the update: a retry that overtakes its
  // first try (which then arrives as the duplicate) is applied once too.
  auto it = done_.find(request_id);
  if (it == done_.end())
    return std::nullopt;
  const auto& d = it->second;
  applied out;
  out.version = d.version;
  out.replayed = true;
  if (want_value) {
    if (d.wanted && !d.value.empty())
      out.value = d.value;
    else if (d.version == version_ && initialized_)
      out.value = value_; // nothing changed it since
    else
      return caf::expected<applied>{make_error(
        af_error::aborted,
        what() + " was applied already (a retry of request " + fmt::format("{:016x}", request_id)
          + ", version " + std::to_string(d.version) + "); the value after it is no longer "
          "kept (the variable changed since and kept values are bounded): "
          "read the variable instead of sending the update again")};
  }
  return caf::expected<applied>{std::move(out)};
}

caf::expected<variable_cell::applied>
variable_cell::apply_scatter(kernels::scatter_op op, const tensor& indices, const tensor& updates,
                             bool want_value, uint64_t request_id) {
  const auto what = std::string{kernels::to_string(op)} + " to variable " + quoted(spec_);
  std::lock_guard<std::mutex> guard{mtx_};
  if (request_id != 0)
    if (auto r = replay(request_id, want_value, [&what] { return what; }))
      return std::move(*r);
  if (!initialized_)
    return make_error(af_error::uninitialized,
                      what + " before it was initialized; run initialize() first");
  try {
    // Every id is checked before the first write, so a refused scatter
    // leaves the value as it was; a buffer a reader holds is copied first.
    auto st = kernels::host_scatter(op, value_, indices, updates);
    if (!st.ok())
      return make_error(st.what == kernels::status::kind::dtype ? af_error::dtype_mismatch
                        : st.what == kernels::status::kind::shape ? af_error::shape_mismatch
                                                                   : af_error::invalid_argument,
                        what + " on " + spec_.device + ": " + st.error);
  } catch (const std::bad_alloc&) {
    return out_of_memory(spec_, kernels::to_string(op)); // the copy of a read value
  }
  applied out;
  out.version = ++version_;
  if (want_value)
    out.value = value_;
  if (request_id != 0)
    remember(request_id, out, want_value);
  return out;
}

void variable_cell::remember(uint64_t id, const applied& result, bool want_value) {
  try {
    remembered_update d;
    d.version = result.version;
    d.wanted = want_value;
    bool keep = want_value && !result.value.empty() && result.value.nbytes() <= max_kept_value_bytes;
    if (keep)
      d.value = result.value;
    done_.emplace(id, std::move(d));
    done_order_.push_back(id);
    if (keep) {
      kept_order_.push_back(id);
      kept_bytes_ += result.value.nbytes();
    }
  } catch (const std::bad_alloc&) {
    // Out of memory: this update is applied but not remembered (a retry of
    // it would be applied again). Undo a half-made entry.
    if (!done_order_.empty() && done_order_.back() == id)
      done_order_.pop_back();
    if (!kept_order_.empty() && kept_order_.back() == id)
      kept_order_.pop_back();
    done_.erase(id);
    return;
  }
  // kept_order_ lists the ids with a kept value in the order of done_order_,
  // so the oldest entry, if it keeps a value, is kept_order_'s front.
  auto drop_value = [&](std::unordered_map<uint64_t, remembered_update>::iterator it) {
    kept_bytes_ -= it->second.value.nbytes();
    it->second.value = tensor{};
    kept_order_.pop_front();
  };
  while (done_order_.size() > max_remembered) {
    auto it = done_.find(done_order_.front());
    done_order_.pop_front();
    if (it == done_.end())
      continue;
    if (!it->second.value.empty())
      drop_value(it);
    done_.erase(it);
  }
  while (kept_bytes_ > max_kept_bytes && !kept_order_.empty()) {
    auto it = done_.find(kept_order_.front());
    if (it == done_.end() || it->second.value.empty())
      kept_order_.pop_front();
    else
      drop_value(it);
  }
}

size_t variable_cell::remembered() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return done_.size();
}

caf::expected<uint64_t> variable_cell::initialize(const initializer& init,
                                                  bool only_if_uninitialized,
                                                  const std::string& run_id) {
  {
    std::lock_guard<std::mutex> guard{mtx_};
    if (only_if_uninitialized && initialized_)
      return version_;
  }
  if (auto bytes = value_bytes(spec_); !bytes)
    return std::move(bytes.error());
  // Computed outside the lock: a large random fill must not stall the data
  // plane's ops on this variable. (It reports a failed allocation itself.)
  auto fresh = initial_value(spec_, init);
  if (!fresh)
    return make_error(fresh.error().code, fresh.error().what);
  std::lock_guard<std::mutex> guard{mtx_};
  if (only_if_uninitialized && initialized_)
    return version_; // someone else was first
  value_ = std::move(*fresh);
  initialized_ = true;
  run_id_ = run_id;
  slots_.clear();
  return ++version_;
}

variable_info variable_cell::info() const {
  std::lock_guard<std::mutex> guard{mtx_};
  variable_info out;
  out.spec = spec_;
  out.initialized = initialized_;
  out.version = version_;
  out.run_id = run_id_;
  return out;
}

bool variable_cell::initialized() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return initialized_;
}

bool variable_cell::has_slot(const std::string& name) const {
  std::lock_guard<std::mutex> guard{mtx_};
  return slots_.find(name) != slots_.end();
}

std::optional<tensor> variable_cell::slot(const std::string& name) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto it = slots_.find(name);
  if (it == slots_.end())
    return std::nullopt;
  return it->second;
}

caf::error variable_cell::set_slot(const std::string& name, tensor value) {
  if (value.type() != spec_.type || value.shape() != spec_.shape)
    return make_error(af_error::shape_mismatch,
                      "slot '" + name + "' of " + quoted(spec_) + ": value is "
                        + (value.empty() ? std::string{"empty"} : value.summary()) + ", variable is "
                        + dtype_name(spec_.type) + shape_string(spec_.shape));
  std::lock_guard<std::mutex> guard{mtx_};
  slots_[name] = std::move(value);
  return caf::none;
}

caf::error variable_cell::check_floats(size_t n, const char* what) const {
  if (spec_.type != dtype::float32)
    return make_error(af_error::dtype_mismatch,
                      std::string{what} + " of " + quoted(spec_) + ": the variable is "
                        + dtype_name(spec_.type) + ", training updates float32 variables");
  if (!initialized_)
    return make_error(af_error::uninitialized,
                      std::string{what} + " of " + quoted(spec_) + " on " + spec_.device
                        + " before it was initialized; the chief initializes it first");
  if (n != value_.num_elements())
    return make_error(af_error::shape_mismatch,
                      std::string{what} + " of " + quoted(spec_) + ": got " + std::to_string(n)
                        + " values, the variable " + shape_string(spec_.shape) + " has "
                        + std::to_string(value_.num_elements()));
  return caf::none;
}

void variable_cell::use_slots(const train::optimizer_spec& opt, float* (&out)[2]) {
  auto names = train::slot_names(opt.kind);
  for (size_t k = 0; k < names.size() && k < 2; ++k) {
    auto it = slots_.find(names[k]);
    if (it == slots_.end())
      it = slots_.emplace(names[k], tensor::filled(dtype::float32, spec_.shape,
                                                   train::slot_initial_value(opt, k)))
             .first;
    out[k] = it->second.mutable_data<float>(); // a copy if a checkpoint still holds it
  }
}

template <class Source>
caf::error variable_cell::apply_blocks(const train::optimizer_spec& opt, Source&& source, size_t n,
                                       uint64_t step, const block_updated& updated, bool spread) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (auto err = check_floats(n, "gradient"))
    return err;
  float* slot_ptrs[2] = {nullptr, nullptr};
  try {
    use_slots(opt, slot_ptrs);
    // In place unless a reader still holds the buffer (an answer being
    // written from it: copy on write). Then the update goes to a fresh
    // buffer, each block copied there just before it is updated, while it
    // is in cache: one pass over the old value instead of a whole copy
    // first (async, where another worker's answer is still being sent).
    tensor before;
    const float* old = nullptr;
    if (value_.buffer_shared() && value_.on_host()) {
      tensor fresh{value_.type(), value_.shape()}; // uninitialized; value_ kept if it throws
      before = std::exchange(value_, std::move(fresh));
      old = before.data<float>();
    }
    float* var = value_.mutable_data<float>();
    // Spread: a large variable's blocks split across the cores, since every
    // member of a sync round waits for this pass (core/parallel_ranges.hpp).
    // The blocks are independent, so the values are those of one pass.
    constexpr size_t no_split = std::numeric_limits<size_t>::max();
    parallel_ranges(n, apply_block, spread ? split_floats : no_split, [&](size_t from, size_t to) {
      float buf[apply_block];
      for (size_t offset = from; offset < to; offset += apply_block) {
        size_t len = std::min(apply_block, to - offset);
        if (old != nullptr)
          std::memcpy(var + offset, old + offset, len * sizeof(float));
        const float* grad = source(offset, len, buf);
        float* slots[2] = {slot_ptrs[0] ? slot_ptrs[0] + offset : nullptr,
                           slot_ptrs[1] ? slot_ptrs[1] + offset : nullptr};
        train::apply(opt, var + offset, slots, grad, len, step);
        if (updated)
          updated(offset, len, var + offset);
      }
    });
  } catch (const std::bad_alloc&) {
    return out_of_memory(spec_, "gradient");
  }
  ++version_;
  return caf::none;
}

caf::error variable_cell::apply_gradient(const train::optimizer_spec& opt, const float* grad,
                                         size_t n, uint64_t step) {
  return apply_blocks(
    opt, [grad](size_t offset, size_t, float*) { return grad + offset; }, n, step, nullptr,
    false);
}

caf::error variable_cell::apply_gradient_by(const train::optimizer_spec& opt,
                                            const gradient_fill& fill, size_t n, uint64_t step,
                                            const block_updated& updated, bool spread) {
  return apply_blocks(
    opt,
    [&fill](size_t offset, size_t len, float* buf) -> const float* {
      fill(offset, len, buf);
      return buf;
    },
    n, step, updated, spread);
}

caf::error variable_cell::apply_sparse_gradient(const train::optimizer_spec& opt,
                                                const tensor& ids, const tensor& rows,
                                                uint64_t step) {
  auto refuse = [&](af_error code, const std::string& why) {
    return make_error(code, "sparse gradient of " + quoted(spec_) + " on " + spec_.device + ": "
                              + why);
  };
  // Everything that does not depend on the value is checked and computed
  // before the lock: the shape is fixed, so are the ids' bounds.
  if (spec_.type != dtype::float32 || rows.type() != dtype::float32)
    return refuse(af_error::dtype_mismatch,
                  "the variable is " + std::string{dtype_name(spec_.type)} + " and the rows "
                    + (rows.empty() ? std::string{"empty"} : rows.summary())
                    + "; training updates float32 variables with float32 rows");
  shape_type expected;
  if (auto st = kernels::gather_shape(spec_.shape, spec_.type, ids.shape(), ids.type(), expected);
      !st.ok())
    return refuse(af_error::shape_mismatch, st.error);
  if (rows.shape() != expected)
    return refuse(af_error::shape_mismatch,
                  "rows " + rows.summary() + " are not the rows of ids " + ids.summary()
                    + " (they need " + shape_string(expected) + ")");
  if (auto st = kernels::check_ids(ids, spec_.shape[0], "indices"); !st.ok())
    return refuse(af_error::invalid_argument, st.error);
  const auto n = static_cast<int64_t>(ids.num_elements());
  const size_t row_size = n == 0 ? 0 : rows.num_elements() / static_cast<size_t>(n);
  // Duplicates summed first (TF's _deduplicate_indexed_slices), so that each
  // row is updated once: unique, then the rows summed by their unique index.
  tensor unique_ids, idx;
  tensor summed = rows.reshaped({n, static_cast<int64_t>(row_size)});
  std::vector<int64_t> touched;
  try {
    if (auto st = kernels::host_unique(ids.reshaped({n}), &unique_ids, &idx); !st.ok())
      return refuse(af_error::invalid_argument, st.error);
    const size_t k = unique_ids.num_elements();
    if (k != static_cast<size_t>(n)) {
      tensor out;
      if (auto st = kernels::host_unsorted_segment_sum(summed, idx, static_cast<int64_t>(k), out);
          !st.ok())
        return refuse(af_error::invalid_argument, st.error);
      summed = std::move(out);
    }
    touched.resize(k);
    for (size_t i = 0; i < k; ++i)
      touched[i] = kernels::integer_at(unique_ids, i);
  } catch (const std::bad_alloc&) {
    return out_of_memory(spec_, "sparse gradient");
  }
  std::lock_guard<std::mutex> guard{mtx_};
  if (!initialized_)
    return refuse(af_error::uninitialized,
                  "the variable has no value yet; the chief initializes it first");
  try {
    float* slot_ptrs[2] = {nullptr, nullptr};
    use_slots(opt, slot_ptrs);
    // In place unless a reader still holds the buffer (then a copy: COW).
    train::apply_rows(opt, value_.mutable_data<float>(), slot_ptrs, row_size, touched.data(),
                      summed.data<float>(), touched.size(), step);
  } catch (const std::bad_alloc&) {
    return out_of_memory(spec_, "sparse gradient");
  }
  ++version_;
  return caf::none;
}

caf::error variable_cell::check_gather(const tensor& ids, shape_type& out_shape) const {
  auto refuse = [&](af_error code, const std::string& why) {
    return make_error(code, "gather_rows of " + quoted(spec_) + " on " + spec_.device + ": " + why);
  };
  // Checked before the lock (the shape is fixed): a bad request never waits
  // for an update in progress, and never reads a row.
  if (ids.empty() || ids.shape().size() != 1)
    return refuse(af_error::invalid_argument,
                  "ids " + (ids.empty() ? std::string{"empty"} : ids.summary())
                    + ": gather_rows takes 1-D int32 or int64 ids");
  if (auto st = kernels::gather_shape(spec_.shape, spec_.type, ids.shape(), ids.type(), out_shape);
      !st.ok())
    return refuse(af_error::invalid_argument, st.error);
  if (auto st = kernels::check_ids(ids, spec_.shape[0], "ids"); !st.ok())
    return refuse(af_error::invalid_argument, st.error);
  return caf::none;
}

caf::expected<uint64_t> variable_cell::gather_rows_into(const tensor& ids, std::byte* dst,
                                                        size_t dst_bytes) const {
  shape_type out_shape;
  if (auto err = check_gather(ids, out_shape))
    return err;
  const size_t row_bytes = static_cast<size_t>(num_elements(out_shape)) / ids.num_elements()
                           * dtype_size(spec_.type);
  if (row_bytes * ids.num_elements() != dst_bytes)
    return make_error(af_error::internal,
                      fmt::format("gather_rows of {}: {} bytes of room for {} rows of {} bytes",
                                  quoted(spec_), dst_bytes, ids.num_elements(), row_bytes));
  std::lock_guard<std::mutex> guard{mtx_};
  if (!initialized_)
    return make_error(af_error::uninitialized,
                      "gather_rows of " + quoted(spec_) + " on " + spec_.device
                        + ": the variable has no value yet; the chief initializes it first");
  kernels::copy_rows(ids, value_.bytes(), dst, row_bytes);
  return version_;
}

caf::expected<std::pair<tensor, uint64_t>> variable_cell::gather_rows(const tensor& ids) const {
  auto refuse = [&](af_error code, const std::string& why) {
    return make_error(code, "gather_rows of " + quoted(spec_) + " on " + spec_.device + ": " + why);
  };
  shape_type out_shape;
  if (auto err = check_gather(ids, out_shape))
    return err;
  std::lock_guard<std::mutex> guard{mtx_};
  if (!initialized_)
    return refuse(af_error::uninitialized,
                  "the variable has no value yet; the chief initializes it first");
  tensor out;
  try {
    if (auto st = kernels::host_gather(value_, ids, out); !st.ok())
      return refuse(af_error::invalid_argument, st.error);
  } catch (const std::bad_alloc&) {
    return out_of_memory(spec_, "gather_rows");
  }
  return std::make_pair(std::move(out), version_);
}

caf::error variable_cell::assign_floats(const float* data, size_t n) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (auto err = check_floats(n, "average"))
    return err;
  try {
    std::memcpy(value_.mutable_data<float>(), data, n * sizeof(float));
  } catch (const std::bad_alloc&) {
    return out_of_memory(spec_, "average");
  }
  ++version_;
  return caf::none;
}

caf::error variable_cell::copy_floats(float* dst, size_t n) const {
  std::lock_guard<std::mutex> guard{mtx_};
  if (auto err = check_floats(n, "read"))
    return err;
  std::memcpy(dst, value_.data<float>(), n * sizeof(float));
  return caf::none;
}

caf::error variable_cell::share_value(tensor& into, size_t n) const {
  std::lock_guard<std::mutex> guard{mtx_};
  if (auto err = check_floats(n, "read"))
    return err;
  into = value_; // a copy-assignment: the shape's vector keeps its storage
  return caf::none;
}

caf::expected<std::pair<tensor, std::vector<tensor>>>
variable_cell::snapshot(const std::vector<std::string>& slots,
                        const std::vector<float>& initial) const {
  std::lock_guard<std::mutex> guard{mtx_};
  if (!initialized_)
    return make_error(af_error::uninitialized,
                      "checkpoint of " + quoted(spec_) + ": the variable has no value");
  std::vector<tensor> out;
  for (size_t k = 0; k < slots.size(); ++k) {
    auto it = slots_.find(slots[k]);
    float fill = k < initial.size() ? initial[k] : 0.0f;
    out.push_back(it != slots_.end() ? it->second : tensor::filled(spec_.type, spec_.shape, fill));
  }
  return std::make_pair(value_, std::move(out));
}

caf::expected<variable_cell::update_base>
variable_cell::begin_update(const std::vector<std::string>& slots, const std::vector<float>& initial,
                            size_t n) const {
  std::lock_guard<std::mutex> guard{mtx_};
  if (auto err = check_floats(n, "gradient"))
    return err;
  update_base out;
  out.value = value_;
  out.version = version_;
  try {
    for (size_t k = 0; k < slots.size(); ++k) {
      auto it = slots_.find(slots[k]);
      float fill = k < initial.size() ? initial[k] : 0.0f;
      out.slots.push_back(it != slots_.end() ? it->second
                                             : tensor::filled(spec_.type, spec_.shape, fill));
    }
  } catch (const std::bad_alloc&) {
    return out_of_memory(spec_, "gradient");
  }
  return out;
}

caf::error variable_cell::install_update(uint64_t base_version, tensor value,
                                         const std::vector<std::string>& slot_names,
                                         std::vector<tensor> slots) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (version_ != base_version)
    return make_error(af_error::aborted,
                      "the update of " + quoted(spec_) + " was made from version "
                        + std::to_string(base_version) + ", but the variable is at version "
                        + std::to_string(version_)
                        + " now (it was assigned meanwhile): not installed");
  value_ = std::move(value);
  for (size_t i = 0; i < slot_names.size() && i < slots.size(); ++i)
    slots_[slot_names[i]] = std::move(slots[i]);
  ++version_;
  return caf::none;
}

caf::error variable_cell::restore(tensor value, const std::vector<std::string>& slot_names,
                                  std::vector<tensor> slots, const std::string& run_id) {
  auto bad = [&](const tensor& t) { return t.type() != spec_.type || t.shape() != spec_.shape; };
  if (bad(value) || slot_names.size() != slots.size())
    return make_error(af_error::shape_mismatch,
                      "restore of " + quoted(spec_) + ": the checkpoint holds "
                        + (value.empty() ? std::string{"nothing"} : value.summary())
                        + ", the variable is " + dtype_name(spec_.type) + shape_string(spec_.shape));
  for (size_t i = 0; i < slots.size(); ++i)
    if (bad(slots[i]))
      return make_error(af_error::shape_mismatch,
                        "restore of slot '" + slot_names[i] + "' of " + quoted(spec_) + ": "
                          + slots[i].summary() + " does not match the variable");
  std::lock_guard<std::mutex> guard{mtx_};
  value_ = std::move(value);
  slots_.clear();
  for (size_t i = 0; i < slots.size(); ++i)
    slots_[slot_names[i]] = std::move(slots[i]);
  initialized_ = true;
  run_id_ = run_id;
  ++version_;
  return caf::none;
}

// -- the actor -------------------------------------------------------------------

namespace {

using self_pointer = variable_cell_actor::stateful_pointer<variable_actor_state>;
using clock_type = std::chrono::steady_clock;

bool releases(const variable_info& info, const std::string& run_id) {
  return info.initialized && (run_id.empty() || info.run_id == run_id);
}

/// Answers every waiter that the cell's value now satisfies.
void release_waiters(self_pointer self) {
  auto& ws = self->state.waiters;
  if (ws.size() == 0)
    return;
  auto info = self->state.cell->info();
  ws.release(self, [&](const std::string& run_id) { return releases(info, run_id); },
             [&](const std::string&) { return info.version; });
}

/// Counts a variable op that came as a CAF message (actors/node_watch.hpp):
/// the bytes of its operand and of the value it answers with.
void count_caf_op(const tensor& operand, const tensor& value) {
  caf_variable_ops().count(operand.empty() ? 0 : operand.nbytes(),
                           value.empty() ? 0 : value.nbytes());
}

void sweep(self_pointer self) {
  const auto& spec = self->state.cell->spec();
  self->state.waiters.sweep(self, [&](const auto& w) {
    return make_error(af_error::timeout,
                      "variable " + quoted(spec) + " on " + spec.device + ": waited "
                        + std::to_string(w.timeout_ms) + " ms for its initialization"
                        + (w.key.empty() ? std::string{} : " by run '" + w.key + "'")
                        + "; is the chief running initialize()?");
  });
}

} // namespace

variable_cell_actor::behavior_type variable_impl(self_pointer self, std::shared_ptr<variable_cell> cell) {
  self->state.cell = std::move(cell);
  // A requester that dies takes its waiters with it: nobody is left to answer.
  self->set_down_handler([self](caf::down_msg& dm) { self->state.waiters.drop(dm.source); });
  // Stopped (its node shut down or ended): its waiters hear it now, not at
  // their deadline (a worker waiting init_timeout_ms for a chief whose
  // failure had stopped the ps).
  self->set_exit_handler([self](caf::exit_msg& em) {
    const auto& spec = self->state.cell->spec();
    self->state.waiters.fail_all([&](const auto&) {
      return make_error(af_error::gone, "variable " + quoted(spec) + " on " + spec.device
                                          + " stopped (" + caf::to_string(em.reason)
                                          + ": its node shut down, or it was deleted) while "
                                            "this request waited for its initialization");
    });
    self->quit(em.reason);
  });
  return {
    [self](var_op_atom, var_op op, tensor& operand, bool want_value) -> caf::result<tensor, uint64_t> {
      auto r = self->state.cell->apply(op, operand, want_value);
      if (!r)
        return std::move(r.error());
      count_caf_op(operand, r->value);
      if (r->first_value)
        release_waiters(self);
      return {std::move(r->value), r->version};
    },
    [self](var_op_atom, var_op op, tensor& operand, bool want_value,
           uint64_t request_id) -> caf::result<tensor, uint64_t> {
      auto r = self->state.cell->apply(op, operand, want_value, request_id);
      if (!r)
        return std::move(r.error());
      count_caf_op(operand, r->value);
      if (r->first_value)
        release_waiters(self);
      return {std::move(r->value), r->version};
    },
    [self](scatter_atom, std::string& op, tensor& indices, tensor& updates, bool want_value,
           uint64_t request_id) -> caf::result<tensor, uint64_t> {
      auto kind = kernels::parse_scatter_op(op);
      if (!kind)
        return make_error(af_error::invalid_argument, "variable " + quoted(self->state.cell->spec())
                                                        + ": '" + op + "' is no scatter op");
      auto r = self->state.cell->apply_scatter(*kind, indices, updates, want_value, request_id);
      if (!r)
        return std::move(r.error());
      return {std::move(r->value), r->version};
    },
    [self](gather_atom, tensor& ids) -> caf::result<tensor, uint64_t> {
      auto r = self->state.cell->gather_rows(ids);
      if (!r)
        return std::move(r.error());
      count_caf_op(ids, r->first);
      return {std::move(r->first), r->second};
    },
    [self](init_atom, initializer& init, bool only_if_uninitialized,
           std::string& run_id) -> caf::result<uint64_t> {
      auto v = self->state.cell->initialize(init, only_if_uninitialized, run_id);
      if (!v)
        return std::move(v.error());
      release_waiters(self);
      return *v;
    },
    [self](info_atom) -> variable_info {
      auto info = self->state.cell->info();
      info.waiters = static_cast<uint32_t>(self->state.waiters.size());
      return info;
    },
    [self](wait_init_atom, std::string& run_id, uint32_t timeout_ms) -> caf::result<uint64_t> {
      auto& st = self->state;
      auto info = st.cell->info();
      if (releases(info, run_id))
        return info.version;
      const auto& spec = st.cell->spec();
      if (timeout_ms == 0)
        return make_error(af_error::timeout, "variable " + quoted(spec) + " on " + spec.device
                                               + " is not initialized"
                                               + (run_id.empty() ? std::string{}
                                                                 : " by run '" + run_id + "'"));
      try {
        return st.waiters.park(self, std::move(run_id), timeout_ms);
      } catch (const std::bad_alloc&) {
        return make_error(af_error::resource_exhausted,
                          "variable " + quoted(spec) + ": no memory to park a wait_init request");
      }
    },
    [self](released_atom) { release_waiters(self); },
    [self](sweep_atom) { sweep(self); },
  };
}

} // namespace af
