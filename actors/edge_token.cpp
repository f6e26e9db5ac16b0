#include "actors/edge_token.hpp"

#include <openssl/crypto.h>
#include <openssl/rand.h>

namespace af {

std::string make_edge_token() {
  std::string token(edge_token_bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(token.data()), static_cast<int>(token.size()))
      != 1)
    return {};
  return token;
}

bool edge_token_matches(const std::string& want, const std::string& got) {
  if (want.size() != edge_token_bytes || got.size() != edge_token_bytes)
    return false;
  return CRYPTO_memcmp(want.data(), got.data(), edge_token_bytes) == 0;
}

} // namespace af
