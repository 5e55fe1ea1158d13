// Which other nodes' daemons hold a fingerprint (issue 30, docs/peer-fill.md): the fill's
// first step. Peers are named as "host:port" entries (`--peers`); a name that resolves to
// several addresses stands for each of them, which is how a Kubernetes headless Service
// (`<release>-peers`) names every ready pod of the DaemonSet. Names are resolved again on
// every survey (pods come and go), and this daemon's own address is left out (a headless
// Service lists the asking pod too).
//
// Thread-safety: Survey may be called from several threads at once; clients (gRPC channels)
// are made once per address and kept.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/peer/client.h"
#include "pkg/peer/tls.h"
#include "pkg/util/mutex.h"

namespace weightcache::peer {

// One `--peers` entry, split. IPv6 literals are written "[addr]:port".
struct PeerName {
  std::string host;
  uint16_t port = 0;
};
// INVALID_ARGUMENT naming `entry` and what is wrong (no port, a port outside 1..65535, an
// empty host, an unclosed '[').
absl::StatusOr<PeerName> ParsePeerName(const std::string& entry);
// "host:port" from a comma-separated list; empty items are an error (a stray comma is
// usually a mistake in the flag), as is a list naming nothing.
absl::StatusOr<std::vector<PeerName>> ParsePeerList(const std::string& list);

struct PeerSetOptions {
  std::vector<PeerName> peers;
  TlsMaterial tls;
  // This daemon's peer API port: an address of this host with this port is itself. 0: none
  // is left out.
  uint16_t self_port = 0;
  // Each Describe's deadline: a peer slower than this is counted as failed, not waited for.
  std::chrono::milliseconds describe_timeout{2000};
  // Describes in flight at once (one thread each).
  int parallel = 16;
  // This daemon's node name: when set, every Describe asks the holder for its node token, made
  // for this node and a fresh nonce per call (peer.proto; pkg/nodeid/node_identity.h).
  std::string identify_as;
};

struct PeerHolder {
  std::string address;  // "ip:port" as dialled
  v1::PeerDescribeResponse response;
  std::string identity;  // its certificate's name (PeerClient::Describe)
  std::string nonce;     // the nonce its token must be made for (empty: none asked)
};
struct PeerFailure {
  std::string address;  // the entry, when its name did not resolve
  absl::Status status;
};
struct PeerSurvey {
  std::vector<PeerHolder> holders;    // answered with the record, by address
  std::vector<std::string> without;   // answered NOT_FOUND, by address
  std::vector<PeerFailure> failures;  // unreachable, refused, timed out, unresolvable
  size_t asked() const { return holders.size() + without.size() + failures.size(); }
};

class PeerSet {
 public:
  explicit PeerSet(PeerSetOptions options) : options_(std::move(options)) {}

  // The addresses the entries resolve to now, each once, this host's own left out.
  // `failures` (may be null) receives the entries whose names did not resolve.
  std::vector<std::string> Resolve(std::vector<PeerFailure>* failures) const;

  // Asks every resolved peer to describe `fingerprint`, in parallel; returns when all have
  // answered or timed out. With `transfer`, every holder also exposes the segments for a
  // pull (its answer's `transfer`; the fill asks so).
  PeerSurvey Survey(const std::string& fingerprint, bool transfer = false);

 private:
  // The kept client of `address` (made on first use). Clients of addresses no longer
  // resolved are dropped, and so is one whose call failed: a fresh channel does not inherit
  // gRPC's reconnect backoff (up to two minutes) towards a pod that has just come back.
  std::shared_ptr<PeerClient> ClientFor(const std::string& address);
  void Forget(const std::string& address, const PeerClient* client);
  void KeepOnly(const std::vector<std::string>& addresses);

  const PeerSetOptions options_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<PeerClient>> clients_ ABSL_GUARDED_BY(mu_);
};

}  // namespace weightcache::peer
