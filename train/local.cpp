#include "train/local.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <unordered_map>

#include <fmt/format.h>

#include "graph/evaluate.hpp"
#include "kernels/kernels.hpp"
#include "train/clicks.hpp"
#include "train/config_model.hpp"
#include "train/memory_data.hpp"
#include "train/metrics.hpp"
#include "train/recommender.hpp"

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
  } else if (c.data.rfind(memory_data_prefix, 0) == 0) {
    auto name = c.data.substr(std::strlen(memory_data_prefix));
    auto held = find_memory_dataset(name);
    if (!held)
      return graph_error{af_error::not_found,
                         "data = \"" + c.data + "\": this process holds no data set \"" + name
                           + "\" (a Python program's af.train.Job(..., data=(x, y)) registers "
                             "one for its job)"};
    return holdout(*held, c.holdout, c.seed); // the one copy every set gets: the split
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

// ---- A sparse model in one process -------------------------------------------

namespace {

/// One table's part of a batch: its distinct ids in the order they first
/// occur, each example's place among them, and their rows read from the
/// table. The buffers are kept across steps.
struct table_batch {
  std::unordered_map<int64_t, int32_t> seen;
  std::vector<int64_t> unique;
  std::vector<int32_t> index;
};

/// Fills `tb` for examples `picks` of `ids` and returns their rows [u, width].
outcome<tensor> gather_unique(const tensor& table, const std::string& name,
                              const std::vector<int64_t>& ids, const std::vector<size_t>& picks,
                              table_batch& tb) {
  const int64_t rows = table.shape()[0], width = table.shape()[1];
  tb.seen.clear();
  tb.unique.clear();
  tb.index.clear();
  for (size_t e : picks) {
    int64_t id = ids[e];
    if (id < 0 || id >= rows)
      return graph_error{af_error::invalid_argument,
                         fmt::format("example {} looks up row {} of table '{}': not in [0, {})", e,
                                     id, name, rows)};
    auto [it, fresh] = tb.seen.emplace(id, static_cast<int32_t>(tb.unique.size()));
    if (fresh)
      tb.unique.push_back(id);
    tb.index.push_back(it->second);
  }
  tensor out(dtype::float32, {static_cast<int64_t>(tb.unique.size()), width});
  float* dst = out.mutable_data<float>();
  const float* src = table.data<float>();
  for (size_t r = 0; r < tb.unique.size(); ++r)
    std::memcpy(dst + r * width, src + tb.unique[r] * width, sizeof(float) * width);
  return out;
}

/// Checks that `b` has one id list per table of `m` and one label per example.
graph_status check_examples(const sparse_model& m, const sparse_batch& b, const char* what) {
  if (b.ids.size() != m.tables().size())
    return graph_error{af_error::invalid_argument,
                       fmt::format("the {} examples have ids of {} tables, the model {}", what,
                                   b.ids.size(), m.tables().size())};
  for (const auto& ids : b.ids)
    if (ids.size() != b.labels.size())
      return graph_error{af_error::invalid_argument,
                         fmt::format("the {} examples have {} labels and a table with {} ids",
                                     what, b.labels.size(), ids.size())};
  return ok();
}

/// One forward (and backward, with `want_grads`) pass of `m` on examples
/// `picks`: their rows gathered per table into `tbs`.
outcome<sparse_step_result> run_step(sparse_model& m, const sparse_state& st,
                                     const sparse_batch& data, const std::vector<size_t>& picks,
                                     std::vector<table_batch>& tbs, std::vector<float>& labels,
                                     bool want_grads) {
  auto specs = m.tables();
  std::vector<tensor> rows;
  std::vector<std::vector<int32_t>> index;
  for (size_t t = 0; t < specs.size(); ++t) {
    auto r = gather_unique(st.tables.values[t], specs[t].name, data.ids[t], picks, tbs[t]);
    if (!r)
      return r.error();
    rows.push_back(std::move(*r));
    index.push_back(tbs[t].index);
  }
  labels.clear();
  for (size_t e : picks)
    labels.push_back(data.labels[e]);
  return m.step(rows, index, st.dense.values, labels, want_grads);
}

} // namespace

outcome<sparse_state> sparse_state::make(const sparse_model& m, const optimizer_spec& opt) {
  std::vector<parameter> tables;
  for (const auto& t : m.tables())
    tables.push_back(parameter{t.name, {t.rows, t.width}, t.init});
  auto tv = initial_values(tables);
  if (!tv)
    return tv.error();
  auto dv = initial_values(m.dense_parameters());
  if (!dv)
    return dv.error();
  auto ts = replica_state::make(std::move(*tv), opt);
  if (!ts)
    return ts.error();
  auto ds = replica_state::make(std::move(*dv), opt);
  if (!ds)
    return ds.error();
  return sparse_state{std::move(*ts), std::move(*ds)};
}

outcome<std::vector<float>> predict_sparse(sparse_model& m, const sparse_state& st,
                                           const sparse_batch& examples, size_t batch) {
  if (auto c = check_examples(m, examples, "scored"); !c)
    return c.error();
  std::vector<table_batch> tbs(m.tables().size());
  std::vector<float> labels, out;
  std::vector<size_t> picks;
  for (size_t at = 0; at < examples.labels.size(); at += batch) {
    picks.resize(std::min(batch, examples.labels.size() - at));
    std::iota(picks.begin(), picks.end(), at);
    auto r = run_step(m, st, examples, picks, tbs, labels, false);
    if (!r)
      return r.error();
    out.insert(out.end(), r->predictions.begin(), r->predictions.end());
  }
  return out;
}

example_order::example_order(size_t n, uint64_t seed) : order_(n), rng_(seed) {
  std::iota(order_.begin(), order_.end(), size_t{0});
}

size_t example_order::at(uint64_t pos) {
  auto n = order_.size();
  while (pos / n >= epoch_) {
    std::shuffle(order_.begin(), order_.end(), rng_);
    ++epoch_;
  }
  return order_[pos % n];
}

void example_order::positions(uint64_t first, size_t count, std::vector<size_t>& out) {
  out.clear();
  const auto n = order_.size();
  uint64_t epoch = first / n;
  size_t i = static_cast<size_t>(first % n);
  for (size_t j = 0; j < count; ++j) {
    while (epoch >= epoch_) {
      std::shuffle(order_.begin(), order_.end(), rng_);
      ++epoch_;
    }
    out.push_back(order_[i]);
    if (++i == n) {
      i = 0;
      ++epoch;
    }
  }
}

outcome<sparse_local_result> train_sparse_local(sparse_model& m, const sparse_batch& train,
                                                const sparse_batch& test,
                                                const sparse_local_options& o, sparse_state init) {
  if (auto c = check_examples(m, train, "training"); !c)
    return c.error();
  if (train.labels.empty() || o.batch == 0)
    return graph_error{af_error::invalid_argument, "no training examples, or a batch of 0"};
  sparse_local_result res;
  if (init.tables.values.empty()) {
    auto st = sparse_state::make(m, o.optimizer);
    if (!st)
      return st.error();
    init = std::move(*st);
  }
  res.state = std::move(init);
  auto& st = res.state;
  const auto specs = m.tables();
  std::vector<table_batch> tbs(specs.size());
  example_order order(train.labels.size(), o.seed);
  std::vector<size_t> picks;
  std::vector<float> labels;
  double loss_sum = 0;
  uint64_t loss_count = 0;
  auto start = std::chrono::steady_clock::now();
  for (uint64_t step = 0; step < o.steps; ++step) {
    order.positions(step * o.batch, o.batch, picks);
    auto r = run_step(m, st, train, picks, tbs, labels, true);
    if (!r)
      return r.error();
    if (!std::isfinite(r->loss))
      return graph_error{af_error::non_finite,
                         fmt::format("step {}: the loss is {}: the model diverged (lower "
                                     "learning_rate)",
                                     step, r->loss)};
    for (size_t t = 0; t < specs.size(); ++t) {
      auto& slots = st.tables.slots[t];
      float* slot_ptrs[2] = {nullptr, nullptr};
      for (size_t k = 0; k < slots.size() && k < 2; ++k)
        slot_ptrs[k] = slots[k].mutable_data<float>();
      apply_rows(o.optimizer, st.tables.values[t].mutable_data<float>(), slot_ptrs,
                 static_cast<size_t>(specs[t].width), tbs[t].unique.data(),
                 r->row_grads[t].data<float>(), tbs[t].unique.size(), step);
    }
    if (auto a = st.dense.apply(o.optimizer, r->dense_grads, step); !a)
      return a.error();
    loss_sum += r->loss;
    ++loss_count;
    res.last_loss = loss_sum / static_cast<double>(loss_count);
    if (o.log_every > 0 && (step + 1) % o.log_every == 0) {
      if (o.log)
        o.log(step + 1, res.last_loss);
      loss_sum = 0;
      loss_count = 0;
    }
  }
  res.steps = o.steps;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto p = predict_sparse(m, st, test);
  if (!p)
    return p.error();
  res.auc = auc(*p, test.labels);
  res.log_loss = log_loss(*p, test.labels);
  return res;
}

outcome<click_data> load_clicks(const train_config& c) {
  click_data out;
  if (c.data == "synthetic") {
    click_spec cs;
    cs.users = c.users;
    cs.items = c.items;
    cs.dim = c.dim;
    cs.zipf = c.zipf;
    cs.examples = c.synthetic_examples;
    cs.holdout = c.holdout;
    cs.seed = c.seed;
    auto s = make_synthetic_clicks(cs);
    if (!s)
      return s.error();
    out.data = std::move(s->data);
    out.has_truth = true;
    out.truth_auc = s->truth_auc;
    out.truth_log_loss = s->truth_log_loss;
    return out;
  }
  auto s = read_clicks_csv(c.data.substr(4), c.users, c.items, c.holdout, c.seed);
  if (!s)
    return s.error();
  out.data = std::move(*s);
  return out;
}

outcome<recommender> recommender_of(const train_config& c) {
  recommender_spec rs;
  rs.users = c.users;
  rs.items = c.items;
  rs.dim = c.dim;
  rs.seed = c.seed;
  return recommender::make(rs);
}

outcome<recommender_report> train_recommender_local(
  const train_config& c, std::function<void(uint64_t step, double loss)> log) {
  recommender_report rep;
  if (auto why = recommender_table_problem(c, 1); !why.empty()) // before the data is drawn
    return graph_error{af_error::resource_exhausted, why};
  auto clicks = load_clicks(c);
  if (!clicks)
    return clicks.error();
  auto& data = clicks->data;
  rep.has_truth = clicks->has_truth;
  rep.truth_auc = clicks->truth_auc;
  rep.truth_log_loss = clicks->truth_log_loss;
  rep.train_examples = data.train.labels.size();
  rep.test_examples = data.test.labels.size();
  auto m = recommender_of(c);
  if (!m)
    return m.error();
  sparse_local_options o;
  o.optimizer = c.optimizer;
  o.batch = c.batch_size;
  o.steps = total_steps(c, rep.train_examples, 1);
  o.optimizer.schedule.total_steps = o.steps;
  o.seed = c.seed;
  o.log_every = c.log_every;
  o.log = std::move(log);
  auto r = train_sparse_local(*m, data.train, data.test, o);
  if (!r)
    return r.error();
  rep.result = std::move(*r);
  return rep;
}

} // namespace af::train
