// weightcache-keeper: holds the cache's segment descriptors so the cache outlives a
// weightcached crash or upgrade (pkg/keeper/server.h). Parses flags, runs until
// SIGINT/SIGTERM. Stopping it closes what it holds: engines keep what they mapped, the
// daemon keeps serving and deposits again when a keeper is back.
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "pkg/keeper/server.h"
#include "pkg/util/flags_help.h"
#include "pkg/util/log.h"

ABSL_FLAG(std::string, socket, weightcache::keeper::kDefaultSocket,
          "The keeper's socket; weightcached's --keeper_socket. A missing directory is created "
          "0700; an existing one is used as it is when safe (owned by this uid or root, not "
          "writable by others unless sticky); only a stale socket at the path is replaced");
ABSL_FLAG(std::vector<std::string>, allowed_uids, {},
          "Uids that may deposit and adopt (the daemon's); default: the keeper's own uid");
ABSL_FLAG(uint64_t, max_fds, 0,
          "Most descriptors held for entries; 0: the open-file limit (raised to the hard limit "
          "at start) less 64");
ABSL_FLAG(bool, verbose, false, "Debug logging");

namespace weightcache {
namespace {

int Run() {
  if (absl::GetFlag(FLAGS_verbose)) SetLogLevel(LogLevel::kDebug);
  keeper::KeeperOptions o;
  o.socket_path = absl::GetFlag(FLAGS_socket);
  o.max_fds = absl::GetFlag(FLAGS_max_fds);
  for (const auto& u : absl::GetFlag(FLAGS_allowed_uids)) {
    uint32_t id;
    if (!absl::SimpleAtoi(u, &id)) {
      std::fprintf(stderr, "weightcache-keeper: --allowed_uids: '%s' is not a number\n",
                   u.substr(0, 64).c_str());
      return 2;
    }
    o.allowed_uids.push_back(id);
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  auto k = keeper::Keeper::Start(o);
  if (!k.ok()) {
    std::fprintf(stderr, "weightcache-keeper: %s\n", std::string(k.status().ToString()).c_str());
    return 2;
  }
  int sig = 0;
  sigwait(&sigs, &sig);
  const auto s = (*k)->stats();
  WC_LOG_INFO("keeper: signal %d: exiting; releasing %d entries (%d descriptors)", sig,
              static_cast<int>(s.entries), static_cast<long long>(s.fds));
  (*k)->Stop();
  return 0;
}

}  // namespace
}  // namespace weightcache

int main(int argc, char** argv) {
  const std::string usage =
      "weightcache keeper: holds cached weights' descriptors across weightcached restarts.\n"
      "  weightcache-keeper --socket=/run/weightcache-keeper/keeper.sock\n"
      "Runs until SIGTERM or SIGINT.";
  weightcache::HandleHelpFlag(argc, argv, usage, {"cmd/weightcache-keeper/"});
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
  return weightcache::Run();
}
