// wc_scrub_hook_daemon: the daemon (server::Daemon, host backend) serving one model, beside a
// keeper, with one test hook: while <trigger file> exists, the scrubber's next digest of the
// model's segment 0 differs in its first chunk (and the file is removed), as if a process had
// written to the memory. For tests whose engine is another process (python/tests): a real
// daemon restart, and a corruption found after it. Test-only.
//   wc_scrub_hook_daemon <socket dir> <keeper socket> <model name> <model dir> <trigger file>
// Scrubs every 100 ms; serves until its stdin closes, then shuts down as on SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "pkg/memory/backend.h"
#include "pkg/server/testing/hooks.h"

int main(int argc, char** argv) {
  using namespace weightcache;
  if (argc != 6) {
    std::fprintf(stderr,
                 "usage: %s <socket dir> <keeper socket> <model name> <model dir> <trigger>\n",
                 argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);

  const std::string model = argv[3], trigger = argv[5];
  server::testing::FunctionHooks hooks;
  hooks.before_digest_compare = [&](const std::string& m, size_t segment,
                                    std::vector<uint64_t>* chunks) {
    if (m == model && segment == 0 && !chunks->empty() && ::unlink(trigger.c_str()) == 0) {
      (*chunks)[0] ^= 1;
    }
  };
  server::DaemonOptions o;
  o.socket_dir = argv[1];
  o.keeper_socket = argv[2];
  o.admin_socket_dir = std::string(argv[1]) + "-admin";
  o.digest_store = "";
  o.scrub_interval = std::chrono::milliseconds(100);
  o.scrub_bytes_per_second = 0;
  spec::ModelSpec s;
  s.name = model;
  s.model_dir = argv[4];
  o.specs.push_back(s);
  auto backend = memory::MakeHostBackend();
  auto daemon = server::testing::DaemonHooksAccess::Start(o, backend.get(), &hooks);
  if (!daemon.ok()) {
    std::fprintf(stderr, "wc_scrub_hook_daemon: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  daemon->reset();
  return 0;
}
