#pragma once
/// How a tensor crosses an actor boundary.
///
/// Within a process CAF never serializes: the message holds the tensor, i.e. a
/// pointer to the shared buffer. Across nodes the header (dtype, shape) is
/// followed by the buffer as ONE raw byte blob (`apply_raw`), never element by
/// element; a decoder checks that the blob's length matches the shape.

#include <string>
#include <type_traits>

#include "caf/deserializer.hpp"
#include "caf/error.hpp"
#include "caf/meta/type_name.hpp"
#include "caf/serializer.hpp"

#include "core/tensor.hpp"

namespace af {

inline std::string to_string(dtype t) {
  return dtype_name(t);
}

caf::error inspect(caf::serializer& f, tensor& x);
caf::error inspect(caf::deserializer& f, tensor& x);

/// Any other inspector (e.g. deep_to_string) sees a summary such as "float32[2,2]".
template <class Inspector>
typename std::enable_if<!std::is_base_of<caf::serializer, Inspector>::value
                          && !std::is_base_of<caf::deserializer, Inspector>::value,
                        typename Inspector::result_type>::type
inspect(Inspector& f, tensor& x) {
  auto text = x.summary();
  return f(caf::meta::type_name("tensor"), text);
}

} // namespace af
