// Test-only: a fleet member gone bad, built from the real parts (the peer API's gRPC service
// with mutual TLS, UCX transfers). It asks an honest daemon to describe a fingerprint with a
// transfer, pulls every segment, flips one byte of one segment, and from then on describes
// the fingerprint with the honest daemon's record (its digests are those of the true bytes)
// while serving its own, corrupted copy. A filling daemon must catch the segment and not use
// it (issue 30: "a source that serves a corrupted segment"). With `forge_record`, its record
// names the altered bytes' digest instead: self-consistent (issue 48).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pkg/peer/tls.h"

namespace weightcache::peer::testing {

struct CorruptPeerOptions {
  std::string listen = "127.0.0.1:0";  // its peer API
  TlsFiles server_files;               // its certificate (the fleet CA's: it is a member)
  TlsMaterial client_tls;              // to ask the honest daemon
  std::string honest_address;          // "host:port" of the honest daemon's peer API
  std::string fingerprint;
  int bad_segment = 0;  // the segment whose first byte is flipped
  // Issue 48: the record it describes carries the cryptographic digest of its altered
  // segment instead of the honest one, so record and bytes agree: only an anchor the
  // source does not control (pinned digests, a quorum of other holders) catches it.
  bool forge_record = false;
  // Issue 57: what it does with node tokens (pkg/nodeid/node_identity.h), to pass its record off
  // as the honest daemon's node. kRelay: each asker's node and nonce are forwarded to the honest
  // daemon, whose fresh token comes back beside this peer's own record; kReplay: the token the
  // honest daemon gave it at start (asked as `replay_as_node`, with a nonce of its own) is
  // presented on every call.
  enum class TokenPlay { kNone, kRelay, kReplay };
  TokenPlay token_play = TokenPlay::kNone;
  std::string replay_as_node;
};

class CorruptPeer {
 public:
  static absl::StatusOr<std::unique_ptr<CorruptPeer>> Start(const CorruptPeerOptions& options);
  ~CorruptPeer();
  CorruptPeer(const CorruptPeer&) = delete;
  CorruptPeer& operator=(const CorruptPeer&) = delete;
  int port() const;

  struct State;

 private:
  explicit CorruptPeer(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace weightcache::peer::testing
