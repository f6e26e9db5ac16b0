#include "actors/push_gate.hpp"

#include <openssl/crypto.h>

namespace af {

void push_gate::admit(uint32_t worker, const std::string& token) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (worker >= tokens_.size()) {
    tokens_.resize(static_cast<size_t>(worker) + 1);
    replaced_.resize(tokens_.size());
  }
  if (!tokens_[worker].empty() && tokens_[worker] != token)
    replaced_[worker] = std::move(tokens_[worker]);
  tokens_[worker] = token;
}

namespace {

bool same_token(const std::string& want, const std::string& token) {
  return !want.empty() && token.size() == want.size()
         && CRYPTO_memcmp(want.data(), token.data(), want.size()) == 0;
}

} // namespace

bool push_gate::holds(uint32_t worker, const std::string& token) const {
  std::lock_guard<std::mutex> guard{mtx_};
  return worker < tokens_.size() && same_token(tokens_[worker], token);
}

bool push_gate::replaced(uint32_t worker, const std::string& token) const {
  std::lock_guard<std::mutex> guard{mtx_};
  return worker < replaced_.size() && same_token(replaced_[worker], token);
}

bool push_gate::count_refusal(uint64_t& count) {
  std::lock_guard<std::mutex> guard{mtx_};
  count = ++refused_;
  return (count & (count - 1)) == 0;
}

} // namespace af
