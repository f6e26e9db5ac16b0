#include "fuzz/harness.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "caf/binary_deserializer.hpp"
#include "caf/binary_serializer.hpp"

#include "config/cluster_spec.hpp"
#include "core/device_name.hpp"
#include "messages/error.hpp"
#include "messages/serialization.hpp"
#include "core/wire_format.hpp"
#include "repl/parser.hpp"
#include "train/config.hpp"

namespace af::fuzz {

namespace {

std::string text_of(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

std::string jobs_text(const cluster_spec& spec) {
  std::string out;
  for (const auto& [job, tasks] : spec.jobs()) {
    out += job + ":";
    for (const auto& t : tasks)
      out += " " + t.to_string();
    out += ";";
  }
  return out;
}

} // namespace

std::string cluster_toml(const uint8_t* data, size_t size) {
  auto cfg = parse_cluster_toml(text_of(data, size), "fuzz.toml");
  if (!cfg)
    return {};
  auto again = parse_cluster_toml(cfg->cluster.to_toml(cfg->node), "to_toml");
  if (!again)
    return "a parsed config does not parse back from to_toml: " + describe(again.error());
  if (jobs_text(again->cluster) != jobs_text(cfg->cluster))
    return "to_toml changed the jobs: " + jobs_text(cfg->cluster) + " became "
           + jobs_text(again->cluster);
  return {};
}

std::string cluster_json(const uint8_t* data, size_t size) {
  auto cfg = parse_cluster_json(text_of(data, size), "fuzz.json");
  if (!cfg)
    return {};
  // to_json is TF_CONFIG's "cluster" value: read it back there (as a bare
  // map, a job named "task" or "security" would be taken for those keys)
  auto again = parse_cluster_json("{\"cluster\": " + cfg->cluster.to_json() + "}", "to_json");
  if (!again)
    return "a parsed config does not parse back from to_json: " + describe(again.error());
  if (jobs_text(again->cluster) != jobs_text(cfg->cluster))
    return "to_json changed the jobs: " + jobs_text(cfg->cluster) + " became "
           + jobs_text(again->cluster);
  return {};
}

std::string train_config(const uint8_t* data, size_t size) {
  auto cfg = train::parse_train_config(text_of(data, size), "fuzz.toml");
  if (!cfg)
    return {};
  auto problem = train::validate(*cfg);
  auto text = train::to_toml(*cfg);
  auto again = train::parse_train_config(text, "to_toml");
  if (!again)
    return "a parsed train config does not parse back from to_toml: " + again.error().what
           + "\n" + text;
  if (train::to_toml(*again) != text)
    return "to_toml of a parsed train config changed on a second round:\n" + text;
  if (train::validate(*again) != problem)
    return "validate changed after to_toml and back: '" + problem + "' became '"
           + train::validate(*again) + "'";
  return {};
}

std::string device_name(const uint8_t* data, size_t size) {
  std::string why;
  auto d = af::device_name::parse(text_of(data, size), &why);
  if (!d)
    return why.empty() ? "a refused device name gives no reason" : std::string{};
  auto text = d->to_string();
  auto again = af::device_name::parse(text, &why);
  if (!again)
    return "'" + text + "' (to_string of a parsed name) does not parse: " + why;
  if (*again != *d)
    return "'" + text + "' parses to another name than the one it was printed from";
  if (d->merged_into(*d) != *d || d->merged_into(af::device_name{}) != *d)
    return "merging '" + text + "' changed it";
  (void) d->local_device();
  return {};
}

std::string wire_header(const uint8_t* data, size_t size) {
  unsigned char raw[sizeof(wire::header)] = {}; // a short input: zeros after it
  std::memcpy(raw, data, std::min(size, sizeof(raw)));
  wire::header h;
  std::memcpy(static_cast<void*>(&h), raw, sizeof(h));
  auto problem = wire::validate(h);
  if (!problem.empty() || !h.has_tensor)
    return {};
  auto shape = wire::shape_of(h);
  if (shape.size() != h.rank)
    return "shape_of gave rank " + std::to_string(shape.size()) + " for rank "
           + std::to_string(h.rank);
  auto n = num_elements(shape);
  if (n < 0)
    return "validate accepted shape " + shape_string(shape) + " whose element count is invalid";
  if (static_cast<uint64_t>(n) * wire::element_bytes(h.dtype) != h.payload_bytes)
    return "validate accepted a payload of " + std::to_string(h.payload_bytes)
           + " bytes for shape " + shape_string(shape);
  return {};
}

std::string tensor_decode(const uint8_t* data, size_t size) {
  struct cap_guard {
    uint64_t before = max_decoded_tensor_bytes();
    cap_guard() { set_max_decoded_tensor_bytes(tensor_cap_bytes); }
    ~cap_guard() { set_max_decoded_tensor_bytes(before); }
  } cap;
  caf::binary_deserializer source{nullptr, reinterpret_cast<const char*>(data), size};
  tensor t;
  if (auto err = inspect(source, t))
    return {};
  if (t.empty())
    return {};
  if (t.nbytes() > tensor_cap_bytes)
    return "decoded a tensor of " + std::to_string(t.nbytes()) + " bytes, over the cap of "
           + std::to_string(tensor_cap_bytes);
  if (num_elements(t.shape()) != static_cast<int64_t>(t.num_elements()))
    return "decoded tensor " + t.summary() + " holds " + std::to_string(t.num_elements())
           + " elements";
  // Back through the encoder and decoder: the same tensor. (Not the same
  // bytes: the decoder takes any non-zero has_value byte and long varbytes.)
  std::vector<char> out;
  caf::binary_serializer sink{nullptr, out};
  if (auto err = inspect(sink, t))
    return "a decoded tensor does not serialize: " + describe(err);
  caf::binary_deserializer again_source{nullptr, out.data(), out.size()};
  tensor again;
  if (auto err = inspect(again_source, again))
    return "decoded tensor " + t.summary() + " does not decode after encoding: " + describe(err);
  if (again != t)
    return "decoded tensor " + t.summary() + " changed through encoding and decoding";
  return {};
}

std::string repl_parser(const uint8_t* data, size_t size) {
  auto text = text_of(data, size);
  auto result = repl::parse(text);
  if (result.error) {
    if (result.error->message.empty())
      return "a parse error without a message";
    if (repl::explain(*result.error, text).empty())
      return "explain() of a parse error is empty";
  }
  (void) repl::incomplete(text);
  size_t start = 0;
  while (start <= text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string::npos)
      end = text.size();
    (void) repl::bracket_balance(text.substr(start, end - start));
    start = end + 1;
  }
  return {};
}

} // namespace af::fuzz
