// Mutual TLS between node daemons (issue 30, docs/security.md "Across nodes"): every daemon
// of a fleet holds one certificate and key issued by the fleet's CA (the chart generates
// them, or cert-manager does) and trusts exactly that CA. A peer is whoever presents a
// certificate the CA signed; the client checks the server's certificate against the name
// `server_name` (the chart's certificates carry it as a DNS SAN), not against the address it
// dialled (pod IPs change).
//
// Thread-safety: pure functions of their arguments (the files are read once, when called).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class AuthContext;
class ServerCredentials;
class ChannelCredentials;
}  // namespace grpc

namespace weightcache::peer {

inline constexpr const char* kDefaultServerName = "weightcache-peer";

struct TlsFiles {
  std::string cert_file;  // PEM: this daemon's certificate (then intermediates)
  std::string key_file;   // PEM: its private key
  std::string ca_file;    // PEM: the fleet CA; peers must present a certificate it signed
  std::string server_name = kDefaultServerName;
};

struct TlsMaterial {
  std::string cert_pem, key_pem, ca_pem;
  std::string server_name;
};

// Reads the three files. INVALID_ARGUMENT naming the flag-like field and the file when one
// is unset, unreadable, empty or holds no PEM block of the expected kind ("CERTIFICATE",
// "PRIVATE KEY").
absl::StatusOr<TlsMaterial> ReadTls(const TlsFiles& files);

// Server side: requires and verifies a client certificate signed by the CA.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsMaterial& m);
// Client side: presents this daemon's certificate, verifies the server's against the CA.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsMaterial& m);

// Identities (issue 48): with per-node certificates (each node's common name its own, every
// one carrying `server_name` as a DNS SAN), a peer's identity is its certificate's common
// name; "" when the certificate has none (or the call had no TLS).
std::string CertificateName(const grpc::AuthContext& ctx);
// Whether the other side's certificate carries `server_name` among its DNS SANs: a peer
// certificate of the fleet, not some other certificate the same CA signed.
bool CarriesPeerName(const grpc::AuthContext& ctx, const std::string& server_name);

}  // namespace weightcache::peer
