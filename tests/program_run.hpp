// What the tests that run a program (actorflow-train's command line, its
// TensorBoard files) share: a scratch folder, a file's bytes, and a run of
// the program that waits for it with its output captured.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace af::test {

/// A fresh folder under the temporary directory, removed with everything in
/// it when this goes; `prefix` names the test file that made it.
struct scratch_dir {
  std::filesystem::path path;
  explicit scratch_dir(const std::string& prefix) {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path()
           / ("actorflow-" + prefix + "-" + std::to_string(::getpid()) + "-"
              + std::to_string(counter++) + "-"
              + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    std::filesystem::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

/// The bytes of the file at `path` (empty if it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  return {std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
}

/// How a run of a program ended, and what it wrote.
struct run_result {
  int status = -1; ///< its exit code; -1 if a signal ended it
  std::string out;
  std::string err;
};

/// Runs `program` with `args` (each single-quoted for the shell) and waits
/// for it to exit, its output in `dir`; `prefix`: shell text before it
/// ("ulimit -v N; ", "timeout 30 ").
inline run_result run_program(const scratch_dir& dir, const std::string& program,
                              const std::vector<std::string>& args,
                              const std::string& prefix = "") {
  std::string cmd = prefix + "'" + program + "'";
  for (const auto& a : args)
    cmd += " '" + a + "'";
  auto out = dir / "stdout.txt";
  auto err = dir / "stderr.txt";
  cmd += " >'" + out + "' 2>'" + err + "' </dev/null";
  run_result r;
  int raw = std::system(cmd.c_str());
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

} // namespace af::test
