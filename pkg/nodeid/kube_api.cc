#include "pkg/nodeid/kube_api.h"

#include <httplib.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "pkg/nodeid/jwt.h"

namespace weightcache::nodeid {
namespace {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": cannot be read"));
  }
  std::ostringstream s;
  s << in.rdbuf();
  std::string text(absl::StripAsciiWhitespace(s.str()));
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": empty"));
  if (text.size() > (1 << 16)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": over 64 KiB"));
  }
  return text;
}

}  // namespace

bool InClusterCredentialsPresent(const KubeApiOptions& o) {
  std::error_code ec;
  return std::filesystem::exists(o.token_file, ec);
}

KubeApi::KubeApi(KubeApiOptions o, std::string host, int port, std::string ns, std::string sa)
    : options_(std::move(o)),
      host_(std::move(host)),
      port_(port),
      host_port_(absl::StrCat(host_, ":", port_)),
      namespace_(std::move(ns)),
      service_account_(std::move(sa)) {}

absl::StatusOr<std::unique_ptr<KubeApi>> KubeApi::Make(const KubeApiOptions& o) {
  std::string server = o.server;
  if (server.empty()) {
    const char* h = ::getenv("KUBERNETES_SERVICE_HOST");
    const char* p = ::getenv("KUBERNETES_SERVICE_PORT");
    if (h == nullptr || *h == '\0' || p == nullptr || *p == '\0') {
      return absl::InvalidArgumentError(
          "the API server: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset (not "
          "in a pod?); name it with --kube_api_server");
    }
    const std::string host(h);
    server = host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", p)
                                                 : absl::StrCat(host, ":", p);
  }
  const size_t colon = server.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(server.substr(colon + 1), &port) ||
      port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("the API server '", server, "': not host:port"));
  }
  std::string host = server.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (auto ca = ReadSmallFile(o.ca_file, "the cluster CA"); !ca.ok()) return ca.status();
  auto ns = ReadSmallFile(o.namespace_file, "the namespace file");
  if (!ns.ok()) return ns.status();
  auto token = ReadSmallFile(o.token_file, "the service account token");
  if (!token.ok()) return token.status();
  // The pod's own token, read for its subject only (the API server checks it, not we).
  auto jwt = ParseJwt(*token);
  if (!jwt.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the service account token ", o.token_file, ": ", jwt.status().message()));
  }
  const std::string sub = jwt->claims.value("sub", "");
  const std::string prefix = absl::StrCat("system:serviceaccount:", *ns, ":");
  if (!absl::StartsWith(sub, prefix) || sub.size() == prefix.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the service account token ", o.token_file, ": subject '", sub,
                     "' is not a service account of namespace '", *ns, "'"));
  }
  return std::unique_ptr<KubeApi>(
      new KubeApi(o, std::move(host), port, *std::move(ns), sub.substr(prefix.size())));
}

absl::StatusOr<nlohmann::json> KubeApi::Get(const std::string& path) const {
  return Call("GET", path, nullptr);
}

absl::StatusOr<nlohmann::json> KubeApi::Post(const std::string& path,
                                             const nlohmann::json& body) const {
  return Call("POST", path, &body);
}

absl::StatusOr<nlohmann::json> KubeApi::Call(const std::string& method, const std::string& path,
                                             const nlohmann::json* body) const {
  auto token = ReadSmallFile(options_.token_file, "the service account token");
  if (!token.ok()) return token.status();
  httplib::SSLClient cli(host_, port_);
  cli.set_ca_cert_path(options_.ca_file.c_str());
  cli.enable_server_certificate_verification(true);
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(options_.timeout);
  const auto usecs = std::chrono::duration_cast<std::chrono::microseconds>(options_.timeout - secs);
  cli.set_connection_timeout(secs.count(), usecs.count());
  cli.set_read_timeout(secs.count(), usecs.count());
  cli.set_write_timeout(secs.count(), usecs.count());
  cli.set_bearer_token_auth(*token);
  httplib::Headers headers = {{"Accept", "application/json"}};
  httplib::Result r = body == nullptr
                          ? cli.Get(path.c_str(), headers)
                          : cli.Post(path.c_str(), headers, body->dump(), "application/json");
  const std::string where = absl::StrCat(method, " https://", host_port_, path);
  if (!r) {
    return absl::UnavailableError(absl::StrCat(
        where, ": ", httplib::to_string(r.error()),
        r.error() == httplib::Error::SSLServerVerification
            ? " (the server's certificate is not signed by the cluster CA " + options_.ca_file + ")"
            : ""));
  }
  nlohmann::json j = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (r->status == 200 || r->status == 201) {
    if (j.is_discarded()) {
      return absl::FailedPreconditionError(absl::StrCat(where, ": the answer is not JSON"));
    }
    return j;
  }
  std::string message = j.is_object() ? j.value("message", "") : "";
  if (message.empty()) message = r->body.substr(0, 200);
  const std::string text = absl::StrCat(where, ": HTTP ", r->status, ": ", message);
  if (r->status == 401 || r->status == 403) return absl::PermissionDeniedError(text);
  return absl::FailedPreconditionError(text);
}

}  // namespace weightcache::nodeid
