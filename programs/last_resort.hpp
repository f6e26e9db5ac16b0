#pragma once
/// The programs' last resort for running out of memory: std::bad_alloc that
/// no reader bounded (each input that can ask for memory has its own limit
/// and error, see config/read_file.hpp and max_data_bytes) would otherwise
/// abort the process (SIGABRT, exit 134) with no word of what happened.

#include <cstdio>
#include <new>

namespace af {

/// `body()`'s exit status; 1 with a line on stderr if it threw std::bad_alloc.
template <class F>
int last_resort(const char* program, F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "%s: out of memory: an input asked for more memory than this machine can give "
                 "(check the sizes the config and the data files ask for, or raise the memory "
                 "limit)\n",
                 program);
    return 1;
  }
}

} // namespace af
