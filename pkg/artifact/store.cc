#include "pkg/artifact/store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "pkg/artifact/internal/files.h"
#include "pkg/identity/identity.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"

namespace weightcache::artifact {
namespace {

constexpr size_t kMaxRecordBytes = 64 << 10;  // an artifact's JSON record on disk

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

// ---- PutSlot ------------------------------------------------------------------------------

PutSlot::PutSlot(Store* store, Key key, std::string id, uint64_t size, ScopedFd fd)
    : store_(store), key_(std::move(key)), id_(std::move(id)), size_(size), fd_(std::move(fd)) {}

PutSlot::~PutSlot() {
  if (!done_) store_->EndPut(id_, size_);
}

absl::Status PutSlot::Append(std::string_view data) {
  if (done_) return absl::FailedPreconditionError(absl::StrCat("put of ", id_, " ended"));
  if (data.size() > size_ - written_) {
    return absl::InvalidArgumentError(absl::StrCat("artifact ", key_.kind, " of model '",
                                                   key_.model, "': more than the declared ", size_,
                                                   " bytes sent"));
  }
  for (size_t done = 0; done < data.size();) {
    const ssize_t w = ::pwrite(fd_.get(), data.data() + done, data.size() - done,
                               static_cast<off_t>(written_ + done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoStatus(errno, "write artifact memfd", id_);
    done += static_cast<size_t>(w);
  }
  written_ += data.size();
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Artifact>> PutSlot::Commit(const Publisher& publisher) {
  if (done_) return absl::FailedPreconditionError(absl::StrCat("put of ", id_, " ended"));
  if (written_ != size_) {
    return absl::FailedPreconditionError(absl::StrCat("artifact ", key_.kind, " of model '",
                                                      key_.model, "': ", written_, " of the ",
                                                      size_, " declared bytes sent"));
  }
  WC_ASSIGN_OR_RETURN(ScopedFd ro, SealReadOnly(fd_.get(), id_));
  // The digest is taken from the sealed memfd: what every reader will map.
  WC_ASSIGN_OR_RETURN(std::string sha, identity::Sha256File(ro.get(), size_, id_));
  Publisher who = publisher;
  if (who.unix_seconds == 0) who.unix_seconds = UnixNow();
  auto a = std::make_shared<const Artifact>(std::move(ro), key_, id_, size_, std::move(sha),
                                            std::move(who));
  std::vector<std::string> changed;
  {
    MutexLock l(store_->mu_);
    done_ = true;
    store_->putting_.erase(id_);
    store_->reserved_bytes_ -= size_;  // becomes resident: Insert finds the room it kept
    store_->cv_.NotifyAll();
    WC_RETURN_IF_ERROR(store_->Insert(a, &changed));
  }
  changed.push_back(id_);
  store_->Notify(changed);
  store_->Spill(*a);
  return a;
}

// ---- Store --------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Store>> Store::Open(StoreOptions options) {
  std::unique_ptr<Store> s(new Store(std::move(options)));
  if (!s->options_.dir.empty()) WC_RETURN_IF_ERROR(s->IndexDir());
  return s;
}

Store::~Store() = default;

absl::Status Store::IndexDir() {
  const auto& dir = options_.dir;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, "mkdir --artifact_dir", dir);
  }
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    if (f.path().extension() != ".json") continue;
    const std::string path = f.path().string();
    struct stat st {};
    // A record is small; a FIFO or a link in its place is skipped, never waited on.
    auto text = ReadRegular(path, kMaxRecordBytes, &st);
    absl::StatusOr<Record> meta = text.ok() ? DecodeRecord(*text) : text.status();
    if (meta.ok() && f.path().stem().string() != meta->id) {
      meta = absl::InvalidArgumentError("its file name is not its id");
    }
    if (!meta.ok()) {
      WC_LOG_WARN("artifact dir: skipping %s: %s", path.c_str(),
                  std::string(meta.status().message()).c_str());
      continue;
    }
    const auto used = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::seconds(st.st_mtim.tv_sec) +
            std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
    MutexLock l(mu_);
    if (spilled_.count(meta->id) == 0) disk_bytes_ += meta->bytes;
    spilled_[meta->id] = Spilled{meta->key, meta->bytes, meta->sha256, meta->publisher, used};
  }
  if (ec) return ErrnoStatus(ec.value(), "read --artifact_dir", dir);
  MutexLock l(mu_);
  // A budget lowered since the last run: the least recently used go now.
  MakeDirRoom(0, "");
  WC_LOG_INFO("artifact dir %s: %zu artifacts, %llu bytes", dir.c_str(), spilled_.size(),
              static_cast<unsigned long long>(disk_bytes_));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PutSlot>> Store::BeginPut(const Key& key, uint64_t size) {
  WC_RETURN_IF_ERROR(ValidateKey(key));
  if (size == 0 || size > options_.max_artifact_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact ", key.kind, " of model '", key.model, "': size ", size, " bytes; must be 1 to ",
        options_.max_artifact_bytes, " (--artifact_max_bytes)"));
  }
  if (size > options_.budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("artifact ", key.kind, " of model '", key.model, "': ", size,
                     " bytes exceed the artifact budget of ", options_.budget_bytes, " bytes"));
  }
  std::string id = IdOf(key);
  std::vector<std::string> dropped;
  {
    MutexLock l(mu_);
    if (resident_.count(id) != 0 || spilled_.count(id) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("artifact ", id, " is stored already"));
    }
    if (putting_.count(id) != 0) {
      return absl::AbortedError(
          absl::StrCat("artifact ", id, " is being put by another engine: get it with wait"));
    }
    // The declared size is reserved now, before a byte comes: puts in flight can never hold
    // more than the budget between them, however slowly they send.
    if (reserved_bytes_ + size > options_.budget_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "artifact ", key.kind, " of model '", key.model, "': its ", size,
          " declared bytes do not fit the artifact budget of ", options_.budget_bytes,
          " bytes (--artifact_budget) beside the ", reserved_bytes_, " bytes reserved by ",
          putting_.size(), " put(s) in flight; try again when they end"));
    }
    putting_.insert(id);
    reserved_bytes_ += size;
    DropResident(0, &dropped);
  }
  Notify(dropped);
  auto fd = NewMemfd(id, size);
  if (!fd.ok()) {
    EndPut(id, size);
    return fd.status();
  }
  return std::unique_ptr<PutSlot>(new PutSlot(this, key, std::move(id), size, std::move(*fd)));
}

void Store::EndPut(const std::string& id, uint64_t reserved) {
  MutexLock l(mu_);
  putting_.erase(id);
  reserved_bytes_ -= reserved;
  cv_.NotifyAll();
}

void Store::DropResident(uint64_t incoming, std::vector<std::string>* dropped) {
  while (resident_bytes_ + reserved_bytes_ + incoming > options_.budget_bytes &&
         !resident_.empty()) {
    auto lru = resident_.begin();
    for (auto it = resident_.begin(); it != resident_.end(); ++it) {
      if (it->second.used < lru->second.used) lru = it;
    }
    WC_LOG_INFO("artifact %s (%llu bytes) dropped from memory for the budget%s", lru->first.c_str(),
                static_cast<unsigned long long>(lru->second.artifact->bytes()),
                spilled_.count(lru->first) != 0 ? " (kept on disk)" : "");
    resident_bytes_ -= lru->second.artifact->bytes();
    dropped->push_back(lru->first);
    resident_.erase(lru);
    ++evictions_;
  }
}

absl::Status Store::Insert(std::shared_ptr<const Artifact> a, std::vector<std::string>* dropped) {
  if (reserved_bytes_ + a->bytes() > options_.budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("artifact ", a->id(), ": ", a->bytes(),
                     " bytes do not fit the artifact budget of ", options_.budget_bytes,
                     " bytes beside the ", reserved_bytes_, " bytes reserved by puts in flight"));
  }
  DropResident(a->bytes(), dropped);
  resident_bytes_ += a->bytes();
  const std::string id = a->id();
  resident_[id] = Resident{std::move(a), std::chrono::steady_clock::now()};
  return absl::OkStatus();
}

std::vector<std::string> Store::MakeDirRoom(uint64_t incoming, const std::string& keep) {
  std::vector<std::string> gone;
  const uint64_t budget = options_.dir_budget_bytes;
  while (budget != 0 && disk_bytes_ + incoming > budget) {
    auto lru = spilled_.end();
    for (auto it = spilled_.begin(); it != spilled_.end(); ++it) {
      if (it->first != keep && (lru == spilled_.end() || it->second.used < lru->second.used)) {
        lru = it;
      }
    }
    if (lru == spilled_.end()) break;
    WC_LOG_INFO("artifact %s (%llu bytes) removed from %s for --artifact_dir_budget",
                lru->first.c_str(), static_cast<unsigned long long>(lru->second.bytes),
                options_.dir.c_str());
    disk_bytes_ -= lru->second.bytes;
    gone.push_back(lru->first);
    spilled_.erase(lru);
    ++dir_evictions_;
  }
  // Under the lock: a put of the same id that starts now finds it gone and writes afresh.
  UnlinkFiles(gone);
  disk_bytes_ += incoming;
  return gone;
}

void Store::UnlinkFiles(const std::vector<std::string>& ids) const {
  for (const auto& id : ids) {
    const std::string base = options_.dir + "/" + id;
    ::unlink((base + ".json").c_str());  // first: without it the blob is not indexed
    ::unlink((base + ".blob").c_str());
  }
}

void Store::TouchOnDisk(const std::string& id) {
  {
    MutexLock l(mu_);
    auto it = spilled_.find(id);
    if (it == spilled_.end()) return;
    it->second.used = std::chrono::system_clock::now();
  }
  // The order across a restart (IndexDir reads it back); a failure only loses that.
  ::utimensat(AT_FDCWD, (options_.dir + "/" + id + ".json").c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
}

void Store::Spill(const Artifact& a) {
  if (options_.dir.empty()) return;
  if (options_.dir_budget_bytes != 0 && a.bytes() > options_.dir_budget_bytes) {
    WC_LOG_WARN("artifact %s (%llu bytes) not written to %s: larger than --artifact_dir_budget",
                a.id().c_str(), static_cast<unsigned long long>(a.bytes()), options_.dir.c_str());
    return;
  }
  {
    MutexLock l(mu_);
    MakeDirRoom(a.bytes(), a.id());  // counts its bytes now; given back if the write fails
  }
  const std::string base = options_.dir + "/" + a.id();
  const std::string blob_tmp = base + ".blob.tmp", meta_tmp = base + ".json.tmp";
  auto write = [&]() -> absl::Status {
    ScopedFd out(
        ::open(blob_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out) return ErrnoStatus(errno, "create", blob_tmp);
    WC_RETURN_IF_ERROR(CopyAll(a.fd(), out.get(), a.bytes(), blob_tmp));
    if (::fsync(out.get()) != 0) return ErrnoStatus(errno, "fsync", blob_tmp);
    if (::rename(blob_tmp.c_str(), (base + ".blob").c_str()) != 0) {
      return ErrnoStatus(errno, "rename", blob_tmp);
    }
    // The metadata last: its presence says the blob beside it is whole.
    {
      std::ofstream meta(meta_tmp, std::ios::trunc);
      meta << EncodeRecord(a) << "\n";
      if (!meta.flush()) return absl::InternalError(absl::StrCat("write ", meta_tmp, " failed"));
    }
    if (::rename(meta_tmp.c_str(), (base + ".json").c_str()) != 0) {
      return ErrnoStatus(errno, "rename", meta_tmp);
    }
    return absl::OkStatus();
  };
  if (auto s = write(); !s.ok()) {
    // Memory still serves it; only a restart would miss it.
    WC_LOG_WARN("artifact %s not written to %s: %s", a.id().c_str(), options_.dir.c_str(),
                std::string(s.message()).c_str());
    ::unlink(blob_tmp.c_str());
    ::unlink(meta_tmp.c_str());
    MutexLock l(mu_);
    disk_bytes_ -= a.bytes();
    return;
  }
  MutexLock l(mu_);
  spilled_[a.id()] =
      Spilled{a.key(), a.bytes(), a.sha256(), a.publisher(), std::chrono::system_clock::now()};
}

absl::StatusOr<std::shared_ptr<const Artifact>> Store::ReadSpilled(const std::string& id,
                                                                   const Spilled& s) {
  const std::string base = options_.dir + "/" + id;
  const std::string blob = base + ".blob";
  struct stat st {};
  // Never blocks: a FIFO, a directory or a link in the blob's place is refused at once.
  auto in = OpenRegular(blob, &st);
  if (!in.ok() && in.status().code() == absl::StatusCode::kNotFound) return in.status();
  std::string bad;
  if (!in.ok()) {
    bad = std::string(in.status().message());
  } else if (static_cast<uint64_t>(st.st_size) != s.bytes) {
    bad = absl::StrCat(blob, " holds ", st.st_size, " bytes, its metadata says ", s.bytes);
  }
  std::shared_ptr<const Artifact> a;
  if (bad.empty()) {
    WC_ASSIGN_OR_RETURN(ScopedFd fd, NewMemfd(id, s.bytes));
    WC_RETURN_IF_ERROR(CopyAll(in->get(), fd.get(), s.bytes, blob));
    WC_ASSIGN_OR_RETURN(ScopedFd ro, SealReadOnly(fd.get(), id));
    WC_ASSIGN_OR_RETURN(std::string sha, identity::Sha256File(ro.get(), s.bytes, blob));
    if (sha != s.sha256) {
      bad = absl::StrCat(blob, ": SHA-256 ", sha, ", its metadata says ", s.sha256);
    } else {
      a = std::make_shared<const Artifact>(std::move(ro), s.key, id, s.bytes, sha, s.publisher);
    }
  }
  if (!bad.empty()) {
    // Kept for whoever investigates, out of the index.
    ::rename(blob.c_str(), (blob + ".bad").c_str());
    ::rename((base + ".json").c_str(), (base + ".json.bad").c_str());
    MutexLock l(mu_);
    if (spilled_.erase(id) != 0) disk_bytes_ -= s.bytes;
    WC_LOG_ERROR("artifact %s set aside: %s", id.c_str(), bad.c_str());
    return absl::DataLossError(absl::StrCat("artifact ", id, " on disk is damaged: ", bad));
  }
  return a;
}

absl::StatusOr<std::shared_ptr<const Artifact>> Store::Get(
    const Key& key, bool wait, std::chrono::steady_clock::time_point deadline,
    const std::function<bool()>& gone) {
  WC_RETURN_IF_ERROR(ValidateKey(key));
  const std::string id = IdOf(key);
  Spilled spilled;
  {
    MutexLock l(mu_);
    while (wait && putting_.count(id) != 0 && resident_.count(id) == 0) {
      if (gone && gone()) return absl::CancelledError("the asker went away");
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("artifact ", id, " still being put"));
      }
      // Wakes at least every 100 ms to notice `gone`.
      cv_.WaitUntil(mu_, std::min(deadline, now + std::chrono::milliseconds(100)));
    }
    if (auto it = resident_.find(id); it != resident_.end()) {
      it->second.used = std::chrono::steady_clock::now();
      if (auto d = spilled_.find(id); d != spilled_.end()) {
        d->second.used = std::chrono::system_clock::now();
      }
      return it->second.artifact;
    }
    auto it = spilled_.find(id);
    if (it == spilled_.end()) {
      return absl::NotFoundError(absl::StrCat("no artifact ", key.kind, " for model '", key.model,
                                              "' with this key (", id, ")"));
    }
    spilled = it->second;
  }
  WC_ASSIGN_OR_RETURN(auto a, ReadSpilled(id, spilled));
  TouchOnDisk(id);
  std::vector<std::string> changed;
  {
    MutexLock l(mu_);
    if (auto it = resident_.find(id); it != resident_.end()) return it->second.artifact;
    // Evicted while it was read back: this asker gets what it asked for; memory keeps nothing.
    if (spilled_.count(id) == 0) return a;
    if (auto s = Insert(a, &changed); !s.ok()) {
      WC_LOG_WARN("artifact %s served from disk without staying in memory: %s", id.c_str(),
                  std::string(s.message()).c_str());
    } else {
      changed.push_back(id);
    }
  }
  Notify(changed);
  return a;
}

absl::StatusOr<std::shared_ptr<const Artifact>> Store::Adopt(ScopedFd fd, const Record& record) {
  const std::string& id = record.id;
  constexpr int kSealed = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW;
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) return ErrnoStatus(errno, "F_GET_SEALS (not a memfd?)", id);
  if ((seals & kSealed) != kSealed) {
    return absl::FailedPreconditionError(
        absl::StrCat("artifact ", id, ": its descriptor is not sealed against writes"));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat", id);
  if (static_cast<uint64_t>(st.st_size) != record.bytes) {
    return absl::DataLossError(absl::StrCat("artifact ", id, ": its memfd holds ", st.st_size,
                                            " bytes, its record says ", record.bytes));
  }
  WC_ASSIGN_OR_RETURN(std::string sha, identity::Sha256File(fd.get(), record.bytes, id));
  if (sha != record.sha256) {
    return absl::DataLossError(
        absl::StrCat("artifact ", id, ": SHA-256 ", sha, ", its record says ", record.sha256));
  }
  auto a = std::make_shared<const Artifact>(std::move(fd), record.key, id, record.bytes,
                                            std::move(sha), record.publisher);
  std::vector<std::string> changed;
  {
    MutexLock l(mu_);
    if (resident_.count(id) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("artifact ", id, " is held already"));
    }
    WC_RETURN_IF_ERROR(Insert(a, &changed));
  }
  changed.push_back(id);
  Notify(changed);
  return a;
}

void Store::SetObserver(std::function<void(const std::string& id)> changed) {
  changed_ = std::move(changed);
}

void Store::Notify(const std::vector<std::string>& ids) const {
  if (!changed_) return;
  for (const auto& id : ids) changed_(id);
}

std::shared_ptr<const Artifact> Store::InMemory(const std::string& id) const {
  MutexLock l(mu_);
  auto it = resident_.find(id);
  return it == resident_.end() ? nullptr : it->second.artifact;
}

std::vector<std::shared_ptr<const Artifact>> Store::ResidentArtifacts() const {
  MutexLock l(mu_);
  std::vector<std::shared_ptr<const Artifact>> out;
  out.reserve(resident_.size());
  for (const auto& [id, r] : resident_) out.push_back(r.artifact);
  return out;
}

bool Store::Evict(const std::string& id) {
  bool found = false, was_resident = false;
  {
    MutexLock l(mu_);
    if (auto it = resident_.find(id); it != resident_.end()) {
      resident_bytes_ -= it->second.artifact->bytes();
      resident_.erase(it);
      found = was_resident = true;
    }
    if (auto it = spilled_.find(id); it != spilled_.end()) {
      disk_bytes_ -= it->second.bytes;
      spilled_.erase(it);
      found = true;
    }
  }
  if (was_resident) Notify({id});
  if (found && !options_.dir.empty()) {
    const std::string base = options_.dir + "/" + id;
    ::unlink((base + ".json").c_str());  // first: without it the blob is not indexed
    ::unlink((base + ".blob").c_str());
  }
  return found;
}

std::vector<ArtifactInfo> Store::List() const {
  MutexLock l(mu_);
  std::map<std::string, ArtifactInfo> out;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [id, r] : resident_) {
    auto& i = out[id];
    i.artifact = r.artifact;
    i.id = id;
    i.key = r.artifact->key();
    i.bytes = r.artifact->bytes();
    i.sha256 = r.artifact->sha256();
    i.publisher = r.artifact->publisher();
    i.resident = true;
    i.idle_seconds = std::chrono::duration<double>(now - r.used).count();
  }
  for (const auto& [id, s] : spilled_) {
    auto& i = out[id];
    if (!i.resident) {
      i.id = id;
      i.key = s.key;
      i.bytes = s.bytes;
      i.sha256 = s.sha256;
      i.publisher = s.publisher;
    }
    i.on_disk = true;
  }
  std::vector<ArtifactInfo> v;
  v.reserve(out.size());
  for (auto& [id, i] : out) v.push_back(std::move(i));
  return v;
}

Usage Store::usage() const {
  MutexLock l(mu_);
  Usage u;
  u.resident_bytes = resident_bytes_;
  u.budget_bytes = options_.budget_bytes;
  u.resident = resident_.size();
  u.on_disk = spilled_.size();
  u.evictions = evictions_;
  u.puts_in_flight = putting_.size();
  u.reserved_bytes = reserved_bytes_;
  u.disk_bytes = disk_bytes_;
  u.dir_budget_bytes = options_.dir_budget_bytes;
  u.dir_evictions = dir_evictions_;
  return u;
}

}  // namespace weightcache::artifact
