// [tls][aes]: the two AES-128-GCM backends of the data plane's records
// (net/aes_gcm.hpp) compute the same thing: a record sealed by one opens
// with the other, with the same ciphertext and tag, however the message is
// split into updates; and each refuses what was changed.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <openssl/evp.h>

#include "net/aes_gcm.hpp"

using namespace af;

namespace {

using bytes = std::vector<unsigned char>;

bytes hex(const std::string& h) {
  bytes out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<unsigned char>(std::stoul(h.substr(i, 2), nullptr, 16)));
  return out;
}

/// The backends to check: OpenSSL's, and ipsec-mb's when built with it.
/// A build with it on a CPU with AES-NI and PCLMULQDQ (every x86-64 CI
/// machine) must have it usable: otherwise these tests would pass on
/// OpenSSL's alone while the data plane silently ran at half speed.
std::vector<aes_gcm::backend> backends() {
  std::vector<aes_gcm::backend> out{aes_gcm::backend::openssl};
  if (aes_gcm::built_with(aes_gcm::backend::ipsec_mb)) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul"))
      REQUIRE(aes_gcm::available(aes_gcm::backend::ipsec_mb));
  }
  if (aes_gcm::available(aes_gcm::backend::ipsec_mb))
    out.push_back(aes_gcm::backend::ipsec_mb);
  return out;
}

/// Runs `n` bytes of `in` through `c` into `out` in updates of the sizes
/// `rng` picks (1 byte up to the whole), as records arrive off a socket.
void run(aes_gcm& c, unsigned char* out, const unsigned char* in, size_t n, std::mt19937& rng) {
  size_t done = 0;
  while (done < n) {
    std::uniform_int_distribution<size_t> pick{1, n - done};
    auto k = rng() % 4 == 0 ? size_t{1} : pick(rng);
    REQUIRE(c.update(out + done, in + done, k));
    done += k;
  }
}

struct sealed {
  bytes text;
  bytes tag;
};

sealed seal(aes_gcm::backend b, const bytes& key, const bytes& iv, const bytes& aad,
            const bytes& plain, std::mt19937& rng, bool in_place) {
  auto c = aes_gcm::make(true, key.data(), b);
  REQUIRE(c);
  REQUIRE(c->start(iv.data(), aad.data(), aad.size()));
  // In place: the text is encrypted where it lies, as the sender's buffer is.
  sealed s{plain, bytes(aes_gcm::tag_bytes)};
  bytes out(plain.size());
  if (in_place)
    run(*c, s.text.data(), s.text.data(), s.text.size(), rng);
  else {
    run(*c, out.data(), plain.data(), plain.size(), rng);
    s.text = out;
  }
  REQUIRE(c->seal(s.tag.data()));
  return s;
}

/// The plaintext, or nothing if the tag did not verify.
std::pair<bool, bytes> open(aes_gcm::backend b, const bytes& key, const bytes& iv,
                            const bytes& aad, const sealed& s, std::mt19937& rng) {
  auto c = aes_gcm::make(false, key.data(), b);
  REQUIRE(c);
  REQUIRE(c->start(iv.data(), aad.data(), aad.size()));
  bytes plain = s.text; // in place, as the record layer decrypts
  run(*c, plain.data(), plain.data(), plain.size(), rng);
  return {c->open(s.tag.data()), plain};
}

const char* name_of(aes_gcm::backend b) {
  return b == aes_gcm::backend::openssl ? "openssl" : "ipsec-mb";
}

} // namespace

// Catches a backend that computes something else than AES-128-GCM (a wrong
// key schedule, AAD or IV handling): the GCM specification's test case 4
// (McGrew and Viega), 60 bytes with 20 bytes of AAD, known ciphertext and tag.
TEST_CASE("each AES-GCM backend gives the GCM specification's ciphertext and tag", "[tls][aes]") {
  auto key = hex("feffe9928665731c6d6a8f9467308308");
  auto iv = hex("cafebabefacedbaddecaf888");
  auto aad = hex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
  auto plain = hex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
                   "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39");
  auto cipher = hex("42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e"
                    "21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091");
  auto tag = hex("5bc94fbc3221a5db94fae95ae7121a47");
  std::mt19937 rng{4};
  for (auto b : backends()) {
    INFO(name_of(b));
    for (bool in_place : {false, true}) {
      auto s = seal(b, key, iv, aad, plain, rng, in_place);
      CHECK(s.text == cipher);
      CHECK(s.tag == tag);
    }
    auto [ok, back] = open(b, key, iv, aad, {cipher, tag}, rng);
    CHECK(ok);
    CHECK(back == plain);
  }
}

// Catches backends that disagree (records of one build would not open on
// the other), or that lose a partial block between updates: every pair of
// backends, lengths around the block and stitch sizes up to a whole 256 KiB
// record, split at random.
TEST_CASE("a record sealed by either AES-GCM backend opens with each, however it is split",
          "[tls][aes]") {
  if (!aes_gcm::available(aes_gcm::backend::ipsec_mb))
    WARN("this build has no intel-ipsec-mb: only OpenSSL's AES-GCM is checked");
  std::mt19937 rng{11};
  auto key = hex("000102030405060708090a0b0c0d0e0f");
  auto iv = hex("a0a1a2a3a4a5a6a7a8a9aaab");
  auto aad = hex("00040000");
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{95},
                   size_t{96}, size_t{97}, size_t{255}, size_t{4099}, size_t{65536},
                   size_t{256} << 10}) {
    bytes plain(n);
    for (auto& c : plain)
      c = static_cast<unsigned char>(rng());
    sealed first{};
    bool have_first = false;
    for (auto from : backends()) {
      auto s = seal(from, key, iv, aad, plain, rng, n % 2 == 0);
      if (have_first) {
        INFO("the two backends' records of " << n << " bytes differ");
        CHECK(s.text == first.text);
        CHECK(s.tag == first.tag);
      }
      first = s;
      have_first = true;
      for (auto to : backends()) {
        INFO(n << " bytes sealed by " << name_of(from) << ", opened by " << name_of(to));
        auto [ok, back] = open(to, key, iv, aad, s, rng);
        CHECK(ok);
        CHECK(back == plain);
      }
    }
  }
}

// Catches an open that does not check the tag, the AAD or the ciphertext:
// one flipped bit in any of them, or another IV, fails.
TEST_CASE("each AES-GCM backend refuses a record with one bit changed", "[tls][aes]") {
  std::mt19937 rng{7};
  auto key = hex("2b7e151628aed2a6abf7158809cf4f3c");
  auto iv = hex("0102030405060708090a0b0c");
  auto aad = hex("00000100");
  bytes plain(300, 0x5a);
  for (auto b : backends()) {
    INFO(name_of(b));
    auto s = seal(b, key, iv, aad, plain, rng, false);
    REQUIRE(open(b, key, iv, aad, s, rng).first);
    auto text = s;
    text.text[150] ^= 0x01;
    CHECK_FALSE(open(b, key, iv, aad, text, rng).first);
    auto tag = s;
    tag.tag[15] ^= 0x80;
    CHECK_FALSE(open(b, key, iv, aad, tag, rng).first);
    auto other_aad = aad;
    other_aad[3] ^= 0x01;
    CHECK_FALSE(open(b, key, iv, other_aad, s, rng).first);
    auto other_iv = iv;
    other_iv[11] ^= 0x01;
    CHECK_FALSE(open(b, key, other_iv, aad, s, rng).first);
  }
}

// Catches a rekey that keeps the old key (or a cipher that cannot be keyed
// again): after set_key, records are those of a cipher made with the new key.
TEST_CASE("an AES-GCM cipher keyed again seals as one made with the new key", "[tls][aes]") {
  std::mt19937 rng{3};
  auto k1 = hex("000102030405060708090a0b0c0d0e0f");
  auto k2 = hex("f0e1d2c3b4a5968778695a4b3c2d1e0f");
  auto iv = hex("a0a1a2a3a4a5a6a7a8a9aaab");
  auto aad = hex("00000010");
  bytes plain(16, 0x11);
  for (auto b : backends()) {
    INFO(name_of(b));
    auto c = aes_gcm::make(true, k1.data(), b);
    REQUIRE(c);
    REQUIRE(c->set_key(k2.data()));
    REQUIRE(c->start(iv.data(), aad.data(), aad.size()));
    sealed s{bytes(16), bytes(16)};
    REQUIRE(c->update(s.text.data(), plain.data(), plain.size()));
    REQUIRE(c->seal(s.tag.data()));
    auto fresh = seal(b, k2, iv, aad, plain, rng, false);
    CHECK(s.text == fresh.text);
    CHECK(s.tag == fresh.tag);
    CHECK_FALSE(open(b, k1, iv, aad, s, rng).first);
  }
}

// Catches a record layer that ignores ACTORFLOW_AES_GCM (ctest runs the
// record tests once more with =openssl, so that OpenSSL's path stays
// tested where ipsec-mb is the default) or that leaves ipsec-mb unused
// where it works; and a description that does not say which runs.
TEST_CASE("the records' AES-GCM is ipsec-mb's where usable, OpenSSL's when the environment says so",
          "[tls][aes]") {
  const char* env = std::getenv("ACTORFLOW_AES_GCM");
  bool forced = env != nullptr && std::string{env} == "openssl";
  INFO("ACTORFLOW_AES_GCM=" << (env != nullptr ? env : "(unset)") << "; "
                            << aes_gcm::describe(aes_gcm::best()));
  bool fips = EVP_default_properties_is_fips_enabled(nullptr) == 1;
  if (forced || fips || !aes_gcm::available(aes_gcm::backend::ipsec_mb))
    CHECK(aes_gcm::best() == aes_gcm::backend::openssl);
  else
    CHECK(aes_gcm::best() == aes_gcm::backend::ipsec_mb);
  if (aes_gcm::best() == aes_gcm::backend::ipsec_mb)
    CHECK_THAT(aes_gcm::describe(aes_gcm::best()),
               Catch::StartsWith("intel-ipsec-mb 1.") && Catch::Contains("("));
  else
    CHECK_THAT(aes_gcm::describe(aes_gcm::best()), Catch::StartsWith("OpenSSL"));
}
