// A file's SHA-256 taken from the bytes a load reads anyway (issue 58: one read per byte).
// The load's reads are parallel and out of order; the hash is sequential. Each read chunk is
// offered as it lands: one at the file's hash cursor is hashed in place (by the thread that
// read it, before its buffer is reused), one ahead of the cursor is copied aside while the
// bytes held stay under `hold_bytes` (else it is left, and read again at Finish), and the
// held chunks are hashed as the cursor reaches them. What no reader offered (the header, a
// tensor the plan does not read, a chunk left) is read by Finish itself: `reread_bytes`.
//
// A file whose every byte is hashed during the load is reported at once (`on_file`, from the
// thread that hashed its last byte), so a mismatch can stop the load mid-way.
//
// Thread-safety: Offer from any thread, concurrently; Finish once, after the last
// Offer has returned. The descriptors must stay open until Finish returns.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
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
  // `on_file(index, "sha256:<hex>")`: a file hashed whole during the load.
  FollowingSha256(std::vector<File> files, uint64_t hold_bytes,
                  std::function<void(size_t, const std::string&)> on_file);
  ~FollowingSha256();
  FollowingSha256(const FollowingSha256&) = delete;
  FollowingSha256& operator=(const FollowingSha256&) = delete;

  // Hashes file i's first `n` bytes reading them itself (a safetensors header: read once
  // at open, never by the load), so the cursor starts where the load's reads do.
  absl::Status Start(size_t i, uint64_t n);
  // Bytes [offset, offset + n) of the file open as `fd`, as a reader read them. Another
  // descriptor of a followed file (the load's O_DIRECT one) is that file (same device and
  // inode); a descriptor of no followed file is ignored.
  void Offer(int fd, uint64_t offset, const void* data, uint64_t n);
  // Every file's digest ("sha256:<hex>", in the order given), reading what was not offered,
  // up to `threads` files side by side. CANCELLED when `cancel` turns true meanwhile; the
  // read's error naming the file.
  absl::StatusOr<std::vector<std::string>> Finish(const std::atomic<bool>* cancel = nullptr,
                                                  unsigned threads = 1);

  uint64_t reread_bytes() const { return reread_.load(); }
  uint64_t followed_bytes() const { return followed_.load(); }

 private:
  struct State;
  State* Find(int fd);
  void Drain(State& s);                          // hashes held chunks the cursor has reached
  bool Complete(State& s, std::string* digest);  // finalizes when the cursor is at the end
  absl::Status ReadAhead(State& s, uint64_t end, const std::atomic<bool>* cancel);
  absl::Status FinishOne(State& s, const std::atomic<bool>* cancel);  // takes s.mu

  std::vector<std::unique_ptr<State>> files_;
  Mutex alias_mu_;
  // Other descriptors seen, by number: the file's index, or -1 for none followed.
  std::vector<std::pair<int, long>> aliases_ ABSL_GUARDED_BY(alias_mu_);
  const uint64_t hold_bytes_;
  std::atomic<uint64_t> held_{0}, reread_{0}, followed_{0};
  std::function<void(size_t, const std::string&)> on_file_;
};

}  // namespace weightcache::identity
