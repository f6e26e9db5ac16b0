#pragma once
/// TensorFlow device names: `/job:J/replica:R/task:T/device:TYPE:N`.
///
/// Every field is optional. Short forms `/cpu:0`, `/gpu:1`, `/device:GPU:1`,
/// `/job:ps/task:0` parse too; the type is case-insensitive ("gpu", "GPU") and is
/// printed upper case, as TensorFlow prints it. `merge` fills the fields a name
/// leaves open from an enclosing scope, the way nested `tf.device` blocks do.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace af {

/// True for a job name: a letter, then letters, digits and '_' (the rule of
/// both device names and the cluster spec's jobs).
bool valid_job_name(std::string_view s);

struct device_name {
  std::optional<std::string> job;
  std::optional<int32_t> replica;
  std::optional<int32_t> task;
  std::optional<std::string> type;   ///< "CPU" or "GPU"
  std::optional<int32_t> id;

  /// Parses `text`; on failure returns nullopt and writes the reason to `why`.
  static std::optional<device_name> parse(std::string_view text, std::string* why = nullptr);

  /// Canonical text of the fields that are set ("" if none).
  std::string to_string() const;

  /// Fields of `*this` win; the open ones are taken from `outer`.
  device_name merged_into(const device_name& outer) const;

  /// True if every field is set.
  bool fully_specified() const {
    return job && replica && task && type && id;
  }

  /// "CPU:0" style local part; empty if type is unset.
  std::string local_device() const;

  bool operator==(const device_name& other) const;
  bool operator!=(const device_name& other) const { return !(*this == other); }
};

} // namespace af
