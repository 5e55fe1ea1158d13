#include "pkg/peer/ucx_transfer.h"

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

namespace weightcache::peer {
namespace {

absl::Status UcxError(const char* call, ucs_status_t s) {
  return absl::UnavailableError(absl::StrCat("UCX ", call, ": ", ucs_status_string(s)));
}

absl::StatusOr<ucp_context_h> MakeContext(uint64_t features, bool shared) {
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return UcxError("ucp_config_read", s);
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = features;
  params.mt_workers_shared = shared ? 1 : 0;
  ucp_context_h ctx = nullptr;
  const ucs_status_t s = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  if (s != UCS_OK) return UcxError("ucp_init", s);
  return ctx;
}

absl::StatusOr<ucp_worker_h> MakeWorker(ucp_context_h ctx, ucs_thread_mode_t mode) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = mode;
  ucp_worker_h w = nullptr;
  if (ucs_status_t s = ucp_worker_create(ctx, &params, &w); s != UCS_OK) {
    return UcxError("ucp_worker_create", s);
  }
  return w;
}

absl::Status SetHandler(ucp_worker_h w, uint16_t id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG;
  p.id = id;
  p.cb = cb;
  p.arg = arg;
  if (ucs_status_t s = ucp_worker_set_am_recv_handler(w, &p); s != UCS_OK) {
    return UcxError("ucp_worker_set_am_recv_handler", s);
  }
  return absl::OkStatus();
}

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

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server.

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

// ---------------------------------------------------------------------------------------------
// Puller.

namespace {

// One pull's chunks: requests go out a window at a time; replies arrive in the AM callback
// on the pulling thread (inside ucp_worker_progress), which copies the bytes into place.
struct Window {
  uint64_t pull = 0;  // tags carry it in their high bits: a late reply to an earlier pull
                      // (ended by its deadline) is ignored
  char* dst = nullptr;
  uint64_t base = 0;  // the pull's offset in the region (for messages)
  uint64_t length = 0;
  uint64_t chunk = 0;
  uint64_t chunks = 0;
  std::vector<uint8_t> state;  // per chunk: 0 to send, 1 asked, 2 done
  uint64_t done = 0;
  uint64_t asked = 0;  // outstanding
  ucs_status_t error = UCS_OK;
  absl::Status refused;               // the server's answer, when it refused
  std::vector<ReadRequest> requests;  // headers kept until their sends complete
  uint64_t sends = 0;                 // request sends not yet completed
  bool busy = false;                  // the server said busy: ask again after a pause
};

constexpr uint64_t kChunkBits = 40;  // tag = pull << 40 | chunk

}  // namespace

struct UcxPuller::State {
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  std::mutex mu;  // one pull at a time
  uint64_t pulls = 0;
  Window* current = nullptr;  // the pull in progress (its thread runs the callbacks)

  ~State() {
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (ctx != nullptr) ucp_cleanup(ctx);
  }
  // Progresses until `req` (from an *_nbx call without a callback) completes or `until`.
  ucs_status_t Wait(ucs_status_ptr_t req, std::chrono::steady_clock::time_point until) const {
    if (req == nullptr) return UCS_OK;
    if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
    ucs_status_t s = UCS_INPROGRESS;
    while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < until) {
      if (ucp_worker_progress(worker) == 0) std::this_thread::yield();
    }
    if (s == UCS_INPROGRESS) ucp_request_cancel(worker, req);
    while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(req);
    return s;
  }
  // Ends a pull's endpoint. A failed pull closes it by force, which completes the sends still
  // outstanding (with an error); a good one flushes and closes. Either way no callback may
  // touch the window once it is gone: waits for the sends (bounded), and stops taking replies.
  ucs_status_t Close(ucp_ep_h ep, const Window& win, bool failed,
                     std::chrono::steady_clock::time_point deadline) {
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = failed ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    const auto close_until =
        std::max(deadline, std::chrono::steady_clock::now()) + std::chrono::seconds(5);
    const ucs_status_t closed = Wait(ucp_ep_close_nbx(ep, &cp), close_until);
    while (win.sends > 0 && std::chrono::steady_clock::now() < close_until) {
      if (ucp_worker_progress(worker) == 0) std::this_thread::yield();
    }
    current = nullptr;
    return closed;
  }

  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<State*>(arg);
    Window* w = self->current;
    if (w == nullptr || header_length != sizeof(ReadReply) ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      return UCS_OK;  // not for a pull in progress (or not of this protocol): dropped
    }
    ReadReply r;
    std::memcpy(&r, header, sizeof r);
    const uint64_t chunk = r.tag & ((uint64_t{1} << kChunkBits) - 1);
    if ((r.tag >> kChunkBits) != w->pull || chunk >= w->chunks || w->state[chunk] != 1) {
      return UCS_OK;
    }
    --w->asked;
    const uint64_t off = chunk * w->chunk;
    const uint64_t want = std::min(w->chunk, w->length - off);
    switch (r.status) {
      case kOk:
        if (length != want) {
          if (w->refused.ok()) {
            w->refused = absl::DataLossError(
                absl::StrCat("UCX pull: the server sent ", length, " bytes for a chunk of ", want));
          }
          return UCS_OK;
        }
        std::memcpy(w->dst + off, data, length);
        w->state[chunk] = 2;
        ++w->done;
        return UCS_OK;
      case kBusy:
        w->state[chunk] = 0;  // asked again
        w->busy = true;
        return UCS_OK;
      case kUnknownRegion:
        if (w->refused.ok()) {
          w->refused = absl::NotFoundError(
              "UCX pull: the server exposes no region with that token (unexposed, or never)");
        }
        return UCS_OK;
      case kReadFailed:
        if (w->refused.ok()) {
          w->refused = absl::UnavailableError(
              absl::StrCat("UCX pull: the server could not read bytes [", w->base + off, ", ",
                           w->base + off + want, ") of the region"));
        }
        return UCS_OK;
      default:
        if (w->refused.ok()) {
          w->refused =
              absl::OutOfRangeError(absl::StrCat("UCX pull: bytes [", w->base + off, ", ",
                                                 w->base + off + want, ") are outside the region"));
        }
        return UCS_OK;
    }
  }
};

namespace {

void OnRequestSent(void* req, ucs_status_t s, void* user) {
  auto* w = static_cast<Window*>(user);
  --w->sends;
  if (s != UCS_OK && w->error == UCS_OK) w->error = s;
  ucp_request_free(req);
}

void OnEpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* w = static_cast<Window*>(arg);
  if (w->error == UCS_OK) w->error = status;
}

// An endpoint to the server at `worker_address` whose errors (a dead server) end the pull of
// `win`.
absl::StatusOr<ucp_ep_h> Connect(ucp_worker_h w, const std::string& worker_address, Window* win) {
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                         UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep_params.err_handler.cb = OnEpError;
  ep_params.err_handler.arg = win;
  ucp_ep_h ep = nullptr;
  if (ucs_status_t s = ucp_ep_create(w, &ep_params, &ep); s != UCS_OK) {
    return UcxError("ucp_ep_create", s);
  }
  return ep;
}

// Asks for the chunks from `first` on that are not asked or done, until `inflight` are
// outstanding. A send that fails at once ends the pull (win.error).
void AskChunks(ucp_ep_h ep, const std::string& token, unsigned inflight, uint64_t first,
               const ucp_request_param_t& p, Window& win) {
  for (uint64_t c = first; c < win.chunks && win.asked < inflight; ++c) {
    if (win.state[c] != 0) continue;
    ReadRequest& r = win.requests[c];
    std::memcpy(r.token, token.data(), kTokenBytes);
    r.offset = win.base + c * win.chunk;
    r.length = std::min(win.chunk, win.length - c * win.chunk);
    r.tag = win.pull << kChunkBits | c;
    win.state[c] = 1;
    ++win.asked;
    const ucs_status_ptr_t s = ucp_am_send_nbx(ep, kReadRequestId, &r, sizeof r, nullptr, 0, &p);
    if (UCS_PTR_IS_ERR(s)) {
      win.error = UCS_PTR_STATUS(s);
      break;
    }
    if (s != nullptr) ++win.sends;
  }
}

// Keeps `inflight` chunks asked and progresses the worker (whose reply callback fills the
// window) until every chunk is done, the transport or the server fails the pull, or the
// deadline passes.
void Exchange(ucp_worker_h w, ucp_ep_h ep, const std::string& token, const PullOptions& o,
              std::chrono::steady_clock::time_point deadline, Window& win) {
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = OnRequestSent;
  p.user_data = &win;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  uint64_t next = 0;  // the lowest chunk that may still need asking
  uint64_t reported = 0;
  while (win.done < win.chunks && win.error == UCS_OK && win.refused.ok()) {
    AskChunks(ep, token, o.inflight, next, p, win);
    while (next < win.chunks && win.state[next] == 2) ++next;
    if (win.error != UCS_OK || !win.refused.ok()) break;
    if (ucp_worker_progress(w) == 0) std::this_thread::yield();
    if (o.after_chunk && win.done > reported) {
      reported = win.done;
      o.after_chunk(std::min(win.length, reported * o.chunk_bytes));
    }
    if (win.busy) {
      win.busy = false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
  }
}

// How a pull ended: the server's refusal first, then a transport error, then chunks still
// missing at the deadline.
absl::Status Outcome(const Window& win, const PullOptions& o) {
  if (!win.refused.ok()) return win.refused;
  if (win.error != UCS_OK) return UcxError("pull", win.error);
  if (win.done < win.chunks) {
    return absl::DeadlineExceededError(
        absl::StrCat("UCX pull: ", std::min(win.length, win.done * o.chunk_bytes), " of ",
                     win.length, " bytes after ", o.timeout.count(), " ms"));
  }
  return absl::OkStatus();
}

}  // namespace

UcxPuller::UcxPuller(std::unique_ptr<State> s) : s_(std::move(s)) {}
UcxPuller::~UcxPuller() = default;

absl::StatusOr<std::unique_ptr<UcxPuller>> UcxPuller::Create() {
  auto s = std::make_unique<State>();
  auto ctx = MakeContext(UCP_FEATURE_AM, false);
  if (!ctx.ok()) return ctx.status();
  s->ctx = *ctx;
  auto w = MakeWorker(s->ctx, UCS_THREAD_MODE_SINGLE);
  if (!w.ok()) return w.status();
  s->worker = *w;
  if (absl::Status st = SetHandler(s->worker, kReadReplyId, &State::OnReply, s.get()); !st.ok())
    return st;
  return std::unique_ptr<UcxPuller>(new UcxPuller(std::move(s)));
}

absl::Status UcxPuller::Pull(const std::string& worker_address, const std::string& token,
                             uint64_t offset, void* dst, uint64_t length, const PullOptions& o) {
  if (worker_address.empty() || token.size() != kTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("UCX pull: no worker address, or a token of ",
                                                   token.size(), " bytes (not ", kTokenBytes, ")"));
  }
  if (o.chunk_bytes == 0 || o.chunk_bytes > kMaxChunkBytes || o.inflight == 0) {
    return absl::InvalidArgumentError(absl::StrCat("UCX pull: chunk_bytes must be in 1..",
                                                   kMaxChunkBytes, " and inflight positive"));
  }
  if (length == 0) return absl::OkStatus();
  std::lock_guard<std::mutex> l(s_->mu);
  const auto deadline = std::chrono::steady_clock::now() + o.timeout;
  ucp_worker_h w = s_->worker;
  Window win;
  win.pull = ++s_->pulls;
  win.dst = static_cast<char*>(dst);
  win.base = offset;
  win.length = length;
  win.chunk = o.chunk_bytes;
  win.chunks = (length + o.chunk_bytes - 1) / o.chunk_bytes;
  win.state.assign(win.chunks, 0);
  win.requests.resize(win.chunks);

  auto ep = Connect(w, worker_address, &win);
  if (!ep.ok()) return ep.status();
  s_->current = &win;
  Exchange(w, *ep, token, o, deadline, win);
  absl::Status result = Outcome(win, o);
  const ucs_status_t closed = s_->Close(*ep, win, !result.ok(), deadline);
  if (result.ok() && closed != UCS_OK && closed != UCS_ERR_CONNECTION_RESET &&
      closed != UCS_ERR_ENDPOINT_TIMEOUT && closed != UCS_ERR_CANCELED) {
    result = UcxError("ucp_ep_close_nbx", closed);
  }
  return result;
}

}  // namespace weightcache::peer
