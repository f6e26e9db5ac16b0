#pragma once
/// SHA-256 and HMAC-SHA256 (OpenSSL) for checkpoints: the job-state file's
/// HMAC (train/checkpoint.hpp) and the table checkpoints' chain of digests
/// (train/table_checkpoint.hpp), which the manifest's HMAC anchors.

#include <cstddef>
#include <string>

namespace af::train {

/// Bytes of a SHA-256 digest (and of an HMAC-SHA256).
constexpr size_t digest_size = 32;

/// SHA-256 of `n` bytes at `data`: 32 raw bytes.
std::string sha256(const void* data, size_t n);

/// HMAC-SHA256 of `n` bytes under `key`: 32 raw bytes; empty if OpenSSL failed.
std::string hmac_sha256(const std::string& key, const void* data, size_t n);

/// `bytes` as lower-case hex, two digits a byte.
std::string to_hex(const std::string& bytes);

} // namespace af::train
