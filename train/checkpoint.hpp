#pragma once
/// Checkpoints (TF's Saver), no CAF: every variable with its optimizer slots,
/// the global step, the data position and the config, as a Cereal binary
/// archive behind a header (magic, format version) and a checksum of the body.
/// Written to a temporary file in the same directory, fsynced, renamed, and
/// the directory fsynced: a crash leaves the old checkpoint or the new one,
/// never half of one. A torn, truncated or foreign file is refused with an
/// error naming it.
///
/// The checksum finds accidents (a torn write, a flipped byte), not forgery:
/// anyone who can write the directory can write a checkpoint that passes it.
/// With a key (train_config::checkpoint_key), save() appends an HMAC-SHA256
/// of the header and body, and load() refuses a file without a valid one.
///
/// File layout (integers little-endian):
///   0   8 bytes  magic "AFCKPT01"
///   8   u32      format version (checkpoint_format_version): the body's
///   12  u32      flags: bit 0, an HMAC follows the body; no other bit is set
///   16  u64      body length in bytes
///   24  u64      FNV-1a 64 of the body
///   32  body     a cereal PortableBinary archive: global_step, data_position,
///                config, then each variable's name, value and slots; a
///                tensor is its dtype, shape and raw (host-order) bytes.
///                Format 2 then holds the push numbers: per aggregator, its
///                name and (worker, last push number taken) pairs. Format 1
///                (no push numbers) is still read.
///   with flag bit 0 only, after the body: 32 bytes, HMAC-SHA256 under the
///                key of the 32 header bytes and the body.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "graph/outcome.hpp"
#include "core/tensor.hpp"

namespace af::train {

struct saved_variable {
  std::string name;
  tensor value;
  std::map<std::string, tensor> slots;
};

struct checkpoint {
  uint64_t global_step = 0;
  uint64_t data_position = 0;       ///< steps of data each worker has consumed
  std::string config;               ///< the training config (TOML)
  std::vector<saved_variable> variables;
  /// Per aggregator (by name): per worker index, the last push number it
  /// took (messages/aggregator.hpp's push_credentials::seq), so that a push
  /// retried after its ps died and was restored from here counts once.
  std::map<std::string, std::map<uint32_t, uint64_t>> push_seqs;
};

/// The format this build writes; load() refuses newer ones.
constexpr uint32_t checkpoint_format_version = 2;

/// The header's flags this build knows (load() refuses a file with others).
constexpr uint32_t checkpoint_flag_hmac = 1; ///< an HMAC-SHA256 follows the body

/// The bytes of an HMAC key (train_config::checkpoint_key): empty for none.
/// The key may be any bytes; load_checkpoint_key() reads it from a file.
using checkpoint_key = std::string;

/// The key in file `path` (its bytes, as they are: `openssl rand -hex 32 >
/// FILE` makes one): a regular file of 16 to 4096 bytes. Errors name the
/// file, the key (checkpoint_key) and what is wrong.
outcome<checkpoint_key> load_checkpoint_key(const std::string& path);

/// Writes `ckpt` as DIR/ckpt-<global_step>.afck and updates DIR/latest
/// (which names it) the same atomic way; keeps the newest `keep` files
/// (by step; the one just written always stays; 0 keeps all). Creates DIR
/// if needed. With a `key`, the file carries an HMAC (checkpoint_flag_hmac;
/// builds older than it refuse the file). Returns
/// the path written.
outcome<std::string> save(const std::string& dir, const checkpoint& ckpt, size_t keep = 3,
                          const checkpoint_key& key = {});

/// Called by save() halfway through writing the checkpoint file of
/// `global_step`: the first `written` of `total` bytes are in `tmp_path`
/// (the temporary file, renamed when complete) and fsynced. A seam for
/// tests (tests/checkpoint_pause_hook.cpp stops a real chief there, to kill
/// it in the middle of a write); no program installs one.
using checkpoint_write_hook = void (*)(uint64_t global_step, const std::string& tmp_path,
                                       size_t written, size_t total);

/// Installs `hook` for every later save() of this process (nullptr: none,
/// the default); returns the one it replaces.
checkpoint_write_hook set_checkpoint_write_hook(checkpoint_write_hook hook);

/// Empty if save() can write into `dir`: creates it (and its parents) if
/// needed, then writes, fsyncs and removes a probe file there. Else a sentence
/// naming the directory, what failed and what to do, for refusing a job
/// before it trains rather than at its first checkpoint.
std::string check_checkpoint_dir(const std::string& dir);

/// Reads one checkpoint file; errors name the file and what is wrong
/// (not a regular file, a symbolic link, not a checkpoint, a newer format,
/// truncated, checksum mismatch, a body that does not decode, a tensor whose
/// shape does not match its bytes). With a `key`, a file without an HMAC or
/// with a wrong one is refused; without one, an HMAC is not checked. Values
/// are not judged here (NaN round-trips): check_checkpoint() does that.
outcome<checkpoint> load(const std::string& path, const checkpoint_key& key = {});

/// The path DIR/latest names, or "" if DIR has no checkpoint yet (or does
/// not exist); an error if `latest` is not a regular file, or names
/// anything but a plain file name (no '/', not "." or "..") of a regular
/// file in DIR (a symbolic link, a FIFO, a missing file are refused).
outcome<std::string> latest(const std::string& dir);

} // namespace af::train
