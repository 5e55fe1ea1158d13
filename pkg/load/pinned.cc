// Pinned digests: the spec names each checkpoint file's SHA-256 (issue 48). Opening takes them
// without reading a byte; every load from disk checks them against the bytes it reads, in the
// same pass (issue 58: the hash follows the load's reads).
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

absl::StatusOr<std::unique_ptr<PinCheck>> PinCheck::Start(
    const OpenedModel& model, uint64_t hold_bytes,
    std::function<void(const absl::Status&)> on_mismatch) {
  auto check = std::unique_ptr<PinCheck>(new PinCheck());
  check->model_ = &model;
  check->on_mismatch_ = std::move(on_mismatch);
  std::vector<identity::FollowingSha256::File> files;
  for (size_t i = 0; i < model.files.size(); ++i) {
    // Only files taken on the pin's word: a file this node hashed before (kStore) was
    // checked at open, without a read.
    if (model.files[i].digest_source != identity::DigestSource::kPinned) continue;
    const auto& f = model.checkpoint.files()[i];
    files.push_back({f.fd(), f.info().size, f.info().path});
    check->followed_.push_back(i);
  }
  {
    MutexLock l(check->mu_);  // before any reader: for the analysis
    check->compared_.assign(check->followed_.size(), false);
  }
  auto* raw = check.get();
  check->hash_ = std::make_unique<identity::FollowingSha256>(
      std::move(files), hold_bytes,
      [raw](size_t k, const std::string& digest) { raw->Checked(k, digest); });
  for (size_t k = 0; k < check->followed_.size(); ++k) {
    // The header: read once by the open already, hashed here so the cursor starts where
    // the load's reads do.
    const auto& info = model.checkpoint.files()[check->followed_[k]].info();
    WC_RETURN_IF_ERROR(check->hash_->Start(k, info.data_offset));
  }
  check->tap_ = [raw](int fd, uint64_t offset, const void* data, uint64_t n) {
    raw->hash_->Offer(fd, offset, data, n);
  };
  return check;
}

// The hashers first: one may still be reporting a file (Checked uses mu_ and compared_,
// declared after hash_ and so destroyed before it), e.g. after Finish returned a mismatch
// found mid-load without waiting for them.
PinCheck::~PinCheck() { hash_.reset(); }

absl::Status PinCheck::Compare(size_t k, const std::string& digest) {
  const SourceFile& sf = model_->files[followed_[k]];
  const int fd = model_->checkpoint.files()[followed_[k]].fd();
  WC_ASSIGN_OR_RETURN(identity::FileStat now, identity::StatFd(fd, sf.path));
  if (now != sf.stat) {
    return absl::UnavailableError(absl::StrCat(
        "model '", model_->spec.name, "': ", identity::DescribeChange(sf.name, sf.stat, now),
        " since it was opened; load it again"));
  }
  {
    MutexLock l(mu_);
    if (compared_[k]) return absl::OkStatus();  // during the load already
    compared_[k] = true;
  }
  // What this file version hashes to, right or wrong: the next open decides without a read.
  if (model_->digests != nullptr) {
    model_->digests->CountHashed(sf.stat.size);
    model_->digests->Record(sf.stat, digest);
  }
  if (digest == sf.digest) return absl::OkStatus();
  WC_LOG_WARN("model %s: pinned digest mismatch: %s hashes to %s, the spec pins %s",
              model_->spec.name, sf.name, digest, sf.digest);
  return Mismatch(absl::StrCat("model '", model_->spec.name, "': pinned digest mismatch: ", sf.name,
                               " hashes to ", digest, " but the spec pins ", sf.digest,
                               "; refused: the file is not the checkpoint the spec names"));
}

void PinCheck::Checked(size_t k, const std::string& digest) {
  absl::Status st = Compare(k, digest);
  if (st.ok()) return;
  bool first = false;
  {
    MutexLock l(mu_);
    if (early_.ok()) early_ = st, first = true;
  }
  if (first && on_mismatch_) on_mismatch_(st);
}

absl::Status PinCheck::Finish(const std::atomic<bool>* cancel, unsigned threads) {
  {
    MutexLock l(mu_);
    if (!early_.ok()) return early_;  // found mid-load: the rest need not be read
  }
  WC_ASSIGN_OR_RETURN(std::vector<std::string> digests, hash_->Finish(cancel, threads));
  {
    MutexLock l(mu_);
    if (!early_.ok()) return early_;  // found by a hasher while the load ended
  }
  absl::Status first;
  for (size_t k = 0; k < digests.size(); ++k) {
    absl::Status st = Compare(k, digests[k]);
    if (!st.ok() && (first.ok() || st.code() == absl::StatusCode::kDataLoss)) {
      if (first.code() != absl::StatusCode::kDataLoss) first = st;
    }
  }
  return first;
}

uint64_t PinCheck::followed_bytes() const { return hash_->followed_bytes(); }
uint64_t PinCheck::reread_bytes() const { return hash_->reread_bytes(); }
uint64_t PinCheck::holes_filled() const { return hash_->holes_filled(); }
double PinCheck::room_wait_seconds() const { return hash_->room_wait_seconds(); }
double PinCheck::hash_seconds() const { return hash_->hash_seconds(); }

}  // namespace internal
}  // namespace weightcache::load
