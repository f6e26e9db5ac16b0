#pragma once
// A directory of its own under /tmp for one test, removed with everything in it.

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace af::testing {

struct temp_dir {
  temp_dir() {
    char tmpl[] = "/tmp/actorflow-test-XXXXXX";
    if (auto* made = mkdtemp(tmpl))
      path = made;
  }
  ~temp_dir() {
    std::error_code ec;
    if (!path.empty())
      std::filesystem::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  /// The path of `name` inside it.
  std::string operator/(const std::string& name) const { return path + "/" + name; }

  std::string path;
};

/// Writes `text` to `path` (made or truncated), byte for byte.
inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream out{path, std::ios::binary | std::ios::trunc};
  out << text;
}

} // namespace af::testing
