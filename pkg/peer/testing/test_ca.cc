#include "pkg/peer/testing/test_ca.h"

#include <openssl/bio.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"

namespace weightcache::peer::testing {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Free>;
using Cert = std::unique_ptr<X509, Free>;

absl::Status Fail(const std::string& what) {
  return absl::InternalError(absl::StrCat("test CA: ", what, " failed"));
}

Key NewKey() { return Key(EVP_EC_gen("P-256")); }

absl::Status Extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return Fail(absl::StrCat("extension ", value));
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return ok == 1 ? absl::OkStatus() : Fail("X509_add_ext");
}

// A certificate for `key` named `cn`, signed by `issuer_key` (issuer null: self-signed).
absl::StatusOr<Cert> MakeCert(EVP_PKEY* key, const std::string& cn, X509* issuer,
                              EVP_PKEY* issuer_key, bool ca, const std::string& dns_name) {
  static long serial = 1;
  Cert c(X509_new());
  if (!c) return Fail("X509_new");
  X509_set_version(c.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(c.get()), serial++);
  X509_gmtime_adj(X509_getm_notBefore(c.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(c.get()), 24L * 3600);
  X509_set_pubkey(c.get(), key);
  X509_NAME* name = X509_get_subject_name(c.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(c.get(), issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509* iss = issuer != nullptr ? issuer : c.get();
  if (ca) {
    if (auto s = Extension(c.get(), iss, NID_basic_constraints, "critical,CA:TRUE"); !s.ok()) {
      return s;
    }
    if (auto s = Extension(c.get(), iss, NID_key_usage, "critical,keyCertSign,cRLSign"); !s.ok()) {
      return s;
    }
  } else {
    if (auto s = Extension(c.get(), iss, NID_basic_constraints, "critical,CA:FALSE"); !s.ok()) {
      return s;
    }
    if (auto s = Extension(c.get(), iss, NID_ext_key_usage, "serverAuth,clientAuth"); !s.ok()) {
      return s;
    }
    const std::string san = absl::StrCat("DNS:", dns_name);
    if (auto s = Extension(c.get(), iss, NID_subject_alt_name, san.c_str()); !s.ok()) return s;
  }
  if (X509_sign(c.get(), issuer_key, EVP_sha256()) == 0) return Fail("X509_sign");
  return c;
}

absl::Status WritePem(const std::string& path, X509* cert, EVP_PKEY* key) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return Fail(absl::StrCat("open ", path));
  const int ok = cert != nullptr
                     ? PEM_write_X509(f, cert)
                     : PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
  return ok == 1 ? absl::OkStatus() : Fail(absl::StrCat("write ", path));
}

absl::StatusOr<std::pair<Cert, Key>> Load(const PemFiles& f) {
  FILE* c = std::fopen(f.cert_file.c_str(), "r");
  FILE* k = std::fopen(f.key_file.c_str(), "r");
  Cert cert(c != nullptr ? PEM_read_X509(c, nullptr, nullptr, nullptr) : nullptr);
  Key key(k != nullptr ? PEM_read_PrivateKey(k, nullptr, nullptr, nullptr) : nullptr);
  if (c != nullptr) std::fclose(c);
  if (k != nullptr) std::fclose(k);
  if (!cert || !key) return Fail(absl::StrCat("reading ", f.cert_file));
  return std::make_pair(std::move(cert), std::move(key));
}

}  // namespace

absl::StatusOr<TestCa> TestCa::Create(const std::string& dir, const std::string& name) {
  Key key = NewKey();
  if (!key) return Fail("EC key");
  auto cert = MakeCert(key.get(), name + " CA", nullptr, key.get(), true, "");
  if (!cert.ok()) return cert.status();
  TestCa ca;
  ca.dir_ = dir;
  ca.name_ = name;
  ca.ca_ = {absl::StrCat(dir, "/", name, "-ca.crt"), absl::StrCat(dir, "/", name, "-ca.key")};
  if (auto s = WritePem(ca.ca_.cert_file, cert->get(), nullptr); !s.ok()) return s;
  if (auto s = WritePem(ca.ca_.key_file, nullptr, key.get()); !s.ok()) return s;
  return ca;
}

absl::StatusOr<PemFiles> TestCa::Issue(const std::string& file_stem,
                                       const std::string& dns_name) const {
  auto issuer = Load(ca_);
  if (!issuer.ok()) return issuer.status();
  Key key = NewKey();
  if (!key) return Fail("EC key");
  auto cert =
      MakeCert(key.get(), file_stem, issuer->first.get(), issuer->second.get(), false, dns_name);
  if (!cert.ok()) return cert.status();
  PemFiles out{absl::StrCat(dir_, "/", file_stem, ".crt"),
               absl::StrCat(dir_, "/", file_stem, ".key")};
  if (auto s = WritePem(out.cert_file, cert->get(), nullptr); !s.ok()) return s;
  if (auto s = WritePem(out.key_file, nullptr, key.get()); !s.ok()) return s;
  return out;
}

}  // namespace weightcache::peer::testing
