// weightcachectl subcommands; main.cc only parses flags. Each returns the process exit
// code: 0 success, 1 a check failed (verify found differences), 2 an error.
#pragma once

#include <string>
#include <vector>

namespace weightcache::ctl {

struct Context {
  std::string socket;
  std::string spec_file;
  std::string fingerprint;
  std::string model_dir;
  int tp_size = 1;
  int tp_rank = -1;  // load: -1 every rank; verify: -1 means 0
  bool load_on_miss = false;
  bool resident = false;  // verify: the daemon checks its resident copy against its digests
  bool tty = false;
};

int Run(const std::string& command, const std::vector<std::string>& args, const Context& ctx);

}  // namespace weightcache::ctl
