// A file's SHA-256 taken from the bytes a load reads anyway (issue 58: one read per byte).
// The load's reads are parallel and out of order; the hash is sequential. Each read chunk is
// offered as it lands and copied aside (its buffer is the load's, reused at once); hasher
// threads of this object hash each file's held chunks as its cursor reaches them, files side
// by side, so a reader only copies and goes on reading (the load is not paced by one core's
// SHA-256 per file). The bytes held stay about `hold_bytes`: a chunk at a file's cursor is
// always taken; one ahead of it that finds the hold full waits for room when it came through
// an O_DIRECT descriptor (storage would otherwise be read twice), and otherwise is left: the
// file's hasher reads it itself when its cursor gets there (so a left chunk costs that chunk,
// not the rest of the file). A waiting chunk the cursor reaches is taken then (it is the
// chunk the hash waits for). Where no hash has moved for `stall` while an O_DIRECT reader
// waits (a cursor's chunk is slow, or in a range no reader reads), the hasher of the file with
// the smallest hole before its held chunks reads that hole itself: an O_DIRECT reader never
// leaves its chunk. (On an H100 the rule before, "leave when no hash moves at this instant",
// left most of a cold load, 7.5 of 8.6 GB read twice: the hash had stopped at the very chunk
// a waiting reader held.) What no reader offered (the header, a tensor the plan does not
// read) is read by a hole's hasher or by Finish. Both: `reread_bytes`.
//
// A file whose every byte is hashed during the load is reported at once (`on_file`, from the
// hasher thread that hashed its last byte), so a mismatch can stop the load mid-way.
//
// Thread-safety: Offer from any thread, concurrently; Finish once, after the last
// Offer has returned. The descriptors must stay open until Finish returns; the destructor
// stops the hashers (after Finish, or dropping what they held).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/util/mutex.h"

namespace weightcache::identity {

class FollowingSha256 {
 public:
  struct File {
    int fd = -1;
    uint64_t size = 0;
    std::string path;  // for errors
  };
  // `on_file(index, "sha256:<hex>")`: a file hashed whole during the load. `hashers`: threads
  // hashing files side by side (0: one per file, at most half the machine's cores, at least 2).
  FollowingSha256(std::vector<File> files, uint64_t hold_bytes,
                  std::function<void(size_t, const std::string&)> on_file, unsigned hashers = 0,
                  std::chrono::milliseconds stall = std::chrono::milliseconds(50));
  ~FollowingSha256();
  FollowingSha256(const FollowingSha256&) = delete;
  FollowingSha256& operator=(const FollowingSha256&) = delete;

  // Hashes file i's first `n` bytes reading them itself (a safetensors header: read once
  // at open, never by the load), so the cursor starts where the load's reads do.
  absl::Status Start(size_t i, uint64_t n);
  // Bytes [offset, offset + n) of the file open as `fd`, as a reader read them: copied (or
  // left, see above); the caller may reuse `data` when this returns. Another descriptor of a
  // followed file (the load's O_DIRECT one) is that file (same device and inode); a
  // descriptor of no followed file is ignored.
  void Offer(int fd, uint64_t offset, const void* data, uint64_t n);
  // Every file's digest ("sha256:<hex>", in the order given), once the hashers have hashed
  // what they hold, reading what was not offered, up to `threads` files side by side. CANCELLED
  // when `cancel` turns true meanwhile; the read's error naming the file.
  absl::StatusOr<std::vector<std::string>> Finish(const std::atomic<bool>* cancel = nullptr,
                                                  unsigned threads = 1);

  // Bytes hashed from offers (final once Finish returned) and read by Finish itself.
  uint64_t reread_bytes() const { return reread_.load(); }
  uint64_t followed_bytes() const { return followed_.load(); }
  // Holes a stalled O_DIRECT reader had a hasher read (see above).
  uint64_t holes_filled() const { return holes_filled_.load(); }
  // Seconds O_DIRECT readers waited for room in the hold, summed over the readers.
  double room_wait_seconds() const { return static_cast<double>(room_wait_ns_.load()) / 1e9; }
  // Seconds the hashers spent in SHA-256 over offered chunks, summed over the hashers:
  // followed_bytes() / hash_seconds() is the rate one hasher hashed at while it hashed (against
  // an idle core's, it says whether the hash was slowed or waited for its chunks).
  double hash_seconds() const { return static_cast<double>(hash_ns_.load()) / 1e9; }

 private:
  struct State;
  State* Find(int fd);
  // Takes room in the hold for s's chunk [offset, +n) ahead of its cursor (or, when the
  // cursor reaches it while it waits, as a chunk at the cursor).
  bool Admit(State& s, int fd, uint64_t offset, uint64_t n);
  void FillHole();  // a stalled hold: a hasher reads the smallest hole before held chunks
  void NoteWait(std::chrono::steady_clock::time_point from);  // into room_wait_ns_
  void Hasher();                                              // a hasher thread's loop
  void HashHeld(State& s);  // hashes s's held chunks at its cursor
  // Offered bytes at s's cursor into its hash (timed: hash_ns_), by the one thread using s.ctx.
  void HashFollowed(State& s, const uint8_t* data, uint64_t n);
  void Left(State& s, uint64_t offset, uint64_t n);     // a chunk not taken: the hasher reads it
  bool ReadGap(State& s, uint64_t from, uint64_t end);  // false: read failed, turn ended
  void Queue(State& s);                                 // a turn for s
  void Released(uint64_t n);                            // held bytes hashed or dropped: room
  void Drain(State& s);                          // Finish: held chunks the cursor has reached
  bool Complete(State& s, std::string* digest);  // finalizes when the cursor is at the end
  // Reads [*at, end) of s's file into its hash, moving *at (s.cursor under s.mu, or a
  // gap's position by the turn's hasher); the read's error names the file and the byte.
  absl::Status ReadHashed(State& s, uint64_t* at, uint64_t end, const std::atomic<bool>* cancel);
  absl::Status FinishOne(State& s, const std::atomic<bool>* cancel);  // takes s.mu

  std::vector<std::unique_ptr<State>> files_;
  Mutex alias_mu_;
  // Other descriptors seen, by number: the file's index, or -1 for none followed.
  std::vector<std::pair<int, long>> aliases_ ABSL_GUARDED_BY(alias_mu_);
  const uint64_t hold_bytes_;
  const std::chrono::milliseconds stall_;
  std::atomic<uint64_t> held_{0}, reread_{0}, followed_{0}, holes_filled_{0}, room_wait_ns_{0},
      hash_ns_{0};
  std::function<void(size_t, const std::string&)> on_file_;
  // The hashers: files with a held chunk at their cursor, queued once each (State::queued).
  Mutex pool_mu_;
  CondVar work_cv_, room_cv_;  // work queued; held bytes released or a file's turn ended
  std::deque<State*> ready_ ABSL_GUARDED_BY(pool_mu_);
  size_t turns_ ABSL_GUARDED_BY(pool_mu_) = 0;  // files queued or being hashed
  bool stop_ ABSL_GUARDED_BY(pool_mu_) = false;
  std::vector<std::thread> hashers_;
};

}  // namespace weightcache::identity
