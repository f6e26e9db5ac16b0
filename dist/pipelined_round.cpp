// A pipelined sync round (dist/pipelined_round.hpp): chunks averaged and
// applied into the round's own buffers as every member's copy arrives,
// installed into the variables at commit.
#include "dist/pipelined_round.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "messages/error.hpp"
#include "train/optimizer_into.hpp"

namespace af {

caf::error pipelined_round::begin(std::vector<variable> vars, const train::optimizer_spec& opt,
                                  const std::vector<std::string>& slot_names, uint64_t step,
                                  std::vector<uint32_t> members, size_t chunk_floats) {
  if (auto err = prepare(std::move(vars), opt, slot_names, std::move(members), chunk_floats))
    return err;
  return start(step);
}

caf::error pipelined_round::prepare(std::vector<variable> vars, const train::optimizer_spec& opt,
                                    const std::vector<std::string>& slot_names,
                                    std::vector<uint32_t> members, size_t chunk_floats) {
  vars_.clear();
  pushes_.clear();
  opt_ = opt;
  slot_names_ = slot_names;
  step_ = 0;
  chunk_ = std::max<size_t>(chunk_floats, 1);
  members_ = std::move(members);
  applied_ = 0;
  started_ = false;
  phase_ = phase::running;
  why_ = caf::error{};
  total_ = 0;
  for (auto& v : vars) {
    total_ = std::max(total_, v.offset + v.size);
    var_state s;
    s.v = std::move(v);
    vars_.push_back(std::move(s));
  }
  try {
    for (size_t m = 0; m < members_.size(); ++m)
      pushes_.emplace_back(dtype::float32, shape_type{static_cast<int64_t>(total_)});
  } catch (const std::bad_alloc&) {
    vars_.clear();
    pushes_.clear();
    return out_of_memory();
  }
  arrived_.assign(members_.size(), 0);
  joined_.assign(members_.size(), false);
  sum_members();
  return caf::none;
}

caf::error pipelined_round::start(uint64_t step) {
  if (started_ || phase_ != phase::running)
    return caf::none;
  step_ = step;
  std::vector<float> initial;
  for (size_t k = 0; k < slot_names_.size(); ++k)
    initial.push_back(train::slot_initial_value(opt_, k));
  try {
    for (auto& s : vars_) {
      auto base = s.v.cell->begin_update(slot_names_, initial, s.v.size);
      if (!base) {
        for (auto& t : vars_)
          t = var_state{std::move(t.v), {}, {}, {}};
        return std::move(base.error());
      }
      s.base = std::move(*base);
      s.value = tensor{dtype::float32, s.base.value.shape()};
      s.slots.clear();
      for (const auto& slot : s.base.slots)
        s.slots.emplace_back(dtype::float32, slot.shape());
    }
  } catch (const std::bad_alloc&) {
    for (auto& t : vars_)
      t = var_state{std::move(t.v), {}, {}, {}};
    return out_of_memory();
  }
  consts_ = train::constants_at(opt_, step_);
  started_ = true;
  apply_ready();
  return caf::none;
}

caf::error pipelined_round::out_of_memory() const {
  return make_error(af_error::resource_exhausted,
                    fmt::format("a pipelined round of {} floats and {} members: out of memory",
                                total_, members_.size()));
}

void pipelined_round::sum_members() {
  // Every member's push by reference, in members_ order: mean_into reads
  // only the chunks that have arrived. No cap on what is kept by reference
  // (the round holds the pushes anyway).
  sum_ = aggregation_round<int>{static_cast<uint32_t>(members_.size()), total_,
                                std::numeric_limits<size_t>::max()};
  static const auto held = std::make_shared<int>(0); // the round owns the pushes
  std::vector<size_t> offsets, sizes;
  for (const auto& s : vars_) {
    offsets.push_back(s.v.offset);
    sizes.push_back(s.v.size);
  }
  for (auto& push : pushes_) {
    std::vector<const float*> parts;
    for (const auto& s : vars_)
      parts.push_back(push.data<float>() + s.v.offset);
    sum_.add(parts, offsets, sizes, held);
  }
}

void pipelined_round::joined(uint32_t worker) {
  auto it = std::find(members_.begin(), members_.end(), worker);
  if (it != members_.end())
    joined_[static_cast<size_t>(it - members_.begin())] = true;
}

bool pipelined_round::abstain(uint32_t worker) {
  auto it = std::find(members_.begin(), members_.end(), worker);
  if (phase_ != phase::running || it == members_.end())
    return false;
  auto m = static_cast<size_t>(it - members_.begin());
  // A member that has not joined has sent nothing, so no chunk was applied
  // (each needs every member's): the mean can still leave it out.
  if (joined_[m] || members_.size() == 1)
    return false;
  members_.erase(it);
  pushes_.erase(pushes_.begin() + static_cast<std::ptrdiff_t>(m));
  arrived_.erase(arrived_.begin() + static_cast<std::ptrdiff_t>(m));
  joined_.erase(joined_.begin() + static_cast<std::ptrdiff_t>(m));
  sum_members();
  apply_ready();
  return true;
}

bool pipelined_round::is_member(uint32_t worker) const {
  return std::find(members_.begin(), members_.end(), worker) != members_.end();
}

float* pipelined_round::buffer(uint32_t worker) {
  auto it = std::find(members_.begin(), members_.end(), worker);
  if (it == members_.end())
    return nullptr;
  return pushes_[static_cast<size_t>(it - members_.begin())].mutable_data<float>();
}

size_t pipelined_round::arrived(uint32_t worker, size_t floats) {
  auto it = std::find(members_.begin(), members_.end(), worker);
  if (it == members_.end() || phase_ != phase::running)
    return applied_;
  auto& got = arrived_[static_cast<size_t>(it - members_.begin())];
  got = std::max(got, std::min(floats, total_));
  apply_ready();
  return applied_;
}

void pipelined_round::apply_ready() {
  if (!started_)
    return; // chunks are kept until start()
  size_t all = *std::min_element(arrived_.begin(), arrived_.end());
  size_t ready = all == total_ ? chunks() : all / chunk_;
  for (; applied_ < ready; ++applied_)
    apply_range(applied_ * chunk_, std::min((applied_ + 1) * chunk_, total_));
}

void pipelined_round::apply_range(size_t from, size_t to) {
  // variable_cell::apply_blocks' operations, written into the round's copy
  // in one pass: the old value and slots read where they lie
  // (train::apply_into: apply()'s formulas, so the same bits).
  float buf[variable_cell::apply_block];
  for (auto& s : vars_) {
    size_t lo = std::max(from, s.v.offset), hi = std::min(to, s.v.offset + s.v.size);
    for (size_t at = lo; at < hi; at += variable_cell::apply_block) {
      size_t len = std::min(variable_cell::apply_block, hi - at);
      size_t local = at - s.v.offset;
      float* var = s.value.mutable_data<float>() + local;
      const float* old_var = s.base.value.data<float>() + local;
      float* slots[2] = {nullptr, nullptr};
      const float* old_slots[2] = {nullptr, nullptr};
      for (size_t k = 0; k < s.slots.size() && k < 2; ++k) {
        slots[k] = s.slots[k].mutable_data<float>() + local;
        old_slots[k] = s.base.slots[k].data<float>() + local;
      }
      // One member (an async push, or a round the others abstained from):
      // its gradient as it is, which is its mean (times 1: the same bits).
      const float* grad = buf;
      if (pushes_.size() == 1)
        grad = pushes_[0].data<float>() + at;
      else
        sum_.mean_into(at, len, buf);
      train::apply_into(consts_, old_var, old_slots, var, slots, grad, len);
    }
  }
}

void pipelined_round::answer_pieces(size_t from, size_t to, std::vector<iovec>& out) const {
  for (const auto& s : vars_) {
    size_t lo = std::max(from, s.v.offset), hi = std::min(to, s.v.offset + s.v.size);
    if (lo >= hi)
      continue;
    const float* p = s.value.data<float>() + (lo - s.v.offset);
    out.push_back({const_cast<float*>(p), (hi - lo) * sizeof(float)});
  }
}

caf::error pipelined_round::commit() {
  if (phase_ != phase::running)
    return why_;
  if (applied_ != chunks()) {
    abort(make_error(af_error::internal,
                     fmt::format("a pipelined round committed with {} of its {} chunks applied",
                                 applied_, chunks())));
    return why_;
  }
  // All or none: a cell assigned meanwhile is found before any is installed
  // (the aggregator's lock keeps its own updates out; an assign is the only
  // other writer: one between this check and the installs below is refused
  // by install_update and said, the variables before it having taken the
  // update, as the store-and-forward round's update_each says of a failure).
  for (auto& s : vars_) {
    if (s.v.cell->info().version != s.base.version) {
      abort(make_error(af_error::aborted,
                       fmt::format("variable '{}' was assigned during the round (version {} at "
                                   "its start, {} now): the round's update is not installed",
                                   s.v.name, s.base.version, s.v.cell->info().version)));
      return why_;
    }
  }
  for (auto& s : vars_) {
    // The cell takes shared copies: this round's answer still reads them,
    // so the next update of the variable writes a copy (copy on write)
    // until the answer is sent and the round let go.
    if (auto err = s.v.cell->install_update(s.base.version, s.value, slot_names_, s.slots)) {
      abort(err);
      return why_;
    }
    s.base = variable_cell::update_base{}; // the old value and slots are let go
  }
  phase_ = phase::committed;
  sum_.release();
  pushes_.clear();
  return caf::none;
}

void pipelined_round::abort(caf::error why) {
  if (phase_ != phase::running)
    return;
  phase_ = phase::aborted;
  why_ = std::move(why);
  sum_.release();
}

bool pipelined_round::all_arrived() const {
  return std::all_of(arrived_.begin(), arrived_.end(), [&](size_t a) { return a == total_; });
}

std::string pipelined_round::behind() const {
  std::vector<std::string> out;
  for (size_t m = 0; m < members_.size(); ++m)
    if (arrived_[m] < total_)
      out.push_back(fmt::format("worker {} ({} of {} floats)", members_[m], arrived_[m], total_));
  return fmt::format("{}", fmt::join(out, ", "));
}

std::string pipelined_round::where(size_t index) const {
  for (const auto& s : vars_)
    if (index >= s.v.offset && index < s.v.offset + s.v.size)
      return fmt::format("variable '{}' element {}", s.v.name, index - s.v.offset);
  return fmt::format("flat element {}", index);
}

} // namespace af
