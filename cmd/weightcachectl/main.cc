// weightcachectl: the operator's CLI for a node's weightcache daemon.
//   weightcachectl status                      cache entries, leases and counters
//   weightcachectl list                        known models, their ranks and what is cached
//   weightcachectl load MODEL [--spec FILE]    load (every rank) with a progress bar
//   weightcachectl evict MODEL|--fingerprint=FP
//   weightcachectl evict-artifacts MODEL|ID    drop compile artifacts (admin)
//   weightcachectl verify MODEL                acquire, map, compare every byte with disk
//   weightcachectl verify --resident MODEL     the daemon re-digests its resident copy
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "cmd/weightcachectl/commands.h"
#include "pkg/util/flags_help.h"

ABSL_FLAG(std::string, socket, "",
          "Daemon control socket or its directory (default $WEIGHTCACHE_SOCKET, else "
          "/run/weightcache/control.sock)");
ABSL_FLAG(std::string, spec, "", "load: a spec file (YAML/JSON) holding one model");
ABSL_FLAG(std::string, fingerprint, "", "evict/verify: an exact fingerprint");
ABSL_FLAG(std::string, model_dir, "", "verify: checkpoint directory (default: the daemon's)");
ABSL_FLAG(int, tp_size, 1, "verify: layout asked");
ABSL_FLAG(int, tp_rank, -1,
          "load: only this tensor-parallel rank (default: every rank of the spec); verify: the "
          "rank asked (default 0)");
ABSL_FLAG(bool, load_on_miss, false, "verify: ask the daemon to load on a miss");
ABSL_FLAG(bool, resident, false,
          "verify: the daemon digests its resident entries of MODEL again and compares them with "
          "their digests from when they were filled (admin; nothing is mapped here)");

int main(int argc, char** argv) {
  const std::string usage =
      "weightcache CLI: talks to the node's weightcached.\n"
      "Commands:\n"
      "  weightcachectl status                    cache entries (sorted by model and rank),\n"
      "                                           leases, devices and acquire counters\n"
      "  weightcachectl list                      known models: dir, tp/pp, quantization,\n"
      "                                           cached ranks, refused ones with the reason\n"
      "  weightcachectl load MODEL | --spec=FILE  load every rank (--tp_rank=N: one)\n"
      "  weightcachectl evict MODEL | --fingerprint=FP\n"
      "  weightcachectl evict-artifacts MODEL | ID  drop a model's compile artifacts, or one\n"
      "  weightcachectl verify MODEL | --fingerprint=FP\n"
      "                                           map and compare every byte with the files\n"
      "  weightcachectl verify --resident MODEL   the daemon checks its resident copy against\n"
      "                                           the digests taken when it was filled\n"
      "  weightcachectl pin MODEL                 the spec's digests: block (each file's\n"
      "                                           SHA-256) for a model this node hashed (admin)\n"
      "  weightcachectl demo-checkpoint DIR       write a small Llama-shaped checkpoint";
  weightcache::HandleHelpFlag(argc, argv, usage, {"cmd/weightcachectl/"});
  absl::SetProgramUsageMessage(usage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  weightcache::ctl::Context ctx;
  ctx.socket = absl::GetFlag(FLAGS_socket);
  ctx.spec_file = absl::GetFlag(FLAGS_spec);
  ctx.fingerprint = absl::GetFlag(FLAGS_fingerprint);
  ctx.model_dir = absl::GetFlag(FLAGS_model_dir);
  ctx.tp_size = absl::GetFlag(FLAGS_tp_size);
  ctx.tp_rank = absl::GetFlag(FLAGS_tp_rank);
  ctx.load_on_miss = absl::GetFlag(FLAGS_load_on_miss);
  ctx.resident = absl::GetFlag(FLAGS_resident);
  ctx.tty = ::isatty(STDOUT_FILENO) != 0;
  std::string cmd = args[1];
  std::vector<std::string> rest(args.begin() + 2, args.end());
  return weightcache::ctl::Run(cmd, rest, ctx);
}
