// The transfer's server (ucx_transfer.h): exposed regions answered from a worker thread of
// its own; a reply is the asked bytes or a status.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/peer/internal/ucx_wire.h"
#include "pkg/peer/ucx_transfer.h"

namespace weightcache::peer {

namespace {

struct Region {
  const std::byte* base = nullptr;  // null: `read` copies
  UcxServer::RegionReader read;
  uint64_t length = 0;
  std::string token;
};

// One reply in flight: its header and the copy of the bytes, freed when the send completes.
struct ReplyBlock {
  std::atomic<uint64_t>* in_flight;
  uint64_t bytes;
  ReadReply header;
  // the data follows
  std::byte* data() { return reinterpret_cast<std::byte*>(this + 1); }
};

void FreeReply(ReplyBlock* b) {
  b->in_flight->fetch_sub(b->bytes);
  std::free(b);
}

void OnReplySent(void* req, ucs_status_t /*status*/, void* user) {
  FreeReply(static_cast<ReplyBlock*>(user));
  ucp_request_free(req);
}

}  // namespace

struct UcxServer::State {
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  std::string address;
  int worker_fd = -1;
  int stop_fd = -1;
  uint64_t max_reply_bytes = 0;
  std::atomic<bool> stop{false};
  std::thread progress;
  mutable std::mutex mu;
  std::map<uint64_t, Region> regions;        // guarded by mu
  std::map<std::string, uint64_t> by_token;  // guarded by mu
  uint64_t next_id = 1;                      // guarded by mu
  std::atomic<uint64_t> reply_bytes{0};      // copies in flight
  std::atomic<uint64_t> busy{0};

  // Serves `region` under a fresh random token.
  absl::StatusOr<ExposedRegion> Add(Region region);

  static ucs_status_t OnRequest(void* arg, const void* header, size_t header_length, void* /*data*/,
                                size_t /*length*/, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<State*>(arg);
    // A request without a reply endpoint or of another size is not ours: dropped.
    if (header_length != sizeof(ReadRequest) ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || param->reply_ep == nullptr) {
      return UCS_OK;
    }
    // Answered here, not later from the loop: the reply endpoint is only sure to be alive
    // during the callback (a queued one dangled once its puller died: SEGV under ASan).
    ReadRequest r;
    std::memcpy(&r, header, sizeof r);  // the header may be unaligned
    self->Answer(param->reply_ep, r);
    return UCS_OK;
  }

  void Answer(ucp_ep_h reply_ep, const ReadRequest& r) {
    uint32_t status = kOk;
    uint64_t bytes = 0;
    ReplyBlock* block = nullptr;
    {
      std::lock_guard<std::mutex> l(mu);
      auto t = by_token.find(std::string(r.token, kTokenBytes));
      if (t == by_token.end()) {
        status = kUnknownRegion;
      } else if (const Region& g = regions.at(t->second);
                 r.length == 0 || r.length > kMaxChunkBytes || r.offset > g.length ||
                 r.length > g.length - r.offset) {
        status = kOutOfRange;
      } else if (reply_bytes.load() + r.length > max_reply_bytes) {
        status = kBusy;
        busy.fetch_add(1);
      } else {
        block = static_cast<ReplyBlock*>(std::malloc(sizeof(ReplyBlock) + r.length));
        if (block == nullptr) {
          status = kBusy;
        } else {
          bytes = r.length;
          reply_bytes.fetch_add(bytes);
          // Under mu: no reply reads a region after Unexpose returns.
          if (g.base != nullptr) {
            std::memcpy(block->data(), g.base + r.offset, bytes);
          } else if (absl::Status rs = g.read(r.offset, block->data(), bytes); !rs.ok()) {
            reply_bytes.fetch_sub(bytes);
            bytes = 0;
            status = kReadFailed;
          }
        }
      }
    }
    if (block == nullptr) {
      block = static_cast<ReplyBlock*>(std::malloc(sizeof(ReplyBlock)));
      if (block == nullptr) return;  // the puller's deadline answers it
    }
    block->in_flight = &reply_bytes;
    block->bytes = bytes;
    block->header = ReadReply{r.tag, status, 0};
    ucp_request_param_t sp{};
    sp.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    sp.cb.send = OnReplySent;
    sp.user_data = block;
    // Eager only: a rendezvous would have the puller read this process's memory remotely.
    sp.flags = UCP_AM_SEND_FLAG_EAGER;
    const ucs_status_ptr_t s = ucp_am_send_nbx(reply_ep, kReadReplyId, &block->header,
                                               sizeof(ReadReply), block->data(), bytes, &sp);
    if (s == nullptr || UCS_PTR_IS_ERR(s)) FreeReply(block);  // done at once, or failed
  }

  void Run() {
    while (!stop.load()) {
      while (ucp_worker_progress(worker) != 0) {
      }
      const ucs_status_t s = ucp_worker_arm(worker);
      if (s == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress again
      pollfd fds[2] = {{worker_fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
      (void)::poll(fds, 2, s == UCS_OK ? 1000 : 10);
    }
  }
  ~State() {
    if (progress.joinable()) {
      stop.store(true);
      const uint64_t one = 1;
      (void)!::write(stop_fd, &one, sizeof(one));
      progress.join();
    }
    // Replies still queued complete (with an error) as the worker goes; their blocks are
    // freed by the callbacks.
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (ctx != nullptr) ucp_cleanup(ctx);
    if (stop_fd >= 0) ::close(stop_fd);
  }
};

UcxServer::UcxServer(std::unique_ptr<State> s) : s_(std::move(s)) {}
UcxServer::~UcxServer() = default;

absl::StatusOr<std::unique_ptr<UcxServer>> UcxServer::Start(uint64_t max_reply_bytes) {
  auto s = std::make_unique<State>();
  s->max_reply_bytes = max_reply_bytes;
  // Active messages only: no RMA (a worker with it serves gets of any address over TCP).
  auto ctx = MakeContext(UCP_FEATURE_AM | UCP_FEATURE_WAKEUP, true);
  if (!ctx.ok()) return ctx.status();
  s->ctx = *ctx;
  auto w = MakeWorker(s->ctx, UCS_THREAD_MODE_MULTI);
  if (!w.ok()) return w.status();
  s->worker = *w;
  if (absl::Status st = SetHandler(s->worker, kReadRequestId, &State::OnRequest, s.get()); !st.ok())
    return st;
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  if (ucs_status_t st = ucp_worker_get_address(s->worker, &addr, &len); st != UCS_OK) {
    return UcxError("ucp_worker_get_address", st);
  }
  s->address.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(s->worker, addr);
  if (ucs_status_t st = ucp_worker_get_efd(s->worker, &s->worker_fd); st != UCS_OK) {
    return UcxError("ucp_worker_get_efd", st);
  }
  s->stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->stop_fd < 0) return absl::InternalError("eventfd failed");
  State* raw = s.get();
  s->progress = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<UcxServer>(new UcxServer(std::move(s)));
}

const std::string& UcxServer::worker_address() const { return s_->address; }

absl::StatusOr<ExposedRegion> UcxServer::Expose(const void* base, uint64_t length) {
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError("UCX expose: an empty region");
  }
  return s_->Add(Region{static_cast<const std::byte*>(base), nullptr, length, {}});
}

absl::StatusOr<ExposedRegion> UcxServer::Expose(uint64_t length, RegionReader read) {
  if (!read || length == 0) return absl::InvalidArgumentError("UCX expose: an empty region");
  return s_->Add(Region{nullptr, std::move(read), length, {}});
}

absl::StatusOr<ExposedRegion> UcxServer::State::Add(Region region) {
  region.token.assign(kTokenBytes, '\0');
  if (::getrandom(region.token.data(), region.token.size(), 0) !=
      static_cast<ssize_t>(region.token.size())) {
    return absl::InternalError("UCX expose: getrandom failed");
  }
  ExposedRegion r;
  r.length = region.length;
  r.token = region.token;
  std::lock_guard<std::mutex> l(mu);
  r.id = next_id++;
  by_token[r.token] = r.id;
  regions[r.id] = std::move(region);
  return r;
}

absl::Status UcxServer::Unexpose(uint64_t id) {
  std::lock_guard<std::mutex> l(s_->mu);
  auto it = s_->regions.find(id);
  if (it == s_->regions.end()) {
    return absl::NotFoundError(absl::StrCat("UCX region ", id, " is not exposed"));
  }
  s_->by_token.erase(it->second.token);
  s_->regions.erase(it);
  return absl::OkStatus();
}

size_t UcxServer::exposed() const {
  std::lock_guard<std::mutex> l(s_->mu);
  return s_->regions.size();
}

uint64_t UcxServer::busy_replies() const { return s_->busy.load(); }

}  // namespace weightcache::peer
