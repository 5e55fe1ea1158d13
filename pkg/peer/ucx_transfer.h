// Segment bytes between node daemons over UCX (UCP, Debian's UCX 1.13: TCP, shared memory,
// verbs), the transport of peer fill (issue 30, docs/peer-fill.md). The serving daemon
// registers the memory it may serve (ucp_mem_map of an existing mapping) and hands out, through
// the peer API, its worker's address and one packed remote key per region; the filling daemon
// connects to that worker and pulls a region with RMA gets in chunks, a window of them in
// flight, into memory it owns. No listener or port of its own: the worker address carries the
// interfaces to connect to.
//
// Failure is an answer, never a hang: endpoints use UCP_ERR_HANDLING_MODE_PEER (a serving
// process that dies fails the outstanding gets), and every pull has a deadline (a serving
// process that stops answering, or a network that drops everything, ends the pull with
// DEADLINE_EXCEEDED). Over TCP the server's worker must progress to answer gets: UcxServer
// does on its own thread, asleep on the worker's event descriptor when idle.
//
// Thread-safety: UcxServer's methods may be called from any thread. A UcxPuller serves one
// Pull at a time (calls are serialized). Lifetimes: memory registered with Expose must stay
// mapped until Unexpose returns; a UcxServer must outlive nothing of the peers (a peer that
// pulls from a destroyed server gets an error).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace weightcache::peer {

// A registered region as a peer sees it: where it is in the server's address space and the
// packed remote key that lets the peer's endpoint read it.
struct ExposedRegion {
  uint64_t id = 0;  // for Unexpose
  uint64_t address = 0;
  uint64_t length = 0;
  std::string rkey;  // ucp_rkey_pack's bytes
};

class UcxServer {
 public:
  // A UCP context and worker with their progress thread. UNAVAILABLE naming the UCX call when
  // UCX cannot start (no transport; UCX_TLS honoured).
  static absl::StatusOr<std::unique_ptr<UcxServer>> Start();
  ~UcxServer();
  UcxServer(const UcxServer&) = delete;
  UcxServer& operator=(const UcxServer&) = delete;

  // The worker's address (ucp_worker_get_address): what a peer connects to.
  const std::string& worker_address() const;
  // Registers [base, base + length) for remote reads.
  absl::StatusOr<ExposedRegion> Expose(const void* base, uint64_t length);
  // Unregisters; NOT_FOUND for an unknown id. Gets in flight on it fail.
  absl::Status Unexpose(uint64_t id);
  size_t exposed() const;

 private:
  struct State;
  explicit UcxServer(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

struct PullOptions {
  uint64_t chunk_bytes = 4ull << 20;  // docs/peer-fill.md: 1-4 MiB x 1-4 in flight on TCP
  unsigned inflight = 4;
  std::chrono::milliseconds timeout{30000};  // the whole pull
  // Tests only: called after each chunk completed with the bytes done so far (to kill or
  // stop the serving process at a known point). Null in production.
  std::function<void(uint64_t done)> after_chunk;
};

class UcxPuller {
 public:
  static absl::StatusOr<std::unique_ptr<UcxPuller>> Create();
  ~UcxPuller();
  UcxPuller(const UcxPuller&) = delete;
  UcxPuller& operator=(const UcxPuller&) = delete;

  // Reads [remote_address, remote_address + length) of the region whose key is `rkey` at the
  // worker `worker_address` into dst. INVALID_ARGUMENT for an address or key UCX cannot
  // unpack; UNAVAILABLE naming the UCX status when the peer is unreachable or goes away;
  // DEADLINE_EXCEEDED past options.timeout. dst's contents are unspecified after an error.
  absl::Status Pull(const std::string& worker_address, const std::string& rkey,
                    uint64_t remote_address, void* dst, uint64_t length,
                    const PullOptions& options);

 private:
  struct State;
  explicit UcxPuller(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace weightcache::peer
