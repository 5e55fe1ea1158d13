#include "pkg/server/internal/model_catalog.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {

namespace {

// `path` with links resolved; the input itself when it cannot be (it does not exist: the
// open that follows says so).
std::string Resolved(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) != nullptr ? std::string(buf) : path;
}

bool Under(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

}  // namespace

ModelCatalog::ModelCatalog(const std::vector<spec::ModelSpec>& specs, unsigned hash_threads,
                           const std::vector<std::string>& model_roots, metrics::Metrics* metrics)
    : hash_threads_(hash_threads), metrics_(metrics) {
  for (const auto& s : specs) {
    specs_[s.name] = s;
    yaml_[s.name] = spec::ToYaml(s);
    if (metrics_ != nullptr) metrics_->OnModel(s.name);
  }
  for (const auto& r : model_roots) roots_.push_back(Resolved(r));
}

absl::Status ModelCatalog::CheckPath(const spec::ModelSpec& s, const std::string& what,
                                     const std::string& path) const {
  const std::string real = Resolved(path);
  for (const auto& root : roots_) {
    if (Under(real, root)) return absl::OkStatus();
  }
  if (metrics_ != nullptr) metrics_->OnRefused("model_roots");
  return absl::PermissionDeniedError(
      absl::StrCat("model '", s.name, "': ", what, " ", path,
                   real == path ? "" : absl::StrCat(" (resolves to ", real, ")"),
                   " is not under the daemon's --model_roots (", absl::StrJoin(roots_, ", "), ")"));
}

absl::Status ModelCatalog::CheckRoots(const spec::ModelSpec& s) const {
  if (roots_.empty()) return absl::OkStatus();
  WC_RETURN_IF_ERROR(CheckPath(s, "model_dir", s.model_dir));
  // Every file the loader may read in it too (*.json, *.safetensors), before anything is
  // read: a shard or config.json linked out of the roots would otherwise be served under
  // this spec (issue 25).
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(s.model_dir, ec)) {
    const std::string ext = f.path().extension().string();
    if (ext != ".json" && ext != ".safetensors") continue;
    WC_RETURN_IF_ERROR(CheckPath(s, "file", f.path().string()));
  }
  return absl::OkStatus();
}

absl::Status ModelCatalog::OpenDigestStore(const std::string& path) {
  if (!path.empty()) {
    const std::string dir = path.substr(0, path.rfind('/'));
    if (!dir.empty() && dir != path && ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, "mkdir (digest store)", dir);
    }
  }
  WC_ASSIGN_OR_RETURN(digests_, identity::DigestStore::Open(path));
  return absl::OkStatus();
}

ModelCatalog::Previous ModelCatalog::Define(const spec::ModelSpec& s) {
  std::string yaml = spec::ToYaml(s);
  if (metrics_ != nullptr) metrics_->OnModel(s.name);
  MutexLock l(mu_);
  Previous previous{s.name, std::nullopt, inline_.count(s.name) != 0};
  if (auto it = specs_.find(s.name); it != specs_.end()) previous.spec = it->second;
  specs_[s.name] = s;
  yaml_[s.name] = std::move(yaml);
  inline_.insert(s.name);
  ForgetOpenedLocked(s.name);
  return previous;
}

void ModelCatalog::Restore(const Previous& previous) {
  const std::string& name = previous.name;
  std::string yaml = previous.spec ? spec::ToYaml(*previous.spec) : std::string();
  MutexLock l(mu_);
  if (previous.spec) {
    specs_[name] = *previous.spec;
    yaml_[name] = std::move(yaml);
  } else {
    specs_.erase(name);
    yaml_.erase(name);
  }
  if (previous.defined_inline) {
    inline_.insert(name);
  } else {
    inline_.erase(name);
  }
  ForgetOpenedLocked(name);
}

void ModelCatalog::ForgetOpenedLocked(const std::string& name) {
  opened_.erase(name);
  open_errors_.erase(name);
  refreshed_.erase(name);
}

bool ModelCatalog::TakeRefresh(const std::string& name, std::chrono::milliseconds interval) {
  const auto now = std::chrono::steady_clock::now();
  MutexLock l(mu_);
  auto [it, first] = refreshed_.try_emplace(name, now);
  if (first) return true;
  if (now - it->second < interval) return false;
  it->second = now;
  return true;
}

bool ModelCatalog::DefinedInline(const std::string& name) const {
  MutexLock l(mu_);
  return inline_.count(name) != 0;
}

std::string ModelCatalog::SpecYaml(const std::string& name) const {
  MutexLock l(mu_);
  auto it = yaml_.find(name);
  return it == yaml_.end() ? std::string() : it->second;
}

std::optional<spec::ModelSpec> ModelCatalog::Spec(const std::string& name) const {
  MutexLock l(mu_);
  auto it = specs_.find(name);
  if (it == specs_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::shared_ptr<const load::OpenedModel>> ModelCatalog::Open(const std::string& name,
                                                                            bool refresh) {
  spec::ModelSpec s;
  {
    MutexLock l(mu_);
    auto it = specs_.find(name);
    if (it == specs_.end()) {
      std::vector<std::string> known;
      for (const auto& [n, _] : specs_) known.push_back(n);
      return absl::NotFoundError(
          absl::StrCat("model '", name, "' is not known to this daemon (known: ",
                       known.empty() ? "none" : absl::StrJoin(known, ", "), ")"));
    }
    if (!refresh) {
      auto o = opened_.find(name);
      if (o != opened_.end()) return o->second;
    }
    s = it->second;
  }
  WC_RETURN_IF_ERROR(CheckRoots(s));
  // Opening reads config.json and the headers, and hashes unknown file versions: unlocked.
  load::OpenOptions oo;
  oo.digests = digests_.get();
  oo.hash_threads = hash_threads_;
  oo.cancel = &stopping_;
  auto opened = load::OpenModel(s, oo);
  if (opened.ok() && !roots_.empty()) {
    // And what was opened (a link swapped after the check above is caught here).
    for (const auto& f : (*opened)->files) {
      if (absl::Status in = CheckPath(s, "file", f.path); !in.ok()) opened = in;
      if (!opened.ok()) break;
    }
  }
  if (!opened.ok() && metrics_ != nullptr && load::IsPinnedDigestMismatch(opened.status())) {
    metrics_->OnPinnedDigestMismatch(name);
  }
  MutexLock l(mu_);
  if (!opened.ok()) {
    open_errors_[name] = std::string(opened.status().message());
    return opened.status();
  }
  open_errors_.erase(name);
  opened_[name] = *opened;
  return *opened;
}

std::map<std::string, std::shared_ptr<const load::OpenedModel>> ModelCatalog::Opened() const {
  MutexLock l(mu_);
  return opened_;
}

std::vector<std::string> ModelCatalog::NamesOf(const cache::EntrySnapshot& s) const {
  std::vector<std::string> names;
  for (const auto& [name, o] : Opened()) {
    if (name == s.model || o->Reproduces(s.inputs, s.fingerprint)) {
      names.push_back(name);
    }
  }
  if (std::find(names.begin(), names.end(), s.model) == names.end()) names.push_back(s.model);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<ModelCatalog::Known> ModelCatalog::List() const {
  MutexLock l(mu_);
  std::vector<Known> out;
  for (const auto& [name, s] : specs_) {
    auto err = open_errors_.find(name);
    out.push_back({s, err == open_errors_.end() ? "" : err->second});
  }
  return out;
}

std::vector<std::string> ModelCatalog::Names() const {
  MutexLock l(mu_);
  std::vector<std::string> out;
  for (const auto& [name, _] : specs_) out.push_back(name);
  return out;
}

uint64_t ModelCatalog::hashed_bytes() const {
  return digests_ != nullptr ? digests_->hashed_bytes() : 0;
}

absl::Status ModelCatalog::AdmitKept(const std::string& name, const std::string& model_dir,
                                     bool defined_inline, const std::string& spec_yaml) {
  if (auto current = Spec(name)) {
    // Still configured: its current spec, with its current access rules, serves it. Only
    // if it still reads the directory the bytes came from.
    if (current->model_dir != model_dir) {
      return absl::FailedPreconditionError(
          absl::StrCat("model '", name, "' is now configured with model_dir ", current->model_dir,
                       ", not ", model_dir, " its cached copy came from"));
    }
    return absl::OkStatus();
  }
  if (defined_inline && !spec_yaml.empty()) {
    // An admin's inline spec stays defined across a restart, as the admin wrote it.
    auto specs = spec::ParseSpecs(spec_yaml, "keeper record of " + name);
    if (!specs.ok()) return specs.status();
    if (specs->size() != 1 || specs->front().name != name) {
      return absl::InvalidArgumentError(
          absl::StrCat("keeper record of '", name, "': its spec_yaml is not that model's spec"));
    }
    Define(specs->front());
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "model '", name,
      "' is no longer configured (not in the spec file, and not an admin's inline spec): "
      "revoked, its cached copy is not served again"));
}

}  // namespace weightcache::server
