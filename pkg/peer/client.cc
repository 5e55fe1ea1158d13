#include "pkg/peer/client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"

namespace weightcache::peer {

std::unique_ptr<PeerClient> PeerClient::Make(const std::string& address, const TlsMaterial& tls) {
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(tls.server_name);
  args.SetMaxReceiveMessageSize(256 << 20);  // records of very large models
  auto channel = grpc::CreateCustomChannel(address, ChannelCredentials(tls), args);
  return std::unique_ptr<PeerClient>(
      new PeerClient(address, v1::WeightCachePeer::NewStub(channel)));
}

absl::StatusOr<v1::PeerDescribeResponse> PeerClient::Describe(const std::string& fingerprint,
                                                              std::chrono::milliseconds timeout,
                                                              bool transfer, std::string* identity,
                                                              const std::string& asker_node,
                                                              const std::string& nonce) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::PeerDescribeRequest req;
  req.set_fingerprint(fingerprint);
  req.set_transfer(transfer);
  req.set_asker_node(asker_node);
  req.set_nonce(nonce);
  v1::PeerDescribeResponse resp;
  const grpc::Status s = stub_->Describe(&ctx, req, &resp);
  if (s.ok()) {
    if (identity != nullptr) *identity = CertificateName(*ctx.auth_context());
    return resp;
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("peer ", address_, ": ", s.error_message()));
}

}  // namespace weightcache::peer
