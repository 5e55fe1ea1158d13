#include "pkg/peer/tls.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace weightcache::peer {
namespace {

absl::StatusOr<std::string> ReadPem(const char* field, const std::string& path,
                                    const std::string& kind) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is not set"));
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", path, ": cannot be read"));
  }
  std::ostringstream s;
  s << in.rdbuf();
  std::string pem = s.str();
  // "-----BEGIN CERTIFICATE-----", "-----BEGIN PRIVATE KEY-----", "-----BEGIN EC PRIVATE
  // KEY-----", "-----BEGIN RSA PRIVATE KEY-----": the kind is a suffix of the label.
  const size_t begin = pem.find("-----BEGIN ");
  const size_t label_end = begin == std::string::npos ? begin : pem.find("-----", begin + 11);
  if (label_end == std::string::npos ||
      !std::string_view(pem).substr(begin + 11, label_end - begin - 11).ends_with(kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", path, ": holds no PEM ", kind, " block"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<TlsMaterial> ReadTls(const TlsFiles& f) {
  TlsMaterial m;
  auto cert = ReadPem("peer TLS certificate", f.cert_file, "CERTIFICATE");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem("peer TLS key", f.key_file, "PRIVATE KEY");
  if (!key.ok()) return key.status();
  auto ca = ReadPem("peer TLS CA", f.ca_file, "CERTIFICATE");
  if (!ca.ok()) return ca.status();
  if (f.server_name.empty()) {
    return absl::InvalidArgumentError("peer TLS server name is empty");
  }
  m.cert_pem = std::move(*cert);
  m.key_pem = std::move(*key);
  m.ca_pem = std::move(*ca);
  m.server_name = f.server_name;
  return m;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsMaterial& m) {
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = m.ca_pem;
  o.pem_key_cert_pairs.push_back({m.key_pem, m.cert_pem});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsMaterial& m) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = m.ca_pem;
  o.pem_private_key = m.key_pem;
  o.pem_cert_chain = m.cert_pem;
  return grpc::SslCredentials(o);
}

}  // namespace weightcache::peer
