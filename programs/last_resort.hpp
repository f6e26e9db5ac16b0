#pragma once
/// The programs' last resort for running out of memory: std::bad_alloc that
/// no reader bounded (each input that can ask for memory has its own limit
/// and error, see core/read_file.hpp and max_data_bytes) would otherwise
/// abort the process (SIGABRT, exit 134) with no word of what happened.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <system_error>

namespace af {

/// The line a program prints when it runs out of memory: once, however many
/// threads run out together (a machine with many cores starts many). A
/// thread that comes second waits until the first has printed: it goes on to
/// _Exit, which must not end the process before the line is out.
inline void say_out_of_memory(const char* program) {
  static std::mutex mtx;
  static bool said = false;
  std::lock_guard<std::mutex> guard{mtx};
  if (said)
    return;
  said = true;
  std::fprintf(stderr,
               "%s: out of memory: an input asked for more memory than this machine gives "
               "(check the sizes that the config and the data files ask for, e.g. "
               "max_data_bytes, or raise the memory limit)\n",
               program);
  std::fflush(stderr);
}

/// True for the system_error a thread's start throws when its stack cannot be
/// mapped (EAGAIN, ENOMEM): memory, as a bad_alloc is. (A CUDA build, whose
/// runtime reserves more address space, meets a memory cap there first.)
inline bool out_of_memory(const std::system_error& e) {
  return e.code() == std::errc::resource_unavailable_try_again
         || e.code() == std::errc::not_enough_memory;
}

/// `body()`'s exit status; 1 with a line on stderr if it ran out of memory
/// (std::bad_alloc, or a thread that could not start for want of it), on this
/// thread or (through std::terminate) on any other.
template <class F>
int last_resort(const char* program, F&& body) {
  static const char* name = program;
  static std::terminate_handler previous = nullptr; // libstdc++'s: prints the exception
  previous = std::set_terminate([] {
    if (auto e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::bad_alloc&) {
        say_out_of_memory(name);
        std::_Exit(1);
      } catch (const std::system_error& x) {
        if (out_of_memory(x)) {
          say_out_of_memory(name);
          std::_Exit(1);
        }
      } catch (...) {
        // another exception: what std::terminate did before
      }
    }
    if (previous)
      previous();
    std::abort();
  });
  try {
    return body();
  } catch (const std::bad_alloc&) {
    say_out_of_memory(program);
    return 1;
  } catch (const std::system_error& e) {
    if (!out_of_memory(e))
      throw;
    say_out_of_memory(program);
    return 1;
  }
}

} // namespace af
