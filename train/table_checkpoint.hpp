#pragma once
/// Checkpoints of partitioned embedding tables, shard by shard (issue 25):
/// a table too large for one process is never in one process to be saved
/// either. Each shard (its value and its optimizer slots) is written by the
/// process that holds it, streamed in chunks of rows straight from its
/// buffers to its own file (no copy of the shard, no buffer of the table),
/// atomically as train/checkpoint.hpp's files (a temporary file, fsync,
/// rename, the directory fsynced). A small manifest lists the shards; it is
/// written last, by whoever knows the table's layout (the chief), once every
/// shard file is in place.
///
/// A table is restored onto any number of shards, by any strategy: each new
/// shard reads its rows (and slots) from the old shard files that hold them,
/// chunk by chunk, never the whole table. So a job saved on 3 ps (mod)
/// resumes on 2 or 4 ps, mod or div.
///
/// Shard file `<dir>/<table>.shard-<k>-of-<n>.aftab` ('/' in a table name
/// written as "%2F", '%' as "%25"), integers little-endian:
///   header:  8 bytes magic "AFTAB002", u32 header length H, then H bytes:
///            the table name, shard k, shards n, strategy (u8), every
///            shard's rows (n x i64: with the strategy, which global rows
///            this shard holds), the row shape (the dims after the first),
///            the dtype (float32), the slot names, the global step, rows per
///            chunk; then the SHA-256 of those H bytes (32 bytes).
///   data:    the shard's rows in order, in chunks of `rows per chunk` rows
///            (the last shorter); a row is its value's floats then each
///            slot's floats, in the slot names' order (one read gives a row
///            and its slots).
///   trailer: the SHA-256 of each chunk (32 bytes each), then u64 the chunk
///            count and 8 bytes "AFTABEND".
/// Its size follows from the header: a file of another size is torn.
/// The file's digest is the SHA-256 of its header's digest followed by its
/// trailer: through the chunks' digests it covers every byte of the file,
/// yet a restore that reads some chunks checks just those.
///
/// Manifest `<dir>/<table>.manifest`: text, one `key value...` per line
/// (first line "actorflow table checkpoint 2"; table, strategy, shard_rows,
/// row_shape, dtype, slots, global_step, one `shard <k> <file> <bytes>
/// <file digest, hex>` per shard), then, written with a checkpoint_key,
/// `hmac <HMAC-SHA256 of the lines before, hex>`, and last `checksum
/// <SHA-256 of the lines before, hex>`.
///
/// So a key's HMAC on the manifest vouches for every row: the manifest
/// lists each file's digest, the file's trailer each chunk's. The chief
/// checks the HMAC (verify_table_manifest) and hands each ps the manifest's
/// SHA-256, which the ps checks of the manifest it reads. Without a key the
/// digests find accidents (a torn write, a flipped byte, a file of another
/// checkpoint), not forgery; a restore then still refuses non-finite rows.

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "graph/outcome.hpp"
#include "kernels/shard_routing.hpp"

namespace af::train {

/// What a table checkpoint says of the table (the manifest) and of each of
/// its shard files (their headers).
struct table_checkpoint_layout {
  std::string table;                                                 ///< e.g. "emb"
  kernels::partition_strategy strategy = kernels::partition_strategy::mod;
  std::vector<int64_t> shard_rows;                                   ///< rows of each shard
  shape_type row_shape;                                              ///< dims after the first
  std::vector<std::string> slots;                                    ///< optimizer slot names
  uint64_t global_step = 0;
  /// read_table_manifest: each shard file's size and digest (hex), so a
  /// restore refuses a file that is not the one the manifest lists (empty
  /// when writing).
  std::vector<uint64_t> shard_bytes;
  std::vector<std::string> shard_digests;

  /// The table's rows (the sum of shard_rows).
  int64_t rows() const;
  /// Floats of one row of the value (or of one slot).
  int64_t row_floats() const;
};

/// One shard in memory, as its holder has it: `value` [shard rows x
/// row_floats] and one buffer of the same size per slot (layout.slots
/// order). Borrowed: the writer reads them, a restore writes them.
struct table_shard_view {
  const float* value = nullptr;
  std::vector<const float*> slots;
};

/// `<dir>/<table>.shard-<k>-of-<n>.aftab` (the name escaped as above).
std::string table_shard_path(const std::string& dir, const std::string& table, size_t k,
                             size_t n);

/// `<dir>/<table>.manifest`.
std::string table_manifest_path(const std::string& dir, const std::string& table);

/// Writes shard `k` of `layout` from `shard`, streamed in chunks of about
/// `chunk_bytes`, atomically (temporary file, fsync, rename, directory
/// fsync). Returns the file's path. Refused before anything is written: k
/// not a shard, a layout the strategy refuses, a slot count other than
/// layout.slots'.
outcome<std::string> write_table_shard(const std::string& dir,
                                       const table_checkpoint_layout& layout,
                                       size_t k, const table_shard_view& shard,
                                       size_t chunk_bytes = size_t{1} << 20);

/// Writes the manifest of `layout` once every shard file is written: reads
/// each file's header and trailer (not its data) to check it is that shard
/// of this table and layout, and lists its size and digest; with a `key`
/// (train::checkpoint_key's bytes), an HMAC line. Atomic.
outcome<std::string> write_table_manifest(const std::string& dir,
                                          const table_checkpoint_layout& layout,
                                          const std::string& key = {});

/// The manifest of table `table` in `dir`, checked (its checksum, its
/// fields; with `want_sha256`, hex, that its bytes have that SHA-256: the
/// one the chief checked). An error names the file and what is wrong.
outcome<table_checkpoint_layout> read_table_manifest(const std::string& dir,
                                                     const std::string& table,
                                                     const std::string& want_sha256 = {});

/// The chief's check of the manifest of `table` in `dir` before a restore:
/// its checksum and fields, and with a `key` its HMAC (a manifest without
/// one, or with another key's, is refused). Returns the SHA-256 of its
/// bytes, hex, for each ps's read_table_manifest.
outcome<std::string> verify_table_manifest(const std::string& dir, const std::string& table,
                                           const std::string& key);

/// Where a restore puts one new shard: shard `k` of the table cut by
/// `strategy` into `shard_rows`, into `value` and `slots` (`slot_names`
/// order, each [shard rows x row_floats]). A slot the checkpoint lacks is
/// filled with `slot_starts[i]` (train::slot_initial_value), else 0.
struct table_shard_target {
  kernels::partition_strategy strategy = kernels::partition_strategy::mod;
  std::vector<int64_t> shard_rows;
  size_t k = 0;
  shape_type row_shape;                ///< must be the checkpoint's
  std::vector<std::string> slot_names;
  std::vector<float> slot_starts;
  float* value = nullptr;
  std::vector<float*> slots;
};

/// Restores one new shard from the checkpoint of `saved` (read_table_manifest)
/// in `dir`: for each of its rows, the old shard and row that hold it (the
/// old layout's router), read chunk by chunk from that shard's file (each
/// chunk's checksum checked before any of it is used), so only the chunks
/// that hold its rows are read and at most one chunk per old shard is in
/// memory. Refused, naming the file: a shard file missing, torn (not the
/// size its header gives), foreign (another table, shard or layout than the
/// manifest lists; not a shard file), of other dims or dtype, or failing a
/// checksum; and a target whose rows are not the checkpoint's table's or
/// whose row shape differs. On an error the target's buffers may hold part
/// of the rows.
graph_status read_table_shard(const std::string& dir, const table_checkpoint_layout& saved,
                              const table_shard_target& target);

} // namespace af::train
