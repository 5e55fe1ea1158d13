// Segment bytes between node daemons over UCX (UCP, Debian's UCX 1.13: TCP, shared memory,
// verbs), the transport of peer fill (issue 30, docs/peer-fill.md). The serving daemon exposes
// the memory it may serve; each region gets a random 16-byte token, handed out through the
// peer API (mutual TLS) with the server worker's address. The filling daemon connects to that
// worker and asks for a region's bytes in chunks, a window of them in flight, naming the token;
// the server answers each request with a copy of the bytes it names (active messages), and
// only from an exposed region, inside its bounds.
//
// Why not RMA gets (the first version): over TCP, UCX does not confine gets to registered
// memory. A peer's get reads any address of a worker that enables RMA, with the key of any
// region or one it packed itself, and still reads after the region is unregistered (measured:
// docs/peer-fill.md, "Why the transport is not RMA over TCP"). The serving worker here enables
// active messages only: a forged get finds no handler and is dropped
// (UcxTransferTest.AForgedGetIsNeverAnswered).
//
// Failure is an answer, never a hang: endpoints use UCP_ERR_HANDLING_MODE_PEER (a serving
// process that dies fails the outstanding requests), and every pull has a deadline (a serving
// process that stops answering ends the pull with DEADLINE_EXCEEDED). The server's worker
// progresses on its own thread, asleep on the worker's event descriptor when idle.
//
// Thread-safety: UcxServer's methods may be called from any thread. A UcxPuller serves one
// Pull at a time (calls are serialized). Lifetimes: memory exposed with Expose must stay
// mapped until Unexpose returns (replies are copies made under the server's lock).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace weightcache::peer {

// An exposed region as a peer sees it: its length and the token a request must name.
struct ExposedRegion {
  uint64_t id = 0;  // for Unexpose
  uint64_t length = 0;
  std::string token;  // kTokenBytes random bytes (getrandom)
};
inline constexpr size_t kTokenBytes = 16;
// The largest chunk one request may ask for (a reply is a copy of this size at most).
inline constexpr uint64_t kMaxChunkBytes = 16ull << 20;

class UcxServer {
 public:
  // A UCP context (active messages only) and worker with their progress thread. UNAVAILABLE
  // naming the UCX call when UCX cannot start (no transport; UCX_TLS honoured).
  // `max_reply_bytes`: bytes of reply copies in flight at once, over all peers; a request
  // past it is answered "busy" and asked again by the puller.
  static absl::StatusOr<std::unique_ptr<UcxServer>> Start(uint64_t max_reply_bytes = 256ull << 20);
  ~UcxServer();
  UcxServer(const UcxServer&) = delete;
  UcxServer& operator=(const UcxServer&) = delete;

  // The worker's address (ucp_worker_get_address): what a peer connects to.
  const std::string& worker_address() const;
  // Serves [base, base + length) to requests naming the returned token.
  absl::StatusOr<ExposedRegion> Expose(const void* base, uint64_t length);
  // Copies [offset, offset + n) of a region into the host buffer `dst` (GPU memory: a
  // device-to-host copy). Called on the server's progress thread, under the lock Unexpose
  // takes; an error answers the request "read failed" (the puller's UNAVAILABLE).
  using RegionReader = std::function<absl::Status(uint64_t offset, void* dst, uint64_t n)>;
  // Serves a region of `length` bytes that `read` copies out, to requests naming the token.
  absl::StatusOr<ExposedRegion> Expose(uint64_t length, RegionReader read);
  // Stops serving it (later requests are refused; no reply reads it after this returns);
  // NOT_FOUND for an unknown id.
  absl::Status Unexpose(uint64_t id);
  size_t exposed() const;
  // Requests answered "busy" so far (replies in flight were at max_reply_bytes).
  uint64_t busy_replies() const;

 private:
  struct State;
  explicit UcxServer(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

struct PullOptions {
  // 1 MiB x 4: the best of the chunk x window grid on the H200 machine (3.07 GB/s against
  // 2.36 for 4 MiB x 4) and on a busy 2-core machine (docs/benchmarks.md).
  uint64_t chunk_bytes = 1ull << 20;  // at most kMaxChunkBytes
  unsigned inflight = 4;
  std::chrono::milliseconds timeout{30000};  // the whole pull
  // Called (on the pulling thread) after each chunk completed with the chunks done so far
  // times chunk_bytes, capped at the length: the fill's progress, and tests' way to kill or
  // stop the serving process at a known point. May be null.
  std::function<void(uint64_t done)> after_chunk;
};

class UcxPuller {
 public:
  static absl::StatusOr<std::unique_ptr<UcxPuller>> Create();
  ~UcxPuller();
  UcxPuller(const UcxPuller&) = delete;
  UcxPuller& operator=(const UcxPuller&) = delete;

  // Reads [offset, offset + length) of the region whose token is `token` at the worker
  // `worker_address` into dst. INVALID_ARGUMENT for bad arguments; NOT_FOUND when the server
  // does not expose such a region (a wrong token, or unexposed meanwhile); OUT_OF_RANGE past
  // the region's end; UNAVAILABLE naming the UCX status when the peer is unreachable or goes
  // away; DEADLINE_EXCEEDED past options.timeout. dst's contents are unspecified after an
  // error.
  absl::Status Pull(const std::string& worker_address, const std::string& token, uint64_t offset,
                    void* dst, uint64_t length, const PullOptions& options);

 private:
  struct State;
  explicit UcxPuller(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace weightcache::peer
