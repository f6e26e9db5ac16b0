#include "actors/aes_gcm.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/opensslv.h>

#ifdef ACTORFLOW_WITH_IPSEC_MB
#include <intel-ipsec-mb.h>
#endif

namespace af {

namespace {

class openssl_gcm final : public aes_gcm {
public:
  explicit openssl_gcm(bool sealing) : sealing_(sealing), ctx_(EVP_CIPHER_CTX_new()) {}
  ~openssl_gcm() override { EVP_CIPHER_CTX_free(ctx_); }

  bool ok() const { return ctx_ != nullptr; }

  bool set_key(const unsigned char* key) override {
    // The first key also picks the cipher; later ones only replace the key.
    const EVP_CIPHER* cipher = keyed_ ? nullptr : EVP_aes_128_gcm();
    keyed_ = true;
    return (sealing_ ? EVP_EncryptInit_ex(ctx_, cipher, nullptr, key, nullptr)
                     : EVP_DecryptInit_ex(ctx_, cipher, nullptr, key, nullptr))
           == 1;
  }

  bool start(const unsigned char* iv, const unsigned char* aad, size_t aad_len) override {
    int outl = 0;
    if (sealing_)
      return EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv) == 1
             && EVP_EncryptUpdate(ctx_, nullptr, &outl, aad, static_cast<int>(aad_len)) == 1;
    return EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv) == 1
           && EVP_DecryptUpdate(ctx_, nullptr, &outl, aad, static_cast<int>(aad_len)) == 1;
  }

  bool update(unsigned char* out, const unsigned char* in, size_t n) override {
    int outl = 0;
    return (sealing_ ? EVP_EncryptUpdate(ctx_, out, &outl, in, static_cast<int>(n))
                     : EVP_DecryptUpdate(ctx_, out, &outl, in, static_cast<int>(n)))
           == 1;
  }

  bool seal(unsigned char* tag) override {
    unsigned char last[16];
    int outl = 0;
    return EVP_EncryptFinal_ex(ctx_, last, &outl) == 1
           && EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(tag_bytes), tag)
                == 1;
  }

  bool open(const unsigned char* tag) override {
    unsigned char last[16];
    int outl = 0;
    return EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_SET_TAG, static_cast<int>(tag_bytes),
                               const_cast<unsigned char*>(tag))
             == 1
           && EVP_DecryptFinal_ex(ctx_, last, &outl) == 1;
  }

private:
  bool sealing_;
  bool keyed_ = false;
  EVP_CIPHER_CTX* ctx_;
};

#ifdef ACTORFLOW_WITH_IPSEC_MB

/// The library's function table for this CPU, made once: the GCM calls
/// below only read it, so all streams and threads share it.
IMB_MGR* ipsec_manager() {
  static IMB_MGR* mgr = [] {
    IMB_MGR* m = alloc_mb_mgr(0);
    if (m == nullptr)
      return m;
    IMB_ARCH arch = IMB_ARCH_NONE;
    init_mb_mgr_auto(m, &arch);
    if (arch == IMB_ARCH_NONE || imb_get_errno(m) != 0) {
      free_mb_mgr(m);
      return static_cast<IMB_MGR*>(nullptr);
    }
    return m;
  }();
  return mgr;
}

class ipsec_gcm final : public aes_gcm {
public:
  explicit ipsec_gcm(bool sealing) : sealing_(sealing), mgr_(ipsec_manager()) {}
  ~ipsec_gcm() override {
    OPENSSL_cleanse(&keys_, sizeof(keys_));
    OPENSSL_cleanse(&ctx_, sizeof(ctx_));
  }

  bool ok() const { return mgr_ != nullptr; }

  bool set_key(const unsigned char* key) override {
    IMB_AES128_GCM_PRE(mgr_, key, &keys_.k);
    return true;
  }

  bool start(const unsigned char* iv, const unsigned char* aad, size_t aad_len) override {
    IMB_AES128_GCM_INIT(mgr_, &keys_.k, &ctx_, iv, aad, aad_len);
    return true;
  }

  bool update(unsigned char* out, const unsigned char* in, size_t n) override {
    if (sealing_)
      IMB_AES128_GCM_ENC_UPDATE(mgr_, &keys_.k, &ctx_, out, in, n);
    else
      IMB_AES128_GCM_DEC_UPDATE(mgr_, &keys_.k, &ctx_, out, in, n);
    return true;
  }

  bool seal(unsigned char* tag) override {
    IMB_AES128_GCM_ENC_FINALIZE(mgr_, &keys_.k, &ctx_, tag, tag_bytes);
    return true;
  }

  bool open(const unsigned char* tag) override {
    unsigned char computed[tag_bytes];
    IMB_AES128_GCM_DEC_FINALIZE(mgr_, &keys_.k, &ctx_, computed, tag_bytes);
    bool same = CRYPTO_memcmp(computed, tag, tag_bytes) == 0;
    OPENSSL_cleanse(computed, sizeof(computed));
    return same;
  }

private:
  // The library's assembly wants its key schedule aligned (C++17's new
  // honours the alignment of the class).
  struct alignas(64) key_block {
    gcm_key_data k;
  };
  key_block keys_{};
  alignas(64) gcm_context_data ctx_{};
  bool sealing_;
  IMB_MGR* mgr_;
};

#endif

} // namespace

bool aes_gcm::available(backend b) {
#ifdef ACTORFLOW_WITH_IPSEC_MB
  if (b == backend::ipsec_mb)
    return ipsec_manager() != nullptr;
#else
  if (b == backend::ipsec_mb)
    return false;
#endif
  return true;
}

aes_gcm::backend aes_gcm::best() {
  // ACTORFLOW_AES_GCM=openssl takes OpenSSL's even where ipsec-mb is there
  // (to compare the two, or to set aside a library that misbehaves).
  static const bool forced_openssl = [] {
    const char* v = std::getenv("ACTORFLOW_AES_GCM");
    return v != nullptr && std::strcmp(v, "openssl") == 0;
  }();
  return !forced_openssl && available(backend::ipsec_mb) ? backend::ipsec_mb : backend::openssl;
}

std::string aes_gcm::describe(backend b) {
  if (b == backend::openssl)
    return OPENSSL_VERSION_TEXT;
#ifdef ACTORFLOW_WITH_IPSEC_MB
  if (auto* m = ipsec_manager(); m != nullptr) {
    const char* arch = "SSE";
    if (m->features & IMB_FEATURE_VAES)
      arch = (m->features & IMB_FEATURE_AVX512_SKX) == IMB_FEATURE_AVX512_SKX ? "VAES, AVX-512"
                                                                              : "VAES";
    else if (m->features & IMB_FEATURE_AVX2)
      arch = "AVX2";
    else if (!(m->features & IMB_FEATURE_AESNI))
      arch = "no AES-NI";
    return std::string{"intel-ipsec-mb "} + imb_get_version_str() + " (" + arch + ")";
  }
#endif
  return "intel-ipsec-mb (not in this build)";
}

std::unique_ptr<aes_gcm> aes_gcm::make(bool sealing, const unsigned char* key, backend b) {
  if (!available(b))
    return nullptr;
#ifdef ACTORFLOW_WITH_IPSEC_MB
  if (b == backend::ipsec_mb) {
    std::unique_ptr<ipsec_gcm> c{new (std::nothrow) ipsec_gcm(sealing)};
    if (!c || !c->ok() || !c->set_key(key))
      return nullptr;
    return c;
  }
#endif
  std::unique_ptr<openssl_gcm> c{new (std::nothrow) openssl_gcm(sealing)};
  if (!c || !c->ok() || !c->set_key(key))
    return nullptr;
  return c;
}

} // namespace af
