#include "train/config.hpp"

#include "core/nesting.hpp"
#include "core/read_file.hpp"
#include "core/utf8.hpp"
#include "core/spelling.hpp"
#include "train/config_model.hpp"
#include "train/memory_data.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>
#include <variant>
#include <cctype>

#include <fmt/format.h>
#include <toml.hpp>

namespace af::train {

using detail::read_integer;
using detail::read_number;

namespace {

using detail::quoted; // train/config_model.hpp
using detail::real;

graph_error config_error(std::string msg) {
  return graph_error{af_error::invalid_config, std::move(msg)};
}

/// A value as an error message echoes it: a long one (a --set of 60 KB)
/// is cut to its first 80 bytes, at a UTF-8 character's start, and its size.
std::string clipped(std::string_view s) {
  constexpr size_t keep = 80;
  size_t cut = s.size();
  if (s.size() > keep) {
    cut = keep;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80)
      --cut;
  }
  // A control byte (ESC, DEL) is shown, not sent to the terminal.
  std::string out;
  for (char ch : s.substr(0, cut)) {
    auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\x{:02x}", u);
    else
      out += ch;
  }
  if (cut < s.size())
    out += fmt::format("... ({} bytes)", s.size());
  return out;
}

/// Every key of a [train] table, in the order to_toml writes them.
const std::vector<std::string>& known_keys() {
  static const std::vector<std::string> keys = {
    "mode", "model", "hidden", "data", "holdout", "synthetic_examples", "synthetic_features",
    "synthetic_classes", "batch_size", "steps", "epochs", "optimizer", "learning_rate",
    "momentum", "beta1", "beta2", "epsilon", "initial_accumulator", "schedule", "decay_steps",
    "decay_rate", "min_lr",
    "average_every", "seed", "checkpoint_dir", "checkpoint_key", "checkpoint_steps",
    "checkpoint_secs", "metrics", "logdir", "histogram_every", "log_every", "eval_every", "step_timeout_ms", "init_timeout_ms",
    "ps_recovery_timeout_ms", "max_nonfinite_steps", "replicas_to_aggregate", "step_deadline_ms",
    "min_replicas", "staleness", "max_partitions", "min_slice_bytes", "max_data_bytes",
    "grad_norm_guard", "warmup_secs", "window_secs", "users", "items", "dim", "zipf",
    "partition_strategy", "pipeline_sync", "pipeline_async", "wire_dtype"};
  return keys;
}

std::string closest_key(const std::string& key) {
  return closest(key, known_keys(), std::numeric_limits<size_t>::max() - 1);
}

/// A TOML value as the user wrote it, for messages.
std::string show(const toml::value& v) {
  switch (v.type()) {
    case toml::value_t::string:
      return "\"" + v.as_string().str + "\"";
    case toml::value_t::integer:
      return std::to_string(v.as_integer());
    case toml::value_t::floating:
      return fmt::format("{}", v.as_floating());
    case toml::value_t::boolean:
      return v.as_boolean() ? "true" : "false";
    case toml::value_t::table:
      return "a table";
    default: {
      auto s = toml::format(v);
      while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
        s.pop_back();
      return s;
    }
  }
}

const char* type_name(const toml::value& v) {
  switch (v.type()) {
    case toml::value_t::string: return "a string";
    case toml::value_t::integer: return "an integer";
    case toml::value_t::floating: return "a number";
    case toml::value_t::boolean: return "a boolean";
    case toml::value_t::array: return "an array";
    case toml::value_t::table: return "a table";
    default: return "a date or time";
  }
}

/// Sets the field of `key` from `v`; an error sentence (without the file
/// and line) if the type or the range of the field's C++ type is wrong.
/// Values that fit the type but make no sense are check()'s business.
std::optional<std::string> assign(train_config& c, const std::string& key, const toml::value& v) {
  auto bad = [&](const std::string& what) {
    return fmt::format("{} = {}: {}", key, show(v), what);
  };
  auto text = [&](std::string& field) -> std::optional<std::string> {
    if (!v.is_string())
      return bad(fmt::format("must be a string, not {}", type_name(v)));
    field = v.as_string().str;
    return std::nullopt;
  };
  auto number = [&](double& field) -> std::optional<std::string> {
    if (v.is_integer())
      field = static_cast<double>(v.as_integer());
    else if (v.is_floating())
      field = v.as_floating();
    else
      return bad(fmt::format("must be a number, not {}", type_name(v)));
    return std::nullopt;
  };
  auto whole = [&](auto& field) -> std::optional<std::string> {
    using T = std::decay_t<decltype(field)>;
    if (!v.is_integer())
      return bad(fmt::format("must be a non-negative integer, not {}", type_name(v)));
    auto x = v.as_integer();
    if (x < 0)
      return bad("must be a non-negative integer");
    if (static_cast<uint64_t>(x) > std::numeric_limits<T>::max())
      return bad(fmt::format("must be at most {}", std::numeric_limits<T>::max()));
    field = static_cast<T>(x);
    return std::nullopt;
  };
  auto& o = c.optimizer;
  if (key == "pipeline_sync" || key == "pipeline_async") {
    bool sync = key == "pipeline_sync"; // "auto": streamed until the aggregator asks for whole
    bool is_auto = sync && v.is_string() && v.as_string().str == "auto";
    if (!v.is_boolean() && !is_auto)
      return bad(fmt::format("must be {}{}", sync ? "true, false or \"auto\"" : "true or false",
                             v.is_string() ? std::string{} : fmt::format(", not {}", type_name(v))));
    (sync ? c.pipeline_sync : c.pipeline_async) = is_auto || v.as_boolean();
    if (sync)
      c.pipeline_sync_auto = is_auto;
    return std::nullopt;
  }
  if (key == "mode") return text(c.mode);
  if (key == "model") return text(c.model);
  if (key == "data") return text(c.data);
  if (key == "optimizer") return text(o.kind);
  if (key == "schedule") return text(o.schedule.kind);
  if (key == "checkpoint_dir") return text(c.checkpoint_dir);
  if (key == "checkpoint_key") return text(c.checkpoint_key);
  if (key == "metrics") return text(c.metrics);
  if (key == "logdir") return text(c.logdir);
  if (key == "partition_strategy") return text(c.partition_strategy);
  if (key == "wire_dtype") return text(c.wire_dtype);
  if (key == "zipf") return number(c.zipf);
  if (key == "users") return whole(c.users);
  if (key == "items") return whole(c.items);
  if (key == "dim") return whole(c.dim);
  if (key == "holdout") return number(c.holdout);
  if (key == "epochs") return number(c.epochs);
  if (key == "learning_rate") return number(o.lr);
  if (key == "momentum") return number(o.momentum);
  if (key == "beta1") return number(o.beta1);
  if (key == "beta2") return number(o.beta2);
  if (key == "epsilon") return number(o.epsilon);
  if (key == "initial_accumulator") return number(o.initial_accumulator);
  if (key == "decay_rate") return number(o.schedule.decay_rate);
  if (key == "min_lr") return number(o.schedule.min_lr);
  if (key == "checkpoint_secs") return number(c.checkpoint_secs);
  if (key == "grad_norm_guard") return number(c.grad_norm_guard);
  if (key == "warmup_secs") return number(c.warmup_secs);
  if (key == "window_secs") return number(c.window_secs);
  if (key == "synthetic_examples") return whole(c.synthetic_examples);
  if (key == "synthetic_features") return whole(c.synthetic_features);
  if (key == "synthetic_classes") return whole(c.synthetic_classes);
  if (key == "batch_size") return whole(c.batch_size);
  if (key == "steps") return whole(c.steps);
  if (key == "decay_steps") return whole(o.schedule.decay_steps);
  if (key == "average_every") return whole(c.average_every);
  if (key == "seed") return whole(c.seed);
  if (key == "checkpoint_steps") return whole(c.checkpoint_steps);
  if (key == "log_every") return whole(c.log_every);
  if (key == "histogram_every") return whole(c.histogram_every);
  if (key == "eval_every") return whole(c.eval_every);
  if (key == "step_timeout_ms") return whole(c.step_timeout_ms);
  if (key == "init_timeout_ms") return whole(c.init_timeout_ms);
  if (key == "ps_recovery_timeout_ms") return whole(c.ps_recovery_timeout_ms);
  if (key == "max_nonfinite_steps") return whole(c.max_nonfinite_steps);
  if (key == "replicas_to_aggregate") return whole(c.replicas_to_aggregate);
  if (key == "step_deadline_ms") return whole(c.step_deadline_ms);
  if (key == "min_replicas") return whole(c.min_replicas);
  if (key == "staleness") return whole(c.staleness);
  if (key == "max_partitions") return whole(c.max_partitions);
  if (key == "min_slice_bytes") return whole(c.min_slice_bytes);
  if (key == "max_data_bytes") return whole(c.max_data_bytes);
  if (key == "hidden") {
    if (!v.is_array())
      return bad(fmt::format("must be an array of layer sizes like [128, 64], not {}",
                             type_name(v)));
    std::vector<int64_t> sizes;
    for (const auto& e : v.as_array()) {
      if (!e.is_integer() || e.as_integer() <= 0)
        return bad(fmt::format("{} is not a layer size: sizes are positive integers",
                               show(e)));
      sizes.push_back(e.as_integer());
    }
    c.hidden = std::move(sizes);
    return std::nullopt;
  }
  return std::nullopt; // unknown keys are reported before assign is called
}

struct key_problem {
  std::string key; ///< "" when no single key is to blame
  std::string what;
};

std::optional<key_problem> fail(std::string key, std::string what) {
  return std::optional<key_problem>{key_problem{std::move(key), std::move(what)}};
}

bool one_of(const std::string& v, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (v == a)
      return true;
  return false;
}

/// check(): the mode, the model and its data, the held-out split, the batch
/// and how long to train.
std::optional<key_problem> check_model_and_data(const train_config& c, bool combinations) {
  if (!one_of(c.mode, {"sync", "async", "ssp", "average", "allreduce"}))
    return fail("mode", fmt::format("mode = \"{}\" is unknown: use sync, async, ssp, average or "
                                    "allreduce", clipped(c.mode)));
  if (!one_of(c.model, {"softmax", "mlp", "linear", "linear_bias", "recommender"}))
    return fail("model", fmt::format("model = \"{}\" is unknown: use softmax, mlp, linear, "
                                     "linear_bias or recommender", clipped(c.model)));
  for (auto h : c.hidden)
    if (h <= 0)
      return fail("hidden", fmt::format("hidden = [{}]: layer sizes must be positive",
                                        fmt::join(c.hidden, ", ")));
  const auto& d = c.data;
  auto has_prefix = [&](const char* p) { return d.rfind(p, 0) == 0; };
  if (has_prefix("csv:")) {
    if (d.size() == 4)
      return fail("data", "data = \"csv:\" names no file: write csv:PATH");
  } else if (has_prefix("idx:")) {
    auto rest = d.substr(4);
    auto comma = rest.find(',');
    if (comma == std::string::npos || comma == 0 || comma + 1 == rest.size())
      return fail("data", fmt::format("data = \"{}\" must name two files: idx:IMAGES,LABELS",
                                      clipped(d)));
  } else if (has_prefix(memory_data_prefix)) { // a process's own set, looked up at load
  } else if (!one_of(d, {"digits", "synthetic", "synthetic_linear", "per_worker_linear"})) {
    return fail("data", fmt::format("data = \"{}\" is unknown: use digits, synthetic, "
                                    "synthetic_linear, per_worker_linear, csv:PATH or "
                                    "idx:IMAGES,LABELS", clipped(d)));
  }
  bool regression_model = one_of(c.model, {"linear", "linear_bias"});
  bool regression_data = one_of(d, {"synthetic_linear", "per_worker_linear"});
  if (has_prefix(memory_data_prefix)) // regression: float targets, no labels
    if (auto held = find_memory_dataset(d.substr(std::strlen(memory_data_prefix))))
      regression_data = held->y.empty();
  if (combinations && regression_model != regression_data)
    return fail("model", fmt::format("model = \"{}\" with data = \"{}\": the linear models are "
                                     "the regression ones, for data = \"synthetic_linear\" or "
                                     "\"per_worker_linear\", and the only ones for them",
                                     clipped(c.model), clipped(d)));
  if (!(c.holdout > 0 && c.holdout < 1))
    return fail("holdout", fmt::format("holdout = {}: the held-out fraction must be between 0 "
                                       "and 1, both excluded (e.g. 0.2)", c.holdout));
  if (c.synthetic_examples == 0)
    return fail("synthetic_examples", "synthetic_examples = 0: it must be at least 1");
  if (c.synthetic_features == 0)
    return fail("synthetic_features", "synthetic_features = 0: it must be at least 1");
  if (c.synthetic_classes < 2)
    return fail("synthetic_classes", fmt::format("synthetic_classes = {}: it must be at least 2",
                                                 c.synthetic_classes));
  if (c.batch_size == 0)
    return fail("batch_size", "batch_size = 0: it must be at least 1 (examples per worker "
                              "and step)");
  if (!std::isfinite(c.epochs) || c.epochs < 0 || (combinations && c.steps == 0 && c.epochs == 0))
    return fail("epochs", fmt::format("epochs = {}: it must be a positive number when steps is 0 "
                                      "(and never negative)", c.epochs));
  return std::nullopt;
}

/// check(): the optimizer and its learning-rate schedule.
std::optional<key_problem> check_optimizer(const optimizer_spec& o, bool combinations) {
  if (!one_of(o.kind, {"sgd", "momentum", "adagrad", "adam"}))
    return fail("optimizer", fmt::format("optimizer = \"{}\" is unknown: use sgd, momentum, "
                                         "adagrad or adam", clipped(o.kind)));
  if (!(o.lr > 0) || !std::isfinite(o.lr))
    return fail("learning_rate", fmt::format("learning_rate = {}: it must be a positive number",
                                             o.lr));
  if (!(o.momentum >= 0 && o.momentum < 1))
    return fail("momentum", fmt::format("momentum = {}: it must be in [0, 1)", o.momentum));
  if (!(o.beta1 >= 0 && o.beta1 < 1))
    return fail("beta1", fmt::format("beta1 = {}: it must be in [0, 1)", o.beta1));
  if (!(o.beta2 >= 0 && o.beta2 < 1))
    return fail("beta2", fmt::format("beta2 = {}: it must be in [0, 1)", o.beta2));
  if (!(o.epsilon > 0) || !std::isfinite(o.epsilon))
    return fail("epsilon", fmt::format("epsilon = {}: it must be a positive number", o.epsilon));
  // Checked whatever the optimizer: a config that switches to adagrad later keeps it.
  if (!(o.initial_accumulator > 0) || !std::isfinite(o.initial_accumulator))
    return fail("initial_accumulator",
                fmt::format("initial_accumulator = {}: it must be a positive number (adagrad's "
                            "accumulator starts there; TF's default is 0.1)",
                            o.initial_accumulator));
  if (!one_of(o.schedule.kind, {"constant", "step", "cosine"}))
    return fail("schedule", fmt::format("schedule = \"{}\" is unknown: use constant, step or "
                                        "cosine", clipped(o.schedule.kind)));
  if (o.schedule.decay_steps == 0)
    return fail("decay_steps", "decay_steps = 0: it must be at least 1");
  if (!(o.schedule.decay_rate > 0) || !std::isfinite(o.schedule.decay_rate))
    return fail("decay_rate", fmt::format("decay_rate = {}: it must be a positive number",
                                          o.schedule.decay_rate));
  if (!(o.schedule.min_lr >= 0) || !std::isfinite(o.schedule.min_lr))
    return fail("min_lr", fmt::format("min_lr = {}: it must be a number >= 0",
                                      o.schedule.min_lr));
  // What the optimizer itself refuses (combinations, such as min_lr > lr).
  if (auto why = combinations ? validate(o) : std::string{}; !why.empty())
    return fail(o.schedule.kind == "cosine" && o.schedule.min_lr > o.lr ? "min_lr" : "",
                "optimizer: " + why);
  return std::nullopt;
}

/// check(): the job's settings: modes, checkpoints, bounds, timeouts,
/// partitions, and that every integer can be written back as TOML.
std::optional<key_problem> check_job_settings(const train_config& c, bool combinations) {
  const auto& o = c.optimizer;
  if (c.average_every == 0)
    return fail("average_every", "average_every = 0: it must be at least 1 (local steps "
                                 "between averages)");
  if (!std::isfinite(c.grad_norm_guard) || (c.grad_norm_guard != 0 && !(c.grad_norm_guard >= 1)))
    return fail("grad_norm_guard", fmt::format("grad_norm_guard = {}: it must be 0 (off) or a "
                                               "number >= 1 (the most times the median of the "
                                               "recent gradient norms one push may have)",
                                               c.grad_norm_guard));
  if (!(c.checkpoint_secs >= 0) || !std::isfinite(c.checkpoint_secs))
    return fail("checkpoint_secs", fmt::format("checkpoint_secs = {}: it must be a number >= 0 "
                                               "(0: not by time)", c.checkpoint_secs));
  // TOML integers are signed 64-bit: larger values could not be written back.
  for (auto [key, value] : {std::pair<const char*, uint64_t>{"seed", c.seed},
                            {"steps", c.steps},
                            {"synthetic_examples", c.synthetic_examples},
                            {"synthetic_features", c.synthetic_features},
                            {"batch_size", c.batch_size},
                            {"decay_steps", o.schedule.decay_steps},
                            {"checkpoint_steps", c.checkpoint_steps},
                            {"log_every", c.log_every},
                            {"eval_every", c.eval_every},
                            {"staleness", c.staleness},
                            {"max_nonfinite_steps", c.max_nonfinite_steps},
                            {"min_slice_bytes", c.min_slice_bytes},
                            {"max_data_bytes", c.max_data_bytes}})
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return fail(key, fmt::format("{} = {}: it must be at most 2^63 - 1, the largest TOML "
                                   "integer", key, value));
  if (c.step_timeout_ms == 0)
    return fail("step_timeout_ms", "step_timeout_ms = 0: it must be at least 1");
  if (c.init_timeout_ms == 0)
    return fail("init_timeout_ms", "init_timeout_ms = 0: it must be at least 1");
  if (combinations && !c.checkpoint_key.empty() && c.checkpoint_dir.empty())
    return fail("checkpoint_key", fmt::format("checkpoint_key = \"{}\" without a checkpoint_dir: "
                                              "the key signs checkpoints, and none are written; "
                                              "set checkpoint_dir too, or drop checkpoint_key",
                                              clipped(c.checkpoint_key)));
  if (c.max_nonfinite_steps == 0)
    return fail("max_nonfinite_steps", "max_nonfinite_steps = 0: it must be at least 1 (steps in "
                                       "a row a worker may abstain from, its gradient not finite, "
                                       "before the job fails)");
  if (c.min_replicas == 0)
    return fail("min_replicas", "min_replicas = 0: it must be at least 1 (a step closed with no "
                                "gradient would only move the step count)");
  if (combinations && c.replicas_to_aggregate > 0 && c.min_replicas > c.replicas_to_aggregate)
    return fail("min_replicas", fmt::format("min_replicas = {} is more than replicas_to_aggregate "
                                            "= {}: a step never needs more gradients than it uses",
                                            c.min_replicas, c.replicas_to_aggregate));
  if (combinations && c.step_deadline_ms > 0 && c.step_deadline_ms >= c.step_timeout_ms)
    return fail("step_deadline_ms", fmt::format("step_deadline_ms = {} is not below "
                                                "step_timeout_ms = {}: the step would time out "
                                                "before its deadline could close it",
                                                c.step_deadline_ms, c.step_timeout_ms));
  if (c.max_partitions == 0)
    return fail("max_partitions", "max_partitions = 0: it must be at least 1 (1: no variable is "
                                  "partitioned)");
  if (c.min_slice_bytes == 0)
    return fail("min_slice_bytes", "min_slice_bytes = 0: it must be at least 1");
  if (c.max_data_bytes == 0)
    return fail("max_data_bytes", "max_data_bytes = 0: it must be at least 1");
  for (auto [key, value] : {std::pair<const char*, double>{"warmup_secs", c.warmup_secs},
                            {"window_secs", c.window_secs}})
    if (!(value >= 0) || !std::isfinite(value) || value > train_config::max_window_secs)
      return fail(key, fmt::format("{} = {}: it must be a number of seconds from 0 (off) to {} "
                                   "(a week)",
                                   key, value, train_config::max_window_secs));
  if (combinations && c.window_secs > 0 && !one_of(c.mode, {"sync", "async", "ssp"}))
    return fail("window_secs", fmt::format("window_secs = {} with mode = \"{}\": a timed window "
                                           "counts ps 0's global step, so the mode must be sync, "
                                           "async or ssp", c.window_secs, clipped(c.mode)));
  if (combinations && c.window_secs > 0 && !c.checkpoint_dir.empty())
    return fail("window_secs", "window_secs with a checkpoint_dir: a timed run stops its workers "
                               "where the time ends, not at a step a checkpoint could resume "
                               "from exactly; drop one of them");
  if (combinations && c.warmup_secs > 0 && c.window_secs == 0)
    return fail("warmup_secs", fmt::format("warmup_secs = {} without window_secs: the warm-up "
                                           "comes before a timed window; set window_secs too",
                                           c.warmup_secs));
  return std::nullopt;
}

/// check(): a generated set is allocated whole: refuse one larger than the
/// bound before a single byte of it is (2e9 examples aborted with bad_alloc).
std::optional<key_problem> check_data_size(const train_config& c, bool combinations) {
  const auto& d = c.data;
  // The recommender's synthetic clicks are sized by recommender_problem.
  if (combinations && one_of(d, {"synthetic", "synthetic_linear", "per_worker_linear"})
      && c.model != "recommender") {
    uint64_t outputs = d == "synthetic" ? c.synthetic_classes : 1;
    uint64_t floats = 0, teacher = 0;
    bool overflow = __builtin_mul_overflow(uint64_t{c.synthetic_examples},
                                           uint64_t{c.synthetic_features} + 1, &floats)
                    || __builtin_mul_overflow(uint64_t{c.synthetic_features}, outputs, &teacher)
                    || __builtin_add_overflow(floats, teacher, &floats)
                    || floats > c.max_data_bytes / 4;
    if (overflow)
      return fail(c.synthetic_examples > c.synthetic_features ? "synthetic_examples"
                                                              : "synthetic_features",
                  fmt::format("synthetic_examples = {} x synthetic_features = {} makes a data set "
                              "of {} bytes, more than max_data_bytes = {}: lower them, or raise "
                              "max_data_bytes on a machine with the memory",
                              c.synthetic_examples, c.synthetic_features,
                              fmt::format("{:.4g}", 4.0 * (static_cast<double>(c.synthetic_examples)
                                                           * (c.synthetic_features + 1.0)
                                                         + static_cast<double>(c.synthetic_features)
                                                             * static_cast<double>(outputs))),
                              c.max_data_bytes));
  }
  return std::nullopt;
}

/// The first key whose value makes no sense, with a sentence naming it, its
/// value and what is allowed. `combinations`: also keys that are each fine
/// but not together (parsing leaves those to validate(), so that a file and
/// then --set overrides can be applied one by one).
std::optional<key_problem> check(const train_config& c, bool combinations) {
  if (auto p = check_model_and_data(c, combinations))
    return p;
  if (auto p = check_optimizer(c.optimizer, combinations))
    return p;
  if (auto p = check_job_settings(c, combinations))
    return p;
  if (auto p = recommender_problem(c, combinations)) // train/config_model.cpp
    return fail(p->first, p->second);
  if (auto p = wire_dtype_problem(c, combinations)) // train/config_model.cpp
    return fail(p->first, p->second);
  return check_data_size(c, combinations);
}

enum class value_kind { text, number, whole, sizes, boolean };

/// The type `key` has in the config's TOML: read from what to_toml writes
/// for the defaults, so a key added there needs no second list here.
value_kind kind_of(const std::string& key) {
  static const toml::value defaults = [] {
    std::istringstream in{to_toml(train_config{})};
    return toml::parse(in, "the defaults");
  }();
  const auto& table = toml::find(defaults, "train").as_table();
  auto it = table.find(key);
  if (it == table.end())
    return value_kind::whole; // unknown keys are refused before this is asked
  switch (it->second.type()) {
    case toml::value_t::string: return value_kind::text;
    case toml::value_t::floating: return value_kind::number;
    case toml::value_t::array: return value_kind::sizes;
    case toml::value_t::boolean: return value_kind::boolean;
    default: return value_kind::whole;
  }
}

/// What `key` takes, with an example, for the end of an override's error.
std::string takes(const std::string& key) {
  switch (kind_of(key)) {
    case value_kind::text:
      if (key == "checkpoint_dir")
        return "a directory path, e.g. --set checkpoint_dir=/tmp/ckpt";
      if (key == "checkpoint_key")
        return "a file path, e.g. --set checkpoint_key=/etc/actorflow/checkpoint.key";
      if (key == "metrics")
        return "a file path, e.g. --set metrics=/tmp/metrics.csv";
      if (key == "logdir")
        return "a directory path, e.g. --set logdir=/tmp/tb (or --logdir /tmp/tb)";
      if (key == "data")
        return "digits, synthetic, synthetic_linear, per_worker_linear, csv:PATH or "
               "idx:IMAGES,LABELS, e.g. "
               "--set data=csv:/tmp/train.csv";
      return fmt::format("a name, e.g. --set {}={}", key,
                         key == "mode" ? "async" : key == "model" ? "softmax"
                         : key == "optimizer" ? "adam" : key == "schedule" ? "cosine"
                         : key == "wire_dtype" ? "bf16" : "div");
    case value_kind::number:
      if (key == "grad_norm_guard") // 0.01 would be refused: 0 or >= 1
        return "0 (off) or a number >= 1, e.g. --set grad_norm_guard=10";
      return fmt::format("a number (a decimal or with an exponent), e.g. --set {}=0.01 or "
                         "--set {}=1e-3", key, key);
    case value_kind::whole:
      return fmt::format("a whole number, e.g. --set {}=100", key);
    case value_kind::boolean:
      if (key == "pipeline_sync")
        return "true, false or auto, e.g. --set pipeline_sync=auto";
      return fmt::format("true or false, e.g. --set {}=true", key);
    case value_kind::sizes:
      break;
  }
  return "a list of positive layer sizes, e.g. --set hidden=[64,64] (or hidden=64,64)";
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
    s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
    s.remove_suffix(1);
  return s;
}

/// The override's value as a TOML value of the key's type, or why it is not one.
std::variant<toml::value, std::string> override_value(const std::string& key,
                                                      std::string_view value) {
  switch (kind_of(key)) {
    case value_kind::text: {
      if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'')
          && value.back() == value.front())
        value = value.substr(1, value.size() - 2);
      return toml::value(std::string{value});
    }
    case value_kind::number:
      if (auto x = read_number(value))
        return toml::value(*x);
      return fmt::format("'{}' is not a number", clipped(value));
    case value_kind::whole:
      if (auto n = read_integer(value))
        return toml::value(*n);
      if (auto x = read_number(value); x && std::isfinite(*x) && std::trunc(*x) == *x)
        return fmt::format("{} is too large: at most 2^63 - 1", clipped(value));
      return fmt::format("'{}' is not {}", clipped(value),
                         read_number(value) ? "a whole number" : "a number");
    case value_kind::boolean:
      if (value == "true" || value == "false")
        return toml::value(value == "true");
      if (key == "pipeline_sync" && (value == "auto" || value == "\"auto\""))
        return toml::value("auto");
      return fmt::format("'{}' is not true{}", clipped(value),
                         key == "pipeline_sync" ? ", false or auto" : " or false");
    case value_kind::sizes:
      break;
  }
  auto list = value;
  bool open = !list.empty() && list.front() == '[';
  bool close = !list.empty() && list.back() == ']';
  if (open != close)
    return fmt::format("'{}' has an unbalanced bracket", clipped(value));
  if (open)
    list = trimmed(list.substr(1, list.size() - 2));
  toml::array sizes;
  if (list.empty() && !open)
    return std::string{"the value is empty: write hidden=[] for no hidden layer, or the layer "
                       "sizes"};
  if (list.empty())
    return toml::value(sizes); // hidden=[]: no hidden layer
  for (size_t at = 0; at <= list.size();) {
    auto comma = std::min(list.find(',', at), list.size());
    auto item = trimmed(list.substr(at, comma - at));
    auto n = read_integer(item);
    if (!n || *n <= 0)
      return fmt::format("'{}' is not a layer size (a positive integer)", clipped(item));
    sizes.push_back(toml::value(*n));
    at = comma + 1;
  }
  return toml::value(sizes);
}

} // namespace

outcome<train_config> apply_overrides(train_config c, const std::vector<std::string>& sets) {
  for (const auto& kv : sets) {
    auto eq = kv.find('=');
    auto key = std::string{trimmed(std::string_view{kv}.substr(0, std::min(eq, kv.size())))};
    if (eq == std::string::npos || key.empty())
      return config_error(fmt::format("--set {}: write --set key=value, e.g. --set mode=async "
                                      "(every key is listed in config/train.toml)", clipped(kv)));
    auto value = trimmed(std::string_view{kv}.substr(eq + 1));
    const auto& keys = known_keys();
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      return config_error(fmt::format("--set {}: unknown key '{}'; did you mean '{}'? (every "
                                      "key is listed in config/train.toml)",
                                      clipped(kv), clipped(key), closest_key(key)));
    auto refuse = [&](const std::string& why) {
      return config_error(fmt::format("--set {}: {}; {} takes {}", clipped(kv), why, key, takes(key)));
    };
    auto v = override_value(key, value);
    if (auto* why = std::get_if<std::string>(&v))
      return refuse(*why);
    auto next = c;
    if (auto err = assign(next, key, std::get<toml::value>(v)))
      return refuse(*err);
    if (auto p = check(next, false))
      return refuse(p->what);
    c = std::move(next);
  }
  return c;
}

std::string check_workers(const train_config& c, uint32_t workers) {
  // per_worker_linear: example i is worker i's (docs/training.md, "The 1 M
  // workload"). The batcher gives worker w examples w*b .. w*b+b-1 of each
  // global batch of workers x b: only a set of exactly one global batch
  // keeps each worker on its own fixed examples (more would hand worker w
  // other workers' examples on later steps; fewer is not one batch).
  uint64_t per_batch = uint64_t{workers} * c.batch_size;
  if (c.data == "per_worker_linear" && workers > 0 && c.synthetic_examples != per_batch)
    return fmt::format("synthetic_examples = {} with data = \"per_worker_linear\", {} worker "
                       "task(s) and batch_size = {}: its examples are the workers' own, each "
                       "reading the same batch_size of them every step (the 1 M workload: one "
                       "each, batch_size = 1); set synthetic_examples = {} (worker tasks x "
                       "batch_size)",
                       c.synthetic_examples, workers, c.batch_size, per_batch);
  if (c.replicas_to_aggregate <= workers)
    return {};
  return fmt::format("replicas_to_aggregate = {} is more than the {} worker task(s) of the "
                     "cluster: each worker pushes one gradient per step, so a step could never "
                     "gather {}; use at most {} (0: every worker's), fewer to have backup "
                     "workers",
                     c.replicas_to_aggregate, workers, c.replicas_to_aggregate, workers);
}

std::string validate(const train_config& c) {
  auto p = check(c, true);
  return p ? p->what : std::string{};
}

outcome<train_config> parse_train_config(const std::string& text, const std::string& origin) {
  if (auto bad = utf8_problem(text); !bad.empty()) // before toml11 (core/utf8.hpp)
    return config_error(fmt::format("malformed TOML in {}: {}", origin, bad));
  if (auto deep = nesting_problem(text, true); !deep.empty()) // before toml11 recurses
    return config_error(fmt::format("{}: {}", origin, deep));
  toml::value root;
  try {
    std::istringstream in{text};
    root = toml::parse(in, origin);
  } catch (const std::exception& e) {
    return config_error(fmt::format("malformed TOML in {}: {}", origin, e.what()));
  }
  auto at_line = [&](const toml::value& v) {
    return fmt::format("{}:{}", origin, v.location().line());
  };
  train_config c;
  const toml::value* table = &root;
  std::string where = origin;
  if (root.is_table() && root.contains("train")) {
    table = &root.at("train");
    if (!table->is_table())
      return config_error(at_line(*table) + ": 'train' must be a table: write [train] and its "
                                            "keys below it");
    where = "[train] of " + origin;
  } else if (root.is_table() && root.contains("cluster")) {
    // A cluster file without [train]: train with the defaults, unless a
    // table looks like a misspelt [train].
    for (const auto& [name, v] : root.as_table())
      if (v.is_table() && name != "cluster" && name != "node" && edit_distance(name, "train") <= 2)
        return config_error(fmt::format("{}: table [{}] is unknown; did you mean [train]?",
                                        at_line(v), name));
    return c;
  }
  if (!table->is_table())
    return config_error(origin + ": expected a TOML table of training keys");
  // Keys in file order, so that the first problem reported is the first one.
  std::vector<std::pair<std::string, const toml::value*>> entries;
  for (const auto& [key, v] : table->as_table())
    entries.emplace_back(key, &v);
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.second->location().line() < b.second->location().line();
  });
  for (const auto& [key, v] : entries) {
    const auto& keys = known_keys();
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      return config_error(fmt::format("{}: unknown key '{}' in {}; did you mean '{}'? (every "
                                      "key is listed in config/train.toml)",
                                      at_line(*v), key, where, closest_key(key)));
    if (auto err = assign(c, key, *v))
      return config_error(at_line(*v) + ": " + *err);
  }
  if (auto p = check(c, false)) {
    for (const auto& [key, v] : entries)
      if (key == p->key)
        return config_error(at_line(*v) + ": " + p->what);
    return config_error(fmt::format("{}: {}{}", origin, p->what,
                                    p->key.empty() ? "" : " (the default of " + p->key + ")"));
  }
  return c;
}

outcome<train_config> load_train_config(const std::string& path) {
  std::string text;
  if (auto why = read_regular_file(path, max_config_file_bytes, text); !why.empty())
    return graph_error{errno == ENOENT ? af_error::not_found : af_error::invalid_argument,
                       fmt::format("cannot open training config '{}': {} (check the path)", path,
                                   why)};
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) // a byte order mark is no part of the TOML
    text.erase(0, 3);
  return parse_train_config(text, path);
}

std::string to_toml(const train_config& c) {
  const auto& o = c.optimizer;
  std::string out = "[train]\n";
  auto line = [&](const char* key, const std::string& value) {
    out += fmt::format("{} = {}\n", key, value);
  };
  line("mode", quoted(c.mode));
  line("model", quoted(c.model));
  line("hidden", fmt::format("[{}]", fmt::join(c.hidden, ", ")));
  line("data", quoted(c.data));
  line("holdout", real(c.holdout));
  line("synthetic_examples", std::to_string(c.synthetic_examples));
  line("synthetic_features", std::to_string(c.synthetic_features));
  line("synthetic_classes", std::to_string(c.synthetic_classes));
  line("batch_size", std::to_string(c.batch_size));
  line("steps", std::to_string(c.steps));
  line("epochs", real(c.epochs));
  line("optimizer", quoted(o.kind));
  line("learning_rate", real(o.lr));
  line("momentum", real(o.momentum));
  line("beta1", real(o.beta1));
  line("beta2", real(o.beta2));
  line("epsilon", real(o.epsilon));
  line("initial_accumulator", real(o.initial_accumulator));
  line("schedule", quoted(o.schedule.kind));
  line("decay_steps", std::to_string(o.schedule.decay_steps));
  line("decay_rate", real(o.schedule.decay_rate));
  line("min_lr", real(o.schedule.min_lr));
  line("average_every", std::to_string(c.average_every));
  line("seed", std::to_string(c.seed));
  line("checkpoint_dir", quoted(c.checkpoint_dir));
  line("checkpoint_key", quoted(c.checkpoint_key));
  line("checkpoint_steps", std::to_string(c.checkpoint_steps));
  line("checkpoint_secs", real(c.checkpoint_secs));
  line("metrics", quoted(c.metrics));
  line("logdir", quoted(c.logdir));
  line("histogram_every", std::to_string(c.histogram_every));
  line("log_every", std::to_string(c.log_every));
  line("eval_every", std::to_string(c.eval_every));
  line("step_timeout_ms", std::to_string(c.step_timeout_ms));
  line("init_timeout_ms", std::to_string(c.init_timeout_ms));
  line("ps_recovery_timeout_ms", std::to_string(c.ps_recovery_timeout_ms));
  line("max_nonfinite_steps", std::to_string(c.max_nonfinite_steps));
  line("replicas_to_aggregate", std::to_string(c.replicas_to_aggregate));
  line("step_deadline_ms", std::to_string(c.step_deadline_ms));
  line("min_replicas", std::to_string(c.min_replicas));
  line("staleness", std::to_string(c.staleness));
  line("max_partitions", std::to_string(c.max_partitions));
  line("min_slice_bytes", std::to_string(c.min_slice_bytes));
  line("max_data_bytes", std::to_string(c.max_data_bytes));
  line("grad_norm_guard", real(c.grad_norm_guard));
  line("warmup_secs", real(c.warmup_secs));
  line("window_secs", real(c.window_secs));
  line("users", std::to_string(c.users));
  line("items", std::to_string(c.items));
  line("dim", std::to_string(c.dim));
  line("zipf", real(c.zipf));
  line("partition_strategy", quoted(c.partition_strategy));
  line("pipeline_sync", c.pipeline_sync_auto ? "\"auto\"" : c.pipeline_sync ? "true" : "false");
  line("pipeline_async", c.pipeline_async ? "true" : "false");
  line("wire_dtype", quoted(c.wire_dtype));
  return out;
}

} // namespace af::train
