// The transfer's puller (ucx_transfer.h): a pull asks for chunks a window at a time and
// copies each reply into place on the pulling thread.
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
