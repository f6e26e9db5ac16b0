#include "train/checkpoint_check.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "train/optimizer.hpp"

namespace af::train {

namespace {

graph_error refuse(const std::string& path, const std::string& why,
                   af_error code = af_error::invalid_argument) {
  return graph_error{code,
                     fmt::format("checkpoint '{}' {}; it is not restored: move it (and 'latest') "
                                 "out of the checkpoint directory to resume from an older one or "
                                 "start afresh",
                                 path, why)};
}

/// A name from the file as it may be printed: at most 200 bytes, and a
/// byte that is not printable ASCII shown as '?' (a forged name could hold
/// terminal escapes).
std::string shown_name(const std::string& name) {
  auto out = name.size() > 200 ? name.substr(0, 200) + "..." : name;
  for (auto& ch : out)
    if (ch < 0x20 || ch == 0x7f)
      ch = '?';
  return out;
}

/// The slot names some optimizer keeps.
const std::set<std::string>& known_slots() {
  static const std::set<std::string> names = [] {
    std::set<std::string> out;
    for (const char* kind : {"sgd", "momentum", "adagrad", "adam"})
      for (auto& n : slot_names(kind))
        out.insert(n);
    return out;
  }();
  return names;
}

/// "variable 'w'" or "slot 'm' of variable 'w'".
std::string field_name(const std::string& var, const std::string& slot) {
  return slot.empty() ? fmt::format("variable '{}'", var)
                      : fmt::format("slot '{}' of variable '{}'", slot, var);
}

/// What a slot's elements must be besides finite: Adam's second moment is
/// never negative, Adagrad's accumulator always positive (it starts at
/// initial_accumulator > 0 and only grows; it is a square root's argument
/// and a divisor).
enum class sign_rule { any, non_negative, positive };

/// The sign rule of slot `slot` (element checks of a value: any).
sign_rule rule_of(const std::string& slot) {
  if (slot == "v")
    return sign_rule::non_negative;
  if (slot == "accumulator")
    return sign_rule::positive;
  return sign_rule::any;
}

/// "" if every element of float32 `t` is finite (and keeps `rule`), else
/// what is wrong with the first one that is not.
std::string bad_element(const tensor& t, const std::string& var, const std::string& slot,
                        sign_rule rule) {
  if (t.type() != dtype::float32)
    return "";
  auto n = static_cast<size_t>(t.num_elements());
  const float* data = t.data<float>();
  auto bad = first_non_finite(data, n);
  if (bad < n)
    return fmt::format("holds {} whose element {} is {}, not finite", field_name(var, slot), bad,
                       data[bad]);
  if (rule == sign_rule::non_negative)
    for (size_t i = 0; i < n; ++i)
      if (data[i] < 0)
        return fmt::format("holds {} whose element {} is {}: an Adam second moment is never "
                           "negative (its square root would be NaN)",
                           field_name(var, slot), i, data[i]);
  if (rule == sign_rule::positive)
    for (size_t i = 0; i < n; ++i)
      if (!(data[i] > 0))
        return fmt::format("holds {} whose element {} is {}: an Adagrad accumulator is always "
                           "positive (it starts at initial_accumulator and grows; the update "
                           "divides by its square root)",
                           field_name(var, slot), i, data[i]);
  return "";
}

} // namespace

uint64_t max_checkpoint_step(uint64_t total_steps, uint32_t workers) {
  uint64_t out = 0;
  if (__builtin_add_overflow(total_steps, uint64_t{workers}, &out))
    return UINT64_MAX;
  return out;
}

graph_status check_checkpoint(const checkpoint& ck, const std::string& path,
                              const checkpoint_expectations& want) {
  if (ck.global_step > want.max_step)
    return refuse(path, fmt::format("has global_step = {}, past this job's end (at most {}: its "
                                    "steps and one push per worker); a job of more steps "
                                    "(steps, epochs) may resume it",
                                    ck.global_step, want.max_step));
  if (ck.data_position > want.max_step)
    return refuse(path, fmt::format("has data_position = {}, past this job's end (at most {} "
                                    "global batches: its steps and one push per worker)",
                                    ck.data_position, want.max_step));
  bool adam = want.optimizer_kind == "adam", adagrad = want.optimizer_kind == "adagrad";
  std::set<std::string> seen;
  for (const auto& v : ck.variables) {
    auto shown = shown_name(v.name);
    auto p = std::find_if(want.params.begin(), want.params.end(),
                          [&](const parameter& q) { return q.name == v.name; });
    if (p == want.params.end())
      return refuse(path, fmt::format("holds variable '{}', which this model does not have: it "
                                      "was written by another model (restore it with the config "
                                      "it was trained with)",
                                      shown));
    if (!seen.insert(v.name).second)
      return refuse(path, fmt::format("holds variable '{}' twice", shown));
    if (v.value.type() != dtype::float32 || v.value.shape() != p->shape)
      return refuse(path, fmt::format("holds variable '{}' as {}, but the model's is float32{}: "
                                      "it was written by another model (restore it with the "
                                      "config it was trained with)",
                                      shown, v.value.summary(), shape_string(p->shape)),
                    af_error::shape_mismatch);
    if (auto bad = bad_element(v.value, shown, "", sign_rule::any); !bad.empty())
      return refuse(path, bad, af_error::non_finite);
    for (const auto& [slot, t] : v.slots) {
      auto slot_shown = shown_name(slot);
      if (known_slots().count(slot) == 0)
        return refuse(path, fmt::format("holds a slot '{}' of variable '{}', which no optimizer "
                                        "keeps (momentum keeps \"momentum\", adagrad "
                                        "\"accumulator\", adam \"m\" and \"v\")",
                                        slot_shown, shown));
      if (t.type() != dtype::float32 || t.shape() != p->shape)
        return refuse(path, fmt::format("holds slot '{}' of variable '{}' as {}, but the "
                                        "variable is float32{}: the file is inconsistent",
                                        slot_shown, shown, t.summary(), shape_string(p->shape)),
                      af_error::shape_mismatch);
      // Only the job's own optimizer's rule: a slot it does not use is not restored.
      bool used = (adam && slot == "v") || (adagrad && slot == "accumulator");
      auto rule = used ? rule_of(slot) : sign_rule::any;
      if (auto bad = bad_element(t, shown, slot_shown, rule); !bad.empty())
        return refuse(path, bad, af_error::non_finite);
    }
  }
  for (const auto& p : want.params)
    if (seen.count(p.name) == 0)
      return refuse(path, fmt::format("has no variable '{}': it was written by another model "
                                      "(restore it with the config it was trained with)",
                                      p.name));
  // Push numbers: a job's workers count theirs from 1 and a joiner goes on
  // from the last one taken, so a number near 2^64 (only a forger writes
  // one) would wrap and make every later push look like a retry: the job
  // stalled, answering each push "not applied twice".
  for (const auto& [agg, seqs] : ck.push_seqs)
    for (const auto& [worker, seq] : seqs)
      if (seq > max_push_number)
        return refuse(path, fmt::format("holds push number {} of worker {} for aggregator '{}', "
                                        "more than any job makes (at most {}): the file is "
                                        "corrupt or forged",
                                        seq, worker, shown_name(agg), max_push_number));
  return ok();
}

std::string slot_mismatch(const checkpoint& ck, const std::string& optimizer_kind) {
  auto names = slot_names(optimizer_kind);
  std::set<std::string> wanted(names.begin(), names.end()), held, missing;
  for (const auto& v : ck.variables) {
    for (const auto& [slot, t] : v.slots)
      held.insert(slot);
    for (const auto& n : names)
      if (v.slots.count(n) == 0)
        missing.insert(n);
  }
  std::set<std::string> ignored;
  for (const auto& h : held)
    if (wanted.count(h) == 0)
      ignored.insert(shown_name(h));
  if (missing.empty() && ignored.empty())
    return {};
  std::string out = fmt::format("it was written with other optimizer slots than {}'s:",
                                optimizer_kind);
  if (!missing.empty())
    out += missing.count("accumulator") != 0
               ? fmt::format(" these start at their initial values (the accumulator at "
                             "initial_accumulator): {}",
                             fmt::join(missing, ", "))
               : fmt::format(" these start at zeros: {}", fmt::join(missing, ", "));
  if (!missing.empty() && !ignored.empty())
    out += ";";
  if (!ignored.empty())
    out += fmt::format(" these are not used: {}", fmt::join(ignored, ", "));
  return out;
}

std::string first_non_finite_value(const checkpoint& ck) {
  for (const auto& v : ck.variables) {
    if (auto bad = bad_element(v.value, shown_name(v.name), "", sign_rule::any); !bad.empty())
      return bad;
    for (const auto& [slot, t] : v.slots)
      if (auto bad = bad_element(t, shown_name(v.name), shown_name(slot), sign_rule::any);
          !bad.empty())
        return bad;
  }
  return "";
}

} // namespace af::train
