// Pinned digests: the spec names each checkpoint file's SHA-256 (issue 48). Opening takes them
// without reading a byte; every load from disk checks them against the bytes.
#include "pkg/load/internal/pinned.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/load/model.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/untrusted_text.h"

namespace weightcache::load {
namespace {

constexpr char kMismatchPayload[] = "weightcache.io/pinned-digest-mismatch";

absl::Status Mismatch(const std::string& message) {
  absl::Status st = absl::DataLossError(message);
  st.SetPayload(kMismatchPayload, absl::Cord("1"));
  return st;
}

}  // namespace

bool IsPinnedDigestMismatch(const absl::Status& status) {
  return status.GetPayload(kMismatchPayload).has_value();
}

namespace internal {

absl::Status CheckPinsCover(const spec::ModelSpec& spec, const safetensors::Checkpoint& ckpt) {
  if (spec.digests.empty()) return absl::OkStatus();
  std::vector<std::string> names;
  for (const auto& f : ckpt.files()) names.push_back(f.info().name);
  std::vector<std::string> faults;
  for (const auto& [file, digest] : spec.digests) {
    if (std::find(names.begin(), names.end(), file) == names.end()) {
      faults.push_back(absl::StrCat("a digest is pinned for ", QuoteTruncated(file),
                                    ", which is not a checkpoint file of ", spec.model_dir));
    }
  }
  for (const auto& name : names) {
    if (spec.digests.count(name) == 0) {
      faults.push_back(absl::StrCat("checkpoint file ", QuoteTruncated(name),
                                    " has no pinned digest (when any file is pinned, every one "
                                    "must be)"));
    }
  }
  if (faults.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "model '", spec.name, "': digests: ", absl::StrJoin(faults, "; "),
      " (the checkpoint's files: ", absl::StrJoin(names, ", "), "; `weightcachectl pin ", spec.name,
      "` prints the block on a node that "
      "hashed them)"));
}

absl::StatusOr<SourceFile> PinnedSource(const spec::ModelSpec& spec, const std::string& name,
                                        const std::string& path, int fd,
                                        const identity::DigestStore* store) {
  SourceFile sf{name, path, {}, "sha256:" + spec.digests.at(name), identity::DigestSource::kPinned};
  WC_ASSIGN_OR_RETURN(sf.stat, identity::StatFd(fd, path));
  if (store == nullptr) return sf;
  // This node hashed this very version before: the pin is checked without a read.
  if (auto known = store->Lookup(sf.stat); known && known->rfind("sha256:", 0) == 0) {
    if (*known != sf.digest) {
      return Mismatch(absl::StrCat("model '", spec.name, "': pinned digest mismatch: ", name,
                                   " hashes to ", *known, " (this node read it) but the spec pins ",
                                   sf.digest,
                                   "; refused: the file is not the checkpoint the spec names"));
    }
    sf.digest_source = identity::DigestSource::kStore;
  }
  return sf;
}

}  // namespace internal

namespace {

// One pinned file against its bytes.
absl::Status VerifyFile(const OpenedModel& model, size_t i, identity::DigestStore& store,
                        const std::atomic<bool>* cancel) {
  const SourceFile& sf = model.files[i];
  if (sf.digest_source != identity::DigestSource::kPinned) return absl::OkStatus();
  const int fd = model.checkpoint.files()[i].fd();
  WC_ASSIGN_OR_RETURN(identity::ResolvedDigest got, store.Resolve(sf.path, fd, cancel));
  if (got.stat != sf.stat) {
    return absl::UnavailableError(absl::StrCat(
        "model '", model.spec.name, "': ", identity::DescribeChange(sf.name, sf.stat, got.stat),
        " since it was opened; load it again"));
  }
  if (got.digest != sf.digest) {
    WC_LOG_WARN("model %s: pinned digest mismatch: %s hashes to %s, the spec pins %s",
                model.spec.name, sf.name, got.digest, sf.digest);
    return Mismatch(absl::StrCat("model '", model.spec.name, "': pinned digest mismatch: ", sf.name,
                                 " hashes to ", got.digest, " but the spec pins ", sf.digest,
                                 "; refused: the file is not the checkpoint the spec names"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VerifyPinned(const OpenedModel& model, unsigned threads,
                          const std::atomic<bool>* cancel,
                          const std::function<void(const absl::Status&)>& on_mismatch) {
  if (!model.pinned()) return absl::OkStatus();
  std::unique_ptr<identity::DigestStore> private_store;
  identity::DigestStore* store = model.digests;
  if (store == nullptr) {
    WC_ASSIGN_OR_RETURN(private_store, identity::DigestStore::Open(""));
    store = private_store.get();
  }
  const size_t n = model.files.size();
  std::vector<absl::Status> errors(n);
  std::atomic<size_t> next{0};
  std::once_flag told;
  auto worker = [&] {
    for (size_t i = next++; i < n; i = next++) {
      errors[i] = VerifyFile(model, i, *store, cancel);
      if (errors[i].code() == absl::StatusCode::kDataLoss && on_mismatch) {
        std::call_once(told, [&] { on_mismatch(errors[i]); });
      }
    }
  };
  const auto workers =
      static_cast<unsigned>(std::clamp<size_t>(threads, 1, std::max<size_t>(1, n)));
  std::vector<std::thread> pool;
  for (unsigned w = 1; w < workers; ++w) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  // A mismatch first: it says more than a cancellation of the others.
  for (const auto& e : errors) {
    if (e.code() == absl::StatusCode::kDataLoss) return e;
  }
  for (const auto& e : errors) WC_RETURN_IF_ERROR(e);
  return absl::OkStatus();
}

}  // namespace weightcache::load
