#pragma once
/// AES-128-GCM for one direction of the data plane's records (net/tls_io.hpp):
/// intel-ipsec-mb's where the build has it (Debian's libipsec-mb-dev; its
/// VAES/AVX-512 code runs at about twice OpenSSL 3.0's speed on a CPU with
/// those, docs/wire.md "TLS figures"), else OpenSSL's EVP. Both compute the
/// same AES-GCM: a record sealed by one opens with the other, so nodes of
/// both kinds of build talk to each other.

#include <cstddef>
#include <memory>
#include <string>

namespace af {

class aes_gcm {
public:
  enum class backend { openssl, ipsec_mb };

  static constexpr size_t key_bytes = 16;
  static constexpr size_t iv_bytes = 12;
  static constexpr size_t tag_bytes = 16;

  /// The backend records use: ipsec-mb when built with it and it starts on
  /// this CPU, else OpenSSL; OpenSSL's too when it runs in FIPS mode, or
  /// when the environment has ACTORFLOW_AES_GCM=openssl. Decided once per
  /// process.
  static backend best();

  /// Whether this build has `b` (whatever the CPU).
  static bool built_with(backend b);

  /// Whether this build and CPU have `b`.
  static bool available(backend b);

  /// Which code computes it, for the bench and the node's ready line
  /// ("intel-ipsec-mb 1.3.0 (AVX-512, VAES)": the code path it runs;
  /// "OpenSSL 3.0.19 ...").
  static std::string describe(backend b);

  /// A cipher that seals (encrypts) or opens (decrypts) with `key`; null if
  /// `b` is not available or there is no memory.
  static std::unique_ptr<aes_gcm> make(bool sealing, const unsigned char* key,
                                       backend b = best());

  virtual ~aes_gcm() = default;

  /// Replaces the key (the old one is wiped).
  virtual bool set_key(const unsigned char* key) = 0;

  /// Starts a message under `iv` (iv_bytes) with `aad` authenticated.
  virtual bool start(const unsigned char* iv, const unsigned char* aad, size_t aad_len) = 0;

  /// Encrypts or decrypts the next `n` bytes of the message (any length, any
  /// split; `out` may be `in`).
  virtual bool update(unsigned char* out, const unsigned char* in, size_t n) = 0;

  /// Sealing: ends the message and writes its tag (tag_bytes).
  virtual bool seal(unsigned char* tag) = 0;

  /// Opening: ends the message; false if `tag` is not its tag (compared in
  /// constant time).
  virtual bool open(const unsigned char* tag) = 0;
};

} // namespace af
