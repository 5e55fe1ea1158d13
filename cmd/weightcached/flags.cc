// weightcached's flags: their definitions, and the daemon's options, backend and memory
// budget read from them (flags.h). Every check names the flag it refuses.
#include "cmd/weightcached/flags.h"

#include <prometheus/registry.h>
#include <signal.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cmd/weightcached/peer_flags.h"
#include "pkg/kube/device_plugin.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/metrics/http_server.h"
#include "pkg/metrics/metrics.h"
#include "pkg/server/daemon.h"
#include "pkg/spec/spec.h"
#include "pkg/util/flags_help.h"
#include "pkg/util/log.h"
#include "pkg/util/rlimit.h"
#include "pkg/util/size_flag.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/version.h"

ABSL_FLAG(std::string, socket_dir, weightcache::server::kDefaultSocketDir,
          "Directory for control.sock and handle.sock: created 0750 when missing; an existing "
          "one is used as it is when safe (owned by this uid or root, not writable by others "
          "unless sticky; docs/security.md, \"Paths\"), never chmod'ed");
ABSL_FLAG(std::vector<std::string>, spec_file, {},
          "Model spec files (YAML/JSON) to know and preload, comma-separated");
ABSL_FLAG(std::string, model, "",
          "One model spec in flag form, e.g. name=llama,model_dir=/models/llama");
ABSL_FLAG(bool, preload, true, "Load every known model at start");
ABSL_FLAG(std::string, backend, "auto", "Memory backend: auto | host | cuda");
ABSL_FLAG(std::string, memory_budget, "0",
          "Most bytes the cache may hold per device, e.g. 120GiB, or a share of the smallest "
          "device's memory, e.g. 80%; 0 means unlimited");
ABSL_FLAG(std::vector<std::string>, allowed_uids, {},
          "Uids allowed to connect to the control and handle sockets; empty: anyone who can "
          "reach the sockets");
ABSL_FLAG(std::string, admin_socket_dir, "",
          "Directory of the admin socket (created 0700 when missing, used as it is when safe; "
          "control.sock in it): every peer there "
          "is admin and publisher. Never a directory engine pods mount. Default: "
          "<socket_dir>-admin; none: no admin socket");
ABSL_FLAG(std::vector<std::string>, admin_uids, {},
          "Admin uids on the engine socket: may define inline specs, evict, and end other "
          "peers' leases. Default: nobody (use the admin socket)");
ABSL_FLAG(std::vector<std::string>, admin_gids, {}, "Admin gids (see --admin_uids)");
ABSL_FLAG(std::vector<std::string>, publish_uids, {},
          "Uids that may publish weights they processed themselves (BeginPublish) on the "
          "engine socket. Default: nobody (the admin socket may)");
ABSL_FLAG(std::vector<std::string>, publish_gids, {},
          "Gids that may publish (a peer's primary gid; see --publish_uids)");
ABSL_FLAG(std::vector<std::string>, publish_namespaces, {},
          "With --namespace_rules: pods of these namespaces may publish through their slot "
          "socket. Default: none");
ABSL_FLAG(std::vector<std::string>, model_roots, {},
          "Directories model_dir must resolve under (symlinks followed), comma-separated, each "
          "absolute and existing at start; empty: anywhere");
ABSL_FLAG(double, refresh_interval, 10,
          "Seconds: a non-admin Load re-reads a model's files (and hashes what changed) at "
          "most this often; in between it loads the identity read last. Admins: every Load");
ABSL_FLAG(int, max_connections, 2048, "Control connections open at once; more are closed");
ABSL_FLAG(int, max_connections_per_pod, 256,
          "Control connections per tenant unit: the peer's pod (from its cgroup; needs "
          "hostPID), its slot socket, or outside Kubernetes the process; past it that unit's "
          "requests are answered RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_handle_connections, 4096,
          "Handle-channel connections open at once (leases included); more are answered "
          "RESOURCE_EXHAUSTED and closed");
ABSL_FLAG(int, max_connections_unresolved, 16,
          "Control (and, alike, handle) connections that all peers the daemon cannot tell by "
          "pod or process share (gone or a zombie at accept, or a pid not visible without "
          "hostPID); smaller than --max_connections_per_pod");
ABSL_FLAG(int, socket_gid, -1,
          "Group id given the sockets (0660) and a socket dir the daemon creates (0750), so "
          "engines running as other uids in that group can connect (an existing dir must let "
          "them search it); -1 keeps the daemon's group");
ABSL_FLAG(std::string, metrics_address, weightcache::metrics::HttpServer::kDefaultAddress,
          "Address of /metrics, /healthz, /readyz (IPv4:port or [IPv6]:port; 'off' disables)");
ABSL_FLAG(int, read_threads, 16, "Parallel preads per load");
ABSL_FLAG(std::string, artifact_budget, "1GiB",
          "Host memory for compile artifacts (torch.compile caches, JIT cache directories) "
          "that engines put and get; least recently used ones are dropped past it. 0: none");
ABSL_FLAG(std::string, artifact_max_bytes, "512MiB", "Largest single compile artifact");
ABSL_FLAG(std::string, artifact_dir, "",
          "Directory (made 0700) where compile artifacts are also written, so they survive "
          "a restart or a reboot; read back and checked against their SHA-256 when asked "
          "for. Empty: memory only");
ABSL_FLAG(std::string, artifact_dir_budget, "10GiB",
          "Bytes of compile artifacts --artifact_dir may hold; past it the least recently "
          "used are removed from it (memory keeps what it holds). 0: no limit");
ABSL_FLAG(int, artifact_max_puts, 8,
          "Compile-artifact puts in progress at once, in all (each holds a gRPC thread and "
          "reserves its declared size of --artifact_budget while it runs); more are answered "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int, artifact_max_puts_per_unit, 2,
          "Compile-artifact puts one pod (or slot, or process outside Kubernetes) may have in "
          "progress at once; each reserves its declared size of --artifact_budget while it runs");
ABSL_FLAG(std::string, artifact_reserve_per_unit, "",
          "Bytes of --artifact_budget one pod's (or slot's, or process's) compile-artifact "
          "puts in flight may reserve at once; all pods' together at most the budget less one "
          "such share, kept for the admin's puts (which are not counted). At most half the "
          "budget; empty or 0: a quarter of it");
ABSL_FLAG(std::string, staging_keep, "256MiB",
          "GPU loads: page-locked staging memory kept pinned between loads (one 256 MiB ring; "
          "saves pinning it again, ~0.1 s per load); 0 frees it after every load");
ABSL_FLAG(bool, device_plugin, false, "Register a kubelet device plugin for the socket dir");
ABSL_FLAG(std::string, kubelet_dir, "/var/lib/kubelet/device-plugins",
          "Kubelet device-plugins directory (holds kubelet.sock)");
ABSL_FLAG(int, device_plugin_slots, 64, "How many engine pods may hold the resource at once");
ABSL_FLAG(std::string, device_plugin_resource, "weightcache.io/client", "Resource name");
ABSL_FLAG(std::string, csi_endpoint, "",
          "Serve the CSI node plugin (driver csi.weightcache.io) on this Unix socket: an engine "
          "pod's inline volume of the driver gets the pod's own control and handle sockets, and "
          "every connection on them is that pod's, as the kubelet named it (no hostPID needed; "
          "docs/kubernetes.md). Empty: off");
ABSL_FLAG(std::string, csi_registration_dir, "/var/lib/kubelet/plugins_registry",
          "With --csi_endpoint: the kubelet's plugin registration directory, where the driver's "
          "registration socket goes; none: do not register");
ABSL_FLAG(std::string, csi_pods_dir, "/var/lib/kubelet/pods",
          "With --csi_endpoint: the kubelet's pods directory; a volume's target path must lie "
          "under it");
ABSL_FLAG(std::string, pod_volumes_file, "",
          "With --csi_endpoint: where the published pod volumes are recorded, so a restart serves "
          "their sockets again; empty: <socket_dir>-state/pod-volumes.json");
ABSL_FLAG(std::string, node_name, "",
          "This node's name (the CSI plugin's node id, and with --peer_identity=token the node "
          "that peers' tokens must be made for: spec.nodeName); empty: $NODE_NAME, else (the "
          "CSI plugin only) the host name");
ABSL_FLAG(std::string, container_socket_dir, "",
          "Where the socket dir appears in engine containers (default: the same path)");
ABSL_FLAG(bool, namespace_rules, false,
          "Enforce the models' allowed_namespaces: serve one socket dir per device-plugin slot "
          "(<socket_dir>/slots/weightcache-<i>/, --device_plugin_slots of them; with "
          "--device_plugin, Allocate mounts the slot's dir) and ask the kubelet's PodResources "
          "API which pod holds a connection's slot. Restricted models are refused when the pod "
          "cannot be identified, and on the shared socket to all but admin peers "
          "(docs/security.md)");
ABSL_FLAG(std::string, pod_resources_socket, "/var/lib/kubelet/pod-resources/kubelet.sock",
          "The kubelet's PodResources API socket (--namespace_rules)");
ABSL_FLAG(double, pod_resources_cache, 2,
          "Seconds a PodResources answer is reused for connections accepted before it was "
          "asked (--namespace_rules); a connection made later always asks afresh; 0: never reused");
ABSL_FLAG(std::string, peer_policy, "copy",
          "When an engine asks for a model-rank cached on another GPU of this node: copy "
          "(GPU peer copy into a new entry on the engine's GPU, host-staged when P2P is "
          "impossible) | host (always staged through pinned host memory) | miss (NOT_FOUND)");
ABSL_FLAG(std::vector<std::string>, host_devices, {},
          "Host backend only: names of fake devices to place segments on (e.g. "
          "host-a,host-b), to rehearse multi-GPU placement and peer copies without a GPU; "
          "default one device, 'host'");
ABSL_FLAG(std::string, host_max_segment_bytes, "1GiB",
          "Host backend only: the largest segment a model-rank is placed in (e.g. 1GiB, 4MiB). "
          "A rank of several segments is pulled by peer fill over several holders at once "
          "(striped), and segment sizes are part of what a peer's copy must match");
ABSL_FLAG(std::string, digest_store, "",
          "File remembering the content digest of each checkpoint file version, so a restart "
          "does not hash the files again (default <socket_dir>-state/digests.json, in a 0700 "
          "dir beside the socket dir, never in it: engines mount that one; 'none' keeps "
          "digests in memory only)");
ABSL_FLAG(double, shutdown_timeout, 10,
          "Seconds from SIGTERM/SIGINT to exit, at most: loads and waits are cancelled at once, "
          "RPCs in flight get min(1 s, a quarter of it) to finish; past it the process exits "
          "anyway (0), removing its sockets. Engines keep what they mapped");
ABSL_FLAG(std::string, keeper_socket, "/run/weightcache-keeper/keeper.sock",
          "weightcache-keeper's socket: ready entries are deposited there and adopted back at "
          "start, so the cache outlives a daemon crash or upgrade; 'off': no keeper");
ABSL_FLAG(int, keeper_uid, -1,
          "The uid weightcache-keeper runs as: a process of another uid serving --keeper_socket "
          "is refused (nothing deposited or adopted); -1: the daemon's own uid");
ABSL_FLAG(double, keeper_timeout, 5,
          "Seconds one message to the keeper may take (connect, greeting, each reply) before the "
          "daemon gives that connection up and connects again; clients never wait on it");
ABSL_FLAG(double, scrub_interval, 30,
          "Integrity: seconds between the starts of scrub passes, each digesting every resident "
          "entry again and comparing it with its digest from when it was filled (a change marks "
          "it corrupt and loads a clean copy); 0: no scrubbing");
ABSL_FLAG(std::string, scrub_bandwidth, "50GB",
          "Integrity: bytes per second a scrub pass may read (e.g. 50GB, 500MiB; 0: unthrottled). "
          "At 50GB a bandwidth-bound kernel beside it on an H200 slowed by 0.06 %");
ABSL_FLAG(double, corrupt_reload_interval, 600,
          "Integrity: seconds within which an entry found corrupt again is not reloaded (its "
          "reload could evict other tenants' entries each time; Status and the log say so); "
          "0: every finding reloads");
ABSL_FLAG(bool, verbose, false, "Debug logging");

namespace weightcache {
namespace {

// Where the daemon serves and keeps its state, and what it does at start.
void ReadPathFlags(server::DaemonOptions& opts) {
  opts.socket_dir = absl::GetFlag(FLAGS_socket_dir);
  opts.digest_store = absl::GetFlag(FLAGS_digest_store);
  // Daemon state lives beside the engines' socket directory, never in it (they mount it).
  std::string beside = opts.socket_dir;
  while (beside.size() > 1 && beside.back() == '/') beside.pop_back();
  if (opts.digest_store.empty()) opts.digest_store = beside + "-state/digests.json";
  if (opts.digest_store == "none") opts.digest_store.clear();
  opts.admin_socket_dir = absl::GetFlag(FLAGS_admin_socket_dir);
  if (opts.admin_socket_dir.empty()) opts.admin_socket_dir = beside + "-admin";
  if (opts.admin_socket_dir == "none") opts.admin_socket_dir.clear();
  if (!absl::GetFlag(FLAGS_csi_endpoint).empty()) {
    opts.pod_volumes_file = absl::GetFlag(FLAGS_pod_volumes_file);
    if (opts.pod_volumes_file.empty()) opts.pod_volumes_file = beside + "-state/pod-volumes.json";
  }
  opts.publish_namespaces = absl::GetFlag(FLAGS_publish_namespaces);
  opts.preload = absl::GetFlag(FLAGS_preload);
  opts.keeper_socket = absl::GetFlag(FLAGS_keeper_socket);
  if (opts.keeper_socket == "off") opts.keeper_socket.clear();
}

// Values that make no sense stop the daemon naming the flag, rather than being bent into
// something else (issue 26: -7 as a gid, 0 read threads, a device named twice).
absl::Status ReadCountFlags(server::DaemonOptions& opts) {
  opts.socket_gid = absl::GetFlag(FLAGS_socket_gid);
  if (opts.socket_gid < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--socket_gid: ", opts.socket_gid, " is not a group id (-1 keeps the daemon's group)"));
  }
  if (const int t = absl::GetFlag(FLAGS_read_threads); t < 1 || t > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("--read_threads: ", t, " is not in [1, 1024]"));
  }
  opts.read_threads = static_cast<unsigned>(absl::GetFlag(FLAGS_read_threads));
  if (const int n = absl::GetFlag(FLAGS_device_plugin_slots); n < 1 || n > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device_plugin_slots: ", n, " is not in [1, 100000]"));
  }
  std::set<std::string> seen;
  for (const auto& d : absl::GetFlag(FLAGS_host_devices)) {
    if (d.empty() || !seen.insert(d).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--host_devices: '", d, "' is ", d.empty() ? "empty" : "named twice"));
    }
  }
  return absl::OkStatus();
}

// The models the daemon knows (--spec_file, --model) and the sizes of what it keeps besides
// them (staging memory, compile artifacts).
absl::Status ReadModelFlags(server::DaemonOptions& opts) {
  for (const auto& f : absl::GetFlag(FLAGS_spec_file)) {
    WC_ASSIGN_OR_RETURN(auto specs, spec::LoadSpecFile(f));
    opts.specs.insert(opts.specs.end(), specs.begin(), specs.end());
  }
  if (!absl::GetFlag(FLAGS_model).empty()) {
    WC_ASSIGN_OR_RETURN(auto s, spec::ParseSpecFlag(absl::GetFlag(FLAGS_model)));
    opts.specs.push_back(s);
  }
  WC_ASSIGN_OR_RETURN(opts.staging_keep_bytes,
                      ParseByteSize(absl::GetFlag(FLAGS_staging_keep), "--staging_keep"));
  WC_ASSIGN_OR_RETURN(opts.artifact_budget_bytes,
                      ParseByteSize(absl::GetFlag(FLAGS_artifact_budget), "--artifact_budget"));
  WC_ASSIGN_OR_RETURN(
      opts.artifact_max_bytes,
      ParseByteSize(absl::GetFlag(FLAGS_artifact_max_bytes), "--artifact_max_bytes"));
  if (const std::string share = absl::GetFlag(FLAGS_artifact_reserve_per_unit); !share.empty()) {
    WC_ASSIGN_OR_RETURN(opts.artifact_reserve_per_unit_bytes,
                        ParseByteSize(share, "--artifact_reserve_per_unit"));
  }
  opts.artifact_dir = absl::GetFlag(FLAGS_artifact_dir);
  WC_ASSIGN_OR_RETURN(
      opts.artifact_dir_budget_bytes,
      ParseByteSize(absl::GetFlag(FLAGS_artifact_dir_budget), "--artifact_dir_budget"));
  for (const auto& [flag, value, out] :
       {std::tuple{"--artifact_max_puts", absl::GetFlag(FLAGS_artifact_max_puts),
                   &opts.artifact_max_puts},
        std::tuple{"--artifact_max_puts_per_unit", absl::GetFlag(FLAGS_artifact_max_puts_per_unit),
                   &opts.artifact_max_puts_per_unit}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " must be at least 1, got ", value));
    }
    *out = static_cast<size_t>(value);
  }
  return absl::OkStatus();
}

// Who may connect and in which role, where models may live, and how much one peer may ask.
absl::Status ReadAccessFlags(server::DaemonOptions& opts) {
  for (const auto& [flag, ids, out] :
       {std::tuple{"--allowed_uids", absl::GetFlag(FLAGS_allowed_uids), &opts.allowed_uids},
        std::tuple{"--admin_uids", absl::GetFlag(FLAGS_admin_uids), &opts.admin_uids},
        std::tuple{"--admin_gids", absl::GetFlag(FLAGS_admin_gids), &opts.admin_gids},
        std::tuple{"--publish_uids", absl::GetFlag(FLAGS_publish_uids), &opts.publish_uids},
        std::tuple{"--publish_gids", absl::GetFlag(FLAGS_publish_gids), &opts.publish_gids}}) {
    for (const auto& u : ids) {
      uint32_t id;
      if (!absl::SimpleAtoi(u, &id)) {
        return absl::InvalidArgumentError(std::string(flag) + ": '" + u.substr(0, 64) +
                                          "' is not a number");
      }
      out->push_back(id);
    }
  }
  opts.model_roots = absl::GetFlag(FLAGS_model_roots);
  if (const double r = absl::GetFlag(FLAGS_refresh_interval); !(r >= 0 && r <= 86400)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--refresh_interval: ", r, " is not in [0, 86400] seconds"));
  }
  opts.refresh_interval =
      std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_refresh_interval) * 1000));
  if (absl::GetFlag(FLAGS_max_connections) < 1 ||
      absl::GetFlag(FLAGS_max_connections_per_pod) < 1 ||
      absl::GetFlag(FLAGS_max_connections_unresolved) < 1 ||
      absl::GetFlag(FLAGS_max_handle_connections) < 1) {
    return absl::InvalidArgumentError(
        "--max_connections, --max_connections_per_pod, --max_connections_unresolved and "
        "--max_handle_connections must be at least 1");
  }
  opts.max_handle_connections = static_cast<size_t>(absl::GetFlag(FLAGS_max_handle_connections));
  opts.max_connections_unresolved =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_connections_unresolved));
  opts.max_connections = static_cast<size_t>(absl::GetFlag(FLAGS_max_connections));
  opts.max_connections_per_pod = static_cast<size_t>(absl::GetFlag(FLAGS_max_connections_per_pod));
  if (const int k = absl::GetFlag(FLAGS_keeper_uid); k < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keeper_uid: ", k, " is not a uid (-1: the daemon's own)"));
  } else if (k >= 0) {
    opts.keeper_uid = static_cast<uid_t>(k);
  }
  return absl::OkStatus();
}

// How long shutting down, the keeper's messages and integrity scrubbing may take. Returns
// --shutdown_timeout in seconds: the signal thread's watchdog needs it too.
absl::StatusOr<double> ReadTimingFlags(server::DaemonOptions& opts) {
  const double shutdown_timeout = absl::GetFlag(FLAGS_shutdown_timeout);
  if (!(shutdown_timeout > 0 && shutdown_timeout <= 3600)) {
    return absl::InvalidArgumentError("--shutdown_timeout: must be in (0, 3600] seconds");
  }
  // Loads and waits are cancelled first, so the RPCs left are short ones: 1 s is plenty, and
  // it also bounds how long gRPC waits for idle client connections to go (clients with no call
  // in flight notice the server's GOAWAY only at their next poll, up to 5 s later).
  opts.shutdown_grace =
      std::chrono::milliseconds(static_cast<int64_t>(std::min(1000.0, shutdown_timeout * 250)));
  // A daemon that owns the keeper and is exiting lets go within its own --shutdown_timeout
  // (the same flag, the same value across a DaemonSet's pods).
  opts.keeper_claim_wait = std::chrono::milliseconds(static_cast<int64_t>(shutdown_timeout * 1000));
  const double keeper_timeout = absl::GetFlag(FLAGS_keeper_timeout);
  if (!(keeper_timeout >= 0.01 && keeper_timeout <= 3600)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keeper_timeout: ", keeper_timeout, " is not in [0.01, 3600] seconds"));
  }
  opts.keeper_timeout = std::chrono::milliseconds(static_cast<int64_t>(keeper_timeout * 1000));
  const double scrub_interval = absl::GetFlag(FLAGS_scrub_interval);
  if (!(scrub_interval == 0 || (scrub_interval >= 0.05 && scrub_interval <= 86400))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--scrub_interval: ", scrub_interval, " is neither 0 (off) nor in [0.05, 86400] seconds"));
  }
  opts.scrub_interval = std::chrono::milliseconds(static_cast<int64_t>(scrub_interval * 1000));
  WC_ASSIGN_OR_RETURN(const uint64_t scrub_bandwidth,
                      ParseByteSize(absl::GetFlag(FLAGS_scrub_bandwidth), "--scrub_bandwidth"));
  opts.scrub_bytes_per_second = static_cast<double>(scrub_bandwidth);
  const double reload_interval = absl::GetFlag(FLAGS_corrupt_reload_interval);
  if (!(reload_interval >= 0 && reload_interval <= 7 * 86400)) {
    return absl::InvalidArgumentError(absl::StrCat("--corrupt_reload_interval: ", reload_interval,
                                                   " is not in [0, 604800] seconds"));
  }
  opts.corrupt_reload_interval =
      std::chrono::milliseconds(static_cast<int64_t>(reload_interval * 1000));
  return shutdown_timeout;
}

// Per-model namespace rules (--namespace_rules): one socket dir per device-plugin slot, and
// the kubelet's PodResources API to say which pod holds a slot.
// Read (and checked, by CheckOptions) whether or not the rules are on: a mistyped value is
// refused before it matters. --container_socket_dir serves the device plugin too.
absl::Status ReadNamespaceRuleFlags(server::NamespaceRulesOptions& nr) {
  nr.container_socket_dir = absl::GetFlag(FLAGS_container_socket_dir);
  const double cache = absl::GetFlag(FLAGS_pod_resources_cache);
  if (!(std::abs(cache) <= 1e9)) {  // NaN too; the range is CheckOptions'
    return absl::InvalidArgumentError(
        absl::StrCat("--pod_resources_cache=", cache, ": not a number of seconds"));
  }
  nr.cache_ttl = std::chrono::milliseconds(static_cast<int64_t>(cache * 1000));
  if (!absl::GetFlag(FLAGS_namespace_rules)) return absl::OkStatus();
  nr.enabled = true;
  nr.slots = absl::GetFlag(FLAGS_device_plugin_slots);
  nr.resource_name = absl::GetFlag(FLAGS_device_plugin_resource);
  nr.pod_resources_socket = absl::GetFlag(FLAGS_pod_resources_socket);
  if (nr.slots < 1 || nr.slots > 100000) {
    return absl::InvalidArgumentError(
        "--device_plugin_slots: must be in [1, 100000] (one socket dir per slot with "
        "--namespace_rules)");
  }
  if (!absl::GetFlag(FLAGS_device_plugin)) {
    WC_LOG_WARN(
        "--namespace_rules without --device_plugin: slot sockets are served, but nothing "
        "here gives pods a slot");
  }
  return absl::OkStatus();
}

// What Run builds from the flags before any backend exists.

}  // namespace

// The daemon's options from the flags, in the order the flags were always checked in: an
// error names the first bad flag.
absl::StatusOr<Options> OptionsFromFlags() {
  Options o;
  ReadPathFlags(o.daemon);
  WC_RETURN_IF_ERROR(ReadCountFlags(o.daemon));
  WC_RETURN_IF_ERROR(ReadModelFlags(o.daemon));
  WC_RETURN_IF_ERROR(ReadPeerFlags(o.daemon.peer));
  WC_RETURN_IF_ERROR(ReadAccessFlags(o.daemon));
  // Descriptors are the daemon's working material (a connection, a lease's segments, a
  // checkpoint file each, adopted entries): the soft limit goes up to the hard one. (Between
  // the checks, as always: its log line comes before the later flags' errors.)
  RaiseOpenFileLimit();
  WC_ASSIGN_OR_RETURN(o.shutdown_timeout, ReadTimingFlags(o.daemon));
  WC_RETURN_IF_ERROR(ReadNamespaceRuleFlags(o.daemon.namespace_rules));
  WC_ASSIGN_OR_RETURN(o.daemon.peer_policy,
                      server::ParsePeerPolicy(absl::GetFlag(FLAGS_peer_policy)));
  WC_RETURN_IF_ERROR(server::CheckOptions(o.daemon));
  return o;
}

// The memory backend --backend names. The host backend's own flags (--host_devices,
// --host_max_segment_bytes) need --backend=host rather than being ignored.
absl::StatusOr<std::unique_ptr<memory::Backend>> BackendFromFlags() {
  const std::string host_segment = absl::GetFlag(FLAGS_host_max_segment_bytes);
  WC_ASSIGN_OR_RETURN(const uint64_t host_segment_bytes,
                      ParseByteSize(host_segment, "--host_max_segment_bytes"));
  if (host_segment_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--host_max_segment_bytes=", host_segment,
                                                   ": a segment holds at least 4096 bytes"));
  }
  const bool host_options =
      !absl::GetFlag(FLAGS_host_devices).empty() || host_segment_bytes != (1ull << 30);
  if (!host_options) return memory::MakeBackend(absl::GetFlag(FLAGS_backend));
  if (absl::GetFlag(FLAGS_backend) != "host") {
    return absl::InvalidArgumentError(
        "--host_devices and --host_max_segment_bytes need --backend=host");
  }
  memory::HostBackendOptions ho;
  if (!absl::GetFlag(FLAGS_host_devices).empty())
    ho.device_uuids = absl::GetFlag(FLAGS_host_devices);
  ho.max_segment_bytes = host_segment_bytes;
  return memory::MakeHostBackend(ho);
}

// --memory_budget, which may be a share of the smallest device's memory: known only once the
// backend has found its devices.
absl::Status SetMemoryBudget(const memory::Backend& backend, server::DaemonOptions& opts) {
  uint64_t smallest = 0;
  for (const auto& d : backend.Devices()) {
    if (smallest == 0 || d.total_bytes < smallest) smallest = d.total_bytes;
  }
  WC_ASSIGN_OR_RETURN(
      opts.memory_budget_bytes,
      ParseByteSizeOrShare(absl::GetFlag(FLAGS_memory_budget), smallest, "--memory_budget"));
  if (absl::GetFlag(FLAGS_memory_budget).find('%') != std::string::npos) {
    WC_LOG_INFO("memory budget %s: %s per device (of %s)", absl::GetFlag(FLAGS_memory_budget),
                FormatBytes(opts.memory_budget_bytes), FormatBytes(smallest));
  }
  return absl::OkStatus();
}

}  // namespace weightcache
