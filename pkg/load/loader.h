// Loads a planned model-rank into segments of a memory backend: parallel preads straight
// into host-addressable segments (host backend); for cuda-vmm segments, the scatter plan
// (scatter.h) through a ring of pinned staging buffers whose asynchronous host->device
// copies overlap the next reads; for any other backend, through a bounded staging buffer
// and CopyIn. LoadRanks loads a tensor-parallel group reading each byte once.
// Segments are sealed before Load returns. Progress is published through LoadProgress,
// which other threads may read at any time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/load/plan.h"
#include "pkg/load/staging_pool.h"
#include "pkg/memory/backend.h"
#include "pkg/util/mutex.h"

namespace weightcache::load {

class LoadProgress {
 public:
  void SetTotal(uint64_t total) { total_.store(total); }
  void Add(uint64_t bytes) { done_.fetch_add(bytes); }
  void SetDone(uint64_t bytes) { done_.store(bytes); }
  void SetFile(const std::string& f) {
    MutexLock l(mu_);
    file_ = f;
  }
  uint64_t done() const { return done_.load(); }
  uint64_t total() const { return total_.load(); }
  // Asks the load to stop: its reads fail with CANCELLED at the next chunk (16 MiB host,
  // one staging buffer GPU), and the loader returns that status.
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  const std::atomic<bool>* cancel_flag() const { return &cancelled_; }
  std::string file() const {
    MutexLock l(mu_);
    return file_;
  }

 private:
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> total_{0};
  std::atomic<bool> cancelled_{false};
  mutable Mutex mu_;
  std::string file_ ABSL_GUARDED_BY(mu_);
};

// Per-stage timings of one load (GPU path; the other paths fill seconds and bytes_read only).
struct LoadStats {
  double seconds = 0;            // LoadRank, from the first allocation to the last seal
  double read_seconds = 0;       // blocked on preads (GPU path: they run ahead on workers)
  double wait_seconds = 0;       // blocked on host->device copies: a free staging buffer, the drain
  uint64_t bytes_read = 0;       // from files, alignment padding included
  uint32_t files = 0;            // files read
  uint32_t direct_files = 0;     // of which with O_DIRECT
  double alloc_seconds = 0;      // allocating the segments (backend.Allocate)
  double staging_seconds = 0;    // taking the staging ring (pinning what the pool lacked)
  uint32_t staging_buffers = 0;  // in the ring
  uint32_t staging_reused = 0;   // of which already pinned (from LoadOptions::staging_pool)
  // Pinned digests checked in the load's pass: bytes hashed from the load's own reads, and
  // bytes the check read itself (headers, what no plan of this load reads, chunks read too
  // far ahead of the hash). Both 0 when nothing was pinned or this node knew the files.
  uint64_t pin_followed_bytes = 0;
  uint64_t pin_reread_bytes = 0;
  // How the check paced the reads: holes a hasher read because no hash moved while an
  // O_DIRECT reader waited, and the seconds readers waited for room in the hold (summed).
  uint64_t pin_holes_filled = 0;
  double pin_room_wait_seconds = 0;
  // Seconds the check's hashers spent in SHA-256 over the load's bytes, summed over them:
  // pin_followed_bytes / pin_hash_seconds is one hasher's rate while it hashed.
  double pin_hash_seconds = 0;
  // Seconds from the load's last read to the check's verdict: the hashing left behind when
  // the reads ended (at most about the hold, LoadOptions::pin_hold_bytes, at one core's
  // SHA-256 a file) and what the check read itself.
  double pin_finish_seconds = 0;
};

struct LoadedModel {
  Plan plan;
  LoadStats stats;
  std::vector<std::unique_ptr<memory::Segment>> segments;  // sealed
  std::string device_uuid;
  std::string model_dir;  // the checkpoint it came from
  // Names this memory (not its content: two copies of one fingerprint differ): drawn at random
  // when it first becomes ready (cache::Registry), kept across a daemon restart by the keeper
  // record. A client that lost its daemon re-attaches its lease only to memory of the same id.
  std::string content_id;
  // How these bytes were first filled, wherever they went since (a keeper, another daemon):
  // "disk" (read from the checkpoint and hashed), "peer_fill_pinned" (pulled from a peer and
  // checked against an admin's pinned digests), "peer_fill" (pulled, vouched for by a quorum or
  // one holder), "publish". Empty: the entry's own source says it. The keeper record carries
  // it; a peer's quorum counts only holders whose copies came from disk or a pinned anchor.
  std::string origin;
  uint64_t resident_bytes() const;
};

// GPU path: how checkpoint files are read into the pinned staging ring. kAuto: O_DIRECT for a
// file that is mostly not in the page cache (sampled with mincore), the page cache for one
// that is (a second load of a hot file is a memory copy, not a disk read). Falls back to the
// page cache where the file system refuses O_DIRECT (tmpfs).
enum class DirectIo { kOff, kOn, kAuto };

// Defaults from bench/load_bench.cc on the H200 machine (docs/benchmarks.md, "Cold load"):
// 16 threads, 256 MiB of staging in 4 buffers and O_DIRECT for cold files read 8 GiB at
// 1.86 GB/s cold and 35 GB/s hot, against 1.61 / 33.9 GB/s with 1 GiB in 8 buffers (which
// also takes 4x as long to pin) and 1.32 / 27.5 GB/s with 8 threads through the page cache.
struct LoadOptions {
  unsigned read_threads = 16;
  uint64_t chunk_bytes = 16ull << 20;
  // For backends without host_data(): bytes of staging in all, split into staging_buffers
  // pinned buffers on the GPU path (each no larger than the model needs).
  uint64_t staging_bytes = 256ull << 20;
  unsigned staging_buffers = 4;
  DirectIo direct_io = DirectIo::kAuto;
  // GPU path: where the pinned staging buffers come from. Null: pinned for this load and
  // freed after it. The daemon passes one pool for its lifetime (staging_pool.h).
  StagingPool* staging_pool = nullptr;
  // Every chunk the load reads, as it lands (safetensors::ReadOptions::tap): LoadRank and
  // LoadRanks set it themselves to check pinned digests in the same pass.
  const safetensors::ReadTap* read_tap = nullptr;
  // Files read side by side: a group load's staging buffers, or a lone host rank's reads
  // (chunk by chunk), take turns across this many files; 1 reads the files one after
  // another. 0: kPinnedFilesSideBySide where the load checks pinned digests (each file's
  // SHA-256 is one core's, about 1 GB/s, a cold NVMe read 2-7 GB/s), else 1. (A lone rank
  // on the GPU reads through the group path.)
  size_t files_side_by_side = 0;
  static constexpr size_t kPinnedFilesSideBySide = 4;
  // Pinned loads: bytes of chunks read ahead of a file's hash cursor held aside (copied)
  // while the load goes on (identity::FollowingSha256): past it a chunk read through the page
  // cache is left and read again by the check, one read with O_DIRECT waits for room. Twice
  // the staging ring (4 buffers of 64 MiB), which takes up to 4 files in turn.
  uint64_t pin_hold_bytes = 512ull << 20;
};

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadRank(
    const OpenedModel& model, Plan plan, memory::Backend& backend, const std::string& device_uuid,
    const std::string& label, const LoadOptions& options, LoadProgress* progress);

// Loads several ranks of one opened model (a tensor-parallel group, each plans[i] made by
// PlanRank) in ONE pass over the files (scatter.h): every checkpoint byte the group needs
// is read once and copied to each rank that needs it, row-parallel shards as 2-D copies.
// plans[i] lands on device_uuids[i] ("" = the backend's default; ranks may share a device)
// in segments labelled labels[i]. Results in plan order; every LoadedModel carries the
// group's stats (bytes_read is the group's). One plan is LoadRank.
absl::StatusOr<std::vector<std::unique_ptr<LoadedModel>>> LoadRanks(
    const OpenedModel& model, std::vector<Plan> plans, memory::Backend& backend,
    const std::vector<std::string>& device_uuids, const std::vector<std::string>& labels,
    const LoadOptions& options, LoadProgress* progress);

}  // namespace weightcache::load
