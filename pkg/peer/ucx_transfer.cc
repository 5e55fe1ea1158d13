#include "pkg/peer/ucx_transfer.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

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

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server.

struct UcxServer::State {
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  std::string address;
  int worker_fd = -1;
  int stop_fd = -1;
  std::atomic<bool> stop{false};
  std::thread progress;
  mutable std::mutex mu;
  std::map<uint64_t, ucp_mem_h> regions;  // guarded by mu
  uint64_t next_id = 1;                   // guarded by mu

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
    for (auto& [id, memh] : regions) (void)ucp_mem_unmap(ctx, memh);
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (ctx != nullptr) ucp_cleanup(ctx);
    if (stop_fd >= 0) ::close(stop_fd);
  }
};

UcxServer::UcxServer(std::unique_ptr<State> s) : s_(std::move(s)) {}
UcxServer::~UcxServer() = default;

absl::StatusOr<std::unique_ptr<UcxServer>> UcxServer::Start() {
  auto s = std::make_unique<State>();
  auto ctx = MakeContext(UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP, true);
  if (!ctx.ok()) return ctx.status();
  s->ctx = *ctx;
  auto w = MakeWorker(s->ctx, UCS_THREAD_MODE_MULTI);
  if (!w.ok()) return w.status();
  s->worker = *w;
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
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                 UCP_MEM_MAP_PARAM_FIELD_PROT;
  p.address = const_cast<void*>(base);  // registered for reading only (prot below)
  p.length = length;
  p.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ;
  ucp_mem_h memh = nullptr;
  if (ucs_status_t s = ucp_mem_map(s_->ctx, &p, &memh); s != UCS_OK) {
    return UcxError("ucp_mem_map", s);
  }
  void* packed = nullptr;
  size_t packed_len = 0;
  if (ucs_status_t s = ucp_rkey_pack(s_->ctx, memh, &packed, &packed_len); s != UCS_OK) {
    (void)ucp_mem_unmap(s_->ctx, memh);
    return UcxError("ucp_rkey_pack", s);
  }
  ExposedRegion r;
  r.address = reinterpret_cast<uint64_t>(base);
  r.length = length;
  r.rkey.assign(static_cast<const char*>(packed), packed_len);
  ucp_rkey_buffer_release(packed);
  std::lock_guard<std::mutex> l(s_->mu);
  r.id = s_->next_id++;
  s_->regions[r.id] = memh;
  return r;
}

absl::Status UcxServer::Unexpose(uint64_t id) {
  ucp_mem_h memh = nullptr;
  {
    std::lock_guard<std::mutex> l(s_->mu);
    auto it = s_->regions.find(id);
    if (it == s_->regions.end()) {
      return absl::NotFoundError(absl::StrCat("UCX region ", id, " is not exposed"));
    }
    memh = it->second;
    s_->regions.erase(it);
  }
  if (ucs_status_t s = ucp_mem_unmap(s_->ctx, memh); s != UCS_OK) {
    return UcxError("ucp_mem_unmap", s);
  }
  return absl::OkStatus();
}

size_t UcxServer::exposed() const {
  std::lock_guard<std::mutex> l(s_->mu);
  return s_->regions.size();
}

// ---------------------------------------------------------------------------------------------
// Puller.

namespace {

// Outstanding gets of one pull: completions arrive in callbacks on the pulling thread (inside
// ucp_worker_progress), which count them and keep the first error.
struct Window {
  uint64_t done = 0;
  ucs_status_t error = UCS_OK;
};

void OnGet(void* req, ucs_status_t s, void* user) {
  auto* w = static_cast<Window*>(user);
  ++w->done;
  if (s != UCS_OK && w->error == UCS_OK) w->error = s;
  ucp_request_free(req);
}

void OnEpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* w = static_cast<Window*>(arg);
  if (w->error == UCS_OK) w->error = status;
}

}  // namespace

struct UcxPuller::State {
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  std::mutex mu;  // one pull at a time
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
};

UcxPuller::UcxPuller(std::unique_ptr<State> s) : s_(std::move(s)) {}
UcxPuller::~UcxPuller() = default;

absl::StatusOr<std::unique_ptr<UcxPuller>> UcxPuller::Create() {
  auto s = std::make_unique<State>();
  auto ctx = MakeContext(UCP_FEATURE_RMA, false);
  if (!ctx.ok()) return ctx.status();
  s->ctx = *ctx;
  auto w = MakeWorker(s->ctx, UCS_THREAD_MODE_SINGLE);
  if (!w.ok()) return w.status();
  s->worker = *w;
  return std::unique_ptr<UcxPuller>(new UcxPuller(std::move(s)));
}

absl::Status UcxPuller::Pull(const std::string& worker_address, const std::string& rkey,
                             uint64_t remote_address, void* dst, uint64_t length,
                             const PullOptions& o) {
  if (worker_address.empty() || rkey.empty()) {
    return absl::InvalidArgumentError("UCX pull: no worker address or remote key");
  }
  if (o.chunk_bytes == 0 || o.inflight == 0) {
    return absl::InvalidArgumentError("UCX pull: chunk_bytes and inflight must be positive");
  }
  if (length == 0) return absl::OkStatus();
  std::lock_guard<std::mutex> l(s_->mu);
  const auto deadline = std::chrono::steady_clock::now() + o.timeout;
  ucp_worker_h w = s_->worker;
  Window win;

  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                         UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep_params.err_handler.cb = OnEpError;
  ep_params.err_handler.arg = &win;
  ucp_ep_h ep = nullptr;
  if (ucs_status_t s = ucp_ep_create(w, &ep_params, &ep); s != UCS_OK) {
    return UcxError("ucp_ep_create", s);
  }
  ucp_rkey_h rk = nullptr;
  absl::Status result;
  ucp_mem_h local = nullptr;
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = dst;
  mp.length = length;
  uint64_t posted = 0;
  if (ucs_status_t s = ucp_ep_rkey_unpack(ep, rkey.data(), &rk); s != UCS_OK) {
    result =
        absl::InvalidArgumentError(absl::StrCat("UCX ucp_ep_rkey_unpack: ", ucs_status_string(s)));
  } else if (s = ucp_mem_map(s_->ctx, &mp, &local); s != UCS_OK) {
    result = UcxError("ucp_mem_map", s);
    local = nullptr;
  } else {
    ucp_request_param_t p{};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
    p.cb.send = OnGet;
    p.user_data = &win;
    p.memh = local;
    const uint64_t n = (length + o.chunk_bytes - 1) / o.chunk_bytes;
    uint64_t reported = 0;
    auto* out = static_cast<char*>(dst);
    while (win.done < n && win.error == UCS_OK) {
      while (posted < n && posted - win.done < o.inflight && win.error == UCS_OK) {
        const uint64_t off = posted * o.chunk_bytes;
        const uint64_t len = std::min(o.chunk_bytes, length - off);
        const ucs_status_ptr_t r = ucp_get_nbx(ep, out + off, len, remote_address + off, rk, &p);
        ++posted;
        if (r == nullptr) {
          ++win.done;  // completed at once: no callback
        } else if (UCS_PTR_IS_ERR(r)) {
          ++win.done;
          win.error = UCS_PTR_STATUS(r);
        }
      }
      if (win.error != UCS_OK) break;
      if (ucp_worker_progress(w) == 0) std::this_thread::yield();
      if (o.after_chunk && win.done > reported) {
        reported = win.done;
        o.after_chunk(std::min(length, reported * o.chunk_bytes));
      }
      if (std::chrono::steady_clock::now() >= deadline) break;
    }
    if (win.error != UCS_OK) {
      result = UcxError("get", win.error);
    } else if (win.done < n) {
      result = absl::DeadlineExceededError(
          absl::StrCat("UCX pull: ", std::min(length, win.done * o.chunk_bytes), " of ", length,
                       " bytes after ", o.timeout.count(), " ms"));
    }
  }
  // A failed pull closes its endpoint by force, which completes the gets still outstanding
  // (with an error); a good one flushes and closes. Either way no callback may run after the
  // window is gone: wait for all of them (bounded: a forced close does not wait on the peer).
  ucp_request_param_t cp{};
  cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  cp.flags = result.ok() ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  if (rk != nullptr && result.ok()) ucp_rkey_destroy(std::exchange(rk, nullptr));
  const auto close_until =
      std::max(deadline, std::chrono::steady_clock::now()) + std::chrono::seconds(5);
  const ucs_status_t closed = s_->Wait(ucp_ep_close_nbx(ep, &cp), close_until);
  while (win.done < posted && std::chrono::steady_clock::now() < close_until) {
    if (ucp_worker_progress(w) == 0) std::this_thread::yield();
  }
  if (rk != nullptr) ucp_rkey_destroy(rk);
  if (local != nullptr) (void)ucp_mem_unmap(s_->ctx, local);
  if (result.ok() && closed != UCS_OK && closed != UCS_ERR_CONNECTION_RESET &&
      closed != UCS_ERR_ENDPOINT_TIMEOUT && closed != UCS_ERR_CANCELED) {
    result = UcxError("ucp_ep_close_nbx", closed);
  }
  return result;
}

}  // namespace weightcache::peer
