// Peer-fill transport brick (issue 30): moves one large buffer between two processes over UCX
// the way the daemon will, and reports GB/s. No weightcache code: the UCP API only.
//
//   server: allocates --bytes filled with a deterministic pattern, registers them
//           (ucp_mem_map), listens on --port, sends the client {address, length, rkey} over a
//           UCX stream, then serves until the client says done.
//   client: connects, then per repetition pulls the region in --chunk pieces with --inflight
//           outstanding operations, verifies every byte, prints GB/s (1 GB = 1e9 bytes; the
//           transfer only, not the verification).
//   methods: get  one-sided ucp_get_nbx from the server's registered region (what peer fill
//                 will do; over TCP the server's progress engine answers the gets);
//            tag  the client asks, the server ucp_tag_send_nbx's every chunk (tag = chunk
//                 index), the client has ucp_tag_recv_nbx's posted.
//
//   ucx_transfer_bench --role=server --port=13337 --bytes=1073741824
//   ucx_transfer_bench --role=client --host=10.0.0.2 --port=13337 --method=get
//   ucx_transfer_bench --role=both --bytes=268435456 --method=tag   # forks a server, loopback
//   ucx_transfer_bench --table        # both, 64 MiB..1 GiB, get/tag, UCX_TLS=tcp and default
//   ucx_transfer_bench --sweep        # both, --bytes, chunk x inflight grid, same columns
//
// Transports: UCX_TLS from the environment is honoured (UCX_TLS=tcp forces TCP; unset lets UCX
// choose, on one host shared memory and CMA). --table and --sweep set it per row themselves.
// The control structs go over the wire in host byte order: both ends must be the same arch.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr uint64_t kMagic = 0x77636275'63786231;  // "wcbucxb1"
constexpr uint64_t kOpTagSend = 1;                // server: tag-send the whole region once
constexpr uint64_t kOpDone = 2;                   // server: close and exit
constexpr size_t kMiB = size_t{1} << 20;

struct Options {
  std::string role = "both";
  std::string host = "127.0.0.1";
  std::string method = "get";
  uint16_t port = 13337;
  bool port_given = false;
  size_t bytes = 256 * kMiB;
  size_t chunk = 8 * kMiB;
  size_t inflight = 8;
  int reps = 3;
  bool peer_errors = true;  // --err_mode=peer (the default) or none
  bool verbose = false;
};

struct Hello {  // server -> client, then rkey_len bytes of packed rkey
  uint64_t magic, bytes, address, rkey_len;
};
struct Request {  // client -> server
  uint64_t magic, op, chunk, inflight;
};
struct Result {  // client -> caller (through a pipe in --role=both)
  double median_gbps = 0, best_gbps = 0;
  int verified = 0;  // 1: every byte of every repetition matched the pattern
};

[[noreturn]] void Fail(const std::string& call, ucs_status_t status) {
  throw std::runtime_error(call + ": " + ucs_status_string(status));
}
void Check(ucs_status_t status, const std::string& call) {
  if (status != UCS_OK) Fail(call, status);
}

// The pattern: 64-bit word i of the region is splitmix64(i); byte o is byte o % 8 of word o / 8.
uint64_t PatternWord(uint64_t i) {
  uint64_t z = i + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
void FillPattern(std::byte* p, size_t n) {
  for (size_t w = 0; w < n / 8; ++w) {
    const uint64_t v = PatternWord(w);
    std::memcpy(p + w * 8, &v, 8);
  }
  const uint64_t tail = PatternWord(n / 8);
  std::memcpy(p + n / 8 * 8, &tail, n % 8);
}
// Returns the first offset that differs from the pattern, or n when all match.
size_t FirstMismatch(const std::byte* p, size_t n) {
  for (size_t w = 0; w < n / 8; ++w) {
    const uint64_t v = PatternWord(w);
    if (std::memcmp(p + w * 8, &v, 8) != 0) {
      const auto* want = reinterpret_cast<const std::byte*>(&v);
      return w * 8 + (std::mismatch(p + w * 8, p + w * 8 + 8, want).first - (p + w * 8));
    }
  }
  const uint64_t tail = PatternWord(n / 8);
  const auto* want = reinterpret_cast<const std::byte*>(&tail);
  return n / 8 * 8 + (std::mismatch(p + n / 8 * 8, p + n, want).first - (p + n / 8 * 8));
}

// One owner per UCX object; destroyed in reverse order of declaration by their users.
struct ContextDel {
  void operator()(ucp_context* c) const { ucp_cleanup(c); }
};
struct WorkerDel {
  void operator()(ucp_worker* w) const { ucp_worker_destroy(w); }
};
struct ListenerDel {
  void operator()(ucp_listener* l) const { ucp_listener_destroy(l); }
};
struct RkeyDel {
  void operator()(ucp_rkey* r) const { ucp_rkey_destroy(r); }
};
using Context = std::unique_ptr<ucp_context, ContextDel>;
using Worker = std::unique_ptr<ucp_worker, WorkerDel>;
using Listener = std::unique_ptr<ucp_listener, ListenerDel>;
using Rkey = std::unique_ptr<ucp_rkey, RkeyDel>;

class MemMap {  // a registered region (ucp_mem_map of memory we own)
 public:
  MemMap(ucp_context_h ctx, void* address, size_t length) : ctx_(ctx) {
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = address;
    p.length = length;
    Check(ucp_mem_map(ctx, &p, &memh_), "ucp_mem_map");
  }
  MemMap(const MemMap&) = delete;
  MemMap& operator=(const MemMap&) = delete;
  ~MemMap() {
    if (const ucs_status_t s = ucp_mem_unmap(ctx_, memh_); s != UCS_OK) {
      std::fprintf(stderr, "ucp_mem_unmap: %s\n", ucs_status_string(s));
    }
  }
  ucp_mem_h get() const { return memh_; }

 private:
  ucp_context_h ctx_;
  ucp_mem_h memh_ = nullptr;
};

Context MakeContext() {
  ucp_config_t* config = nullptr;
  Check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_TAG | UCP_FEATURE_STREAM;
  ucp_context_h ctx = nullptr;
  const ucs_status_t s = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  Check(s, "ucp_init");
  return Context(ctx);
}

Worker MakeWorker(ucp_context_h ctx) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h w = nullptr;
  Check(ucp_worker_create(ctx, &params, &w), "ucp_worker_create");
  return Worker(w);
}

// Busy-polls; yields the CPU when there was nothing to do so a loaded 2-core host still moves.
void Progress(ucp_worker_h w) {
  if (ucp_worker_progress(w) == 0) sched_yield();
}

// Waits for a request returned by an *_nbx call without a callback, then frees it.
ucs_status_t WaitStatus(ucp_worker_h w, ucs_status_ptr_t req) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  ucs_status_t s = UCS_INPROGRESS;
  while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS) Progress(w);
  ucp_request_free(req);
  return s;
}
void Wait(ucp_worker_h w, ucs_status_ptr_t req, const char* call) {
  Check(WaitStatus(w, req), call);
}

void OnEpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  *static_cast<ucs_status_t*>(arg) = status;  // outstanding requests fail with it too
}

class Endpoint {  // an ep; Close() on the success path, a forced close otherwise
 public:
  Endpoint(ucp_worker_h w, ucp_ep_params_t params, bool peer_errors) : worker_(w) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    if (peer_errors) params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    // PEER: a dead peer fails the outstanding requests instead of hanging them. In UCX 1.13
    // it also rules out the shared-memory transports (sysv, posix, cma), so on one host the
    // bytes go over TCP loopback even when UCX_TLS allows shm; --err_mode=none measures those
    // (there, the second end to close may log "error during flush: Endpoint timeout" on
    // stdout: the peer is gone, the run is unaffected).
    params.err_mode = peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    params.err_handler.cb = OnEpError;
    params.err_handler.arg = error_.get();
    Check(ucp_ep_create(w, &params, &ep_), "ucp_ep_create");
  }
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  ~Endpoint() {
    if (ep_ != nullptr) (void)CloseStatus(true);
  }
  ucp_ep_h get() const { return ep_; }
  // Flushes and closes. The peer may already have closed its side (both ends close after the
  // last message), which UCX reports as a reset or timeout: that is the expected end, not an
  // error.
  void Close() {
    const ucs_status_t s = CloseStatus(false);
    if (s != UCS_OK && s != UCS_ERR_CONNECTION_RESET && s != UCS_ERR_ENDPOINT_TIMEOUT &&
        s != UCS_ERR_CANCELED) {
      Fail("ucp_ep_close_nbx", s);
    }
  }

 private:
  ucs_status_t CloseStatus(bool force) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    return WaitStatus(worker_, ucp_ep_close_nbx(std::exchange(ep_, nullptr), &p));
  }
  ucp_worker_h worker_;
  ucp_ep_h ep_ = nullptr;
  std::unique_ptr<ucs_status_t> error_ = std::make_unique<ucs_status_t>(UCS_OK);
};

void StreamSend(ucp_worker_h w, ucp_ep_h ep, const void* buf, size_t n) {
  ucp_request_param_t p{};
  Wait(w, ucp_stream_send_nbx(ep, buf, n, &p), "ucp_stream_send_nbx");
}
void StreamRecv(ucp_worker_h w, ucp_ep_h ep, void* buf, size_t n) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_STREAM_RECV_FLAG_WAITALL;
  size_t got = 0;
  Wait(w, ucp_stream_recv_nbx(ep, buf, n, &got, &p), "ucp_stream_recv_nbx");
}

// A window of --inflight outstanding operations over the chunks of a region. Completions arrive
// in callbacks, which count them, keep the first error and free the request.
struct Window {
  size_t done = 0;
  ucs_status_t error = UCS_OK;
};
void OnSent(void* req, ucs_status_t s, void* user) {
  auto* win = static_cast<Window*>(user);
  ++win->done;
  if (s != UCS_OK && win->error == UCS_OK) win->error = s;
  ucp_request_free(req);
}
void OnTagRecv(void* req, ucs_status_t s, const ucp_tag_recv_info_t* /*info*/, void* user) {
  OnSent(req, s, user);
}

// post(i, offset, length, param) starts chunk i; returns after every chunk completed.
void RunChunks(
    ucp_worker_h w, size_t bytes, size_t chunk, size_t inflight, const char* call,
    const std::function<ucs_status_ptr_t(size_t, size_t, size_t, const ucp_request_param_t*)>& post,
    ucp_mem_h memh, bool recv) {
  Window win;
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
  if (recv) {
    p.cb.recv = OnTagRecv;
  } else {
    p.cb.send = OnSent;
  }
  p.user_data = &win;
  p.memh = memh;
  const size_t n = (bytes + chunk - 1) / chunk;
  for (size_t i = 0; i < n; ++i) {
    while (i - win.done >= inflight && win.error == UCS_OK) Progress(w);
    Check(win.error, call);
    const size_t off = i * chunk;
    const ucs_status_ptr_t r = post(i, off, std::min(chunk, bytes - off), &p);
    if (r == nullptr) ++win.done;  // completed at once: no callback
    if (UCS_PTR_IS_ERR(r)) Fail(call, UCS_PTR_STATUS(r));
  }
  while (win.done < n && win.error == UCS_OK) Progress(w);
  Check(win.error, call);
}

constexpr ucp_tag_t kTagMask = ~ucp_tag_t{0};
ucp_tag_t ChunkTag(size_t i) { return (ucp_tag_t{0x7763} << 48) | i; }

// --- server ---

struct ServerState {
  ucp_listener_h listener = nullptr;
  ucp_conn_request_h conn = nullptr;
};
void OnConnRequest(ucp_conn_request_h req, void* arg) {
  auto* s = static_cast<ServerState*>(arg);
  if (s->conn == nullptr) {
    s->conn = req;
  } else if (const ucs_status_t st = ucp_listener_reject(s->listener, req); st != UCS_OK) {
    std::fprintf(stderr, "ucp_listener_reject: %s\n", ucs_status_string(st));
  }
}

// ready_fd >= 0: the listening port is written there (uint16_t) once the listener is up.
void RunServer(const Options& o, int ready_fd) {
  auto region = std::make_unique_for_overwrite<std::byte[]>(o.bytes);
  FillPattern(region.get(), o.bytes);

  Context ctx = MakeContext();
  Worker worker = MakeWorker(ctx.get());
  MemMap memh(ctx.get(), region.get(), o.bytes);
  void* packed = nullptr;
  size_t packed_len = 0;
  Check(ucp_rkey_pack(ctx.get(), memh.get(), &packed, &packed_len), "ucp_rkey_pack");
  const std::vector<std::byte> rkey(static_cast<std::byte*>(packed),
                                    static_cast<std::byte*>(packed) + packed_len);
  ucp_rkey_buffer_release(packed);

  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(o.port);
  if (inet_pton(AF_INET, o.host.c_str(), &addr.sin_addr) != 1) {
    throw std::runtime_error("--host for the server must be an IPv4 address: " + o.host);
  }
  ServerState state;
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  lp.sockaddr.addrlen = sizeof(addr);
  lp.conn_handler.cb = OnConnRequest;
  lp.conn_handler.arg = &state;
  ucp_listener_h lh = nullptr;
  Check(ucp_listener_create(worker.get(), &lp, &lh), "ucp_listener_create");
  Listener listener(lh);
  state.listener = lh;
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  Check(ucp_listener_query(lh, &la), "ucp_listener_query");
  const uint16_t port = ntohs(reinterpret_cast<const sockaddr_in*>(&la.sockaddr)->sin_port);
  if (ready_fd >= 0) {
    if (write(ready_fd, &port, sizeof(port)) != sizeof(port)) throw std::runtime_error("write");
  } else {
    std::printf("server: %zu bytes registered, listening on port %u\n", o.bytes, port);
    std::fflush(stdout);
  }

  while (state.conn == nullptr) Progress(worker.get());
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  ep_params.conn_request = state.conn;
  Endpoint ep(worker.get(), ep_params, o.peer_errors);

  const Hello hello{kMagic, o.bytes, reinterpret_cast<uint64_t>(region.get()), rkey.size()};
  StreamSend(worker.get(), ep.get(), &hello, sizeof(hello));
  StreamSend(worker.get(), ep.get(), rkey.data(), rkey.size());
  for (;;) {
    Request req{};
    StreamRecv(worker.get(), ep.get(), &req, sizeof(req));
    if (req.magic != kMagic || req.chunk == 0 || req.inflight == 0) {
      throw std::runtime_error("server: malformed request from the client");
    }
    if (req.op == kOpDone) break;
    if (req.op != kOpTagSend) throw std::runtime_error("server: unknown request op");
    RunChunks(
        worker.get(), o.bytes, req.chunk, req.inflight, "ucp_tag_send_nbx",
        [&](size_t i, size_t off, size_t len, const ucp_request_param_t* p) {
          return ucp_tag_send_nbx(ep.get(), region.get() + off, len, ChunkTag(i), p);
        },
        memh.get(), false);
  }
  ep.Close();
}

// --- client ---

Result RunClient(const Options& o) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* ai = nullptr;
  if (const int rc = getaddrinfo(o.host.c_str(), nullptr, &hints, &ai); rc != 0) {
    throw std::runtime_error("getaddrinfo " + o.host + ": " + gai_strerror(rc));
  }
  sockaddr_in addr{};
  std::memcpy(&addr, ai->ai_addr, sizeof(addr));
  freeaddrinfo(ai);
  addr.sin_port = htons(o.port);

  Context ctx = MakeContext();
  Worker worker = MakeWorker(ctx.get());
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep_params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  ep_params.sockaddr.addrlen = sizeof(addr);
  Endpoint ep(worker.get(), ep_params, o.peer_errors);

  Hello hello{};
  StreamRecv(worker.get(), ep.get(), &hello, sizeof(hello));
  if (hello.magic != kMagic || hello.rkey_len == 0 || hello.rkey_len > (1u << 20)) {
    throw std::runtime_error("client: malformed hello from the server");
  }
  std::vector<std::byte> packed(hello.rkey_len);
  StreamRecv(worker.get(), ep.get(), packed.data(), packed.size());
  ucp_rkey_h rk = nullptr;
  Check(ucp_ep_rkey_unpack(ep.get(), packed.data(), &rk), "ucp_ep_rkey_unpack");
  Rkey rkey(rk);
  if (o.verbose) ucp_ep_print_info(ep.get(), stderr);

  const size_t bytes = hello.bytes;
  auto local = std::make_unique_for_overwrite<std::byte[]>(bytes);
  std::memset(local.get(), 0, bytes);  // fault the pages in before any timing
  std::vector<double> gbps;
  Result result;
  result.verified = 1;
  {
    MemMap memh(ctx.get(), local.get(), bytes);
    for (int rep = 0; rep < o.reps; ++rep) {
      std::memset(local.get(), 0, bytes);  // a chunk never written must fail verification
      const auto t0 = std::chrono::steady_clock::now();
      if (o.method == "get") {
        RunChunks(
            worker.get(), bytes, o.chunk, o.inflight, "ucp_get_nbx",
            [&](size_t /*i*/, size_t off, size_t len, const ucp_request_param_t* p) {
              return ucp_get_nbx(ep.get(), local.get() + off, len, hello.address + off, rkey.get(),
                                 p);
            },
            memh.get(), false);
      } else {
        const Request req{kMagic, kOpTagSend, o.chunk, o.inflight};
        bool asked = false;
        RunChunks(
            worker.get(), bytes, o.chunk, o.inflight, "ucp_tag_recv_nbx",
            [&](size_t i, size_t off, size_t len, const ucp_request_param_t* p) {
              const ucs_status_ptr_t r =
                  ucp_tag_recv_nbx(worker.get(), local.get() + off, len, ChunkTag(i), kTagMask, p);
              if (!asked && (i + 1 == o.inflight || off + len == bytes)) {  // window posted
                asked = true;
                StreamSend(worker.get(), ep.get(), &req, sizeof(req));
              }
              return r;
            },
            memh.get(), true);
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const size_t bad = FirstMismatch(local.get(), bytes);
      if (bad != bytes) {
        std::fprintf(stderr, "client: rep %d: byte %zu differs from the pattern\n", rep, bad);
        result.verified = 0;
      }
      gbps.push_back(static_cast<double>(bytes) / s / 1e9);
      if (o.verbose)
        std::fprintf(stderr, "client: rep %d: %.3f s, %.2f GB/s\n", rep, s, gbps.back());
    }
  }
  const Request done{kMagic, kOpDone, 1, 1};
  StreamSend(worker.get(), ep.get(), &done, sizeof(done));
  rkey.reset();
  ep.Close();

  std::sort(gbps.begin(), gbps.end());
  result.median_gbps = gbps[gbps.size() / 2];
  result.best_gbps = gbps.back();
  return result;
}

// --- one-command runs ---

int Guarded(const std::function<void()>& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ucx_transfer_bench: %s\n", e.what());
    return 1;
  }
}

int ExitCode(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return 1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

// Forks a loopback server (port 0 unless --port was given), runs the client here. Returns 0 only
// if both ends succeeded and every byte verified.
int RunBoth(Options o, Result* out) {
  int ready[2];
  if (pipe(ready) != 0) throw std::runtime_error("pipe");
  std::fflush(nullptr);
  const pid_t server = fork();
  if (server < 0) throw std::runtime_error("fork");
  if (server == 0) {
    close(ready[0]);
    Options so = o;
    so.port = o.port_given ? o.port : 0;
    _exit(Guarded([&] { RunServer(so, ready[1]); }));
  }
  close(ready[1]);
  uint16_t port = 0;
  const bool up = read(ready[0], &port, sizeof(port)) == sizeof(port);
  close(ready[0]);
  if (!up) {
    (void)ExitCode(server);
    std::fprintf(stderr, "ucx_transfer_bench: the server exited before listening\n");
    return 1;
  }
  o.port = port;
  Result r;
  const int client_rc = Guarded([&] { r = RunClient(o); });
  if (client_rc != 0) kill(server, SIGTERM);  // it may still be waiting for a connection
  const int server_rc = ExitCode(server);
  if (out != nullptr) *out = r;
  if (client_rc == 0 && out == nullptr) {
    std::printf("%s: %zu bytes, chunk %zu, inflight %zu: %.2f GB/s (median of %d, best %.2f), %s\n",
                o.method.c_str(), o.bytes, o.chunk, o.inflight, r.median_gbps, o.reps, r.best_gbps,
                r.verified != 0 ? "every byte verified" : "VERIFICATION FAILED");
  }
  return (client_rc != 0 || server_rc != 0 || r.verified == 0) ? 1 : 0;
}

struct Row {
  std::string tls;  // "" = UCX_TLS unset (UCX chooses)
  bool peer_errors;
  std::string method;
  size_t bytes, chunk, inflight;
};

std::string Size(size_t b) {
  return b % (1024 * kMiB) == 0 ? std::to_string(b / (1024 * kMiB)) + " GiB"
                                : std::to_string(b / kMiB) + " MiB";
}

// Each row runs in a child with its own UCX_TLS (UCX reads it at ucp_config_read).
int RunTable(const Options& base, const std::vector<Row>& rows) {
  std::printf(
      "| UCX_TLS | err_mode | method | size | chunk | inflight | GB/s (median of %d) | best "
      "| verified |\n",
      base.reps);
  std::printf("|---|---|---|--:|--:|--:|--:|--:|---|\n");
  int failures = 0;
  for (const Row& row : rows) {
    int res[2];
    if (pipe(res) != 0) throw std::runtime_error("pipe");
    std::fflush(nullptr);
    const pid_t child = fork();
    if (child < 0) throw std::runtime_error("fork");
    if (child == 0) {
      close(res[0]);
      if (row.tls.empty()) {
        unsetenv("UCX_TLS");
      } else {
        setenv("UCX_TLS", row.tls.c_str(), 1);
      }
      Options o = base;
      o.peer_errors = row.peer_errors;
      o.method = row.method;
      o.bytes = row.bytes;
      o.chunk = row.chunk;
      o.inflight = row.inflight;
      Result r;
      int rc = 1;
      (void)Guarded([&] { rc = RunBoth(o, &r); });
      const bool sent = write(res[1], &r, sizeof(r)) == sizeof(r);
      _exit(sent ? rc : 1);
    }
    close(res[1]);
    Result r;
    const bool got = read(res[0], &r, sizeof(r)) == sizeof(r);
    close(res[0]);
    const bool ok = ExitCode(child) == 0 && got && r.verified != 0;
    failures += ok ? 0 : 1;
    std::printf("| %s | %s | %s | %s | %s | %zu | %.2f | %.2f | %s |\n",
                row.tls.empty() ? "(default)" : row.tls.c_str(), row.peer_errors ? "peer" : "none",
                row.method.c_str(), Size(row.bytes).c_str(), Size(row.chunk).c_str(), row.inflight,
                r.median_gbps, r.best_gbps, ok ? "yes" : "NO");
    std::fflush(stdout);
  }
  return failures == 0 ? 0 : 1;
}

size_t ParseSize(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || n == 0) {
    throw std::runtime_error(flag + " wants a positive integer, got '" + v + "'");
  }
  return n;
}

constexpr const char* kUsage =
    "usage: ucx_transfer_bench --role=server|client|both [--host=H] [--port=P] [--bytes=N]\n"
    "         [--method=get|tag] [--chunk=N] [--inflight=K] [--reps=R] [--err_mode=peer|none]\n"
    "         [--verbose]\n"
    "       ucx_transfer_bench --table | --sweep [--bytes=N] [--reps=R]\n";

int Main(int argc, char** argv) {
  Options o;
  bool table = false;
  bool sweep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string k = a.substr(0, eq);
    const std::string v = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (k == "--role") {
      o.role = v;
    } else if (k == "--host") {
      o.host = v;
    } else if (k == "--port") {
      o.port = static_cast<uint16_t>(std::min<size_t>(ParseSize(k, v), 65535));
      o.port_given = true;
    } else if (k == "--bytes") {
      o.bytes = ParseSize(k, v);
    } else if (k == "--chunk") {
      o.chunk = ParseSize(k, v);
    } else if (k == "--inflight") {
      o.inflight = ParseSize(k, v);
    } else if (k == "--reps") {
      o.reps = static_cast<int>(std::min<size_t>(ParseSize(k, v), 1000));
    } else if (k == "--method") {
      o.method = v;
    } else if (k == "--err_mode" && (v == "peer" || v == "none")) {
      o.peer_errors = v == "peer";
    } else if (a == "--verbose") {
      o.verbose = true;
    } else if (a == "--table") {
      table = true;
    } else if (a == "--sweep") {
      sweep = true;
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (o.method != "get" && o.method != "tag") {
    std::fprintf(stderr, "--method must be get or tag\n%s", kUsage);
    return 2;
  }
  if (table || sweep) {
    // UCX_TLS=tcp; UCX's choice with peer error handling (the daemon's setting); UCX's choice
    // without it (shared memory allowed).
    const std::vector<std::pair<std::string, bool>> configs = {
        {"tcp", true}, {"", true}, {"", false}};
    std::vector<Row> rows;
    for (const auto& [tls, peer] : configs) {
      for (const char* m : {"get", "tag"}) {
        if (table) {
          for (const size_t b : {64 * kMiB, 256 * kMiB, 1024 * kMiB}) {
            rows.push_back({tls, peer, m, b, o.chunk, o.inflight});
          }
        } else {
          for (const size_t c : {1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB}) {
            for (const size_t k : {1, 4, 16}) rows.push_back({tls, peer, m, o.bytes, c, k});
          }
        }
      }
    }
    return RunTable(o, rows);
  }
  if (o.role == "server") {
    o.host = o.host == "127.0.0.1" ? "0.0.0.0" : o.host;
    return Guarded([&] { RunServer(o, -1); });
  }
  if (o.role == "client") {
    return Guarded([&] {
      const Result r = RunClient(o);
      std::printf("%s: chunk %zu, inflight %zu: %.2f GB/s (median of %d, best %.2f), %s\n",
                  o.method.c_str(), o.chunk, o.inflight, r.median_gbps, o.reps, r.best_gbps,
                  r.verified != 0 ? "every byte verified" : "VERIFICATION FAILED");
      if (r.verified == 0) throw std::runtime_error("verification failed");
    });
  }
  if (o.role == "both") {
    int rc = 1;
    (void)Guarded([&] { rc = RunBoth(o, nullptr); });
    return rc;
  }
  std::fprintf(stderr, "--role must be server, client or both\n%s", kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ucx_transfer_bench: %s\n", e.what());
    return 1;
  }
}
