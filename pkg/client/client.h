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
// Thread-safety: a Client may be used from several threads at once. A Lease is immutable;
// its views and pointers stay valid exactly as long as the Lease object lives. Destroying
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
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/memory/mapping.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::v1 {
class StatusResponse;
class LoadProgress;
class EvictResponse;
class Layout;
}  // namespace weightcache::v1

namespace weightcache::client {

inline constexpr const char* kSocketEnv = "WEIGHTCACHE_SOCKET";
inline constexpr const char* kModelEnv = "WEIGHTCACHE_MODEL";
inline constexpr const char* kDefaultControlSocket = "/run/weightcache/control.sock";

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
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};

  // model from $WEIGHTCACHE_MODEL (set from the pod annotation weightcache.io/model via
  // the Downward API); INVALID_ARGUMENT saying so when it is unset or empty.
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

 private:
  friend class Client;
  Lease() = default;
  std::string id_, model_, fingerprint_, backend_, device_uuid_, model_dir_, spec_yaml_;
  int tp_size_ = 1, tp_rank_ = 0, pp_size_ = 1, pp_rank_ = 0;
  uint64_t total_bytes_ = 0;
  double map_seconds_ = 0;
  std::vector<TensorView> tensors_;
  std::vector<uint64_t> segment_sizes_;
  ScopedFd handle_conn_;  // the lease itself: closed after unmapping, on destruction
  std::unique_ptr<memory::SegmentMapping> mapping_;
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
  // How many entries were evicted.
  absl::StatusOr<uint32_t> Evict(const std::string& model, const std::string& fingerprint);
  // The same, with the draining count and the other spec names that lost the entries.
  absl::StatusOr<v1::EvictResponse> EvictDetailed(const std::string& model,
                                                  const std::string& fingerprint);

 private:
  struct Rpc;
  Client(std::string socket, std::unique_ptr<Rpc> rpc);
  std::string socket_;
  std::unique_ptr<Rpc> rpc_;
};

}  // namespace weightcache::client
