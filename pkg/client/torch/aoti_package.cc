#include "pkg/client/torch/aoti_package.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/version.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/client/aoti_artifact.h"
#include "pkg/util/status_macros.h"

#if __has_include(<torch/csrc/inductor/aoti_package/model_package_loader.h>) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6))
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#define WC_HAVE_AOTI_LOADER 1
#else
#define WC_HAVE_AOTI_LOADER 0
namespace torch::inductor {
class AOTIModelPackageLoader {};  // this libtorch has none: Load says so
}  // namespace torch::inductor
#endif

namespace weightcache::client {
namespace fs = std::filesystem;

static std::string Errno(const std::string& what, const std::string& path) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(errno));
}
#if WC_HAVE_AOTI_LOADER
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

absl::StatusOr<c10::ScalarType> DTypeOfName(const std::string& name) {
  static const std::pair<const char*, c10::ScalarType> kTypes[] = {
      {"float32", c10::ScalarType::Float},     {"float16", c10::ScalarType::Half},
      {"bfloat16", c10::ScalarType::BFloat16}, {"float64", c10::ScalarType::Double},
      {"int64", c10::ScalarType::Long},        {"int32", c10::ScalarType::Int},
      {"int16", c10::ScalarType::Short},       {"int8", c10::ScalarType::Char},
      {"uint8", c10::ScalarType::Byte},        {"bool", c10::ScalarType::Bool},
  };
  for (const auto& [n, t] : kTypes) {
    if (name == n) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("AOTInductor artifact: constant dtype '", name,
                                                 "' is not one this engine reads"));
}

// The marker of one load (weightcache.aoti._Marked): written and synced before the package
// is dlopened, removed when the load returns. Only a process that died mid-load leaves it.
class Marker {
 public:
  static absl::StatusOr<Marker> Write(const std::string& dir, const std::string& name,
                                      const std::string& body) {
    Marker m;
    std::error_code ec;
    fs::create_directories(fs::path(dir) / "aoti-loads", ec);
    ::chmod(dir.c_str(), 0700);
    m.path_ = (fs::path(dir) / "aoti-loads" / name).string();
    const std::string tmp = absl::StrCat(m.path_, ".", ::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return absl::UnavailableError(Errno("cannot write the load marker", tmp));
    const bool ok = ::write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size()) &&
                    ::fsync(fd) == 0;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), m.path_.c_str()) != 0) {
      ::unlink(tmp.c_str());
      return absl::UnavailableError(Errno("cannot write the load marker", m.path_));
    }
    return m;
  }
  Marker(Marker&& o) noexcept : path_(std::exchange(o.path_, "")) {}
  Marker& operator=(Marker&&) = delete;
  Marker(const Marker&) = delete;
  ~Marker() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }

 private:
  Marker() = default;
  std::string path_;
};

// The marker's path when a previous load of this key's package (`sha256`) died, else "".
std::string CrashedBefore(const std::string& path, const std::string& sha256) {
  std::ifstream f(path);
  if (!f) return "";
  std::stringstream text;
  text << f.rdbuf();
  // {"sha256": "...", ...} as either language writes it (the JSON library, not a search for
  // the field's spelling: Python may write it with other spacing). Another package now means
  // the one that died was replaced; an unreadable marker, that a load began and never ended.
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("sha256") || !j["sha256"].is_string()) return path;
  const std::string left = j["sha256"].get<std::string>();
  if (!left.empty() && left != sha256) return "";
  return path;
}

// The package in a private directory (0700: nobody swaps the file between write and load).
absl::StatusOr<std::string> WritePrivate(std::string_view package, std::string* dir) {
  std::string templ =
      std::string(fs::is_directory("/dev/shm") ? "/dev/shm" : "/tmp") + "/wc-aoti-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return absl::UnavailableError(Errno("mkdtemp", templ));
  *dir = templ;
  const std::string path = templ + "/model.pt2";
  std::ofstream out(path, std::ios::binary);
  out.write(package.data(), static_cast<std::streamsize>(package.size()));
  out.close();
  if (!out) return absl::UnavailableError(Errno("cannot write", path));
  return path;
}

}  // namespace
#endif

absl::StatusOr<v1::ArtifactKey> ReadArtifactKeyFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(Errno("artifact key file", path));
  std::stringstream text;
  text << f.rdbuf();
  return ParseArtifactKeyJson(text.str(), path);
}

std::string AotiStateDir() {
  if (const char* d = std::getenv("WEIGHTCACHE_STATE_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* x = std::getenv("XDG_STATE_HOME"); x != nullptr && *x != '\0') {
    return (fs::path(x) / "weightcache").string();
  }
  const char* home = std::getenv("HOME");
  return (fs::path(home != nullptr ? home : "/") / ".local" / "state" / "weightcache").string();
}

AotiModel::~AotiModel() = default;

absl::StatusOr<std::unique_ptr<AotiModel>> AotiModel::Load(
    Client& client, const v1::ArtifactKey& key, const Lease& lease,
    const std::unordered_map<std::string, at::Tensor>& weights, const AotiLoadOptions& options) {
#if !WC_HAVE_AOTI_LOADER
  (void)client, (void)key, (void)lease, (void)weights, (void)options;
  return absl::UnimplementedError(
      absl::StrCat("libtorch ", TORCH_VERSION,
                   " has no AOTInductor package loader with user-managed "
                   "constants (torch 2.6 or later)"));
#else
  if (key.kind() != kAotiPackageKind) {
    return absl::InvalidArgumentError(absl::StrCat("artifact key of kind '", key.kind(),
                                                   "': an AOTInductor package is ",
                                                   std::string(kAotiPackageKind)));
  }
  if (key.fingerprint() != lease.fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the package's key names fingerprint ", key.fingerprint(), " but the lease maps ",
        lease.fingerprint(), ": a package binds only the weights it was built for"));
  }
  // "2.11.0+cu130" is torch 2.11.0 (libtorch's TORCH_VERSION carries no local version).
  if (const std::string& v = key.torch_version();
      v != TORCH_VERSION && !absl::StartsWith(v, absl::StrCat(TORCH_VERSION, "+"))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the package's key names torch ", key.torch_version(), " but this engine runs libtorch ",
        TORCH_VERSION, ": a package loads only into the torch it was built with"));
  }
  auto model = std::unique_ptr<AotiModel>(new AotiModel());
  auto t = std::chrono::steady_clock::now();
  WC_ASSIGN_OR_RETURN(std::unique_ptr<Artifact> artifact, client.GetArtifact(key, options.wait));
  model->seconds_.get = Since(t);
  model->sha256_ = artifact->sha256();
  model->package_bytes_ = artifact->size();
  const std::string_view blob(static_cast<const char*>(artifact->data()), artifact->size());
  WC_ASSIGN_OR_RETURN(AotiArtifact parsed, ParseAotiArtifact(blob));

  const std::string dir = options.state_dir.empty() ? AotiStateDir() : options.state_dir;
  const std::string marker_path = (fs::path(dir) / "aoti-loads" / AotiMarkerName(key)).string();
  if (std::string died = CrashedBefore(marker_path, model->sha256_); !died.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("package sha256:", model->sha256_.substr(0, 16),
                     " of this key killed a previous load of "
                     "it (its marker ",
                     died, " was left behind): not loaded again (remove the marker to retry)"));
  }
  t = std::chrono::steady_clock::now();
  {
    WC_ASSIGN_OR_RETURN(Marker marker,
                        Marker::Write(dir, AotiMarkerName(key),
                                      absl::StrCat("{\"sha256\": \"", model->sha256_,
                                                   "\", \"source\": \"artifact\", "
                                                   "\"pid\": ",
                                                   ::getpid(), ", \"engine\": \"c++\"}")));
    std::string tmp;
    auto path = WritePrivate(parsed.package, &tmp);
    if (path.ok()) {
      c10::DeviceIndex index = -1;
      if (!weights.empty() && weights.begin()->second.is_cuda()) {
        index = weights.begin()->second.device().index();
      }
      try {
        model->loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(*path, "model",
                                                                                   false, 1, index);
      } catch (const std::exception& e) {
        fs::remove_all(tmp);
        return absl::InternalError(absl::StrCat("torch's package loader refused the package ",
                                                "sha256:", model->sha256_.substr(0, 16), ": ",
                                                e.what()));
      }
    }
    if (!tmp.empty()) fs::remove_all(tmp);  // the loader extracted what it keeps
    if (!path.ok()) return path.status();
  }
  model->seconds_.load = Since(t);

  t = std::chrono::steady_clock::now();
  const c10::Device device =
      weights.empty() ? c10::Device(c10::DeviceType::CPU) : weights.begin()->second.device();
  std::unordered_map<std::string, at::Tensor> bound;
  std::vector<std::string> missing;
  for (const std::string& fqn : model->loader_->get_constant_fqns()) {
    if (auto b = parsed.bindings.find(fqn); b != parsed.bindings.end()) {
      if (auto w = weights.find(b->second); w != weights.end()) {
        bound.emplace(fqn, w->second);
        continue;
      }
    }
    bool found = false;
    for (const auto& c : parsed.constants) {
      if (c.fqn != fqn) continue;
      WC_ASSIGN_OR_RETURN(c10::ScalarType dtype, DTypeOfName(c.dtype));
      // A copy: the artifact's mapping ends with this call.
      at::Tensor raw = at::from_blob(const_cast<char*>(c.bytes.data()),
                                     {static_cast<int64_t>(c.bytes.size())}, at::kByte)
                           .clone();
      try {
        bound.emplace(fqn, raw.view(dtype).reshape(c.shape).to(device));
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat("AOTInductor artifact: constant ", fqn, ": ",
                                                       c.bytes.size(), " bytes do not make ",
                                                       c.dtype, ": ", e.what()));
      }
      found = true;
      break;
    }
    if (!found) missing.push_back(fqn);
  }
  if (!missing.empty()) {
    if (missing.size() > 5) missing.resize(5), missing.emplace_back("...");
    return absl::FailedPreconditionError(
        absl::StrCat("the package needs constants neither the weights nor the artifact give: ",
                     absl::StrJoin(missing, ", ")));
  }
  try {
    // use_inactive=false, check_full_update=true, user_managed=true: the tensors given are
    // the constants themselves (the mapped weights; no copy into a package-owned buffer).
    model->loader_->load_constants(bound, false, true, true);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("binding the package's constants: ", e.what()));
  }
  model->constants_ = bound.size();
  model->seconds_.bind = Since(t);
  return model;
#endif
}

std::vector<at::Tensor> AotiModel::Run(const std::vector<at::Tensor>& inputs) {
#if WC_HAVE_AOTI_LOADER
  return loader_->run(inputs);
#else
  (void)inputs;
  return {};
#endif
}

}  // namespace weightcache::client
