#include "pkg/peer/tls.h"

#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "pkg/util/regular_file.h"

namespace weightcache::peer {
namespace {

absl::StatusOr<std::string> ReadPem(const char* field, const std::string& path,
                                    const std::string& kind) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is not set"));
  // A regular file only (a FIFO or device named here fails at once instead of hanging the
  // start), and bounded: PEM files are a few KiB.
  auto file = OpenRegularFile(path);
  if (!file.ok()) {
    if (file.status().code() == absl::StatusCode::kInvalidArgument) {
      return absl::InvalidArgumentError(absl::StrCat(field, " ", file.status().message()));
    }
    return absl::InvalidArgumentError(absl::StrCat(field, " ", path, ": cannot be read"));
  }
  constexpr uint64_t kMaxPemBytes = 1 << 20;
  if (file->size > kMaxPemBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", path, ": ", file->size, " bytes, more than a PEM file holds"));
  }
  std::string pem(file->size, '\0');
  size_t got = 0;
  while (got < pem.size()) {
    const ssize_t n = ::read(file->fd.get(), pem.data() + got, pem.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, " ", path, ": cannot be read"));
    }
    got += static_cast<size_t>(n);
  }
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

std::string CertificateName(const grpc::AuthContext& ctx) {
  const auto names = ctx.FindPropertyValues("x509_common_name");
  return names.empty() ? "" : std::string(names.front().data(), names.front().size());
}

bool CarriesPeerName(const grpc::AuthContext& ctx, const std::string& server_name) {
  for (const auto& san : ctx.FindPropertyValues("x509_subject_alternative_name")) {
    if (std::string_view(san.data(), san.size()) == server_name) return true;
  }
  return false;
}

}  // namespace weightcache::peer
