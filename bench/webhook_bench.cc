// webhook_bench (issue 47): how long the webhook takes to answer a good AdmissionReview, each
// on a fresh TLS connection as an API server opens them under load, with 0 and with N slow TLS
// clients that trickle or stall mid-handshake and reconnect when closed (pkg/webhook/testing).
// The server runs in this process with its defaults (the chart's), on 127.0.0.1.
//   webhook_bench --reviews=200 --slow=0,128
// Prints one row per slow-client count: reviews, p50, p99 and max latency, reviews over the
// API server's 1 s target and over its 5 s timeout, and the slow clients' connections made.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "pkg/webhook/server.h"
#include "pkg/webhook/testing/load.h"

ABSL_FLAG(int, reviews, 200, "Good reviews timed per row");
ABSL_FLAG(std::string, slow, "0,128", "Slow reconnecting clients, one row each");
ABSL_FLAG(int, threads, 32, "The server's request threads (--threads of the webhook)");

namespace weightcache {
namespace {

int Run() {
  char tmpl[] = "/tmp/wc-webhook-bench.XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  if (absl::Status s = webhook::testing::WriteSelfSignedPair(dir); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("%6s %8s %9s %9s %9s %6s %6s %9s\n", "slow", "reviews", "p50 ms", "p99 ms", "max ms",
              ">1s", ">5s", "connects");
  for (const absl::string_view field : absl::StrSplit(absl::GetFlag(FLAGS_slow), ',')) {
    int slow_count = 0;
    if (!absl::SimpleAtoi(field, &slow_count)) return 2;
    webhook::ServerOptions o;
    o.address = "127.0.0.1:0";
    o.cert_file = dir + "/tls.crt";
    o.key_file = dir + "/tls.key";
    o.num_threads = absl::GetFlag(FLAGS_threads);
    auto server = webhook::Server::Start(o);
    if (!server.ok()) {
      std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
      return 1;
    }
    const int port = (*server)->port();
    webhook::testing::SlowClients slow(port, slow_count);
    slow.WaitConnected(1, absl::Seconds(60));
    const absl::Time settle = absl::Now() + absl::Seconds(slow_count > 0 ? 3 : 0);
    while (absl::Now() < settle) absl::SleepFor(absl::Milliseconds(50));  // several rounds
    std::vector<double> ms;
    int over1 = 0;
    int over5 = 0;
    for (int i = 0; i < absl::GetFlag(FLAGS_reviews); ++i) {
      auto took = webhook::testing::TimeReview(port, absl::Seconds(30));
      if (!took.ok()) {
        std::fprintf(stderr, "review %d: %s\n", i, std::string(took.status().message()).c_str());
        ++over5;
        continue;
      }
      ms.push_back(absl::ToDoubleMilliseconds(*took));
      over1 += *took > absl::Seconds(1);
      over5 += *took > absl::Seconds(5);
    }
    std::printf("%6d %8zu %9.1f %9.1f %9.1f %6d %6d %9lld\n", slow_count, ms.size(),
                bench::Percentile(ms, 0.5), bench::Percentile(ms, 0.99), bench::Percentile(ms, 1.0),
                over1, over5, static_cast<long long>(slow.connects()));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace weightcache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return weightcache::Run();
}
