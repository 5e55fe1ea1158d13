#include "pkg/server/peer/peer_exposures.h"

#include <fcntl.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::server {

PeerExposures::PeerExposures(std::unique_ptr<peer::UcxServer> ucx, std::string why,
                             memory::BackendKind kind, std::chrono::milliseconds hold)
    : ucx_(std::move(ucx)), why_(std::move(why)), kind_(kind), hold_(hold) {
  if (ucx_ != nullptr) reaper_ = std::thread([this] { ReapLoop(); });
}

PeerExposures::~PeerExposures() {
  std::map<const load::LoadedModel*, Exposure> all;
  {
    MutexLock l(mu_);
    stop_ = true;
    all.swap(exposures_);
  }
  cv_.NotifyAll();
  if (reaper_.joinable()) reaper_.join();
  for (auto& [key, e] : all) Unexpose(e);
}

absl::StatusOr<PeerExposures::Exposure> PeerExposures::Make(
    std::shared_ptr<const load::LoadedModel> content) const {
  std::vector<ScopedFd> fds;
  std::vector<uint64_t> sizes;
  for (const auto& seg : content->segments) {
    const int dup = fcntl(seg->fd(), F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return ErrnoStatus(errno, "peer transfer: dup", "a segment");
    fds.emplace_back(dup);
    sizes.push_back(seg->size());
  }
  Exposure e;
  const std::string device =
      kind_ == memory::BackendKind::kHost ? std::string() : content->device_uuid;
  auto mapping = memory::MapReadOnly(kind_, std::move(fds), sizes, device);
  if (!mapping.ok()) return mapping.status();
  e.mapping = std::move(mapping).value();
  for (size_t i = 0; i < sizes.size(); ++i) {
    // Host memory is copied into the replies as it is; GPU memory (Debian's UCX has no CUDA)
    // through a device-to-host copy of each requested range.
    absl::StatusOr<peer::ExposedRegion> region;
    if (kind_ == memory::BackendKind::kHost) {
      region = ucx_->Expose(e.mapping->base(i), sizes[i]);
    } else {
      region = ucx_->Expose(sizes[i], [kind = kind_, device, base = e.mapping->base(i)](
                                          uint64_t offset, void* dst, uint64_t n) {
        return memory::CopyToHost(kind, device, base + offset, n, dst);
      });
    }
    if (!region.ok()) {
      Unexpose(e);
      return region.status();
    }
    e.regions.push_back(*std::move(region));
  }
  e.content = std::move(content);
  return e;
}

void PeerExposures::Unexpose(Exposure& e) const {
  for (const peer::ExposedRegion& r : e.regions) {
    if (absl::Status s = ucx_->Unexpose(r.id); !s.ok()) {
      WC_LOG_WARN("peer transfer: unexpose: %s", std::string(s.message()));
    }
  }
  e.regions.clear();
  e.mapping.reset();  // only once no region of it is registered
}

namespace {

void Describe(const std::string& worker_address, const std::vector<peer::ExposedRegion>& regions,
              std::chrono::milliseconds hold, v1::PeerTransfer* out) {
  *out = v1::PeerTransfer();
  out->set_worker_address(worker_address);
  for (const peer::ExposedRegion& r : regions) {
    v1::PeerRegion* p = out->add_regions();
    p->set_length(r.length);
    p->set_token(r.token);
  }
  out->set_hold_ms(static_cast<uint64_t>(hold.count()));
}

}  // namespace

absl::Status PeerExposures::Expose(std::shared_ptr<const load::LoadedModel> content,
                                   v1::PeerTransfer* out) {
  if (ucx_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("no transfers from this daemon: ", why_));
  }
  const load::LoadedModel* key = content.get();
  {
    MutexLock l(mu_);
    if (stop_) return absl::UnavailableError("the daemon is stopping");
    if (auto it = exposures_.find(key); it != exposures_.end()) {
      it->second.until = Clock::now() + hold_;
      Describe(ucx_->worker_address(), it->second.regions, hold_, out);
      return absl::OkStatus();
    }
  }
  // Mapped and registered outside the lock (a large model takes a while). Two Describes of
  // the same content at once may both get here: the later one's exposure is undone.
  auto made = Make(std::move(content));
  if (!made.ok()) return made.status();
  MutexLock l(mu_);
  if (stop_) {
    Unexpose(*made);
    return absl::UnavailableError("the daemon is stopping");
  }
  auto [it, inserted] = exposures_.try_emplace(key);
  if (inserted) {
    it->second = *std::move(made);
  } else {
    Unexpose(*made);
  }
  it->second.until = Clock::now() + hold_;
  if (inserted) cv_.NotifyAll();  // the reaper's next deadline may be this one
  Describe(ucx_->worker_address(), it->second.regions, hold_, out);
  return absl::OkStatus();
}

size_t PeerExposures::active() const {
  MutexLock l(mu_);
  return exposures_.size();
}

void PeerExposures::ReapLoop() {
  for (;;) {
    std::vector<Exposure> lapsed;
    {
      MutexLock l(mu_);
      while (!stop_) {
        const Clock::time_point now = Clock::now();
        Clock::time_point next = now + hold_;
        for (auto it = exposures_.begin(); it != exposures_.end();) {
          if (it->second.until <= now) {
            lapsed.push_back(std::move(it->second));
            it = exposures_.erase(it);
          } else {
            next = std::min(next, it->second.until);
            ++it;
          }
        }
        if (!lapsed.empty()) break;
        cv_.WaitUntil(mu_, next);
      }
      if (lapsed.empty()) return;  // stopping: the destructor unexposes the rest
    }
    // Outside the lock; the content may be freed here (an evicted entry's last reference).
    for (Exposure& e : lapsed) Unexpose(e);
  }
}

}  // namespace weightcache::server
