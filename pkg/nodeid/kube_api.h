// The Kubernetes API server as a pod reaches it with its own credentials (in-cluster): the
// service account's token, the cluster CA and the namespace under
// /var/run/secrets/kubernetes.io/serviceaccount, the server at KUBERNETES_SERVICE_HOST:
// KUBERNETES_SERVICE_PORT. Every path is an option so tests can point at a test-played API
// server (testing/fake_api_server.h). HTTPS only, the server's certificate checked against the
// CA file and its name.
//
// Thread-safety: Get and Post may be called from several threads at once (each request opens
// its own connection: a few per fill, not worth pooling). The bearer token is read from its
// file on every request, since the kubelet rotates it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace weightcache::nodeid {

inline constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

struct KubeApiOptions {
  // "host:port"; empty: $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
  std::string server;
  std::string token_file = std::string(kServiceAccountDir) + "/token";
  std::string ca_file = std::string(kServiceAccountDir) + "/ca.crt";
  std::string namespace_file = std::string(kServiceAccountDir) + "/namespace";
  std::chrono::milliseconds timeout{5000};
};

// Whether the in-cluster credentials are there (the token file exists): a pod with a service
// account token mounted.
bool InClusterCredentialsPresent(const KubeApiOptions& o);

class KubeApi {
 public:
  // Reads the namespace and the service account's name (the `sub` of the pod's own token);
  // INVALID_ARGUMENT naming the file or the environment variable that is missing or wrong.
  static absl::StatusOr<std::unique_ptr<KubeApi>> Make(const KubeApiOptions& o);

  // The JSON body of a 200 (or 201) answer; UNAVAILABLE naming the path when the server cannot
  // be reached, PERMISSION_DENIED for 401/403, FAILED_PRECONDITION with the server's message
  // for other codes.
  absl::StatusOr<nlohmann::json> Get(const std::string& path) const;
  absl::StatusOr<nlohmann::json> Post(const std::string& path, const nlohmann::json& body) const;

  const std::string& namespace_name() const { return namespace_; }
  const std::string& service_account() const { return service_account_; }
  const std::string& server() const { return host_port_; }

 private:
  KubeApi(KubeApiOptions o, std::string host, int port, std::string ns, std::string sa);
  absl::StatusOr<nlohmann::json> Call(const std::string& method, const std::string& path,
                                      const nlohmann::json* body) const;
  const KubeApiOptions options_;
  const std::string host_;
  const int port_;
  const std::string host_port_;
  const std::string namespace_, service_account_;
};

}  // namespace weightcache::nodeid
