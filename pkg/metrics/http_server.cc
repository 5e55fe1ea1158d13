#include "pkg/metrics/http_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "pkg/util/log.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace weightcache::metrics {

struct ListenAddress {
  std::string listening_ports;  // civetweb's option value
  sockaddr_storage wake;        // where to connect to reach the listener (port unset)
  socklen_t wake_len = 0;
};

namespace {

constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";
constexpr const char* kTextContentType = "text/plain; charset=utf-8";

const char* ReasonPhrase(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 405:
      return "Method Not Allowed";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

// Writes a complete response; returns `code` for civetweb's request handler contract
// (1..999: handled, this status).
int Respond(mg_connection* conn, int code, const char* content_type, const std::string& body) {
  const mg_request_info* info = mg_get_request_info(conn);
  const bool head = info != nullptr && info->request_method != nullptr &&
                    std::strcmp(info->request_method, "HEAD") == 0;
  const std::string header =
      absl::StrCat("HTTP/1.1 ", code, " ", ReasonPhrase(code), "\r\nContent-Type: ", content_type,
                   "\r\nContent-Length: ", body.size(),
                   "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n");
  mg_write(conn, header.data(), header.size());
  if (!head && !body.empty()) mg_write(conn, body.data(), body.size());
  return code;
}

// Returns 0 when the method is GET or HEAD, else answers 405 and returns its code.
int RejectMethod(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  const char* m = info != nullptr ? info->request_method : nullptr;
  if (m != nullptr && (std::strcmp(m, "GET") == 0 || std::strcmp(m, "HEAD") == 0)) return 0;
  return Respond(conn, 405, kTextContentType, "only GET and HEAD\n");
}

bool AllDigits(const std::string& s) {
  if (s.empty() || s.size() > 5) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Validates "IPv4:port" / "[IPv6]:port". civetweb would read other syntaxes ("8080s",
// "a,b", "+8080") as TLS, several ports or dual-stack; none of them is meant here.
absl::StatusOr<ListenAddress> ParseAddress(const std::string& address) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\": ", why,
                     " (want IPv4:port or [IPv6]:port, e.g. 0.0.0.0:9464)"));
  };
  std::string host;
  std::string port;
  bool v6 = false;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find("]:");
    if (close == std::string::npos) return bad("no \"]:port\" after an IPv6 address");
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
    v6 = true;
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  if (!AllDigits(port) || std::stoi(port) > 65535) return bad("port is not a number 0..65535");
  ListenAddress out;
  out.listening_ports = address;
  std::memset(&out.wake, 0, sizeof(out.wake));
  if (v6) {
    if (mg_check_feature(8) == 0) return bad("this civetweb build has no IPv6 support");
    auto* sa = reinterpret_cast<sockaddr_in6*>(&out.wake);
    sa->sin6_family = AF_INET6;
    if (inet_pton(AF_INET6, host.c_str(), &sa->sin6_addr) != 1) {
      return bad(absl::StrCat("\"", host, "\" is not a numeric IPv6 address"));
    }
    if (IN6_IS_ADDR_UNSPECIFIED(&sa->sin6_addr)) sa->sin6_addr = in6addr_loopback;
    out.wake_len = sizeof(sockaddr_in6);
  } else {
    auto* sa = reinterpret_cast<sockaddr_in*>(&out.wake);
    sa->sin_family = AF_INET;
    if (inet_pton(AF_INET, host.c_str(), &sa->sin_addr) != 1) {
      return bad(absl::StrCat("\"", host, "\" is not a numeric IPv4 address"));
    }
    if (sa->sin_addr.s_addr == htonl(INADDR_ANY)) sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    out.wake_len = sizeof(sockaddr_in);
  }
  return out;
}

void SetPort(sockaddr_storage& addr, int port) {
  if (addr.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(port));
  }
}

int LogMessage(const mg_connection* /*conn*/, const char* message) {
  WC_LOG_WARN("metrics http: %s", message != nullptr ? message : "(null)");
  return 1;  // handled: civetweb prints nothing itself
}

}  // namespace

HttpServer::HttpServer(std::string address, ReadinessCheck readiness)
    : address_(std::move(address)), readiness_(std::move(readiness)) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options) {
  absl::StatusOr<ListenAddress> listen = ParseAddress(options.address);
  if (!listen.ok()) return listen.status();
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics http: num_threads ", options.num_threads, " < 1"));
  }
  std::unique_ptr<HttpServer> server(new HttpServer(options.address, std::move(options.readiness)));

  const std::string threads = std::to_string(options.num_threads);
  const char* config[] = {"listening_ports",
                          listen->listening_ports.c_str(),
                          "num_threads",
                          threads.c_str(),
                          "enable_keep_alive",
                          "no",
                          "request_timeout_ms",
                          "10000",
                          nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = &LogMessage;
  mg_init_data init;
  std::memset(&init, 0, sizeof(init));
  init.callbacks = &callbacks;
  init.user_data = server.get();
  init.configuration_options = config;
  char error_text[256] = {0};
  unsigned error_code = 0;
  mg_error_data error;
  std::memset(&error, 0, sizeof(error));
  error.code = &error_code;
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);

  server->ctx_ = mg_start2(&init, &error);
  if (server->ctx_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("metrics http: cannot listen on \"", options.address,
                                               "\": ", error_text, " (civetweb error ", error_code,
                                               ")"));
  }
  mg_set_request_handler(server->ctx_, "/metrics$", &HttpServer::HandleMetrics, server.get());
  mg_set_request_handler(server->ctx_, "/healthz$", &HttpServer::HandleHealthz, server.get());
  mg_set_request_handler(server->ctx_, "/readyz$", &HttpServer::HandleReadyz, server.get());

  mg_server_port bound[4];
  std::memset(bound, 0, sizeof(bound));
  const int n = mg_get_server_ports(server->ctx_, 4, bound);
  if (n < 1 || bound[0].port <= 0) {
    // The destructor stops the context.
    return absl::InternalError(absl::StrCat("metrics http: listening on \"", options.address,
                                            "\" but cannot read the bound port back"));
  }
  server->port_ = bound[0].port;
  server->wake_ = listen->wake;
  server->wake_len_ = listen->wake_len;
  SetPort(server->wake_, server->port_);
  WC_LOG_INFO("metrics http: serving /metrics /healthz /readyz on %s (port %d)", server->address_,
              server->port_);
  return server;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address) {
  HttpServerOptions options;
  options.address = address;
  return Start(std::move(options));
}

HttpServer::~HttpServer() {
  if (ctx_ == nullptr) return;
  if (port_ == 0) {  // Start failed after mg_start2; nothing to wake
    mg_stop(ctx_);
    return;
  }
  // mg_stop joins civetweb's threads, but its listening thread sees the stop flag only when
  // its poll() returns, up to 2 s later. A connection to the listening socket (closed at
  // once, so a worker that gets it reads EOF) makes poll() return now. The wake may race
  // ahead of the stop flag, hence the retry until mg_stop has returned.
  absl::Notification stopped;
  std::thread stopper([this, &stopped] {
    mg_stop(ctx_);
    stopped.Notify();
  });
  do {
    WakeListener();
  } while (!stopped.WaitForNotificationWithTimeout(absl::Milliseconds(20)));
  stopper.join();
}

void HttpServer::WakeListener() const {
  const int fd = socket(wake_.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;  // best effort: mg_stop still returns after its poll timeout
  (void)connect(fd, reinterpret_cast<const sockaddr*>(&wake_), wake_len_);
  close(fd);
}

void HttpServer::RegisterCollectable(std::weak_ptr<prometheus::Collectable> collectable) {
  absl::MutexLock lock(&mu_);
  collectables_.push_back(std::move(collectable));
}

void HttpServer::SetReadinessCheck(ReadinessCheck check) {
  absl::MutexLock lock(&mu_);
  readiness_ = std::move(check);
}

std::string HttpServer::RenderMetrics() const {
  std::vector<std::shared_ptr<prometheus::Collectable>> live;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& weak : collectables_) {
      if (auto c = weak.lock()) live.push_back(std::move(c));
    }
  }
  // Collect outside the lock: collectables may take their own locks and take time.
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : live) {
    std::vector<prometheus::MetricFamily> f = c->Collect();
    families.insert(families.end(), std::make_move_iterator(f.begin()),
                    std::make_move_iterator(f.end()));
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

std::pair<bool, std::string> HttpServer::CheckReady() const {
  ReadinessCheck check;
  {
    absl::MutexLock lock(&mu_);
    check = readiness_;
  }
  if (!check) return {false, "readiness check not set"};
  return check();
}

// The handlers run on civetweb threads; an exception must not cross into C.
int HttpServer::HandleMetrics(mg_connection* conn, void* self) {
  if (int code = RejectMethod(conn)) return code;
  try {
    return Respond(conn, 200, kMetricsContentType,
                   static_cast<const HttpServer*>(self)->RenderMetrics());
  } catch (const std::exception& e) {
    WC_LOG_ERROR("metrics http: /metrics: %s", e.what());
    return Respond(conn, 500, kTextContentType, absl::StrCat("collect failed: ", e.what(), "\n"));
  }
}

int HttpServer::HandleHealthz(mg_connection* conn, void* /*self*/) {
  if (int code = RejectMethod(conn)) return code;
  return Respond(conn, 200, kTextContentType, "ok\n");
}

int HttpServer::HandleReadyz(mg_connection* conn, void* self) {
  if (int code = RejectMethod(conn)) return code;
  try {
    auto [ready, reason] = static_cast<const HttpServer*>(self)->CheckReady();
    if (ready) return Respond(conn, 200, kTextContentType, "ready\n");
    return Respond(conn, 503, kTextContentType, absl::StrCat("not ready: ", reason, "\n"));
  } catch (const std::exception& e) {
    return Respond(conn, 503, kTextContentType,
                   absl::StrCat("not ready: readiness check threw: ", e.what(), "\n"));
  }
}

}  // namespace weightcache::metrics
