#include "pkg/nodeid/jwt.h"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>

#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace weightcache::nodeid {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

template <typename T, void (*F)(T*)>
struct Deleter {
  void operator()(T* p) const { F(p); }
};
using BnPtr = std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>>;
using BldPtr = std::unique_ptr<OSSL_PARAM_BLD, Deleter<OSSL_PARAM_BLD, OSSL_PARAM_BLD_free>>;
using ParamPtr = std::unique_ptr<OSSL_PARAM, Deleter<OSSL_PARAM, OSSL_PARAM_free>>;
using CtxPtr = std::unique_ptr<EVP_PKEY_CTX, Deleter<EVP_PKEY_CTX, EVP_PKEY_CTX_free>>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, Deleter<EVP_MD_CTX, EVP_MD_CTX_free>>;
using SigPtr = std::unique_ptr<ECDSA_SIG, Deleter<ECDSA_SIG, ECDSA_SIG_free>>;

absl::StatusOr<std::string> Field(const nlohmann::json& k, const char* name,
                                  const std::string& kid) {
  auto it = k.find(name);
  if (it == k.end() || !it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("JWKS: key '", kid, "' has no string field '", name, "'"));
  }
  return Base64UrlDecode(it->get<std::string>(), absl::StrCat("JWKS key '", kid, "' ", name));
}

absl::StatusOr<std::shared_ptr<EVP_PKEY>> FromData(const char* type, OSSL_PARAM_BLD* bld,
                                                   const std::string& kid) {
  ParamPtr params(OSSL_PARAM_BLD_to_param(bld));
  CtxPtr ctx(EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr));
  EVP_PKEY* key = nullptr;
  if (!params || !ctx || EVP_PKEY_fromdata_init(ctx.get()) <= 0 ||
      EVP_PKEY_fromdata(ctx.get(), &key, EVP_PKEY_PUBLIC_KEY, params.get()) <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("JWKS: key '", kid, "' is not a valid ", type, " public key"));
  }
  return std::shared_ptr<EVP_PKEY>(key, EVP_PKEY_free);
}

absl::StatusOr<PublicKey> RsaKey(const nlohmann::json& k, const std::string& kid) {
  auto n = Field(k, "n", kid);
  if (!n.ok()) return n.status();
  auto e = Field(k, "e", kid);
  if (!e.ok()) return e.status();
  if (n->size() < 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("JWKS: RSA key '", kid, "' has ", n->size() * 8, " bits (2048 or more)"));
  }
  BnPtr bn_n(BN_bin2bn(reinterpret_cast<const unsigned char*>(n->data()),
                       static_cast<int>(n->size()), nullptr));
  BnPtr bn_e(BN_bin2bn(reinterpret_cast<const unsigned char*>(e->data()),
                       static_cast<int>(e->size()), nullptr));
  BldPtr bld(OSSL_PARAM_BLD_new());
  if (!bn_n || !bn_e || !bld ||
      !OSSL_PARAM_BLD_push_BN(bld.get(), OSSL_PKEY_PARAM_RSA_N, bn_n.get()) ||
      !OSSL_PARAM_BLD_push_BN(bld.get(), OSSL_PKEY_PARAM_RSA_E, bn_e.get())) {
    return absl::InternalError("JWKS: OpenSSL could not hold an RSA key");
  }
  auto key = FromData("RSA", bld.get(), kid);
  if (!key.ok()) return key.status();
  return PublicKey{"RS256", *std::move(key)};
}

absl::StatusOr<PublicKey> EcKey(const nlohmann::json& k, const std::string& kid) {
  auto x = Field(k, "x", kid);
  if (!x.ok()) return x.status();
  auto y = Field(k, "y", kid);
  if (!y.ok()) return y.status();
  if (x->size() != 32 || y->size() != 32) {
    return absl::InvalidArgumentError(absl::StrCat("JWKS: P-256 key '", kid,
                                                   "' has coordinates of ", x->size(), " and ",
                                                   y->size(), " bytes (32 each)"));
  }
  std::string pub = "\x04" + *x + *y;
  BldPtr bld(OSSL_PARAM_BLD_new());
  if (!bld ||
      !OSSL_PARAM_BLD_push_utf8_string(bld.get(), OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0) ||
      !OSSL_PARAM_BLD_push_octet_string(bld.get(), OSSL_PKEY_PARAM_PUB_KEY, pub.data(),
                                        pub.size())) {
    return absl::InternalError("JWKS: OpenSSL could not hold an EC key");
  }
  auto key = FromData("EC", bld.get(), kid);
  if (!key.ok()) return key.status();
  return PublicKey{"ES256", *std::move(key)};
}

}  // namespace

std::string Base64UrlEncode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() * 4 + 2) / 3);
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : bytes) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(kAlphabet[(acc >> bits) & 63]);
    }
  }
  if (bits > 0) out.push_back(kAlphabet[(acc << (6 - bits)) & 63]);
  return out;
}

absl::StatusOr<std::string> Base64UrlDecode(std::string_view text, const std::string& what) {
  std::string out;
  out.reserve(text.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  if (text.size() % 4 == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", text.size(), " characters is not a base64url length"));
  }
  for (char c : text) {
    int v;
    if (c >= 'A' && c <= 'Z') {
      v = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      v = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      v = c - '0' + 52;
    } else if (c == '-') {
      v = 62;
    } else if (c == '_') {
      v = 63;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a character outside base64url (code ", static_cast<int>(c), ")"));
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

absl::StatusOr<Jwt> ParseJwt(std::string_view token) {
  std::vector<std::string> parts = absl::StrSplit(std::string(token), '.');
  if (parts.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("token: ", parts.size(), " dot-separated parts (a JWS has 3)"));
  }
  Jwt jwt;
  const std::array<const char*, 2> names = {"header", "payload"};
  for (int i = 0; i < 2; ++i) {
    auto raw = Base64UrlDecode(parts[i], absl::StrCat("token ", names[i]));
    if (!raw.ok()) return raw.status();
    nlohmann::json j = nlohmann::json::parse(*raw, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("token ", names[i], ": not a JSON object"));
    }
    (i == 0 ? jwt.header : jwt.claims) = std::move(j);
  }
  auto sig = Base64UrlDecode(parts[2], "token signature");
  if (!sig.ok()) return sig.status();
  jwt.signature = *std::move(sig);
  jwt.signing_input = absl::StrCat(parts[0], ".", parts[1]);
  return jwt;
}

absl::StatusOr<std::map<std::string, PublicKey>> ParseJwks(std::string_view json) {
  nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("keys") || !doc["keys"].is_array()) {
    return absl::InvalidArgumentError("JWKS: not an object with a 'keys' array");
  }
  std::map<std::string, PublicKey> out;
  for (const auto& k : doc["keys"]) {
    if (!k.is_object() || !k.contains("kid") || !k["kid"].is_string() || !k.contains("kty") ||
        !k["kty"].is_string()) {
      return absl::InvalidArgumentError("JWKS: a key without string 'kid' and 'kty'");
    }
    const std::string kid = k["kid"].get<std::string>();
    const std::string kty = k["kty"].get<std::string>();
    if (k.contains("use") && k["use"] != "sig") continue;
    absl::StatusOr<PublicKey> key;
    if (kty == "RSA") {
      key = RsaKey(k, kid);
    } else if (kty == "EC" && k.value("crv", "") == "P-256") {
      key = EcKey(k, kid);
    } else {
      continue;
    }
    if (!key.ok()) return key.status();
    out[kid] = *std::move(key);
  }
  return out;
}

absl::Status VerifySignature(const Jwt& jwt, const PublicKey& key) {
  const std::string alg = jwt.header.value("alg", "");
  if (alg != key.alg) {
    return absl::PermissionDeniedError(absl::StrCat("token: header alg '", alg, "', but key '",
                                                    jwt.header.value("kid", ""), "' is ", key.alg));
  }
  std::string sig = jwt.signature;
  if (alg == "ES256") {
    // JWS carries r || s (32 bytes each); OpenSSL verifies DER.
    if (sig.size() != 64) {
      return absl::PermissionDeniedError(
          absl::StrCat("token: an ES256 signature of ", sig.size(), " bytes (64)"));
    }
    const auto* raw = reinterpret_cast<const unsigned char*>(sig.data());
    SigPtr s(ECDSA_SIG_new());
    BIGNUM* r = BN_bin2bn(raw, 32, nullptr);
    BIGNUM* ss = BN_bin2bn(raw + 32, 32, nullptr);
    if (!s || r == nullptr || ss == nullptr || ECDSA_SIG_set0(s.get(), r, ss) != 1) {
      BN_free(r);
      BN_free(ss);
      return absl::InternalError("token: OpenSSL could not hold an ECDSA signature");
    }
    unsigned char* der = nullptr;
    const int len = i2d_ECDSA_SIG(s.get(), &der);
    if (len <= 0) return absl::InternalError("token: OpenSSL could not encode the signature");
    sig.assign(reinterpret_cast<char*>(der), static_cast<size_t>(len));
    OPENSSL_free(der);
  }
  MdCtxPtr md(EVP_MD_CTX_new());
  if (!md || EVP_DigestVerifyInit(md.get(), nullptr, EVP_sha256(), nullptr, key.key.get()) != 1) {
    return absl::InternalError("token: OpenSSL could not start a verification");
  }
  if (EVP_DigestVerify(md.get(), reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                       reinterpret_cast<const unsigned char*>(jwt.signing_input.data()),
                       jwt.signing_input.size()) != 1) {
    return absl::PermissionDeniedError(
        absl::StrCat("token: its ", alg, " signature does not verify with key '",
                     jwt.header.value("kid", ""), "' of the issuer"));
  }
  return absl::OkStatus();
}

}  // namespace weightcache::nodeid
