// The metrics port against clients that trickle their request heads: liveness must not starve.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "pkg/metrics/http_server.h"

namespace weightcache::metrics {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

sockaddr_in Loopback(int last_octet, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl((127u << 24) | static_cast<uint32_t>(last_octet));
  return a;
}

// Reads `fd` until the server closes it (or its receive timeout); what it said.
std::string ReadUntilClose(int fd) {
  std::string raw;
  char buf[1024];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      raw.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return n == 0 ? raw : raw + "<read error>";
    }
  }
}

std::string ReadToClose(int fd) {
  timeval tv{10, 0};  // a bound on a hung server, not synchronisation
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return ReadUntilClose(fd);
}

struct Probe {
  int status = 0;  // 0: no answer within the timeout
  milliseconds took{0};
};

// What the kubelet's httpGet probe does: one request, the answer read until close, given up
// after `timeout` (the probe's timeoutSeconds).
Probe ProbeHealthz(int port, milliseconds timeout) {
  Probe p;
  const auto start = Clock::now();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return p;
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const sockaddr_in addr = Loopback(1, port);
  std::string raw;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req =
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kube-probe/1.29\r\n"
        "Accept: */*\r\nConnection: close\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      raw = ReadUntilClose(fd);  // or the timeout
    }
  }
  close(fd);
  p.took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  if (p.took > timeout) return p;
  if (std::sscanf(raw.c_str(), "HTTP/1.%*d %d", &p.status) != 1) p.status = 0;
  return p;
}

// `n` clients from 127.0.0.1..127.0.0.<addresses>, each sending its request head one header
// line every `period`, reconnecting as soon as the server closes it (a hostile pod).
class Tricklers {
 public:
  Tricklers(int port, int n, int addresses, milliseconds period)
      : port_(port), n_(n), addresses_(addresses), period_(period) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Tricklers() {
    stop_ = true;
    thread_.join();
  }
  int connects() const { return connects_.load(); }

 private:
  struct Client {
    int fd = -1;
    Clock::time_point next;
    int lines = 0;
  };
  void Connect(Client& c, int i) {
    c.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c.fd < 0) return;
    const sockaddr_in from = Loopback(1 + i % addresses_, 0);
    const sockaddr_in to = Loopback(1, port_);
    if (bind(c.fd, reinterpret_cast<const sockaddr*>(&from), sizeof(from)) != 0 ||
        (connect(c.fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0 &&
         errno != EINPROGRESS)) {
      close(c.fd);
      c.fd = -1;
      return;
    }
    ++connects_;
    c.lines = 0;
    c.next = Clock::now();
  }
  void Run() {
    std::vector<Client> clients(static_cast<size_t>(n_));
    while (!stop_) {
      const auto now = Clock::now();
      std::vector<pollfd> fds;
      for (size_t i = 0; i < clients.size(); ++i) {
        Client& c = clients[i];
        if (c.fd < 0) Connect(c, static_cast<int>(i));
        if (c.fd < 0) continue;
        if (now >= c.next) {
          const std::string line = c.lines == 0
                                       ? std::string("GET /metrics HTTP/1.1\r\n")
                                       : "X-Trickle-" + std::to_string(c.lines) + ": 1\r\n";
          (void)send(c.fd, line.data(), line.size(), MSG_NOSIGNAL);
          ++c.lines;
          c.next = now + period_;
        }
        fds.push_back({c.fd, POLLIN, 0});
      }
      // Paces the loop (the next line is due at most `period` from now), not a synchronisation.
      if (poll(fds.data(), fds.size(), 50) <= 0) continue;
      for (const pollfd& p : fds) {
        if (p.revents == 0) continue;
        char buf[512];
        const ssize_t r = recv(p.fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EINTR))) continue;
        for (Client& c : clients) {
          if (c.fd == p.fd) {
            close(c.fd);
            c.fd = -1;  // reconnects on the next pass
          }
        }
      }
    }
    for (Client& c : clients) {
      if (c.fd >= 0) close(c.fd);
    }
  }

  const int port_;
  const int n_;
  const int addresses_;
  const milliseconds period_;
  std::atomic<bool> stop_{false};
  std::atomic<int> connects_{0};
  std::thread thread_;
};

// Issue: 16 such clients made /healthz fail every probe on the civetweb server (4 threads, a
// 10 s request timeout), and the chart's liveness probe restarts the daemon after 6 failures.
// Here 64 clients from 8 addresses trickle a header line every 2 s while /healthz is probed
// with the kubelet's timeout (5 s), once a second (the kubelet's period is 10 s: faster covers
// more of the attack in a short test), for 8 s: four of the server's 2 s head deadlines, so
// the tricklers are cut and reconnect several times meanwhile. Every probe answers 200 within
// the 100 ms plus four times the worst latency measured idle in this same test (slack
// for two busy cores and sanitizers; idle is ~1 ms here).
TEST(HealthzTest, TricklingClientsFromEightAddressesDoNotStarveLiveness) {
  auto server = HttpServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const milliseconds kubelet_timeout(5000);

  milliseconds idle_worst(0);
  for (int i = 0; i < 5; ++i) {
    const Probe p = ProbeHealthz(port, kubelet_timeout);
    ASSERT_EQ(p.status, 200) << "idle probe " << i;
    idle_worst = std::max(idle_worst, p.took);
  }
  const milliseconds bound = milliseconds(100) + 4 * idle_worst;

  Tricklers attack(port, 64, 8, milliseconds(2000));
  std::vector<Probe> probes;
  const auto start = Clock::now();
  for (int i = 0; i < 8; ++i) {
    // The kubelet's cadence: a probe each period, whatever the last one took.
    std::this_thread::sleep_until(start + i * milliseconds(1000));
    probes.push_back(ProbeHealthz(port, kubelet_timeout));
  }
  int failed = 0;
  for (size_t i = 0; i < probes.size(); ++i) {
    const bool ok = probes[i].status == 200 && probes[i].took <= bound;
    failed += ok ? 0 : 1;
    EXPECT_TRUE(ok) << "probe " << i << ": status " << probes[i].status << " in "
                    << probes[i].took.count() << " ms (bound " << bound.count() << " ms, idle "
                    << idle_worst.count() << " ms)";
  }
  EXPECT_EQ(failed, 0);
  // The attack ran: every client connected, and was cut and came back at least once.
  EXPECT_GE(attack.connects(), 2 * 64);
}

int ConnectFrom(int last_octet, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const sockaddr_in from = Loopback(last_octet, 0);
  const sockaddr_in to = Loopback(1, port);
  EXPECT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&from), sizeof(from)), 0);
  EXPECT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)), 0);
  return fd;
}

// A head that starts but never ends is closed at the head deadline (counted), and a source
// past its cap is refused at the door with a 503 that says why, while another source is served.
TEST(TricklingTest, HeadDeadlineClosesAndSourceCapRefuses) {
  HttpServerOptions o;
  o.address = "127.0.0.1:0";
  o.max_connections_per_source = 2;
  o.head_timeout = milliseconds(300);
  auto server = HttpServer::Start(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();

  const auto start = Clock::now();
  const int a = ConnectFrom(2, port);
  const int b = ConnectFrom(2, port);
  ASSERT_EQ(write(a, "GET /healthz HTTP/1.1\r\n", 23), 23);  // and nothing more
  ASSERT_EQ(write(b, "G", 1), 1);
  // Both hold 127.0.0.2's places once the door has handed them over: wait for that.
  while ((*server)->listener().accepted < 2) std::this_thread::yield();
  const int c = ConnectFrom(2, port);
  EXPECT_EQ(ReadToClose(c).rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u);
  close(c);
  // Another source is served meanwhile.
  EXPECT_EQ(ProbeHealthz(port, milliseconds(5000)).status, 200);

  EXPECT_EQ(ReadToClose(a), "");  // closed without an answer, not before the deadline
  EXPECT_GE(Clock::now() - start, milliseconds(300));
  EXPECT_EQ(ReadToClose(b), "");
  close(a);
  close(b);
  const ListenerSnapshot l = (*server)->listener();
  EXPECT_EQ(l.listener, "metrics");
  EXPECT_EQ(l.refused.at("per_key"), 1u);
  EXPECT_EQ(l.refused.at("head_deadline"), 2u);
  EXPECT_EQ(l.accepted, 3u);  // a, b and the probe
}

}  // namespace
}  // namespace weightcache::metrics
