#pragma once
/// The files of table checkpoints (train/table_checkpoint.hpp): written
/// atomically through a temporary file, read back exactly, never a FIFO
/// or a device.

#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/outcome.hpp"

namespace af::train {

/// A file being written through `<path>.tmp`: removed unless committed.
class durable_file {
public:
  explicit durable_file(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {}
  durable_file(const durable_file&) = delete;
  durable_file& operator=(const durable_file&) = delete;
  ~durable_file();

  /// A fresh temporary file: a leftover of a crash goes, a planted link is
  /// not followed.
  graph_status open();
  /// All `n` bytes, or an error naming the file.
  graph_status write(const char* data, size_t n);
  /// fsync, close, rename into place, fsync the directory `dir`.
  graph_status commit(const std::string& dir);

private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

/// Reads exactly `n` bytes at `offset`; false if the file ends first.
bool pread_exact(int fd, char* out, size_t n, uint64_t offset);

/// Opens a regular file (never a FIFO or device) to read; its size in
/// `size`. The error says "cannot read <what> '<path>': why".
outcome<int> open_for_reading(const std::string& path, const std::string& what,
                              uint64_t& size);

} // namespace af::train
