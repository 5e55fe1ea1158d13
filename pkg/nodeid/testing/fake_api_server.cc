#include "pkg/nodeid/testing/fake_api_server.h"

#include <httplib.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "pkg/nodeid/jwt.h"
#include "pkg/util/bytes.h"
#include "pkg/webhook/testing/load.h"

namespace weightcache::nodeid::testing {
namespace {

std::shared_ptr<EVP_PKEY> NewKey(const std::string& alg) {
  EVP_PKEY* k = alg == "RS256" ? EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", size_t{2048})
                               : EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  return std::shared_ptr<EVP_PKEY>(k, EVP_PKEY_free);
}

std::string BnParam(EVP_PKEY* k, const char* name) {
  BIGNUM* bn = nullptr;
  if (EVP_PKEY_get_bn_param(k, name, &bn) != 1) return "";
  std::string out(static_cast<size_t>(BN_num_bytes(bn)), '\0');
  BN_bn2bin(bn, reinterpret_cast<unsigned char*>(out.data()));
  BN_free(bn);
  return out;
}

nlohmann::json Jwk(EVP_PKEY* k, const std::string& alg, const std::string& kid) {
  if (alg == "RS256") {
    return {{"kty", "RSA"},
            {"use", "sig"},
            {"alg", "RS256"},
            {"kid", kid},
            {"n", Base64UrlEncode(BnParam(k, OSSL_PKEY_PARAM_RSA_N))},
            {"e", Base64UrlEncode(BnParam(k, OSSL_PKEY_PARAM_RSA_E))}};
  }
  unsigned char pub[65];
  size_t len = 0;
  EVP_PKEY_get_octet_string_param(k, OSSL_PKEY_PARAM_PUB_KEY, pub, sizeof(pub), &len);
  const std::string p(reinterpret_cast<char*>(pub), len);
  return {{"kty", "EC"},
          {"use", "sig"},
          {"alg", "ES256"},
          {"crv", "P-256"},
          {"kid", kid},
          {"x", Base64UrlEncode(p.substr(1, 32))},
          {"y", Base64UrlEncode(p.substr(33, 32))}};
}

std::string SignWith(EVP_PKEY* k, const std::string& alg, const std::string& kid,
                     const nlohmann::json& claims) {
  const nlohmann::json header = {{"alg", alg}, {"kid", kid}};
  const std::string input =
      absl::StrCat(Base64UrlEncode(header.dump()), ".", Base64UrlEncode(claims.dump()));
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  EVP_DigestSignInit(md, nullptr, EVP_sha256(), nullptr, k);
  size_t len = 0;
  EVP_DigestSign(md, nullptr, &len, reinterpret_cast<const unsigned char*>(input.data()),
                 input.size());
  std::string sig(len, '\0');
  EVP_DigestSign(md, reinterpret_cast<unsigned char*>(sig.data()), &len,
                 reinterpret_cast<const unsigned char*>(input.data()), input.size());
  sig.resize(len);
  EVP_MD_CTX_free(md);
  if (alg == "ES256") {  // DER to r || s
    const auto* p = reinterpret_cast<const unsigned char*>(sig.data());
    ECDSA_SIG* s = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(sig.size()));
    std::string raw(64, '\0');
    BN_bn2binpad(ECDSA_SIG_get0_r(s), reinterpret_cast<unsigned char*>(raw.data()), 32);
    BN_bn2binpad(ECDSA_SIG_get0_s(s), reinterpret_cast<unsigned char*>(raw.data()) + 32, 32);
    ECDSA_SIG_free(s);
    sig = raw;
  }
  return absl::StrCat(input, ".", Base64UrlEncode(sig));
}

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Answer(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(nlohmann::json({{"kind", "Status"}, {"message", message}}).dump(),
                  "application/json");
}

}  // namespace

absl::StatusOr<std::unique_ptr<FakeApiServer>> FakeApiServer::Start(const std::string& dir,
                                                                    Options o) {
  std::unique_ptr<FakeApiServer> s(new FakeApiServer(std::move(o)));
  s->dir_ = dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (absl::Status w = webhook::testing::WriteSelfSignedPair(dir); !w.ok()) return w;
  s->cert_file_ = dir + "/tls.crt";
  s->key_ = NewKey(s->options_.alg);
  s->other_key_ = NewKey(s->options_.alg);
  s->kid_ = RandomHex(8);
  s->server_ =
      std::make_unique<httplib::SSLServer>(s->cert_file_.c_str(), (dir + "/tls.key").c_str());
  if (!s->server_->is_valid()) return absl::InternalError("fake API server: TLS did not start");
  s->Route();
  s->port_ = s->server_->bind_to_any_port("127.0.0.1");
  if (s->port_ <= 0) return absl::InternalError("fake API server: cannot bind 127.0.0.1");
  s->thread_ = std::thread([raw = s.get()] { raw->server_->listen_after_bind(); });
  // httplib's stop() does nothing before the loop runs: a server destroyed at once would
  // leave its thread listening.
  while (!s->server_->is_running()) std::this_thread::yield();
  return s;
}

FakeApiServer::FakeApiServer(Options o) : options_(std::move(o)) {}

FakeApiServer::~FakeApiServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<KubeApiOptions> FakeApiServer::AddPod(const FakePod& pod) {
  const std::string d = absl::StrCat(dir_, "/", pod.name);
  std::filesystem::create_directories(d);
  // The pod's own (kubelet-mounted) token: its bearer credential here.
  const int64_t now = Now();
  const std::string token = Sign(ClaimsFor(pod, "https://kubernetes.default.svc", now, 3607));
  {
    MutexLock l(mu_);
    pods_[token] = pod;
  }
  std::ofstream(d + "/token") << token;
  std::ofstream(d + "/namespace") << pod.namespace_name;
  std::filesystem::copy_file(cert_file_, d + "/ca.crt",
                             std::filesystem::copy_options::overwrite_existing);
  KubeApiOptions o;
  o.server = absl::StrCat("127.0.0.1:", port_);
  o.token_file = d + "/token";
  o.ca_file = d + "/ca.crt";
  o.namespace_file = d + "/namespace";
  return o;
}

nlohmann::json FakeApiServer::ClaimsFor(const FakePod& pod, const std::string& audience,
                                        int64_t iat, int64_t lifetime) const {
  return {
      {"iss", options_.issuer},
      {"aud", {audience}},
      {"sub", absl::StrCat("system:serviceaccount:", pod.namespace_name, ":", pod.service_account)},
      {"iat", iat},
      {"nbf", iat},
      {"exp", iat + lifetime},
      {"jti", RandomHex(16)},
      {"kubernetes.io",
       {{"namespace", pod.namespace_name},
        {"serviceaccount", {{"name", pod.service_account}, {"uid", "sa-uid"}}},
        {"pod", {{"name", pod.name}, {"uid", pod.uid}}},
        {"node", {{"name", pod.node}, {"uid", pod.node_uid}}}}}};
}

std::string FakeApiServer::Sign(const nlohmann::json& claims, bool unknown_key,
                                const std::string& kid) const {
  return SignWith(unknown_key ? other_key_.get() : key_.get(), options_.alg,
                  kid.empty() ? kid_ : kid, claims);
}

bool FakeApiServer::PodOf(const std::string& authorization, FakePod* pod) const {
  if (!absl::StartsWith(authorization, "Bearer ")) return false;
  MutexLock l(mu_);
  auto it = pods_.find(authorization.substr(7));
  if (it == pods_.end()) return false;
  *pod = it->second;
  return true;
}

void FakeApiServer::Route() {
  server_->Get("/.well-known/openid-configuration",
               [this](const httplib::Request& req, httplib::Response& res) {
                 FakePod p;
                 if (!PodOf(req.get_header_value("Authorization"), &p)) {
                   return Answer(res, 401, "Unauthorized");
                 }
                 res.set_content(nlohmann::json({{"issuer", options_.issuer},
                                                 {"jwks_uri", options_.issuer + "/openid/v1/jwks"}})
                                     .dump(),
                                 "application/json");
               });
  server_->Get("/openid/v1/jwks", [this](const httplib::Request& req, httplib::Response& res) {
    FakePod p;
    if (!PodOf(req.get_header_value("Authorization"), &p)) return Answer(res, 401, "Unauthorized");
    ++key_fetches_;
    res.set_content(nlohmann::json({{"keys", {Jwk(key_.get(), options_.alg, kid_)}}}).dump(),
                    "application/json");
  });
  server_->Post(
      R"(/api/v1/namespaces/([^/]+)/serviceaccounts/([^/]+)/token)",
      [this](const httplib::Request& req, httplib::Response& res) {
        FakePod p;
        if (!PodOf(req.get_header_value("Authorization"), &p)) {
          return Answer(res, 401, "Unauthorized");
        }
        ++token_requests_;
        if (req.matches[1] != p.namespace_name || req.matches[2] != p.service_account) {
          return Answer(res, 403,
                        absl::StrCat("serviceaccounts \"", std::string(req.matches[2]),
                                     "\" is forbidden: cannot create resource "
                                     "\"serviceaccounts/token\""));
        }
        nlohmann::json body = nlohmann::json::parse(req.body, nullptr, false);
        if (!body.is_object() || !body.contains("spec") || !body["spec"].is_object()) {
          return Answer(res, 400, "not a TokenRequest");
        }
        const nlohmann::json& spec = body["spec"];
        const int64_t seconds = spec.value("expirationSeconds", int64_t{3600});
        if (seconds < 600) {
          return Answer(res, 400,
                        "spec.expirationSeconds: Invalid value: may not specify a duration "
                        "less than 10 minutes");
        }
        if (!spec.contains("audiences") || !spec["audiences"].is_array() ||
            spec["audiences"].size() != 1 || !spec["audiences"][0].is_string()) {
          return Answer(res, 400, "spec.audiences: one audience expected here");
        }
        const nlohmann::json ref = spec.value("boundObjectRef", nlohmann::json::object());
        if (ref.value("kind", "") != "Pod" || ref.value("name", "") != p.name ||
            ref.value("uid", "") != p.uid) {
          return Answer(res, 403, "a token may be bound to the asking pod only");
        }
        const std::string token =
            Sign(ClaimsFor(p, spec["audiences"][0].get<std::string>(), Now(), seconds));
        res.status = 201;
        res.set_content(
            nlohmann::json({{"kind", "TokenRequest"}, {"status", {{"token", token}}}}).dump(),
            "application/json");
      });
}

}  // namespace weightcache::nodeid::testing
