// A file of this build (a program, a generated folder), found from the test
// binary's own path. The tests' compile definitions name each one relative to
// the test binary's folder (ACTORFLOW_NODE_BINARY is
// af::test::built_path("../actorflow-node"); tests/CMakeLists.txt), not by its
// absolute path: the definitions are then the same in every build folder, and
// ccache shares the tests' compiles between CI's CUDA and CPU-only builds
// (.ci/run). tests/CMakeLists.txt force-includes this header where they are set.
#pragma once

#include <limits.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

namespace af::test {

/// `relative` (to the folder of the running test binary) as an absolute
/// path; the pointer stays valid for the life of the process.
inline const char* built_path(const char* relative) {
  static std::mutex mtx;
  static std::map<std::string, std::string> paths; // node-based: values never move
  std::lock_guard<std::mutex> guard{mtx};
  auto& path = paths[relative];
  if (path.empty()) {
    char exe[PATH_MAX];
    auto n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
      throw std::runtime_error(std::string{"built_path: cannot read /proc/self/exe to find "}
                               + relative);
    std::string dir{exe, static_cast<size_t>(n)};
    dir.resize(dir.rfind('/'));
    path = dir + "/" + relative;
  }
  return path.c_str();
}

} // namespace af::test
