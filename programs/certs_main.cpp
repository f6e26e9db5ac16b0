// actorflow-certs: a cluster CA and one certificate per task of a cluster
// config, plus one for clients, for [security] (docs/security.md).
//   actorflow-certs --config cluster.toml --out certs
// writes certs/ca.pem, certs/ca.key, certs/JOB-TASK.pem and .key for every
// task (CN /job:J/task:T, subjectAltName its host) and certs/client.pem and
// .key, then prints the [security] lines to paste into the config. Keys are
// EC P-256; with --passphrase-file the member keys are encrypted with it.
// Exits 0, or 2 with a message naming what failed.
#include <sys/stat.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "config/cluster_spec.hpp"
#include "core/nesting.hpp"
#include "core/read_file.hpp"
#include "messages/error.hpp"
#include "programs/last_resort.hpp"

namespace {

namespace fs = std::filesystem;

struct failure {
  std::string what;
};

std::string openssl_errors() {
  std::string out;
  while (auto code = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(code, text, sizeof(text));
    out += (out.empty() ? "" : "; ") + std::string{text};
  }
  return out.empty() ? "no detail from OpenSSL" : out;
}

void check(bool ok, const std::string& what) {
  if (!ok)
    throw failure{what + ": " + openssl_errors()};
}

using key_ptr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using cert_ptr = std::unique_ptr<X509, decltype(&X509_free)>;

key_ptr new_key() {
  key_ptr key{EVP_EC_gen("P-256"), &EVP_PKEY_free};
  check(key != nullptr, "cannot make an EC P-256 key");
  return key;
}

void add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  auto* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  check(ext != nullptr, "cannot make the extension " + value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

/// A certificate for `subject_key` named `cn`, signed by `issuer` (itself when null).
cert_ptr make_cert(EVP_PKEY* subject_key, const std::string& cn, X509* issuer,
                   EVP_PKEY* issuer_key, int days, const std::string& alt_name) {
  cert_ptr cert{X509_new(), &X509_free};
  check(cert != nullptr, "cannot allocate a certificate");
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  check(RAND_bytes(serial, sizeof(serial)) == 1, "cannot draw a serial number");
  serial[0] &= 0x7f; // positive
  auto* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600); // clocks a little behind
  X509_time_adj_ex(X509_getm_notAfter(cert.get()), days, 0, nullptr);
  X509_set_pubkey(cert.get(), subject_key);
  auto* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("actorflow"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  if (issuer == nullptr) {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    add_extension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(cert.get(), signer, NID_key_usage, "critical,digitalSignature,keyAgreement");
    add_extension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth");
    if (!alt_name.empty())
      add_extension(cert.get(), signer, NID_subject_alt_name, alt_name);
  }
  add_extension(cert.get(), signer, NID_subject_key_identifier, "hash");
  if (issuer != nullptr)
    add_extension(cert.get(), signer, NID_authority_key_identifier, "keyid");
  check(X509_sign(cert.get(), issuer_key, EVP_sha256()) > 0, "cannot sign the certificate of " + cn);
  return cert;
}

/// The config at `path` without its [security] table (TOML) or "security"
/// object (JSON), whose files may not exist yet.
caf::expected<af::cluster_config> load_cluster_only(const std::string& path) {
  std::string text;
  if (!af::read_regular_file(path, af::max_config_file_bytes, text).empty())
    return af::load_cluster_config(path); // its error names the path
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) // a byte order mark
    text.erase(0, 3);
  // nlohmann recurses on what it parses here (the parsers below check too)
  if (auto deep = af::nesting_problem(text, text.find_first_not_of(" \t\r\n") == std::string::npos
                                              || text[text.find_first_not_of(" \t\r\n")] != '{');
      !deep.empty())
    return af::make_error(af::af_error::invalid_config, path + ": " + deep);
  auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_object())
      j.erase("security");
    return af::parse_cluster_json(j.is_discarded() ? text : j.dump(), path);
  }
  // TOML: drop the lines from a [security] header to the next table header.
  std::istringstream lines{text};
  std::string kept, line;
  bool skipping = false;
  while (std::getline(lines, line)) {
    auto at = line.find_first_not_of(" \t");
    bool header = at != std::string::npos && line[at] == '[';
    if (header)
      skipping = line.compare(at, 10, "[security]") == 0;
    kept += skipping ? "\n" : line + "\n"; // blank lines keep the line numbers
  }
  return af::parse_cluster_toml(kept, path);
}

/// "IP:10.0.0.1" or "DNS:host"
std::string alt_name_of(const std::string& host) {
  unsigned char buf[16];
  if (inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1)
    return "IP:" + host;
  return "DNS:" + host;
}

FILE* open_private(const fs::path& path) {
  // 0600 from the start: a file made 0644 and chmod-ed after could be opened
  // by another user in between and read once the key is in it.
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    throw failure{"cannot write '" + path.string() + "': " + std::strerror(errno)};
  ::fchmod(fd, 0600); // an existing file keeps its mode through O_CREAT
  auto* f = ::fdopen(fd, "w");
  if (f == nullptr) {
    ::close(fd);
    throw failure{"cannot write '" + path.string() + "': " + std::strerror(errno)};
  }
  return f;
}

void write_key(const fs::path& path, EVP_PKEY* key, const std::string& passphrase) {
  auto* f = open_private(path);
  int ok = passphrase.empty()
             ? PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr)
             : PEM_write_PrivateKey(f, key, EVP_aes_256_cbc(),
                                    reinterpret_cast<const unsigned char*>(passphrase.data()),
                                    static_cast<int>(passphrase.size()), nullptr, nullptr);
  std::fclose(f);
  check(ok == 1, "cannot write the key '" + path.string() + "'");
}

void write_cert(const fs::path& path, X509* cert) {
  auto* f = std::fopen(path.c_str(), "w");
  if (f == nullptr)
    throw failure{"cannot write '" + path.string() + "': " + std::strerror(errno)};
  int ok = PEM_write_X509(f, cert);
  std::fclose(f);
  check(ok == 1, "cannot write the certificate '" + path.string() + "'");
}

} // namespace

static int main_body(int argc, char** argv) {
  CLI::App app{"actorflow-certs: makes a cluster CA and one certificate per task of a cluster "
               "config (and one for clients), and prints the [security] lines"};
  std::string config_path, out_dir, passphrase_file;
  int days = 365;
  bool force = false;
  app.add_option("-c,--config", config_path, "cluster config file (TOML or JSON)")->required();
  app.add_option("-o,--out", out_dir, "folder for the files (default: certs beside the config)");
  app.add_option("--days", days, "validity of the certificates in days")->check(CLI::Range(1, 36500));
  app.add_option("--passphrase-file", passphrase_file,
                 "encrypt the member keys with the first line of this file");
  app.add_flag("--force", force, "replace an existing CA in the folder (every old certificate "
                                 "then stops being accepted)");
  CLI11_PARSE(app, argc, argv);
  // The config may already name the files this makes ([security] pasted
  // first): only its cluster is read here, so a missing file is no error.
  auto cfg = load_cluster_only(config_path);
  if (!cfg) {
    std::fprintf(stderr, "actorflow-certs: %s\n", af::describe(cfg.error()).c_str());
    return 2;
  }
  auto config_dir = fs::absolute(config_path).parent_path();
  fs::path out = out_dir.empty() ? config_dir / "certs" : fs::absolute(out_dir);
  try {
    std::string passphrase;
    if (!passphrase_file.empty()) {
      std::string text;
      auto why = af::read_regular_file(passphrase_file, af::max_pem_file_bytes, text);
      std::istringstream in{text};
      if (!why.empty() || !std::getline(in, passphrase) || passphrase.empty())
        throw failure{"cannot read a passphrase from the first line of '" + passphrase_file + "'"
                      + (why.empty() ? std::string{} : " (" + why + ")")};
    }
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec)
      throw failure{"cannot make the folder '" + out.string() + "': " + ec.message()};
    if (fs::exists(out / "ca.pem") && !force)
      throw failure{"'" + (out / "ca.pem").string() + "' exists: pass --force to replace the "
                    "CA (every certificate it signed stops being accepted), or another --out"};
    auto ca_key = new_key();
    auto ca = make_cert(ca_key.get(), "actorflow cluster CA", nullptr, ca_key.get(), days, "");
    write_key(out / "ca.key", ca_key.get(), "");
    write_cert(out / "ca.pem", ca.get());
    int made = 0;
    for (const auto& [job, tasks] : cfg->cluster.jobs()) {
      for (size_t t = 0; t < tasks.size(); ++t) {
        auto name = af::security_member_name(job, static_cast<int32_t>(t));
        auto key = new_key();
        auto cert = make_cert(key.get(), "/job:" + job + "/task:" + std::to_string(t), ca.get(),
                              ca_key.get(), days, alt_name_of(tasks[t].host));
        write_key(out / (name + ".key"), key.get(), passphrase);
        write_cert(out / (name + ".pem"), cert.get());
        ++made;
      }
    }
    auto key = new_key();
    auto cert = make_cert(key.get(), "client", ca.get(), ca_key.get(), days, "");
    write_key(out / "client.key", key.get(), passphrase);
    write_cert(out / "client.pem", cert.get());
    // Paths as the config reads them: relative to its folder when inside it.
    auto rel = fs::relative(out, config_dir, ec);
    std::string shown = !ec && !rel.empty() && rel.begin()->string() != ".." ? rel.string()
                                                                             : out.string();
    std::printf("actorflow-certs: wrote a CA, %d task certificates and a client certificate to %s\n"
                "Keep ca.key off the cluster's machines; each machine needs ca.pem and its own "
                "files (JOB-TASK.pem/.key; clients: client.pem/.key).\n"
                "Paste into %s:\n\n"
                "[security]\n"
                "ca = \"%s/ca.pem\"\n"
                "certificate = \"%s/{name}.pem\"   # {name}: ps-0, worker-1, ...; client for sessions\n"
                "key = \"%s/{name}.key\"\n",
                made, out.c_str(), config_path.c_str(), shown.c_str(), shown.c_str(),
                shown.c_str());
    if (!passphrase_file.empty())
      std::printf("passphrase_file = \"%s\"\n", fs::absolute(passphrase_file).c_str());
    return 0;
  } catch (const failure& f) {
    std::fprintf(stderr, "actorflow-certs: %s\n", f.what.c_str());
    return 2;
  }
}

int main(int argc, char** argv) {
  return af::last_resort("actorflow-certs", [&] { return main_body(argc, argv); });
}
