// Static shapes (graph/shapes.hpp): the registry's shape rules where every
// input is known, partial rules in TF's manner where a dimension or a rank
// is not.
#include "graph/shapes.hpp"

#include <algorithm>
#include <set>

#include "kernels/op_registry.hpp"

namespace af {

namespace {

using infos = std::vector<static_info>;
using maybe_shape = std::optional<shape_type>;

/// Why a partial rule refuses its inputs (empty: it does not).
struct refusal {
  std::string why;
};

/// TF's sentence for two known dimensions that must be equal.
refusal unequal(int64_t a, int64_t b) {
  return {"Dimensions must be equal, but are " + std::to_string(a) + " and " + std::to_string(b)};
}

refusal wrong_rank(size_t want, size_t got) {
  return {"Shape must be rank " + std::to_string(want) + " but is rank " + std::to_string(got)};
}

bool known(int64_t d) {
  return d != any_dim;
}

/// NumPy broadcasting where a dimension may be unknown: a known dimension
/// other than 1 wins over an unknown one (as TF's BroadcastBinaryOpShapeFn).
std::optional<refusal> broadcast(const infos& in, static_info& out) {
  out.type = in[0].type ? in[0].type : in[1].type;
  if (!in[0].shape || !in[1].shape)
    return std::nullopt;
  const auto &a = *in[0].shape, &b = *in[1].shape;
  size_t rank = std::max(a.size(), b.size());
  shape_type s(rank, 1);
  for (size_t k = 0; k < rank; ++k) {
    int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1;
    int64_t db = k < b.size() ? b[b.size() - 1 - k] : 1;
    int64_t d = any_dim;
    if (da == 1)
      d = db;
    else if (db == 1)
      d = da;
    else if (known(da) && known(db) && da != db)
      return unequal(da, db);
    else
      d = known(da) ? da : db;
    s[rank - 1 - k] = d;
  }
  out.shape = std::move(s);
  return std::nullopt;
}

std::optional<refusal> matmul(const op_attrs& attrs, const infos& in, static_info& out) {
  out.type = in[0].type ? in[0].type : in[1].type;
  for (const auto& i : in)
    if (i.shape && i.shape->size() != 2)
      return wrong_rank(2, i.shape->size());
  auto dim = [](const maybe_shape& s, size_t k) { return s ? (*s)[k] : any_dim; };
  const auto &a = in[0].shape, &b = in[1].shape;
  auto rows = dim(a, attrs.transpose_a ? 1 : 0), inner_a = dim(a, attrs.transpose_a ? 0 : 1);
  auto inner_b = dim(b, attrs.transpose_b ? 1 : 0), cols = dim(b, attrs.transpose_b ? 0 : 1);
  if (known(inner_a) && known(inner_b) && inner_a != inner_b)
    return unequal(inner_a, inner_b);
  out.shape = shape_type{rows, cols};
  return std::nullopt;
}

std::optional<refusal> reduction(const op_attrs& attrs, const infos& in, static_info& out) {
  out.type = in[0].type;
  const auto& s = in[0].shape;
  if (attrs.all_axes && !attrs.keep_dims) {
    out.shape = shape_type{};
    return std::nullopt;
  }
  if (!s)
    return std::nullopt;
  if (attrs.all_axes) {
    out.shape = shape_type(s->size(), 1);
    return std::nullopt;
  }
  auto rank = static_cast<int32_t>(s->size());
  if (attrs.axis < -rank || attrs.axis >= rank)
    return refusal{"Invalid reduction dimension " + std::to_string(attrs.axis) + " for input with "
                   + std::to_string(rank) + " dimensions"};
  auto axis = static_cast<size_t>(attrs.axis < 0 ? attrs.axis + rank : attrs.axis);
  shape_type r = *s;
  if (attrs.keep_dims)
    r[axis] = 1;
  else
    r.erase(r.begin() + static_cast<std::ptrdiff_t>(axis));
  out.shape = std::move(r);
  return std::nullopt;
}

/// (logits [batch, classes], labels [batch]) -> [batch].
std::optional<refusal> xent(const infos& in, static_info& out) {
  out.type = in[0].type;
  const auto &logits = in[0].shape, &labels = in[1].shape;
  if (logits && logits->size() != 2)
    return wrong_rank(2, logits->size());
  if (labels && labels->size() != 1)
    return wrong_rank(1, labels->size());
  auto a = logits ? (*logits)[0] : any_dim, b = labels ? (*labels)[0] : any_dim;
  if (known(a) && known(b) && a != b)
    return unequal(a, b);
  out.shape = shape_type{known(a) ? a : b};
  return std::nullopt;
}

/// (params, ids) -> ids.shape + params.shape[1:].
std::optional<refusal> gather(const infos& in, static_info& out) {
  out.type = in[0].type;
  const auto &params = in[0].shape, &ids = in[1].shape;
  if (params && params->empty())
    return refusal{"Shape must be at least rank 1 but is rank 0"};
  if (!params || !ids)
    return std::nullopt;
  shape_type r = *ids;
  r.insert(r.end(), params->begin() + 1, params->end());
  out.shape = std::move(r);
  return std::nullopt;
}

/// (a, b) -> a's rows then b's.
std::optional<refusal> concat(const infos& in, static_info& out) {
  out.type = in[0].type ? in[0].type : in[1].type;
  const auto &a = in[0].shape, &b = in[1].shape;
  for (const auto& s : {a, b})
    if (s && s->empty())
      return refusal{"Shape must be at least rank 1 but is rank 0"};
  if (!a || !b)
    return std::nullopt;
  if (a->size() != b->size())
    return refusal{"Shape must be rank " + std::to_string(a->size()) + " but is rank "
                   + std::to_string(b->size())};
  shape_type r = *a;
  r[0] = known((*a)[0]) && known((*b)[0]) ? (*a)[0] + (*b)[0] : any_dim;
  for (size_t k = 1; k < r.size(); ++k) {
    auto da = (*a)[k], db = (*b)[k];
    if (known(da) && known(db) && da != db)
      return unequal(da, db);
    r[k] = known(da) ? da : db;
  }
  out.shape = std::move(r);
  return std::nullopt;
}

/// (data, segment_ids, num_segments) -> [?] + data.shape[rank(segment_ids):].
void segment_sum(const infos& in, static_info& out) {
  out.type = in[0].type;
  const auto &data = in[0].shape, &ids = in[1].shape;
  if (!data || !ids || ids->size() > data->size())
    return;
  shape_type r{any_dim};
  r.insert(r.end(), data->begin() + static_cast<std::ptrdiff_t>(ids->size()), data->end());
  out.shape = std::move(r);
}

const std::set<std::string>& elementwise_ops() {
  static const std::set<std::string> ops = {
    "neg", "exp", "log", "relu", "sigmoid", "tanh", "square", "sqrt", "softplus", "softmax",
    "log_softmax", "ones_like", "relu_grad", "sigmoid_grad", "tanh_grad", "softmax_grad",
    "log_softmax_grad"};
  return ops;
}

/// The partial rule of `kind`; false when there is none (the output is then
/// unknown unless every input is known).
bool partial_rule(const std::string& kind, const op_attrs& attrs, const infos& in, static_info& out,
                  std::optional<refusal>& refused) {
  if (kind == "add" || kind == "sub" || kind == "mul" || kind == "div")
    refused = broadcast(in, out);
  else if (kind == "matmul")
    refused = matmul(attrs, in, out);
  else if (kind == "sum" || kind == "mean" || kind == "max")
    refused = reduction(attrs, in, out);
  else if (kind == "softmax_xent")
    refused = xent(in, out);
  else if (kind == "gather")
    refused = gather(in, out);
  else if (kind == "concat")
    refused = concat(in, out);
  else if (elementwise_ops().count(kind) > 0)
    out = in[0];
  else if (kind == "unique" || kind == "range") // a length known when it runs
    out = {kind == "range" ? std::optional<dtype>(dtype::int32) : in[0].type, shape_type{any_dim}};
  else if (kind == "unique_idx" || kind == "shard_of")
    out = {dtype::int32, in[0].shape};
  else if (kind == "row_in_shard")
    out = in[0];
  else if (kind == "unsorted_segment_sum")
    segment_sum(in, out);
  else if (kind == "size")
    out = {dtype::int32, shape_type{}};
  else if (kind == "correct_count")
    out = {dtype::float32, shape_type{}};
  else if (kind == "sum_to")
    out = {in[0].type, in[1].shape};
  else if (kind == "sum_grad" || kind == "mean_grad" || kind == "max_grad" || kind == "gather_grad"
           || kind == "softmax_xent_grad")
    out = in[1];
  else
    return false;
  return true;
}

std::string input_shapes(const infos& in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i)
    out += (i > 0 ? ", " : "") + static_shape_string(in[i].shape);
  return out;
}

graph_error refuse(const std::string& why, const std::string& kind, const infos& in,
                   const std::string& name) {
  return graph_error{af_error::shape_mismatch,
                     why + " for '" + name + "' (op: '" + kind
                       + "') with input shapes: " + input_shapes(in) + "."};
}

} // namespace

bool static_info::fully_defined() const {
  return shape && std::none_of(shape->begin(), shape->end(), [](int64_t d) { return d < 0; });
}

std::string static_shape_string(const std::optional<shape_type>& shape) {
  if (!shape)
    return "?";
  std::string out = "[";
  for (size_t i = 0; i < shape->size(); ++i)
    out += (i > 0 ? "," : "") + ((*shape)[i] < 0 ? std::string("?") : std::to_string((*shape)[i]));
  return out + "]";
}

outcome<static_info> infer_static(const std::string& kind, const op_attrs& attrs,
                                  const std::vector<static_info>& in, const std::string& name) {
  const auto* def = kernels::find_op_def(kind);
  if (def == nullptr || !def->takes(in.size()))
    return static_info{}; // running names what is wrong
  static_info out;
  std::optional<refusal> refused;
  bool have_rule = partial_rule(kind, attrs, in, out, refused);
  if (refused)
    return refuse(refused->why, kind, in, name);
  bool all_known = std::all_of(in.begin(), in.end(), [](const static_info& i) {
    return i.type && i.fully_defined();
  });
  if (!all_known)
    return have_rule ? out : static_info{};
  // Every input known: the registry's own rule has the last word.
  std::vector<kernels::value_info> values;
  for (const auto& i : in)
    values.push_back({*i.type, *i.shape});
  kernels::value_info v;
  auto st = kernels::infer_op(kind, attrs, values, v);
  if (st.ok())
    return static_info{v.type, v.shape};
  if (st.what == kernels::status::kind::shape)
    return refuse(st.error, kind, in, name);
  return have_rule ? out : static_info{}; // a dtype the rule refuses: running says so
}

const static_info& static_shapes::of(const graph& g, output o) {
  static const static_info nothing;
  if (!g.contains(o))
    return nothing;
  while (known_.size() <= static_cast<size_t>(o.id)) {
    const auto& n = g.nodes()[known_.size()];
    static_info info;
    switch (n.kind) {
      case node_kind::variable:
        info = {n.spec.type, n.spec.shape};
        break;
      case node_kind::constant:
        if (!n.value.empty())
          info = {n.value.type(), n.value.shape()};
        break;
      case node_kind::placeholder:
        info = {n.feed_type, n.feed_shape};
        break;
      case node_kind::update: // fetched, the variable's new value
        if (!n.inputs.empty() && static_cast<size_t>(n.inputs[0]) < known_.size())
          info = known_[static_cast<size_t>(n.inputs[0])];
        break;
      case node_kind::compute: {
        infos in;
        bool inputs_ok = true;
        for (auto i : n.inputs) {
          inputs_ok = inputs_ok && i >= 0 && static_cast<size_t>(i) < known_.size();
          if (inputs_ok)
            in.push_back(known_[static_cast<size_t>(i)]);
        }
        if (inputs_ok)
          if (auto r = infer_static(n.op, n.attrs, in, n.name))
            info = *r;
        break;
      }
    }
    known_.push_back(std::move(info));
  }
  return known_[static_cast<size_t>(o.id)];
}

} // namespace af
