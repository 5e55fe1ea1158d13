// weightcached's peer-fill flags (peer_flags.h): their definitions and what they make of
// server::PeerOptions.
#include "cmd/weightcached/peer_flags.h"

#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "pkg/nodeid/kube_api.h"
#include "pkg/nodeid/node_identity.h"
#include "pkg/peer/peer_set.h"
#include "pkg/peer/tls.h"
#include "pkg/server/peer/fill_anchor.h"

ABSL_DECLARE_FLAG(std::string, node_name);  // flags.cc: the CSI plugin's too

ABSL_FLAG(std::string, peer_listen, "",
          "Peer fill (issue 30): host:port where other nodes' daemons reach this one's peer API "
          "(gRPC on TCP, mutual TLS: --peer_tls_*); e.g. 0.0.0.0:7443. Empty: off");
ABSL_FLAG(int, peer_transfer_hold_seconds, 120,
          "Peer API: how long a peer's pull keeps an entry's segments exposed (and its memory "
          "held, even if evicted meanwhile); each Describe that asks for a transfer renews it");
ABSL_FLAG(int, peer_max_connections, 1024,
          "Peer API: connections its port holds at once (a daemon keeps one to each peer it "
          "asks). At the cap the oldest connection still in its TLS handshake is closed to "
          "make room, and a newcomer when every one is past it");
ABSL_FLAG(int, peer_max_connections_per_address, 16,
          "Peer API: connections one source address may hold at once; past it, closed at "
          "accept");
ABSL_FLAG(int, peer_handshake_timeout_ms, 10000,
          "Peer API: how long a connection may take to complete its TLS handshake before it is "
          "closed");
ABSL_FLAG(std::string, peers, "",
          "Peer fill (issue 30): other nodes' daemons (comma-separated host:port of their "
          "--peer_listen; a DNS name stands for every address it resolves to, e.g. the chart's "
          "headless Service) asked for a model-rank before it is read from disk; a holder's "
          "segments are pulled over UCX and checked against its digests, disk on any failure. "
          "Uses --peer_tls_*. Empty: off");
ABSL_FLAG(std::string, peer_trust, "quorum",
          "Peer fill (issue 48): whose record a fill believes when the spec pins no segment "
          "digests for the fingerprint. quorum: the same segment digests from 2 holders with "
          "distinct identities (--peer_identity), else the disk; single: any one holder, "
          "trusting every node that holds the fleet's certificate");
ABSL_FLAG(std::string, peer_identity, "auto",
          "Peer fill (issue 57): what tells holders apart in a quorum. token: the node a token "
          "the Kubernetes API server signed for the holder's pod proves (TokenRequest, bound to "
          "the pod, made for the asking node, one call and one answer; needs --node_name, "
          "--pod_name, --pod_uid and the pod's in-cluster credentials); certificate: the "
          "holder's certificate common name (per-node certificates, outside Kubernetes); auto: "
          "token when --kube_token_file exists, else certificate");
ABSL_FLAG(std::string, pod_name, "",
          "This daemon's pod (the Downward API's metadata.name): its node tokens are bound to it "
          "(--peer_identity=token); empty: $POD_NAME");
ABSL_FLAG(std::string, pod_uid, "",
          "This daemon's pod uid (metadata.uid; --peer_identity=token); empty: $POD_UID");
ABSL_FLAG(std::string, kube_api_server, "",
          "The Kubernetes API server, host:port. Empty: "
          "$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT");
ABSL_FLAG(std::string, kube_token_file, "/var/run/secrets/kubernetes.io/serviceaccount/token",
          "The pod's service account token (its in-cluster credential)");
ABSL_FLAG(std::string, kube_ca_file, "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
          "The cluster CA that signed the API server's certificate");
ABSL_FLAG(std::string, kube_namespace_file,
          "/var/run/secrets/kubernetes.io/serviceaccount/namespace",
          "The pod's namespace, as the kubelet writes it");
ABSL_FLAG(int, peer_describe_timeout_ms, 2000,
          "Peer fill: how long each peer may take to answer whether it holds a model-rank");
ABSL_FLAG(int, peer_pull_timeout_seconds, 300,
          "Peer fill: how long one segment's pull (up to 1 GiB) may take before that source is "
          "dropped");
ABSL_FLAG(std::string, peer_tls_cert_file, "/etc/weightcache-peer/tls.crt",
          "Peer API: this daemon's PEM certificate, signed by the fleet CA (--peer_tls_ca_file)");
ABSL_FLAG(std::string, peer_tls_key_file, "/etc/weightcache-peer/tls.key",
          "Peer API: the PEM private key of --peer_tls_cert_file");
ABSL_FLAG(std::string, peer_tls_ca_file, "/etc/weightcache-peer/ca.crt",
          "Peer API: the fleet CA (PEM); a peer must present a certificate it signed");
ABSL_FLAG(std::string, peer_tls_server_name, "weightcache-peer",
          "Peer API: the DNS name every daemon's certificate carries (peers are dialled by IP)");
namespace weightcache {

// Peer fill (issue 30): the peer API this daemon serves, the peers it asks, and their TLS,
// read here so that a missing certificate stops the daemon at start, not at the first fill.
absl::Status ReadPeerFlags(server::PeerOptions& out) {
  out.listen = absl::GetFlag(FLAGS_peer_listen);
  out.tls = {absl::GetFlag(FLAGS_peer_tls_cert_file), absl::GetFlag(FLAGS_peer_tls_key_file),
             absl::GetFlag(FLAGS_peer_tls_ca_file), absl::GetFlag(FLAGS_peer_tls_server_name)};
  out.transfer_hold = std::chrono::seconds(absl::GetFlag(FLAGS_peer_transfer_hold_seconds));
  if (out.transfer_hold <= std::chrono::milliseconds(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--peer_transfer_hold_seconds=", absl::GetFlag(FLAGS_peer_transfer_hold_seconds),
        ": must be positive"));
  }
  if (const std::string peers = absl::GetFlag(FLAGS_peers); !peers.empty()) {
    auto list = peer::ParsePeerList(peers);
    if (!list.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--peers: ", list.status().message()));
    }
    out.peers = *std::move(list);
  }
  auto trust = server::ParsePeerTrust(absl::GetFlag(FLAGS_peer_trust));
  if (!trust.ok()) return trust.status();
  out.trust = *trust;
  out.kube.server = absl::GetFlag(FLAGS_kube_api_server);
  out.kube.token_file = absl::GetFlag(FLAGS_kube_token_file);
  out.kube.ca_file = absl::GetFlag(FLAGS_kube_ca_file);
  out.kube.namespace_file = absl::GetFlag(FLAGS_kube_namespace_file);
  auto identity = server::ParsePeerIdentity(absl::GetFlag(FLAGS_peer_identity),
                                            nodeid::InClusterCredentialsPresent(out.kube));
  if (!identity.ok()) return identity.status();
  out.identity = *identity;
  // The Downward API's values, by flag or by the chart's environment.
  auto flag_or_env = [](const std::string& v, const char* env) {
    const char* e = std::getenv(env);
    return v.empty() && e != nullptr ? std::string(e) : v;
  };
  out.node_name = flag_or_env(absl::GetFlag(FLAGS_node_name), "NODE_NAME");
  out.pod = {flag_or_env(absl::GetFlag(FLAGS_pod_name), "POD_NAME"),
             flag_or_env(absl::GetFlag(FLAGS_pod_uid), "POD_UID")};
  if (out.identity == server::PeerIdentity::kToken && !out.peers.empty()) {
    if (absl::Status n = nodeid::CheckNodeName(out.node_name, "--node_name"); !n.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(n.message(), " (--peer_identity=token: the Downward API's spec.nodeName)"));
    }
  }
  for (const auto& [flag, value] :
       {std::pair{"--peer_describe_timeout_ms", absl::GetFlag(FLAGS_peer_describe_timeout_ms)},
        std::pair{"--peer_pull_timeout_seconds", absl::GetFlag(FLAGS_peer_pull_timeout_seconds)},
        std::pair{"--peer_max_connections", absl::GetFlag(FLAGS_peer_max_connections)},
        std::pair{"--peer_max_connections_per_address",
                  absl::GetFlag(FLAGS_peer_max_connections_per_address)},
        std::pair{"--peer_handshake_timeout_ms", absl::GetFlag(FLAGS_peer_handshake_timeout_ms)}}) {
    if (value <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(flag, "=", value, ": must be positive"));
    }
  }
  out.max_connections = static_cast<size_t>(absl::GetFlag(FLAGS_peer_max_connections));
  out.max_connections_per_address =
      static_cast<size_t>(absl::GetFlag(FLAGS_peer_max_connections_per_address));
  out.handshake_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_peer_handshake_timeout_ms));
  out.describe_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_peer_describe_timeout_ms));
  out.pull_timeout = std::chrono::seconds(absl::GetFlag(FLAGS_peer_pull_timeout_seconds));
  if (!out.listen.empty() || !out.peers.empty()) {
    if (auto tls = peer::ReadTls(out.tls); !tls.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(out.listen.empty() ? "--peers" : "--peer_listen=" + out.listen, ": ",
                       tls.status().message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace weightcache
