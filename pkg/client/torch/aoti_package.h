// A compiled engine from the node, in C++ (docs/engines.md, "A C++ engine"): the model's
// AOTInductor package, kept by the daemon as a compile artifact (python/weightcache/aoti.py
// builds and puts it), loaded with libtorch's C++ package loader and bound to the mapped
// weights as user-managed constants (the package runs on the daemon's memory: no copy).
//
//   WC_ASSIGN_OR_RETURN(auto weights, client::ToTorch(lease));
//   WC_ASSIGN_OR_RETURN(auto key, client::ReadArtifactKeyFile("llama-aoti-key.json"));
//   WC_ASSIGN_OR_RETURN(auto model, client::AotiModel::Load(*client, key, *lease, weights));
//   std::vector<at::Tensor> out = model->Run({ids});
//
// The key is the one weightcache.aoti printed for the package (it names the torch, Triton,
// CUDA, GPU, settings and code the package was built for); Load refuses a key of another
// fingerprint than the lease's, or of another torch than this libtorch, naming both. As in
// Python, a load marker is written (and synced) under the state directory before the package
// is dlopened and removed when the load returns: a marker left behind means a load of this
// package killed its process, and it is not loaded again (FAILED_PRECONDITION naming the
// package and the marker) until the daemon holds another package for the key.
//
// Needs torch 2.6 or later (AOTIModelPackageLoader with user-managed constants); with an
// older libtorch Load is UNIMPLEMENTED naming the version.
//
// Thread-safety: Load may be called from any thread; Run from one thread at a time. The
// model holds references to the weights' tensors (so to the lease's mapping) while it lives.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/client/client.h"
#include "proto/weightcache/v1/weightcache.pb.h"

namespace torch::inductor {
class AOTIModelPackageLoader;
}  // namespace torch::inductor

namespace weightcache::client {

// The key in a file (JSON, as weightcache.aoti prints it); errors name the file.
absl::StatusOr<v1::ArtifactKey> ReadArtifactKeyFile(const std::string& path);

// $WEIGHTCACHE_STATE_DIR, else $XDG_STATE_HOME/weightcache, else ~/.local/state/weightcache
// (weightcache.aoti.state_dir): where load markers live.
std::string AotiStateDir();

struct AotiLoadOptions {
  std::string state_dir;              // empty: AotiStateDir()
  std::chrono::milliseconds wait{0};  // GetArtifact's wait for a put in flight
};

class AotiModel {
 public:
  struct Seconds {
    double get = 0;   // GetArtifact (the package mapped from the daemon)
    double load = 0;  // written to a private file, loaded by torch's loader (dlopen)
    double bind = 0;  // the constants bound to the mapped weights
  };

  static absl::StatusOr<std::unique_ptr<AotiModel>> Load(
      Client& client, const v1::ArtifactKey& key, const Lease& lease,
      const std::unordered_map<std::string, at::Tensor>& weights,
      const AotiLoadOptions& options = {});
  ~AotiModel();
  AotiModel(const AotiModel&) = delete;
  AotiModel& operator=(const AotiModel&) = delete;

  // The package's forward on `inputs` (its flattened tensor inputs), its flattened outputs.
  std::vector<at::Tensor> Run(const std::vector<at::Tensor>& inputs);

  const Seconds& seconds() const { return seconds_; }
  size_t constants() const { return constants_; }
  uint64_t package_bytes() const { return package_bytes_; }
  const std::string& package_sha256() const { return sha256_; }

 private:
  AotiModel() = default;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  Seconds seconds_;
  size_t constants_ = 0;
  uint64_t package_bytes_ = 0;
  std::string sha256_;
};

}  // namespace weightcache::client
