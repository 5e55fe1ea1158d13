// The peer API (proto/weightcache/v1/peer.proto, docs/peer-fill.md): what this daemon answers
// other nodes' daemons. It owns everything it answers with: the gRPC server (mutual TLS) on a
// Unix socket in a private directory, the TCP port in front of it (wire/peer_port.h: caps,
// handshake deadline, the relay), and the segments exposed for pulls (peer/peer_exposures.h).
// It reads the registry's entries and the catalog's spec records, nothing else of the daemon.
// Not a public header.
//
// Thread-safety: Start and Stop from the daemon's thread (Start once, Stop any number of
// times); Describe, SourceOf, port and listener from any thread (gRPC's, the metrics').
// Lifetimes: the registry and what `spec_of` reads outlive the PeerApi; after Stop no
// Describe runs, and the listener stays for the metrics' readers until the PeerApi goes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/load/staging_pool.h"
#include "pkg/memory/backend.h"
#include "pkg/metrics/metrics.h"
#include "pkg/nodeid/node_identity.h"
#include "pkg/peer/tls.h"
#include "pkg/server/keeper/keeper_record.h"
#include "pkg/server/options.h"
#include "pkg/server/peer/peer_exposures.h"
#include "pkg/server/peer/peer_fill.h"
#include "pkg/server/wire/peer_port.h"
#include "weightcache/v1/peer.pb.h"

namespace weightcache::server {

class PeerApi {
 public:
  // What a Describe reads: the registry's ready shared entries, the backend they live in, and
  // the spec record of a model (the catalog's).
  struct Sources {
    const cache::Registry* registry = nullptr;
    memory::BackendKind backend = memory::BackendKind::kHost;
    std::function<RecordedSpec(const std::string& model)> spec_of;
  };
  PeerApi(PeerOptions options, std::chrono::milliseconds shutdown_grace, Sources sources);
  ~PeerApi();
  PeerApi(const PeerApi&) = delete;
  PeerApi& operator=(const PeerApi&) = delete;

  // Serves on options.listen (nothing when it is empty): the exposures, the gRPC server, then
  // the port. The error names what did not start (the TLS files, the socket, the port).
  absl::Status Start();
  // The port stops accepting; the calls in flight get their answers (gRPC drains, bounded by
  // the shutdown grace); the connections close; the exposures go (pulls in flight fail at the
  // peers); the private directory is removed.
  void Stop();

  // The record of a ready, shared, loaded entry with `fingerprint`; NOT_FOUND otherwise
  // (published and private copies are never described: they are this node's). With
  // `transfer`, its segments are exposed for pulls over UCX too.
  absl::StatusOr<v1::PeerDescribeResponse> Describe(const std::string& fingerprint, bool transfer);
  // Adds to `resp` this daemon's node token for the asker's node and nonce (peer.proto, checked
  // well-formed by the caller) when a token is asked and this daemon presents them. A token
  // the API server does not give is logged: the answer goes without it.
  void AddNodeToken(const v1::PeerDescribeRequest& req, v1::PeerDescribeResponse* resp);
  // The TCP source ("ipv4:10.1.2.3:40512") behind gRPC's peer string of a call.
  std::string SourceOf(const std::string& grpc_peer) const;
  // The TCP port (0 before Start or without the API); the port's counters (null likewise).
  int port() const { return port_number_.load(); }
  const PeerPort* listener() const { return listener_.load(); }

 private:
  absl::Status StartGrpc(const peer::TlsMaterial& tls, const std::string& backend_path);

  const PeerOptions options_;
  const std::chrono::milliseconds shutdown_grace_;
  const Sources sources_;
  // With --peer_identity=token: the tokens this daemon presents (set once by Start).
  std::unique_ptr<nodeid::TokenSource> tokens_;
  // Declared in the order Stop undoes them.
  std::unique_ptr<PeerExposures> exposures_;
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> grpc_;
  std::string dir_;  // the private directory of grpc_'s Unix socket
  std::unique_ptr<PeerPort> port_;
  std::atomic<const PeerPort*> listener_{nullptr};  // port_, once it runs
  std::atomic<int> port_number_{0};
};

// Peer fill's client side (options.peers; null when empty): asks the peers before a load
// reads from disk, this daemon's own port (`self_port`) left out. The error names the TLS
// files it could not read.
absl::StatusOr<std::unique_ptr<PeerFill>> MakePeerFill(const PeerOptions& options, int self_port,
                                                       memory::Backend* backend,
                                                       metrics::Metrics* metrics,
                                                       load::StagingPool* staging);

}  // namespace weightcache::server
