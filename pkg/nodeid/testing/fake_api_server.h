// Test-only: the Kubernetes API server, played over HTTPS (cpp-httplib) on 127.0.0.1 with its
// own certificate and signing key (EC P-256 or RSA 2048), for the calls a daemon makes with its
// in-cluster credentials (kube_api.h):
//   POST /api/v1/namespaces/{ns}/serviceaccounts/{sa}/token   TokenRequest: a token signed for
//        the pod whose bearer token asks, of its own service account only (403 otherwise, as
//        the chart's RBAC and admission policy have it), bound to that pod (boundObjectRef name
//        and uid must be the asker's), with the pod and its node in the kubernetes.io claim,
//        expirationSeconds of 600 or more (400 otherwise, as the real server answers);
//   GET  /.well-known/openid-configuration, /openid/v1/jwks   the issuer and its public key.
// Every call needs the bearer token of a pod added with AddPod (401 otherwise). Sign forges
// tokens with this server's key (or one it does not publish) for the tests' attacks.
//
// Thread-safety: any method from any thread.
// The server answers on its own threads until destroyed.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "pkg/nodeid/kube_api.h"
#include "pkg/nodeid/service_account_token.h"
#include "pkg/util/mutex.h"

struct evp_pkey_st;
namespace httplib {
class SSLServer;
}

namespace weightcache::nodeid::testing {

struct FakePod {
  std::string namespace_name = "weightcache";
  std::string service_account = "weightcache";
  std::string name, uid, node, node_uid;
};

class FakeApiServer {
 public:
  struct Options {
    std::string alg = "ES256";  // or "RS256"
    std::string issuer = "https://kubernetes.default.svc.cluster.local";
  };
  // Serves on a free port of 127.0.0.1; certificate, key and pods' files under `dir`.
  static absl::StatusOr<std::unique_ptr<FakeApiServer>> Start(const std::string& dir, Options o);
  ~FakeApiServer();
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  // Registers `pod` and writes its in-cluster files (token, ca.crt, namespace) under
  // <dir>/<pod.name>/; the options that reach this server with them.
  absl::StatusOr<KubeApiOptions> AddPod(const FakePod& pod);

  // What TokenRequest signs for `pod` and `audience`, issued at `iat` (seconds since the
  // epoch), valid for `lifetime` seconds.
  nlohmann::json ClaimsFor(const FakePod& pod, const std::string& audience, int64_t iat,
                           int64_t lifetime = kTokenSeconds) const;
  // `claims` signed with this server's key; with `unknown_key`, with a key of the same kind
  // that it does not publish (under the published kid, or `kid` when set).
  std::string Sign(const nlohmann::json& claims, bool unknown_key = false,
                   const std::string& kid = "") const;

  int port() const { return port_; }
  const std::string& issuer() const { return options_.issuer; }
  int token_requests() const { return token_requests_.load(); }
  int key_fetches() const { return key_fetches_.load(); }

 private:
  explicit FakeApiServer(Options o);
  void Route();
  // The pod whose bearer token `authorization` carries; false when none.
  bool PodOf(const std::string& authorization, FakePod* pod) const;

  const Options options_;
  std::string dir_, cert_file_, kid_;
  std::shared_ptr<evp_pkey_st> key_, other_key_;
  mutable Mutex mu_;
  std::map<std::string, FakePod> pods_ ABSL_GUARDED_BY(mu_);  // by bearer token
  std::unique_ptr<httplib::SSLServer> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> token_requests_{0}, key_fetches_{0};
};

}  // namespace weightcache::nodeid::testing
