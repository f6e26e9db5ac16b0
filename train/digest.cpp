// SHA-256 and HMAC-SHA256 for checkpoints (train/digest.hpp).
#include "train/digest.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace af::train {

std::string sha256(const void* data, size_t n) {
  std::string out(digest_size, '\0');
  unsigned int len = 0;
  // EVP_Digest cannot fail on a valid digest and buffer but for a broken
  // OpenSSL: an all-zero digest then matches nothing written by a good one.
  EVP_Digest(data, n, reinterpret_cast<unsigned char*>(out.data()), &len, EVP_sha256(), nullptr);
  return out;
}

std::string hmac_sha256(const std::string& key, const void* data, size_t n) {
  std::string out(digest_size, '\0');
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            static_cast<const unsigned char*>(data), n,
            reinterpret_cast<unsigned char*>(out.data()), &len)
      || len != digest_size)
    return {};
  return out;
}

std::string to_hex(const std::string& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

} // namespace af::train
