// The daemon's vocabulary: its options, socket names and placement rule. The core's parts
// (admission, publishing) and the daemon that assembles them depend on this header, not on
// each other's, so arrows run one way; the subfolders (wire/, policy/, ...) never include it.
//
// Thread-safety: plain values. Lifetimes: DaemonOptions' pointers (metrics)
// outlive the daemon built from them.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/memory/backend.h"
#include "pkg/nodeid/kube_api.h"
#include "pkg/nodeid/service_account_token.h"
#include "pkg/peer/peer_set.h"
#include "pkg/peer/tls.h"
#include "pkg/server/peer/fill_anchor.h"
#include "pkg/server/policy/namespace_rules_options.h"
#include "pkg/spec/spec.h"

namespace weightcache::metrics {
class Metrics;
}  // namespace weightcache::metrics

namespace weightcache::server {

inline constexpr const char* kDefaultSocketDir = "/run/weightcache";
inline constexpr const char* kControlSocketName = "control.sock";
inline constexpr const char* kHandleSocketName = "handle.sock";

// What Acquire does when the asked device does not hold the model-rank but another device
// of this daemon does (--peer_policy):
//   copy: device-to-device copy into a new entry on the asked device (GPU peer access;
//         host-staged when the GPUs cannot reach each other);
//   host: the same, always staged through pinned host memory;
//   miss: NOT_FOUND naming the device that holds it.
enum class PeerPolicy { kCopy, kHost, kMiss };
const char* PeerPolicyName(PeerPolicy p);
absl::StatusOr<PeerPolicy> ParsePeerPolicy(const std::string& name);

// Placement: the device of `rank` when nothing names one (preloads, Load without
// env.device_uuid): the (rank mod n)-th of the backend's devices, in ordinal order, so a
// tp_size N model on an N-GPU node gets one rank per GPU. Empty when there is no device.
std::string DefaultDeviceForRank(const std::vector<memory::DeviceInfo>& devices, int rank);

// The peer API for other nodes' daemons (issue 30, docs/peer-fill.md): gRPC on TCP with
// mutual TLS. Off unless `listen` is set.
struct PeerOptions {
  std::string listen;  // "host:port" ("0.0.0.0:7443"; port 0: any free one, Daemon::peer_port)
  peer::TlsFiles tls;
  // How long a Describe that asks for a transfer keeps the segments exposed (and the
  // content alive); each such Describe renews it. A pull longer than this asks again.
  std::chrono::milliseconds transfer_hold{120000};
  // The port in front of gRPC (issue 47; pkg/server/wire/peer_port.h): connections open at
  // once in all and per source address (a daemon keeps one to each peer it asks, so a fleet
  // of hundreds of nodes needs hundreds), and how long one may take to complete its TLS
  // handshake (also gRPC's own handshake timeout).
  size_t max_connections = 1024;
  size_t max_connections_per_address = 16;
  std::chrono::milliseconds handshake_timeout{10000};
  // Peer fill (issue 30): the other nodes' daemons to ask before a load reads from disk
  // (`--peers`; a name stands for every address it resolves to). Empty: no peer fill. Uses
  // `tls` as a client; this daemon's own peer port is left out of the list.
  std::vector<peer::PeerName> peers;
  std::chrono::milliseconds describe_timeout{2000};  // each peer's answer to the survey
  std::chrono::milliseconds pull_timeout{300000};    // each segment's pull (up to 1 GiB)
  // Which holders a fill may believe without the spec's pinned segment digests (issue 48,
  // pkg/server/peer/fill_anchor.h): two with distinct certificate names that agree
  // (quorum), or any one (single: trusting every node holding the fleet's certificate).
  PeerTrust trust = PeerTrust::kQuorum;
  // What a holder's identity is (issue 57, fill_anchor.h): with kToken this daemon presents,
  // when asked, a token the API server signs for its pod (`pod`, through `kube`), and counts
  // only holders whose tokens prove their nodes; `node_name` is this daemon's node (the
  // tokens others present to it are made for it). kCertificate: certificate names, as before
  // (the flags' "auto" picks token in a pod).
  PeerIdentity identity = PeerIdentity::kCertificate;
  nodeid::KubeApiOptions kube;
  std::string node_name;
  nodeid::PodRef pod;
};

struct DaemonOptions {
  std::string socket_dir = kDefaultSocketDir;
  std::vector<spec::ModelSpec> specs;  // known models; preloaded when `preload`
  bool preload = true;
  uint64_t memory_budget_bytes = 0;  // 0: unlimited
  // Content digests per checkpoint file version (pkg/identity), persisted here so a restart
  // does not hash again; its directory is created 0700. Empty: memory only.
  std::string digest_store;
  // The pods' own sockets published through the CSI plugin (wire/pod_volumes.h), recorded
  // here so a restart serves them again. Empty: not recorded.
  std::string pod_volumes_file;
  // Compile artifacts (issue 29, pkg/artifact): host memory for all of them, one blob's
  // limit, and the optional write-through directory (created 0700) that keeps them across
  // restarts and reboots.
  uint64_t artifact_budget_bytes = 1ull << 30;
  uint64_t artifact_max_bytes = 512ull << 20;
  std::string artifact_dir;
  uint64_t artifact_dir_budget_bytes = 0;  // the directory's blobs (LRU past it); 0: no limit
  // A put is a client stream that holds a gRPC thread, and a reservation of its declared
  // size in the budget, while it runs: at most this many at once (--artifact_max_puts) and
  // `artifact_max_puts_per_unit` per tenant unit (more: RESOURCE_EXHAUSTED at once), each
  // ended when fewer than 64 KiB came in `artifact_put_idle` or it takes longer than
  // `artifact_put_total` in all (publish/put_watch.h).
  size_t artifact_max_puts = 8;
  size_t artifact_max_puts_per_unit = 2;
  // Bytes of the budget one tenant unit's puts in flight may reserve at once
  // (--artifact_reserve_per_unit); all units' together at most the budget less one such
  // share, which the admin's puts (not counted) always find free. 0: a quarter of the budget
  // (ArtifactReservePerUnit).
  uint64_t artifact_reserve_per_unit_bytes = 0;
  std::chrono::milliseconds artifact_put_idle{10000};
  std::chrono::milliseconds artifact_put_total{300000};
  // Who may connect (control and handle sockets, SO_PEERCRED); empty: anyone who can reach
  // the sockets (their modes and --socket_gid decide).
  std::vector<uid_t> allowed_uids;
  // Roles are granted, never implied (policy.h has the table). Admin: define inline specs,
  // evict, end other peers' leases; publisher: BeginPublish. Engines (any allowed peer)
  // acquire, release their own leases, load known specs and read status.
  // The admin socket's directory (created 0700 when missing, else used as it is when
  // PrepareSocketDir accepts it; control.sock in it): every peer there is
  // admin and publisher. It must be a directory that no engine pod mounts. Empty: none.
  std::string admin_socket_dir;
  // On the engine socket (<socket_dir>/control.sock) only: admins and publishers by uid or
  // primary gid. All empty: nobody (the daemon's own uid and root included).
  std::vector<uid_t> admin_uids;
  std::vector<gid_t> admin_gids;
  std::vector<uid_t> publish_uids;
  std::vector<gid_t> publish_gids;
  // Namespace rules on: pods of these namespaces may publish through their slot socket.
  std::vector<std::string> publish_namespaces;
  // Model directories must resolve (symlinks followed) under one of these; empty: anywhere.
  std::vector<std::string> model_roots;
  // Control connections open at once, in all and per peer uid (see ControlListener).
  size_t max_connections = 2048;
  size_t max_connections_per_pod = 256;
  // The one unit every unresolved peer shares (pkg/tenant: gone, a zombie or its pid not
  // visible at accept) is capped at this on the control socket and the handle channel alike.
  size_t max_connections_unresolved = 16;
  // Handle-channel connections open at once (HandleChannel::Options::max_connections).
  size_t max_handle_connections = 4096;
  // Memory gRPC may use for the control plane (requests, streams, buffers) and its threads.
  uint64_t grpc_memory_bytes = 256ull << 20;
  int grpc_max_threads = 128;
  // >= 0: group of the sockets and of the socket dir when the daemon creates it (engines'
  // group); an existing dir is never chown'ed and must let this group search it.
  int socket_gid = -1;
  std::chrono::seconds token_ttl{10};      // an unclaimed token ends its lease after this
  std::chrono::seconds acquire_wait{600};  // wait_ready / load_on_miss bound
  // A non-admin Load re-reads a model's files at most this often (admins: every Load).
  std::chrono::milliseconds refresh_interval{10000};
  // Shutdown: after loads and waits are cancelled, RPCs in flight get this long to finish
  // before they are cancelled too.
  std::chrono::milliseconds shutdown_grace{1000};
  // Integrity scrubbing (docs/integrity.md): a pass over every ready entry starts every
  // scrub_interval (0: no scrubbing; digests are still taken when entries are filled and
  // VerifyResident still checks), reading at most scrub_bytes_per_second (0: unthrottled).
  // At 50 GB/s a bandwidth-bound kernel beside it on the H200 lost 0.06 % (docs/benchmarks.md).
  std::chrono::milliseconds scrub_interval{30000};
  double scrub_bytes_per_second = 50e9;
  // A clean copy of an entry found corrupt is loaded at most once per this interval per
  // entry key (issue 48): a model corrupted over and over must not evict other tenants'
  // entries for its reloads each time. 0: every finding reloads.
  std::chrono::milliseconds corrupt_reload_interval{600000};
  unsigned read_threads = 16;
  // GPU loads: page-locked staging memory kept pinned between loads (one ring: pinning it
  // again costs ~0.1 s per load, a third of a page-cache-hot 8 GiB load); 0 frees it after
  // every load.
  uint64_t staging_keep_bytes = 256ull << 20;
  PeerPolicy peer_policy = PeerPolicy::kCopy;
  // weightcache-keeper's socket: entries are deposited there once they are ready, and
  // adopted from there at start (no disk reads). Empty: no keeper.
  std::string keeper_socket;
  // At start, how long to wait for another daemon that owns the keeper to let go (an exiting
  // one does within its --shutdown_timeout).
  std::chrono::milliseconds keeper_claim_wait{10000};
  // The most one keeper message may take (connect, greeting, each reply) before the link
  // gives the connection up and connects again. Only the link's worker ever waits on it.
  std::chrono::milliseconds keeper_timeout{5000};
  // The uid the keeper must run as (checked on every connection, before anything is
  // deposited or adopted); nullopt: the daemon's own (--keeper_uid).
  std::optional<uid_t> keeper_uid;
  NamespaceRulesOptions namespace_rules;
  PeerOptions peer;
  metrics::Metrics* metrics = nullptr;  // optional
};

// What weightcached refuses at start (options_check.cc), each error naming the flag that sets
// the field and why: a model root that is relative or not an existing directory; a relative
// keeper socket, container socket dir or artifact dir; a PodResources cache time outside
// [0, 3600] s; an artifact size limit of 0 or above the artifact budget (with a budget); a
// pod's share of the artifact budget above half of it (the pods' part, the budget less one
// share, would not hold one share); fewer
// control connections in all than per pod; more artifact puts per pod than in all. Reads the
// file system (model roots) only; the first fault found is returned.
absl::Status CheckOptions(const DaemonOptions& o);

// The daemon's sockets where its options put them: <socket_dir>/control.sock and
// handle.sock; the admin socket's control.sock in admin_socket_dir ("" without one).
// Bytes of the artifact budget one tenant unit's puts may reserve: the option, or (0) a
// quarter of the budget.
inline uint64_t ArtifactReservePerUnit(const DaemonOptions& o) {
  return o.artifact_reserve_per_unit_bytes != 0 ? o.artifact_reserve_per_unit_bytes
                                                : o.artifact_budget_bytes / 4;
}

inline std::string ControlSocketPath(const DaemonOptions& o) {
  return o.socket_dir + "/" + kControlSocketName;
}
inline std::string HandleSocketPath(const DaemonOptions& o) {
  return o.socket_dir + "/" + kHandleSocketName;
}
inline std::string AdminSocketPath(const DaemonOptions& o) {
  return o.admin_socket_dir.empty() ? std::string() : o.admin_socket_dir + "/" + kControlSocketName;
}

}  // namespace weightcache::server
