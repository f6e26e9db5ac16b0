#include "core/device_name.hpp"

#include <cctype>
#include <vector>

namespace af {

namespace {

std::string upper(std::string_view s) {
  std::string out{s};
  for (auto& c : out)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

bool parse_index(std::string_view s, int32_t& out) {
  if (s.empty() || s.size() > 9)
    return false;
  int32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9')
      return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

bool known_type(const std::string& t) {
  return t == "CPU" || t == "GPU";
}

bool fail(std::string* why, std::string msg) {
  if (why)
    *why = std::move(msg);
  return false;
}

} // namespace

bool valid_job_name(std::string_view s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0])))
    return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_')
      return false;
  return true;
}

std::optional<device_name> device_name::parse(std::string_view text, std::string* why) {
  device_name result;
  const std::string quoted = "'" + std::string{text} + "'";
  if (text.empty())
    return result;
  if (text.front() != '/') {
    fail(why, "device name " + quoted + " must start with '/' (e.g. /cpu:0 or /job:ps/task:0)");
    return std::nullopt;
  }
  std::vector<std::string_view> parts;
  size_t pos = 1;
  while (pos <= text.size()) {
    auto next = text.find('/', pos);
    if (next == std::string_view::npos)
      next = text.size();
    parts.push_back(text.substr(pos, next - pos));
    pos = next + 1;
  }
  auto set_device = [&](std::string_view type, std::string_view idx) -> bool {
    auto t = upper(type);
    if (!known_type(t))
      return fail(why, "device name " + quoted + ": unknown device type '" + std::string{type}
                         + "' (actorflow knows CPU and GPU)");
    if (result.type)
      return fail(why, "device name " + quoted + " names a device twice");
    result.type = t;
    if (idx == "*")
      return true;
    int32_t id = 0;
    if (!parse_index(idx, id))
      return fail(why, "device name " + quoted + ": device index '" + std::string{idx}
                         + "' is not a non-negative number");
    result.id = id;
    return true;
  };
  for (auto part : parts) {
    if (part.empty()) {
      fail(why, "device name " + quoted + " has an empty component ('//' or a trailing '/')");
      return std::nullopt;
    }
    auto colon = part.find(':');
    if (colon == std::string_view::npos) {
      fail(why, "device name " + quoted + ": component '" + std::string{part}
                  + "' has no ':' (expected job:NAME, replica:N, task:N or device:TYPE:N)");
      return std::nullopt;
    }
    auto key = part.substr(0, colon);
    auto val = part.substr(colon + 1);
    bool ok = true;
    if (key == "job") {
      if (!valid_job_name(val))
        ok = fail(why, "device name " + quoted + ": job name '" + std::string{val}
                         + "' must start with a letter and hold only letters, digits and '_'");
      else if (result.job)
        ok = fail(why, "device name " + quoted + " names the job twice");
      else
        result.job = std::string{val};
    } else if (key == "replica" || key == "task") {
      int32_t v = 0;
      auto& field = key == "replica" ? result.replica : result.task;
      if (!parse_index(val, v))
        ok = fail(why, "device name " + quoted + ": " + std::string{key} + " index '"
                         + std::string{val} + "' is not a non-negative number");
      else if (field)
        ok = fail(why, "device name " + quoted + " names the " + std::string{key} + " twice");
      else
        field = v;
    } else if (key == "device") {
      auto colon2 = val.find(':');
      if (colon2 == std::string_view::npos)
        ok = fail(why, "device name " + quoted + ": expected device:TYPE:N, got '"
                         + std::string{part} + "'");
      else
        ok = set_device(val.substr(0, colon2), val.substr(colon2 + 1));
    } else {
      // legacy short forms: /cpu:0, /GPU:1
      auto t = upper(key);
      if (known_type(t)) {
        ok = set_device(key, val);
      } else if (t == "TPU" || t == "XLA_CPU" || t == "XLA_GPU") {
        ok = set_device(key, val); // produces the "unknown device type" message
      } else {
        ok = fail(why, "device name " + quoted + ": unknown component '" + std::string{key}
                         + "' (expected job, replica, task, device, cpu or gpu)");
      }
    }
    if (!ok)
      return std::nullopt;
  }
  return result;
}

std::string device_name::to_string() const {
  std::string out;
  if (job)
    out += "/job:" + *job;
  if (replica)
    out += "/replica:" + std::to_string(*replica);
  if (task)
    out += "/task:" + std::to_string(*task);
  if (type)
    out += "/device:" + *type + ":" + (id ? std::to_string(*id) : std::string{"*"});
  return out;
}

std::string device_name::local_device() const {
  if (!type)
    return {};
  return *type + ":" + (id ? std::to_string(*id) : std::string{"*"});
}

device_name device_name::merged_into(const device_name& outer) const {
  device_name out = *this;
  if (!out.job)
    out.job = outer.job;
  if (!out.replica)
    out.replica = outer.replica;
  if (!out.task)
    out.task = outer.task;
  if (!out.type) {
    out.type = outer.type;
    if (!out.id)
      out.id = outer.id;
  }
  return out;
}

bool device_name::operator==(const device_name& other) const {
  return job == other.job && replica == other.replica && task == other.task
         && type == other.type && id == other.id;
}

} // namespace af
