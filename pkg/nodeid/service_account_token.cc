#include "pkg/nodeid/service_account_token.h"

#include "absl/strings/str_cat.h"
#include "pkg/util/status_macros.h"

namespace weightcache::nodeid {
namespace {

// Kubernetes' tokens are about 1 KiB; a peer's answer may carry anything.
constexpr size_t kMaxTokenBytes = 16 << 10;

absl::Status Denied(const std::string& why) {
  return absl::PermissionDeniedError(absl::StrCat("token: ", why));
}

// A string member `name` of `j`, or "" when it is missing or not a string.
std::string Str(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// A NumericDate claim (seconds since the epoch); false when missing or not a number.
bool Time(const nlohmann::json& claims, const char* name, int64_t* out) {
  auto it = claims.find(name);
  if (it == claims.end() || !it->is_number_integer()) return false;
  *out = it->get<int64_t>();
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ApiTokenSource>> ApiTokenSource::Make(
    std::shared_ptr<const KubeApi> api, PodRef pod) {
  if (pod.name.empty()) {
    return absl::InvalidArgumentError("--pod_name: empty (the Downward API's metadata.name)");
  }
  if (pod.uid.empty()) {
    return absl::InvalidArgumentError("--pod_uid: empty (the Downward API's metadata.uid)");
  }
  return std::unique_ptr<ApiTokenSource>(new ApiTokenSource(std::move(api), std::move(pod)));
}

absl::StatusOr<std::string> ApiTokenSource::Token(const std::string& audience) {
  nlohmann::json req = {
      {"apiVersion", "authentication.k8s.io/v1"},
      {"kind", "TokenRequest"},
      {"spec",
       {{"audiences", {audience}},
        {"expirationSeconds", kTokenSeconds},
        {"boundObjectRef",
         {{"apiVersion", "v1"}, {"kind", "Pod"}, {"name", pod_.name}, {"uid", pod_.uid}}}}}};
  const std::string path = absl::StrCat("/api/v1/namespaces/", api_->namespace_name(),
                                        "/serviceaccounts/", api_->service_account(), "/token");
  WC_ASSIGN_OR_RETURN(nlohmann::json answer, api_->Post(path, req));
  const std::string token = answer.contains("status") && answer["status"].is_object()
                                ? Str(answer["status"], "token")
                                : "";
  if (token.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("TokenRequest ", path, ": the answer holds no status.token"));
  }
  return token;
}

absl::StatusOr<std::unique_ptr<ApiTokenVerifier>> ApiTokenVerifier::Make(
    std::shared_ptr<const KubeApi> api, VerifierOptions o) {
  if (o.namespace_name.empty() || o.service_account.empty()) {
    return absl::InvalidArgumentError(
        "token verifier: the peers' namespace and service account must be named");
  }
  return std::unique_ptr<ApiTokenVerifier>(new ApiTokenVerifier(std::move(api), std::move(o)));
}

absl::Status ApiTokenVerifier::FetchLocked() {
  WC_ASSIGN_OR_RETURN(nlohmann::json discovery, api_->Get("/.well-known/openid-configuration"));
  const std::string issuer = Str(discovery, "issuer");
  if (issuer.empty()) {
    return absl::UnavailableError("/.well-known/openid-configuration: no 'issuer'");
  }
  // Keys from the API server itself (with our credentials), not from the document's
  // jwks_uri: that names the issuer's public URL, which a pod may not reach.
  WC_ASSIGN_OR_RETURN(nlohmann::json jwks, api_->Get("/openid/v1/jwks"));
  auto keys = ParseJwks(jwks.dump());
  if (!keys.ok()) {
    return absl::UnavailableError(absl::StrCat("/openid/v1/jwks: ", keys.status().message()));
  }
  issuer_ = issuer;
  keys_ = *std::move(keys);
  fetched_ = std::chrono::steady_clock::now();
  ever_fetched_ = true;
  return absl::OkStatus();
}

absl::StatusOr<PublicKey> ApiTokenVerifier::KeyFor(const std::string& kid, std::string* issuer) {
  MutexLock l(mu_);
  if (keys_.count(kid) == 0 && (!ever_fetched_ || std::chrono::steady_clock::now() - fetched_ >=
                                                      options_.refetch_interval)) {
    absl::Status s = FetchLocked();
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the issuer's keys could not be fetched: ", s.message()));
    }
  }
  auto it = keys_.find(kid);
  if (it == keys_.end()) {
    return Denied(absl::StrCat("signed with key '", kid, "', which the issuer ", issuer_,
                               " does not publish"));
  }
  *issuer = issuer_;
  return it->second;
}

absl::StatusOr<VerifiedNode> ApiTokenVerifier::Verify(const std::string& token,
                                                      const std::string& audience) {
  if (token.size() > kMaxTokenBytes) {
    return Denied(absl::StrCat(token.size(), " bytes (at most ", kMaxTokenBytes, ")"));
  }
  auto jwt = ParseJwt(token);
  if (!jwt.ok()) return Denied(std::string(jwt.status().message()));
  const std::string alg = Str(jwt->header, "alg");
  if (alg != "RS256" && alg != "ES256") {
    return Denied(absl::StrCat("header alg '", alg, "' (RS256 or ES256 accepted)"));
  }
  const std::string kid = Str(jwt->header, "kid");
  if (kid.empty()) return Denied("the header names no key (kid)");
  std::string issuer;
  WC_ASSIGN_OR_RETURN(PublicKey key, KeyFor(kid, &issuer));
  WC_RETURN_IF_ERROR(VerifySignature(*jwt, key));
  return CheckClaims(jwt->claims, issuer, audience, options_);
}

absl::StatusOr<VerifiedNode> CheckClaims(const nlohmann::json& claims, const std::string& issuer,
                                         const std::string& audience, const VerifierOptions& o) {
  if (const std::string iss = Str(claims, "iss"); iss != issuer) {
    return Denied(absl::StrCat("issuer '", iss, "', not the cluster's '", issuer, "'"));
  }
  bool aud_ok = false;
  std::string aud_seen;
  if (auto it = claims.find("aud"); it != claims.end()) {
    aud_seen = it->dump();
    if (it->is_string()) aud_ok = it->get<std::string>() == audience;
    if (it->is_array()) {
      for (const auto& a : *it) aud_ok = aud_ok || (a.is_string() && a == audience);
    }
  }
  if (!aud_ok) {
    return Denied(absl::StrCat("made for audience ", aud_seen.empty() ? "(none)" : aud_seen,
                               ", not this node's call '", audience,
                               "' (another node, another call or another answer)"));
  }
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(o.now().time_since_epoch()).count();
  const int64_t skew = o.skew.count();
  int64_t exp = 0;
  if (!Time(claims, "exp", &exp)) return Denied("no expiry (exp)");
  if (exp + skew < now) {
    return Denied(absl::StrCat("expired ", now - exp, " s ago"));
  }
  int64_t t = 0;
  if (Time(claims, "nbf", &t) && t - skew > now) {
    return Denied(absl::StrCat("not valid for another ", t - now, " s (nbf)"));
  }
  if (Time(claims, "iat", &t) && t - skew > now) {
    return Denied(absl::StrCat("issued ", t - now, " s in the future (iat)"));
  }
  const std::string want_sub =
      absl::StrCat("system:serviceaccount:", o.namespace_name, ":", o.service_account);
  if (const std::string sub = Str(claims, "sub"); sub != want_sub) {
    return Denied(
        absl::StrCat("subject '", sub, "', not the daemons' service account '", want_sub, "'"));
  }
  auto k8s = claims.find("kubernetes.io");
  if (k8s == claims.end() || !k8s->is_object()) return Denied("no 'kubernetes.io' claim");
  VerifiedNode v;
  v.namespace_name = Str(*k8s, "namespace");
  if (k8s->contains("serviceaccount") && (*k8s)["serviceaccount"].is_object()) {
    v.service_account = Str((*k8s)["serviceaccount"], "name");
  }
  if (v.namespace_name != o.namespace_name || v.service_account != o.service_account) {
    return Denied(absl::StrCat("kubernetes.io names service account '", v.namespace_name, "/",
                               v.service_account, "', not '", o.namespace_name, "/",
                               o.service_account, "'"));
  }
  if (k8s->contains("pod") && (*k8s)["pod"].is_object()) {
    v.pod = Str((*k8s)["pod"], "name");
    v.pod_uid = Str((*k8s)["pod"], "uid");
  }
  if (v.pod.empty() || v.pod_uid.empty()) {
    return Denied("not bound to a pod (kubernetes.io.pod): it proves no node");
  }
  if (k8s->contains("node") && (*k8s)["node"].is_object()) {
    v.node = Str((*k8s)["node"], "name");
    v.node_uid = Str((*k8s)["node"], "uid");
  }
  if (v.node.empty()) {
    return Denied(
        "names no node (kubernetes.io.node; Kubernetes 1.30 or later puts it in tokens bound "
        "to a pod)");
  }
  return v;
}

}  // namespace weightcache::nodeid
