#include "pkg/metrics/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pkg/metrics/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace weightcache::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct HttpResponse {
  int status = 0;
  std::string headers;
  std::string body;
};

// A minimal HTTP/1.0 client: one request, read until the server closes.
HttpResponse Get(int port, const std::string& path, const std::string& method = "GET") {
  HttpResponse r;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ADD_FAILURE() << "socket: " << std::strerror(errno);
    return r;
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { close(fd); }
  } closer{fd};
  timeval tv{10, 0};  // a bound on a hung server, not synchronisation
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "connect to port " << port << ": " << std::strerror(errno);
    return r;
  }
  const std::string req = method + " " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    ADD_FAILURE() << "write: " << std::strerror(errno);
    return r;
  }
  std::string raw;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      ADD_FAILURE() << "read: " << std::strerror(errno);
      return r;
    }
    raw.append(buf, static_cast<size_t>(n));
  }
  const size_t split = raw.find("\r\n\r\n");
  if (split == std::string::npos) {
    ADD_FAILURE() << "no header end in response: " << raw;
    return r;
  }
  r.headers = raw.substr(0, split);
  r.body = raw.substr(split + 4);
  if (std::sscanf(r.headers.c_str(), "HTTP/1.%*d %d", &r.status) != 1) {
    ADD_FAILURE() << "bad status line: " << r.headers;
  }
  return r;
}

class FakeState : public StateSource {
 public:
  std::vector<EntrySnapshot> Entries() const override {
    return {{"m", "ready", "GPU-0f1e", 4096, 1}, {"n", "loading", "host", 512, 0}};
  }
  std::vector<DeviceSnapshot> Devices() const override {
    return {{"GPU-0f1e", 1 << 30, 1 << 29, 4096}, {"host", 1 << 20, 1 << 19, 512}};
  }
};

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = std::make_shared<prometheus::Registry>();
    metrics_ = std::make_unique<Metrics>(*registry_, BuildInfo{"0.1.0", "none", "host"});
    metrics_->SetStateSource(&state_);
    auto server = HttpServer::Start("127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    server_->RegisterCollectable(registry_);
    server_->RegisterCollectable(metrics_->collectable());
  }
  void TearDown() override {
    server_.reset();  // first: stops serving before the things it reads go away
    metrics_.reset();
  }

  FakeState state_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, EphemeralPortIsReadBack) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:0");
}

TEST_F(HttpServerTest, MetricsServesCountersGaugesAndBuildInfo) {
  metrics_->OnAcquire("m", AcquireResult::kHit, 0.0002);
  const HttpResponse r = Get(server_->port(), "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.headers, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(r.body, HasSubstr("weightcache_acquire_total{model=\"m\",result=\"hit\"} 1\n"));
  EXPECT_THAT(r.body, HasSubstr("weightcache_acquire_total{model=\"m\",result=\"miss\"} 0\n"));
  EXPECT_THAT(r.body, HasSubstr("weightcache_build_info{backend=\"host\",cuda=\"none\","
                                "version=\"0.1.0\"} 1\n"));
  EXPECT_THAT(r.body, HasSubstr("weightcache_acquire_duration_seconds_count 1\n"));
  EXPECT_THAT(r.body,
              HasSubstr("weightcache_resident_bytes{device=\"GPU-0f1e\",model=\"m\"} 4096\n"));
  EXPECT_THAT(r.body, HasSubstr("weightcache_models{state=\"loading\"} 1\n"));
  EXPECT_THAT(r.body, HasSubstr("weightcache_models{state=\"evicting\"} 0\n"));
  EXPECT_THAT(r.body, HasSubstr("weightcache_device_memory_bytes{device=\"host\",kind=\"used\"} "
                                "512\n"));
  EXPECT_EQ(r.body, server_->RenderMetrics());

  // Counters move between scrapes.
  metrics_->OnAcquire("m", AcquireResult::kHit, 0.0002);
  EXPECT_THAT(Get(server_->port(), "/metrics").body,
              HasSubstr("weightcache_acquire_total{model=\"m\",result=\"hit\"} 2\n"));
}

TEST_F(HttpServerTest, ExpiredCollectableIsSkipped) {
  auto extra = std::make_shared<prometheus::Registry>();
  prometheus::Registry& extra_ref = *extra;
  server_->RegisterCollectable(extra);
  prometheus::BuildCounter().Name("extra_total").Help("x").Register(extra_ref).Add({}).Increment();
  EXPECT_THAT(Get(server_->port(), "/metrics").body, HasSubstr("extra_total 1\n"));
  extra.reset();
  const HttpResponse r = Get(server_->port(), "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.body, Not(HasSubstr("extra_total")));
  EXPECT_THAT(r.body, HasSubstr("weightcache_build_info"));
}

TEST_F(HttpServerTest, HealthzIsOk) {
  const HttpResponse r = Get(server_->port(), "/healthz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok\n");
}

TEST_F(HttpServerTest, ReadyzFollowsTheReadinessCheck) {
  // No check yet.
  HttpResponse r = Get(server_->port(), "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.body, HasSubstr("readiness check not set"));

  std::atomic<bool> ready{false};
  server_->SetReadinessCheck([&ready]() -> std::pair<bool, std::string> {
    if (ready.load()) return {true, ""};
    return {false, "model m is loading"};
  });
  r = Get(server_->port(), "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body, "not ready: model m is loading\n");

  ready.store(true);
  r = Get(server_->port(), "/readyz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ready\n");
}

TEST_F(HttpServerTest, ReadinessCheckThatThrowsIsNotReady) {
  server_->SetReadinessCheck(
      []() -> std::pair<bool, std::string> { throw std::runtime_error("boom"); });
  const HttpResponse r = Get(server_->port(), "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_THAT(r.body, HasSubstr("boom"));
}

TEST_F(HttpServerTest, UnknownPathIs404AndPostIs405) {
  EXPECT_EQ(Get(server_->port(), "/nope").status, 404);
  EXPECT_EQ(Get(server_->port(), "/metricsx").status, 404);
  EXPECT_EQ(Get(server_->port(), "/metrics", "POST").status, 405);
  const HttpResponse head = Get(server_->port(), "/healthz", "HEAD");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
}

TEST(HttpServerStartTest, ReadinessFromOptions) {
  HttpServerOptions options;
  options.address = "127.0.0.1:0";
  options.readiness = [] { return std::make_pair(true, std::string()); };
  auto server = HttpServer::Start(std::move(options));
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(Get((*server)->port(), "/readyz").status, 200);
  EXPECT_EQ(Get((*server)->port(), "/metrics").body, "");  // nothing registered
}

TEST(HttpServerStartTest, DefaultAddressIsDocumented) {
  EXPECT_EQ(HttpServerOptions().address, "0.0.0.0:9464");
  EXPECT_STREQ(HttpServer::kDefaultAddress, "0.0.0.0:9464");
}

TEST(HttpServerStartTest, BadAddressesNameTheAddress) {
  for (const std::string addr :
       {"", "9464", "localhost:9464", "127.0.0.1:99999", "127.0.0.1:abc", "127.0.0.1:80s",
        "1.2.3.4.5:80", "[::1:80", "[zz]:80", "127.0.0.1:80,127.0.0.1:81"}) {
    auto server = HttpServer::Start(addr);
    ASSERT_FALSE(server.ok()) << addr;
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << addr;
    EXPECT_THAT(std::string(server.status().message()), HasSubstr("\"" + addr + "\"")) << addr;
  }
}

TEST(HttpServerStartTest, PortInUseIsUnavailableAndNamesTheAddress) {
  auto first = HttpServer::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string addr = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = HttpServer::Start(addr);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("\"" + addr + "\""));
}

TEST(HttpServerStartTest, NonLocalAddressIsUnavailable) {
  // TEST-NET-1 (RFC 5737) is never assigned to a local interface.
  auto server = HttpServer::Start("192.0.2.1:0");
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("\"192.0.2.1:0\""));
}

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (const auto dir : absl::StrSplit(std::string(path), ':')) {
    std::string candidate = std::string(dir.data(), dir.size()) + "/" + name;
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

TEST_F(HttpServerTest, PromtoolAcceptsTheScrape) {
  const std::string promtool = FindOnPath("promtool");
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool not on PATH (Debian package `prometheus`)";
  }
  for (AcquireResult r : {AcquireResult::kHit, AcquireResult::kMiss, AcquireResult::kMismatch,
                          AcquireResult::kRejected}) {
    metrics_->OnAcquire("m", r, 0.001);
  }
  metrics_->OnLoad("m", "disk", 12.5, 1 << 20);
  metrics_->OnEviction("m", "budget");
  const HttpResponse r = Get(server_->port(), "/metrics");
  ASSERT_EQ(r.status, 200);

  const std::string file =
      ::testing::TempDir() + "/weightcache_scrape_" + std::to_string(getpid()) + ".txt";
  {
    std::ofstream out(file, std::ios::binary);
    out << r.body;
    ASSERT_TRUE(out.good());
  }
  const std::string cmd = promtool + " check metrics < '" + file + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) output.append(buf, n);
  const int rc = pclose(p);
  std::remove(file.c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "promtool: " << output;
  EXPECT_EQ(output, "") << "scrape:\n" << r.body;
}

}  // namespace
}  // namespace weightcache::metrics
