// weightcache client library: connect to the node daemon, acquire a model-rank, and get
// read-only, zero-copy tensor views of the cached weights.
//
//   WC_ASSIGN_OR_RETURN(auto client, client::Client::Connect());  // $WEIGHTCACHE_SOCKET
//   client::AcquireOptions o;
//   o.model = "llama-8b";
//   WC_ASSIGN_OR_RETURN(auto lease, client->Acquire(o));
//   const client::TensorView* w = lease->Find("model.embed_tokens.weight");
//
// Policy on a miss or mismatch is the caller's: the error's code says which (NOT_FOUND a
// miss, FAILED_PRECONDITION a mismatch whose message lists every differing field,
// UNIMPLEMENTED a refused quantization), and the caller loads from disk or fails.
//
// Thread-safety: a Client may be used from several threads at once. A Lease is immutable
// except through Detach/Reattach, which one thread calls while no other thread (and no
// kernel) reads the lease's memory or its id(); its views and pointers keep their values
// exactly as long as the Lease object lives (readable while attached). Destroying
// the Lease unmaps, then closes its handle connection (which ends the lease in the daemon).
// For cuda-vmm, TensorView::data is a device pointer on device_uuid(), readable (not
// writable) by kernels in this process; read it on the host with memory::CopyToHost.
// A lease outlives the daemon: mapped memory stays readable if the daemon dies.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/memory/mapping.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/util/mutex.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::v1 {
class StatusResponse;
class LoadProgress;
class EvictResponse;
class VerifyResidentResponse;
class ArtifactKey;
class PutArtifactResponse;
class Layout;
}  // namespace weightcache::v1

namespace weightcache::client {

namespace internal {
struct Rpc;  // the gRPC channel and stub (client.cc)
}  // namespace internal

inline constexpr const char* kSocketEnv = "WEIGHTCACHE_SOCKET";
// The admin socket of a daemon with the default --socket_dir (weightcached's default
// --admin_socket_dir is <socket_dir>-admin): operators' tools use it when it is there.
inline constexpr const char* kDefaultAdminSocket = "/run/weightcache-admin/control.sock";
inline constexpr const char* kModelEnv = "WEIGHTCACHE_MODEL";
inline constexpr const char* kFingerprintEnv = "WEIGHTCACHE_FINGERPRINT";
inline constexpr const char* kDefaultControlSocket = "/run/weightcache/control.sock";

// What a lease's holder knows of the memory it maps (Lease::Watch).
enum class LeaseState {
  kClean,    // a daemon watches this memory for this lease and reported nothing
  kCorrupt,  // the daemon reported it changed after sealing: stop using it
  kUnknown,  // no daemon watches it for this process (the daemon is gone, or serves another copy)
};
const char* LeaseStateName(LeaseState s);  // "clean" | "corrupt" | "unknown"
struct LeaseWatch {
  LeaseState state = LeaseState::kClean;
  std::string message;  // corrupt: the daemon's (segment and bytes); unknown: why; clean: empty
};

struct TensorView {
  std::string name;
  safetensors::DType dtype = safetensors::DType::kU8;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements
  const void* data = nullptr;    // host pointer (host backend) or device pointer (cuda-vmm)
  uint64_t nbytes = 0;
  uint32_t segment = 0;
  uint64_t offset = 0;
};

// Published weights (Client::BeginPublish): the engine's identity and the name of its
// processing enter the fingerprint; an Acquire with the same fields maps what it published.
struct EngineIdentity {
  std::string engine;             // e.g. "sglang"
  std::string engine_version;     // e.g. "0.5.2"
  std::string framework_version;  // e.g. "torch 2.8.0+cu128"
  std::string recipe;             // the engine's name for its processing, e.g. "fp8-v3"
};

struct AcquireOptions {
  std::string model;        // spec name, or
  std::string fingerprint;  // an exact fingerprint
  int tp_size = 1;
  int tp_rank = 0;
  int pp_size = 1;
  int pp_rank = 0;
  std::string compute_capability;  // empty: the daemon's own environment
  std::string device_uuid;         // GPU the caller will use; empty for host
  std::string dtype;               // optional expectation, e.g. "bf16"
  std::string quantization;        // optional expectation: "none" | "fp8_block"
  bool wait_ready = false;         // wait for a load in progress
  bool load_on_miss = false;       // ask the daemon to load a known model on a miss
  EngineIdentity published;        // set (recipe non-empty): weights an engine published
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};

  // The target from the environment (set from the pod annotations weightcache.io/fingerprint
  // and weightcache.io/model via the Downward API, e.g. by the admission webhook):
  // $WEIGHTCACHE_FINGERPRINT when set and not empty (an exact fingerprint: a pod pinned to
  // the weights it was validated with gets a miss, never other weights), else
  // $WEIGHTCACHE_MODEL; INVALID_ARGUMENT naming both when neither is set.
  static absl::StatusOr<AcquireOptions> FromEnvironment();
};

class Lease {
 public:
  ~Lease();
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  const std::string& id() const { return id_; }
  const std::string& model() const { return model_; }
  const std::string& fingerprint() const { return fingerprint_; }
  const std::string& backend() const { return backend_; }
  const std::string& device_uuid() const { return device_uuid_; }
  // The checkpoint directory the daemon loaded from (as the daemon sees it).
  const std::string& model_dir() const { return model_dir_; }
  // The spec the daemon loaded this entry from (canonical YAML) and the rank served.
  const std::string& spec_yaml() const { return spec_yaml_; }
  int tp_size() const { return tp_size_; }
  int tp_rank() const { return tp_rank_; }
  int pp_size() const { return pp_size_; }
  int pp_rank() const { return pp_rank_; }
  uint64_t total_bytes() const { return total_bytes_; }
  size_t segment_count() const { return mapping_->count(); }
  const std::byte* segment_base(size_t i) const { return mapping_->base(i); }
  // Mappable bytes of segment i (as the daemon sent them).
  uint64_t segment_size(size_t i) const { return segment_sizes_[i]; }
  // In manifest (name) order.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* Find(const std::string& name) const;
  // Seconds from sending Acquire to every segment mapped.
  double map_seconds() const { return map_seconds_; }
  // Where those seconds went, for benchmarks and profiles.
  struct Timings {
    double rpc_ms = 0;    // the Acquire call, manifest decoded
    double claim_ms = 0;  // the descriptors over the handle channel
    memory::MapTimings map;
    double views_ms = 0;  // the tensor views
  };
  const Timings& timings() const { return timings_; }

  // Names the memory mapped (AcquireResponse.content_id): another copy of the same
  // fingerprint has another.
  const std::string& content_id() const { return content_id_; }

  // What is known of the memory this lease maps. The daemon scrubs resident weights
  // (docs/integrity.md); when it finds that they changed -- a process wrote through a
  // writable import, a stray kernel, a memory error -- it stops serving them, loads a clean
  // copy for new Acquires and tells every lease holder on its handle connection: kCorrupt
  // with the daemon's message (segment and byte range), on this and every later call.
  // When the lease's handle connection closes (the daemon ended or restarted, e.g. a
  // rollout), the lease re-attaches once a daemon is back that serves this very memory (it
  // adopted it from the keeper: same content_id): an Acquire by fingerprint, a new handle
  // connection, the descriptors received and closed (nothing is mapped again). That daemon
  // then counts the lease (its Status lists it under a new lease id; the memory is not
  // evicted) and tells it of corruption: kClean again. Until then, and for good when the
  // daemon serves another copy, kUnknown saying why; nobody watches the memory for this
  // process (it stays mapped and readable). A re-attach is tried at most once a second, by
  // the call that finds it due, bounded by about 2 s. Waits up to `timeout` for news (0: only
  // looks; a poll costs one system call). On kCorrupt stop using these weights: re-acquire
  // (the clean copy) or restart. Any thread.
  LeaseWatch Watch(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const;
  // Watch as a status: OK (clean), DATA_LOSS (corrupt, the daemon's message) or UNAVAILABLE
  // ("unknown: ...", why).
  absl::Status Check(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const;

  // Sleep and wake (docs/engines.md, "Sleep and wake"). Detach unmaps every segment of this
  // lease and lets go of the memory (cuda-vmm: waits for the context's queued work, unmaps,
  // releases the imported handles), then ends the lease in the daemon (a Release, then the
  // handle connection closed), so the daemon may evict the entry and fill its memory with
  // another model. The address ranges stay reserved (host: PROT_NONE; cuda-vmm: the VA
  // reservation), so every TensorView::data and segment_base keeps its value and nothing
  // else can ever appear there; reading them while detached faults. A detached lease never
  // re-attaches on its own (Watch says kUnknown, "detached"). OK when detached already.
  absl::Status Detach();
  struct ReattachOptions {
    // When the entry is gone (evicted meanwhile): acquire by the lease's model name and ask
    // the daemon to load it (as an Acquire with load_on_miss); false: a miss is NOT_FOUND.
    bool load_on_miss = true;
    std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  };
  // Maps the same fingerprint at the same addresses again: an Acquire by this lease's
  // fingerprint (waiting for a load in progress), else -- the entry is gone or stale -- by its
  // model name with its layout, device and expectations, from wherever an Acquire takes it
  // (the cache, the keeper, a peer, the disk). FAILED_PRECONDITION naming both fingerprints
  // when the daemon now serves another fingerprint for the model (that lease is released;
  // this one stays detached: acquire the new weights as a new lease). On any failure the
  // lease stays detached and Reattach may be called again. A new lease id (id()) and
  // content_id(); Watch starts again from clean. FAILED_PRECONDITION when attached.
  absl::Status Reattach(const ReattachOptions& options);
  absl::Status Reattach() { return Reattach(ReattachOptions{}); }
  bool detached() const;

 private:
  friend class Client;
  Lease() = default;
  // Reads the handle connection (check_mu_ held): events, or its close.
  void PollLocked(std::chrono::milliseconds timeout) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(check_mu_);
  // The lease on this memory again from a daemon that is back (Watch); false while none is.
  bool ReattachLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(check_mu_);
  // Ends lease `lease_id` in the daemon now, best effort (Detach, a refused re-attach).
  void ReleaseNow(const std::string& lease_id) const;

  std::string id_, model_, fingerprint_, backend_, device_uuid_, model_dir_, spec_yaml_;
  std::string content_id_;
  std::string control_socket_;  // where it was acquired (re-attaches go there)
  AcquireOptions asked_;        // what was asked (Reattach asks the same by model name)
  int tp_size_ = 1, tp_rank_ = 0, pp_size_ = 1, pp_rank_ = 0;
  uint64_t total_bytes_ = 0;
  double map_seconds_ = 0;
  Timings timings_;
  std::vector<TensorView> tensors_;
  std::vector<uint64_t> segment_sizes_;
  std::unique_ptr<memory::SegmentMapping> mapping_;
  mutable Mutex check_mu_;
  // The lease itself (replaced by a re-attach): closed after unmapping, on destruction.
  mutable ScopedFd handle_conn_ ABSL_GUARDED_BY(check_mu_);
  // What Watch() read from handle_conn_ so far.
  mutable std::string events_ ABSL_GUARDED_BY(check_mu_);   // an incomplete line
  mutable std::string corrupt_ ABSL_GUARDED_BY(check_mu_);  // the daemon's message
  mutable bool daemon_closed_ ABSL_GUARDED_BY(check_mu_) = false;
  // Re-attaching: when the next try is due, why none succeeded yet, and whether a daemon
  // serves another copy (then no try is made again).
  mutable std::chrono::steady_clock::time_point next_reattach_ ABSL_GUARDED_BY(check_mu_);
  mutable std::string unknown_why_ ABSL_GUARDED_BY(check_mu_);
  mutable bool another_copy_ ABSL_GUARDED_BY(check_mu_) = false;
  // Detach()ed: nothing mapped, no lease in the daemon, the addresses reserved.
  bool detached_ ABSL_GUARDED_BY(check_mu_) = false;
};

// One tensor a publisher will write.
struct PublishTensor {
  std::string name;
  safetensors::DType dtype = safetensors::DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;  // product(shape) x dtype size
};

struct PublishOptions {
  std::string model;  // the base checkpoint: a spec name the daemon knows
  int tp_size = 1;
  int tp_rank = 0;
  int pp_size = 1;
  int pp_rank = 0;
  std::string compute_capability;  // empty: the device's
  std::string device_uuid;         // GPU holding the source tensors; empty for host
  EngineIdentity identity;         // engine and recipe required
  std::vector<PublishTensor> tensors;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
};

// A publish in progress: begun, writable views mapped, to be committed. Destroying it
// without Commit aborts the publish (nothing is left in the daemon), and so does this
// process's exit or death before the commit.
// joined(): another publisher has (or already published) the same key: nothing was
// allocated, there is nothing to write; Acquire with wait_ready maps its weights.
// Thread-safety: one thread at a time; the views may be written from any thread (host) or
// by kernels/copies on the device (cuda-vmm) until Commit.
class Publish {
 public:
  ~Publish();
  Publish(const Publish&) = delete;
  Publish& operator=(const Publish&) = delete;

  bool joined() const { return joined_; }
  const std::string& id() const { return id_; }
  const std::string& fingerprint() const { return fingerprint_; }
  const std::string& backend() const { return backend_; }
  const std::string& device_uuid() const { return device_uuid_; }
  // Writable views (data is writable until Commit); empty when joined. In name order.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* Find(const std::string& name) const;
  // Writable address of `view` (one of tensors()); null once committed or when joined.
  void* Data(const TensorView& view) const;
  // Waits for queued writes (cuda-vmm), unmaps the writable views, then commits: the daemon
  // seals the segments and serves them. On FAILED_PRECONDITION (a writable mapping of the
  // memory remains elsewhere, e.g. a duplicate or a forked child's: unmap it), UNAVAILABLE or
  // DEADLINE_EXCEEDED the publish stays open and Commit may be called again (the views are
  // unmapped already) or Abort; any other failure has ended it. Succeeds once.
  absl::Status Commit();
  // Ends the publish without serving it (also what the destructor does).
  void Abort();
  bool committed() const { return committed_; }

 private:
  friend class Client;
  Publish() = default;
  std::shared_ptr<internal::Rpc> rpc_;  // the client's channel, kept alive
  std::vector<PublishTensor> begun_;
  std::string id_, fingerprint_, backend_, device_uuid_;
  bool joined_ = false, committed_ = false, ended_ = false;
  std::vector<TensorView> tensors_;
  ScopedFd handle_conn_;  // the publish itself: closing it before the commit aborts
  std::unique_ptr<memory::SegmentMapping> mapping_;
};

// A compile artifact mapped read-only (Client::GetArtifact): the sealed memfd's bytes, valid
// while this object lives. No lease: the daemon may evict it meanwhile; this mapping stays.
class Artifact {
 public:
  ~Artifact();
  Artifact(const Artifact&) = delete;
  Artifact& operator=(const Artifact&) = delete;
  const void* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& id() const { return id_; }
  const std::string& sha256() const { return sha256_; }
  int fd() const { return fd_.get(); }  // read-only descriptor of the sealed memfd

 private:
  friend class Client;
  Artifact() = default;
  ScopedFd fd_;
  const void* data_ = nullptr;
  uint64_t size_ = 0;
  std::string id_, sha256_;
};

class Client {
 public:
  // `socket`: path of control.sock, or the directory holding it; empty: $WEIGHTCACHE_SOCKET,
  // else /run/weightcache/control.sock.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket = "");
  ~Client();

  const std::string& socket_path() const { return socket_; }

  absl::StatusOr<std::unique_ptr<Lease>> Acquire(const AcquireOptions& options);
  absl::Status Release(const std::string& lease_id);
  absl::StatusOr<v1::StatusResponse> Status();
  // Loads a known model (or an inline spec) and reports progress until it ends: every rank
  // of the spec, or only `layout`'s rank when given.
  absl::Status Load(const std::string& model, const std::string& spec_yaml,
                    const std::function<void(const v1::LoadProgress&)>& on_progress,
                    const v1::Layout* layout = nullptr);
  // Begins a publish (see Publish). PERMISSION_DENIED when this uid may not publish.
  absl::StatusOr<std::unique_ptr<Publish>> BeginPublish(const PublishOptions& options);
  // Compile artifacts (docs/protocol.md, "Artifacts"). Put needs the publish role;
  // ALREADY_EXISTS when the key is stored, ABORTED while another engine puts it.
  absl::StatusOr<v1::PutArtifactResponse> PutArtifact(const v1::ArtifactKey& key,
                                                      std::string_view bytes);
  // Maps the artifact read-only. NOT_FOUND when absent; with `wait`, a put in flight is
  // waited for up to that long.
  absl::StatusOr<std::unique_ptr<Artifact>> GetArtifact(
      const v1::ArtifactKey& key, std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  // Admin: by id, or (id empty) every artifact of `model`. How many were evicted.
  absl::StatusOr<uint32_t> EvictArtifacts(const std::string& id, const std::string& model);
  // How many entries were evicted.
  absl::StatusOr<uint32_t> Evict(const std::string& model, const std::string& fingerprint);
  // Integrity: the daemon digests every ready entry of `model` again now and compares them
  // with their digests from when they were filled (no mapping here). Admin only.
  absl::StatusOr<v1::VerifyResidentResponse> VerifyResident(const std::string& model);
  // The same, with the draining count and the other spec names that lost the entries.
  absl::StatusOr<v1::EvictResponse> EvictDetailed(const std::string& model,
                                                  const std::string& fingerprint);

 private:
  Client(std::string socket, std::shared_ptr<internal::Rpc> rpc);
  std::string socket_;
  std::shared_ptr<internal::Rpc> rpc_;  // shared with Publish objects (they commit through it)
};

}  // namespace weightcache::client
