#include "train/local.hpp"

#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "graph/evaluate.hpp"
#include "kernels/kernels.hpp"

namespace af::train {

outcome<std::vector<tensor>> initial_values(const std::vector<parameter>& params) {
  std::vector<tensor> out;
  for (const auto& p : params) {
    variable_spec spec{p.name, dtype::float32, p.shape, ""};
    auto v = initial_value(spec, p.init);
    if (!v)
      return v.error();
    out.push_back(std::move(*v));
  }
  return out;
}

outcome<replica_state> replica_state::make(std::vector<tensor> values, const optimizer_spec& opt) {
  replica_state st;
  auto names = slot_names(opt.kind);
  for (auto& v : values) {
    if (v.type() != dtype::float32)
      return graph_error{af_error::dtype_mismatch, "parameters must be float32, got " + v.summary()};
    std::vector<tensor> s;
    for (size_t i = 0; i < names.size(); ++i)
      s.push_back(tensor::filled(dtype::float32, v.shape(), slot_initial_value(opt, i)));
    st.slots.push_back(std::move(s));
  }
  st.values = std::move(values);
  return st;
}

graph_status replica_state::apply(const optimizer_spec& opt, const std::vector<tensor>& grads,
                                  uint64_t step) {
  if (grads.size() != values.size())
    return graph_error{af_error::invalid_argument,
                       fmt::format("{} gradients for {} parameters", grads.size(), values.size())};
  for (size_t i = 0; i < values.size(); ++i)
    if (grads[i].num_elements() != values[i].num_elements() || grads[i].type() != dtype::float32)
      return graph_error{af_error::shape_mismatch,
                         fmt::format("gradient {} is {}, its parameter {}", i, grads[i].summary(),
                                     values[i].summary())};
  for (size_t i = 0; i < values.size(); ++i) {
    float* slot_ptrs[2] = {nullptr, nullptr};
    for (size_t k = 0; k < slots[i].size() && k < 2; ++k)
      slot_ptrs[k] = slots[i][k].mutable_data<float>();
    train::apply(opt, values[i].mutable_data<float>(), slot_ptrs, grads[i].data<float>(),
          values[i].num_elements(), step);
  }
  return ok();
}

tensor flatten(const std::vector<tensor>& parts) {
  if (parts.size() == 1)
    return parts[0].reshaped({static_cast<int64_t>(parts[0].num_elements())});
  size_t total = 0;
  for (const auto& p : parts)
    total += p.num_elements();
  tensor flat{dtype::float32, {static_cast<int64_t>(total)}};
  auto* dst = flat.mutable_data<float>();
  for (const auto& p : parts) {
    if (p.num_elements() > 0)
      std::memcpy(dst, p.data<float>(), p.nbytes());
    dst += p.num_elements();
  }
  return flat;
}

outcome<std::vector<tensor>> unflatten(const tensor& flat, const std::vector<shape_type>& shapes) {
  size_t total = 0;
  for (const auto& s : shapes)
    total += static_cast<size_t>(num_elements(s));
  if (flat.type() != dtype::float32 || flat.num_elements() != total)
    return graph_error{af_error::shape_mismatch,
                       fmt::format("parameters arrived as {}, expected float32 of {} elements",
                                   flat.summary(), total)};
  std::vector<tensor> out;
  if (shapes.size() == 1) {
    out.push_back(flat.reshaped(shapes[0]));
    return out;
  }
  // Slices of the flat buffer: no copy (a parameter written later, as local
  // training does, copies then).
  size_t first = 0;
  for (const auto& s : shapes) {
    out.push_back(flat.slice(first, s));
    first += static_cast<size_t>(num_elements(s));
  }
  return out;
}

std::vector<std::pair<output, tensor>> feeds(const replica& r, const std::vector<tensor>& params,
                                             const batch& b) {
  std::vector<std::pair<output, tensor>> out;
  out.reserve(params.size() + 2);
  for (size_t i = 0; i < params.size(); ++i)
    out.emplace_back(r.params[i], params[i]);
  out.emplace_back(r.x, b.x);
  if (b.y.type() == dtype::float32 && b.y.shape().size() == 1)
    out.emplace_back(r.y, b.y.reshaped({b.y.shape()[0], 1}));
  else
    out.emplace_back(r.y, b.y);
  return out;
}

outcome<split> load_data(const train_config& c) {
  outcome<dataset> all = graph_error{};
  if (c.data == "digits") {
    all = load_digits();
  } else if (c.data == "synthetic") {
    all = synthetic_classification(c.synthetic_examples, c.synthetic_features,
                                   c.synthetic_classes, c.seed);
  } else if (c.data == "synthetic_linear") {
    all = synthetic_linear(c.synthetic_examples, c.synthetic_features, c.seed);
  } else if (c.data == "per_worker_linear") {
    // One example per worker, all of them trained on: the held-out set is
    // the same examples (its loss is the job's whole objective).
    auto all = per_worker_linear(c.synthetic_examples, c.synthetic_features, c.seed);
    return split{all, all};
  } else if (c.data.rfind("csv:", 0) == 0) {
    all = read_csv(c.data.substr(4), false, 1.0f, default_max_classes, c.max_data_bytes);
  } else if (c.data.rfind("idx:", 0) == 0) {
    auto rest = c.data.substr(4);
    auto comma = rest.find(',');
    if (comma == std::string::npos)
      return graph_error{af_error::invalid_argument,
                         "data = \"" + c.data + "\": write idx:IMAGES,LABELS"};
    all = read_idx(rest.substr(0, comma), rest.substr(comma + 1), c.max_data_bytes);
  } else {
    return graph_error{af_error::invalid_argument,
                       "data = \"" + c.data
                         + "\" is unknown: use digits, synthetic, synthetic_linear, "
                           "per_worker_linear, csv:PATH or idx:IMAGES,LABELS"};
  }
  if (!all)
    return all.error();
  return holdout(*all, c.holdout, c.seed);
}

uint64_t total_steps(const train_config& c, size_t train_examples, uint32_t workers) {
  if (c.steps > 0)
    return c.steps;
  double per_step = static_cast<double>(c.batch_size) * std::max<uint32_t>(workers, 1);
  return std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(c.epochs * train_examples / per_step)));
}

namespace {

struct local_model {
  graph g;
  std::vector<parameter> params;
  replica r;
};

outcome<local_model> make_local_model(const train_config& c, const dataset& d) {
  local_model m;
  auto params = parameters(c.model, d.features, d.classes, c.hidden, c.seed);
  if (!params)
    return params.error();
  m.params = std::move(*params);
  auto r = build_replica(m.g, m.params, c.model);
  if (!r)
    return r.error();
  m.r = std::move(*r);
  return m;
}

} // namespace

outcome<std::pair<double, double>> evaluate_local(const train_config& c, const dataset& test,
                                                  const std::vector<tensor>& params) {
  auto m = make_local_model(c, test);
  if (!m)
    return m.error();
  auto backend = kernels::make_cpu_backend();
  variable_values vars;
  auto b = whole(test);
  std::vector<output> fetches{m->r.loss};
  bool classify = m->r.correct.valid();
  if (classify)
    fetches.push_back(m->r.correct);
  auto out = evaluate(m->g, fetches, feeds(m->r, params, b), vars, *backend);
  if (!out)
    return out.error();
  double acc = classify ? (*out)[1].at(0) / static_cast<double>(test.size()) : -1;
  return std::make_pair((*out)[0].at(0), acc);
}

outcome<local_result> train_local(const train_config& c, const split& data, uint64_t steps,
                                  size_t batch_size, std::vector<tensor> init) {
  auto m = make_local_model(c, data.train);
  if (!m)
    return m.error();
  if (init.empty()) {
    auto v = initial_values(m->params);
    if (!v)
      return v.error();
    init = std::move(*v);
  }
  auto st = replica_state::make(std::move(init), c.optimizer);
  if (!st)
    return st.error();
  auto backend = kernels::make_cpu_backend();
  variable_values vars;
  batcher batches{data.train, batch_size, 0, 1, c.seed};
  std::vector<output> fetches{m->r.loss};
  fetches.insert(fetches.end(), m->r.grads.begin(), m->r.grads.end());
  local_result res;
  auto t0 = std::chrono::steady_clock::now();
  for (uint64_t step = 0; step < steps; ++step) {
    auto b = batches.at(step);
    auto out = evaluate(m->g, fetches, feeds(m->r, st->values, b), vars, *backend);
    if (!out)
      return out.error();
    res.last_loss = (*out)[0].at(0);
    std::vector<tensor> grads(out->begin() + 1, out->end());
    if (auto applied = st->apply(c.optimizer, grads, step); !applied)
      return applied.error();
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.steps = steps;
  res.examples_per_s = res.seconds > 0 ? static_cast<double>(steps * batch_size) / res.seconds : 0;
  if (data.test.size() > 0) {
    auto ev = evaluate_local(c, data.test, st->values);
    if (!ev)
      return ev.error();
    res.test_loss = ev->first;
    res.accuracy = ev->second;
  }
  res.params = std::move(st->values);
  return res;
}

} // namespace af::train
