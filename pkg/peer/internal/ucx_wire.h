// UCX plumbing shared by the transfer's server and puller (ucx_transfer.h): contexts,
// workers, active-message handlers, and the wire of a read (request and reply). Not a public
// header.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "pkg/peer/ucx_transfer.h"

namespace weightcache::peer {

// UNAVAILABLE naming the UCX call and its status.
absl::Status UcxError(const char* call, ucs_status_t s);
absl::StatusOr<ucp_context_h> MakeContext(uint64_t features, bool shared);
absl::StatusOr<ucp_worker_h> MakeWorker(ucp_context_h ctx, ucs_thread_mode_t mode);
absl::Status SetHandler(ucp_worker_h w, uint16_t id, ucp_am_recv_callback_t cb, void* arg);

// The wire: a request names a region by token and a byte range; the reply carries the status
// and, when it is kOk, exactly the bytes asked for. Both sides run on one machine type (x86-64
// little-endian daemons of one fleet); the structs are packed by hand to fixed sizes.
constexpr uint16_t kReadRequestId = 1;
constexpr uint16_t kReadReplyId = 2;

struct ReadRequest {
  char token[kTokenBytes];
  uint64_t offset;
  uint64_t length;
  uint64_t tag;  // the puller's: which pull and chunk this answers
};
static_assert(sizeof(ReadRequest) == 40);

enum ReplyStatus : uint32_t {
  kOk = 0,
  kUnknownRegion = 1,
  kOutOfRange = 2,
  kBusy = 3,
  kReadFailed = 4
};

struct ReadReply {
  uint64_t tag;
  uint32_t status;
  uint32_t reserved;
};
static_assert(sizeof(ReadReply) == 16);

}  // namespace weightcache::peer
