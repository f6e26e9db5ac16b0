// One libFuzzer target: AF_FUZZ_TARGET names the function of fuzz/harness.hpp
// it feeds (fuzz/CMakeLists.txt builds this file once per target).
#include <cstdio>
#include <cstdlib>

#include "fuzz/harness.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The data plane logs every refused peer; at fuzzing speed that is noise.
  setenv("ACTORFLOW_LOG", "off", 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto problem = af::fuzz::AF_FUZZ_TARGET(data, size);
  if (!problem.empty()) {
    std::fprintf(stderr, "fuzz target " AF_FUZZ_NAME ": %s\n", problem.c_str());
    std::abort();
  }
  return 0;
}
