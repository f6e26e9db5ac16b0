#pragma once
/// The per-graph secret of edge frames (issue 22): a step runner draws one
/// when it registers a graph and hands it with every partition; each edge of
/// the graph carries it, and the consumer's executor takes a value only with
/// the right one. A member that learned a graph id (it travels in clear on a
/// plaintext cluster) can no longer be first to fill an op's value.

#include <string>

namespace af {

/// Bytes of an edge token.
constexpr size_t edge_token_bytes = 16;

/// 16 bytes from OpenSSL's CSPRNG (RAND_bytes); empty if it failed.
std::string make_edge_token();

/// True if `got` is `want` and `want` is a whole token; compared in constant
/// time (CRYPTO_memcmp), so a wrong token's timing says nothing.
bool edge_token_matches(const std::string& want, const std::string& got);

} // namespace af
