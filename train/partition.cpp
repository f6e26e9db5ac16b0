#include "train/partition.hpp"
#include "train/local.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

namespace af::train {

namespace {

int64_t rows_of(const shape_type& shape) {
  return shape.empty() ? 1 : shape[0];
}

/// Bytes of one row (a scalar is one row of one element).
size_t row_bytes(const shape_type& shape, dtype type) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d)
    n *= shape[d];
  return static_cast<size_t>(n) * dtype_size(type);
}

} // namespace

std::vector<size_t> partition_plan::on_ps(uint32_t k) const {
  std::vector<size_t> out;
  for (size_t i = 0; i < pieces.size(); ++i)
    if (pieces[i].ps == k)
      out.push_back(i);
  return out;
}

table_layout table_layout_of(const partition_plan& plan, size_t param) {
  table_layout out;
  for (const auto& p : plan.pieces) // plan order is part order within a parameter
    if (p.param == param) {
      out.shard_rows.push_back(p.row_end - p.row_begin);
      out.ps.push_back(p.ps);
    }
  return out;
}

std::vector<uint64_t> partition_plan::bytes_per_ps() const {
  std::vector<uint64_t> out(ps_tasks, 0);
  for (const auto& p : pieces)
    out[p.ps] += p.bytes;
  return out;
}

uint32_t partitions_for(const shape_type& shape, uint64_t bytes, uint32_t max_partitions,
                        uint64_t min_slice_bytes) {
  uint64_t k = max_partitions;
  k = std::min<uint64_t>(k, static_cast<uint64_t>(std::max<int64_t>(1, rows_of(shape))));
  k = std::min<uint64_t>(k, bytes / std::max<uint64_t>(1, min_slice_bytes));
  return static_cast<uint32_t>(std::max<uint64_t>(1, k));
}

outcome<partition_plan> plan_partitions(const std::vector<parameter>& params, uint32_t ps_tasks,
                                        uint32_t max_partitions, uint64_t min_slice_bytes) {
  if (ps_tasks == 0)
    return graph_error{af_error::invalid_argument,
                       "partitioning the variables over 0 ps tasks: the job needs a ps task"};
  if (max_partitions == 0 || min_slice_bytes == 0)
    return graph_error{af_error::invalid_argument,
                       fmt::format("max_partitions = {} and min_slice_bytes = {}: both must be at "
                                   "least 1",
                                   max_partitions, min_slice_bytes)};
  partition_plan plan;
  plan.ps_tasks = ps_tasks;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& shape = params[i].shape;
    auto n = num_elements(shape);
    if (n < 0)
      return graph_error{af_error::invalid_argument,
                         fmt::format("parameter '{}' has shape {}: a negative dimension",
                                     params[i].name, shape_string(shape))};
    uint64_t bytes = static_cast<uint64_t>(n) * dtype_size(dtype::float32);
    uint32_t k = partitions_for(shape, bytes, max_partitions, min_slice_bytes);
    int64_t rows = rows_of(shape);
    int64_t base = rows / k, extra = rows % k, begin = 0;
    for (uint32_t part = 0; part < k; ++part) {
      piece p;
      p.param = i;
      p.part = part;
      p.parts = k;
      p.name = k == 1 ? params[i].name : fmt::format("{}/part_{}", params[i].name, part);
      p.row_begin = begin;
      p.row_end = begin + base + (part < extra ? 1 : 0);
      begin = p.row_end;
      p.logical_shape = shape;
      p.shape = shape;
      if (!shape.empty())
        p.shape[0] = p.row_end - p.row_begin;
      p.bytes = static_cast<uint64_t>(std::max<int64_t>(0, num_elements(p.shape)))
                * dtype_size(dtype::float32);
      plan.pieces.push_back(std::move(p));
    }
  }
  if (max_partitions == 1) {
    // The placement from before partitioning, so old jobs keep theirs.
    for (auto& p : plan.pieces)
      p.ps = static_cast<uint32_t>(p.param % ps_tasks);
    return plan;
  }
  // Largest first onto the lightest ps: the bytes per ps then differ by at
  // most the largest piece (each placement lands on the minimum).
  std::vector<size_t> order(plan.pieces.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return plan.pieces[a].bytes > plan.pieces[b].bytes;
  });
  std::vector<uint64_t> load(ps_tasks, 0);
  for (auto i : order) {
    auto lightest = static_cast<uint32_t>(std::min_element(load.begin(), load.end()) - load.begin());
    plan.pieces[i].ps = lightest;
    load[lightest] += plan.pieces[i].bytes;
  }
  return plan;
}

tensor slice_rows(const tensor& t, int64_t begin, int64_t end) {
  const auto& shape = t.shape();
  if (begin == 0 && end == rows_of(shape))
    return t;
  shape_type out_shape = shape;
  out_shape[0] = end - begin;
  tensor out{t.type(), out_shape};
  auto row = row_bytes(shape, t.type());
  if (out.nbytes() > 0)
    std::memcpy(out.mutable_bytes(), t.bytes() + static_cast<size_t>(begin) * row, out.nbytes());
  return out;
}

outcome<tensor> slice_of(const piece& p, const tensor& logical) {
  if (logical.shape() != p.logical_shape)
    return graph_error{af_error::shape_mismatch,
                       fmt::format("piece '{}' is rows {}..{} of a {} parameter, but the value to "
                                   "cut is {}",
                                   p.name, p.row_begin, p.row_end, shape_string(p.logical_shape),
                                   logical.summary())};
  return slice_rows(logical, p.row_begin, p.row_end);
}

graph_status put_piece(const piece& p, tensor value, tensor& logical) {
  if (value.shape() != p.shape)
    return graph_error{af_error::shape_mismatch,
                       fmt::format("piece '{}' should be {}, got {}", p.name,
                                   shape_string(p.shape), value.summary())};
  if (p.whole()) {
    logical = std::move(value);
    return ok();
  }
  if (logical.empty() || logical.shape() != p.logical_shape || logical.type() != value.type())
    logical = tensor{value.type(), p.logical_shape};
  auto row = row_bytes(p.logical_shape, value.type());
  if (value.nbytes() > 0)
    std::memcpy(logical.mutable_bytes() + static_cast<size_t>(p.row_begin) * row, value.bytes(),
                value.nbytes());
  return ok();
}

outcome<std::vector<tensor>> split_into_pieces(const partition_plan& plan,
                                               const std::vector<tensor>& logical) {
  std::vector<tensor> out;
  out.reserve(plan.pieces.size());
  for (const auto& p : plan.pieces) {
    if (p.param >= logical.size())
      return graph_error{af_error::invalid_argument,
                         fmt::format("piece '{}' is of parameter {}, but only {} values were given",
                                     p.name, p.param, logical.size())};
    auto s = slice_of(p, logical[p.param]);
    if (!s)
      return s.error();
    out.push_back(std::move(*s));
  }
  return out;
}

outcome<std::vector<tensor>> assemble_pieces(const partition_plan& plan, size_t params,
                                             const std::vector<tensor>& pieces) {
  if (pieces.size() != plan.pieces.size())
    return graph_error{af_error::invalid_argument,
                       fmt::format("{} piece values for a plan of {} pieces", pieces.size(),
                                   plan.pieces.size())};
  std::vector<tensor> out(params);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto& p = plan.pieces[i];
    if (p.param >= params)
      return graph_error{af_error::invalid_argument,
                         fmt::format("piece '{}' is of parameter {}, beyond the {} asked for",
                                     p.name, p.param, params)};
    if (auto st = put_piece(p, pieces[i], out[p.param]); !st)
      return st.error();
  }
  return out;
}

outcome<std::vector<saved_variable>> logical_variables(const std::vector<parameter>& params,
                                                       const std::vector<piece>& pieces,
                                                       const std::vector<saved_variable>& saved) {
  std::vector<saved_variable> out(params.size());
  std::vector<bool> seen(params.size(), false);
  for (const auto& p : pieces) {
    if (p.param >= params.size())
      return graph_error{af_error::invalid_argument,
                         fmt::format("piece '{}' is of parameter {}, but the model has {}", p.name,
                                     p.param, params.size())};
    auto it = std::find_if(saved.begin(), saved.end(),
                           [&](const saved_variable& v) { return v.name == p.name; });
    if (it == saved.end())
      return graph_error{af_error::invalid_argument,
                         fmt::format("the state saved has no variable '{}' (piece {} of {} of "
                                     "'{}')",
                                     p.name, p.part, p.parts, params[p.param].name)};
    auto& v = out[p.param];
    v.name = params[p.param].name;
    seen[p.param] = true;
    if (auto st = put_piece(p, it->value, v.value); !st)
      return st.error();
    for (const auto& [slot, value] : it->slots)
      if (auto st = put_piece(p, value, v.slots[slot]); !st)
        return graph_error{st.error().code, "slot '" + slot + "': " + st.error().what};
  }
  std::vector<saved_variable> present;
  for (size_t i = 0; i < out.size(); ++i)
    if (seen[i])
      present.push_back(std::move(out[i]));
  return present;
}

outcome<saved_variable> piece_of_checkpoint(const piece& p, const std::string& param_name,
                                            const checkpoint& ck,
                                            const std::vector<std::string>& slot_names,
                                            const std::string& where,
                                            const std::vector<float>& starts) {
  auto it = std::find_if(ck.variables.begin(), ck.variables.end(),
                         [&](const saved_variable& v) { return v.name == param_name; });
  if (it == ck.variables.end())
    return graph_error{af_error::invalid_argument,
                       fmt::format("the checkpoint in {} has no variable '{}': it was written by "
                                   "another model",
                                   where, param_name)};
  if (it->value.shape() != p.logical_shape)
    return graph_error{af_error::shape_mismatch,
                       fmt::format("the checkpoint in {} holds variable '{}' as {}, but the "
                                   "model's is {}: it was written by another model (restore it "
                                   "with the config it was trained with)",
                                   where, param_name, it->value.summary(),
                                   shape_string(p.logical_shape))};
  saved_variable out;
  out.name = p.name;
  out.value = slice_rows(it->value, p.row_begin, p.row_end);
  for (size_t k = 0; k < slot_names.size(); ++k) {
    const auto& sn = slot_names[k];
    auto sl = it->slots.find(sn);
    if (sl == it->slots.end()) {
      out.slots[sn] = tensor::filled(dtype::float32, p.shape, k < starts.size() ? starts[k] : 0);
      continue;
    }
    if (sl->second.shape() != p.logical_shape)
      return graph_error{af_error::shape_mismatch,
                         fmt::format("the checkpoint in {} holds slot '{}' of variable '{}' as {}, "
                                     "but the variable is {}: the file is inconsistent",
                                     where, sn, param_name, sl->second.summary(),
                                     shape_string(p.logical_shape))};
    out.slots[sn] = slice_rows(sl->second, p.row_begin, p.row_end);
  }
  return out;
}

std::vector<tensor> rows_for(const std::vector<piece>& pieces, const std::vector<tensor>& values) {
  std::vector<tensor> out;
  out.reserve(pieces.size());
  for (const auto& p : pieces)
    out.push_back(slice_rows(values[p.param], p.row_begin, p.row_end));
  return out;
}

graph_status take_pieces(const std::vector<piece>& pieces, const tensor& flat,
                         std::vector<tensor>& into) {
  // The common case as unflatten(flat, the pieces' shapes) would cut it,
  // each part put as it is cut: no vector of shapes nor of parts a step (a
  // worker takes its answer so).
  size_t total = 0;
  for (const auto& p : pieces)
    total += static_cast<size_t>(num_elements(p.shape));
  if (flat.type() == dtype::float32 && flat.num_elements() == total) {
    size_t first = 0;
    for (const auto& p : pieces) {
      auto part = pieces.size() == 1 ? flat.reshaped(p.shape) : flat.slice(first, p.shape);
      first += static_cast<size_t>(num_elements(p.shape));
      if (auto ok = put_piece(p, std::move(part), into[p.param]); !ok)
        return ok;
    }
    return std::monostate{};
  }
  // Anything else goes through unflatten, which names what arrived.
  std::vector<shape_type> shapes;
  for (const auto& p : pieces)
    shapes.push_back(p.shape);
  auto parts = unflatten(flat, shapes);
  if (!parts)
    return parts.error();
  for (size_t j = 0; j < pieces.size(); ++j)
    if (auto ok = put_piece(pieces[j], std::move((*parts)[j]), into[pieces[j].param]); !ok)
      return ok;
  return std::monostate{};
}

} // namespace af::train
