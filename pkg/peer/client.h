// A daemon's side of asking another node's daemon (proto/weightcache/v1/peer.proto) over gRPC
// on TCP with mutual TLS (tls.h). Today: Describe, the record of a fingerprint the peer holds
// ready; the fill that pulls its segments builds on it (docs/peer-fill.md).
//
// Thread-safety: a PeerClient may be used from several threads at once (gRPC stubs are).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/peer/tls.h"
#include "weightcache/v1/peer.grpc.pb.h"

namespace weightcache::peer {

class PeerClient {
 public:
  // `address`: "host:port" (IPv6 as "[addr]:port"). Connects lazily (the first call).
  static std::unique_ptr<PeerClient> Make(const std::string& address, const TlsMaterial& tls);

  // NOT_FOUND when the peer does not hold `fingerprint` ready (or will not serve it);
  // UNAVAILABLE naming the address when it cannot be reached or the TLS handshake fails
  // (either side's certificate not signed by the CA, or the server's not for server_name);
  // DEADLINE_EXCEEDED after `timeout`. With `transfer`, the peer also exposes the segments
  // for a pull (PeerDescribeResponse.transfer).
  // `identity` (may be null) receives the answering daemon's certificate name (its common
  // name: per node, when the fleet issues per-node certificates; tls.h CertificateName).
  // With `asker_node` and `nonce` set, the answer carries the describing daemon's node token
  // for them (peer.proto PeerDescribeRequest; pkg/nodeid/node_identity.h).
  absl::StatusOr<v1::PeerDescribeResponse> Describe(const std::string& fingerprint,
                                                    std::chrono::milliseconds timeout,
                                                    bool transfer = false,
                                                    std::string* identity = nullptr,
                                                    const std::string& asker_node = "",
                                                    const std::string& nonce = "");

  const std::string& address() const { return address_; }

 private:
  PeerClient(std::string address, std::unique_ptr<v1::WeightCachePeer::Stub> stub)
      : address_(std::move(address)), stub_(std::move(stub)) {}
  const std::string address_;
  std::unique_ptr<v1::WeightCachePeer::Stub> stub_;
};

}  // namespace weightcache::peer
