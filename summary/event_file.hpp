#pragma once
/// One TensorBoard event file: what TensorBoard 2.x reads from a run's
/// folder. Records in TFRecord framing (uint64 length, masked CRC-32C of the
/// length, the data, masked CRC-32C of the data; all little-endian), each an
/// `Event` (summary/event.proto); the first says file_version "brain.Event:2".
/// Named events.out.tfevents.<seconds>.<host> as TensorFlow names them, so
/// that `tensorboard --logdir` finds it. Plain C++ and protobuf: no CAF.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "summary/histogram.hpp"

namespace af::summary {

/// The TFRecord frame of `data`: its 16-byte header, the data, its 4-byte footer.
std::string frame_record(const std::string& data);

/// The name of an event file started at `seconds` (since the epoch) on
/// `host`: "events.out.tfevents.0001733450000.host" (ten digits, as
/// TensorFlow's EventsWriter).
std::string event_file_name(int64_t seconds, const std::string& host);

class event_file {
public:
  /// Starts a new event file in `dir` (created with its parents if needed),
  /// never over an existing one (a second file of the same second gets a
  /// ".1", ".2" suffix), and writes its file_version record. Null, with a
  /// sentence naming the path and why in `error`, if it cannot.
  static std::unique_ptr<event_file> open(const std::string& dir, std::string& error);
  ~event_file();
  event_file(const event_file&) = delete;
  event_file& operator=(const event_file&) = delete;

  /// One event of `step` with a simple_value per (tag, value).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  /// One event of `step` with a histogram per (tag, histogram).
  void histograms(int64_t step, const std::vector<std::pair<std::string, histogram>>& values);
  /// A SessionLog START at `step`: TensorBoard drops the events of the run's
  /// earlier files at `step` and after (a resumed job runs them again).
  void start_at(int64_t step);
  /// Writes what is buffered to the file; if the file was removed, starts
  /// a new one in its folder (path() changes), as TensorFlow does. False
  /// (and error() says why) if a write failed since the file was opened.
  bool flush();
  /// flush(), then fsync: what was written survives a crash of the machine,
  /// not only of the process. For the end of a job (close() does it), not
  /// for every record: an fsync waits for the disk. False (error()) if it failed.
  bool sync();
  /// sync(), then closes the file (and fsyncs its folder, so that a new
  /// file's name is durable too); events written after it are dropped. The
  /// destructor closes a file that is still open. False (error()) if it failed.
  bool close();

  const std::string& path() const { return path_; }
  /// Why the last write failed; empty if none did.
  const std::string& error() const { return error_; }

private:
  event_file(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  /// Appends one serialized Event, framed.
  void write(const std::string& event);
  std::FILE* f_ = nullptr;
  std::string path_;
  std::string error_;
};

} // namespace af::summary
