#include "net/aes_gcm.hpp"

#include <cctype>
#include <cstdio>
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

/// The library's function table, made once: the GCM calls below only read
/// it, so all streams and threads share it. The code path is picked here
/// from what the CPU has *and the OS has enabled* (libgcc's
/// __builtin_cpu_supports checks XCR0): ipsec-mb 1.3's own choice
/// (init_mb_mgr_auto) reads CPUID alone, and on a host whose kernel keeps
/// AVX-512 off (clearcpuid, some hypervisors) would run ZMM code and die of
/// SIGILL. Without AES-NI and PCLMULQDQ, OpenSSL's is used.
struct ipsec_setup {
  IMB_MGR* mgr = nullptr;
  const char* path = "";
};

const ipsec_setup& ipsec() {
  static const ipsec_setup setup = [] {
    ipsec_setup out;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("aes") || !__builtin_cpu_supports("pclmul"))
      return out;
    IMB_MGR* m = alloc_mb_mgr(0);
    if (m == nullptr)
      return out;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      init_mb_mgr_avx512(m);
      out.path = (m->features & IMB_FEATURE_VAES) != 0 ? "AVX-512, VAES" : "AVX-512";
    } else if (__builtin_cpu_supports("avx2")) {
      init_mb_mgr_avx2(m);
      out.path = "AVX2";
    } else if (__builtin_cpu_supports("avx")) {
      init_mb_mgr_avx(m);
      out.path = "AVX";
    } else {
      init_mb_mgr_sse(m);
      out.path = "SSE";
    }
    if (imb_get_errno(m) != 0) {
      free_mb_mgr(m);
      return out;
    }
    out.mgr = m;
    return out;
  }();
  return setup;
}

IMB_MGR* ipsec_manager() {
  return ipsec().mgr;
}

class ipsec_gcm final : public aes_gcm {
public:
  explicit ipsec_gcm(bool sealing) : sealing_(sealing), mgr_(ipsec_manager()) {}
  ~ipsec_gcm() override {
    OPENSSL_cleanse(&keys_, sizeof(keys_));
    OPENSSL_cleanse(&ctx_, sizeof(ctx_));
  }

  bool ok() const { return mgr_ != nullptr; }

  // The library's calls return nothing, and its error status
  // (imb_get_errno) is one variable for the whole process that every call
  // resets: with several streams at once it says nothing about this one.
  // So the arguments are checked here; the library checks them too (built
  // with SAFE_PARAM) and does nothing on a bad one.
  bool set_key(const unsigned char* key) override {
    if (key == nullptr)
      return false;
    IMB_AES128_GCM_PRE(mgr_, key, &keys_.k);
    return true;
  }

  bool start(const unsigned char* iv, const unsigned char* aad, size_t aad_len) override {
    if (iv == nullptr || (aad == nullptr && aad_len > 0))
      return false;
    IMB_AES128_GCM_INIT(mgr_, &keys_.k, &ctx_, iv, aad, aad_len);
    return true;
  }

  bool update(unsigned char* out, const unsigned char* in, size_t n) override {
    if (n == 0)
      return true;
    if (out == nullptr || in == nullptr)
      return false;
    if (sealing_)
      IMB_AES128_GCM_ENC_UPDATE(mgr_, &keys_.k, &ctx_, out, in, n);
    else
      IMB_AES128_GCM_DEC_UPDATE(mgr_, &keys_.k, &ctx_, out, in, n);
    return true;
  }

  bool seal(unsigned char* tag) override {
    if (tag == nullptr)
      return false;
    IMB_AES128_GCM_ENC_FINALIZE(mgr_, &keys_.k, &ctx_, tag, tag_bytes);
    return true;
  }

  bool open(const unsigned char* tag) override {
    if (tag == nullptr)
      return false;
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

bool aes_gcm::built_with(backend b) {
#ifdef ACTORFLOW_WITH_IPSEC_MB
  (void) b;
  return true;
#else
  return b == backend::openssl;
#endif
}

aes_gcm::backend aes_gcm::best() {
  static const backend chosen = [] {
    // ACTORFLOW_AES_GCM=openssl takes OpenSSL's even where ipsec-mb is
    // there (to compare the two, or to set aside a library that misbehaves).
    const char* v = std::getenv("ACTORFLOW_AES_GCM");
    std::string want = v == nullptr ? "" : v;
    for (auto& c : want)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!want.empty() && want != "openssl" && want != "ipsec-mb" && want != "auto")
      std::fprintf(stderr,
                   "actorflow: ACTORFLOW_AES_GCM='%s' is not openssl, ipsec-mb or auto: taken "
                   "as auto\n",
                   v);
    if (want == "openssl")
      return backend::openssl;
    // OpenSSL in FIPS mode: its validated AES, not another library's.
    if (EVP_default_properties_is_fips_enabled(nullptr) == 1)
      return backend::openssl;
    return available(backend::ipsec_mb) ? backend::ipsec_mb : backend::openssl;
  }();
  return chosen;
}

std::string aes_gcm::describe(backend b) {
  if (b == backend::openssl)
    return OPENSSL_VERSION_TEXT;
#ifdef ACTORFLOW_WITH_IPSEC_MB
  if (ipsec_manager() != nullptr)
    return std::string{"intel-ipsec-mb "} + imb_get_version_str() + " (" + ipsec().path + ")";
  return "intel-ipsec-mb (not usable on this CPU: no AES-NI/PCLMULQDQ)";
#else
  return "intel-ipsec-mb (not in this build)";
#endif
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
