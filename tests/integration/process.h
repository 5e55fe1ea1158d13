// A child process for tests: argv, stdin pipe, stdout pipe (read line by line with a
// deadline), stderr to a file; killed (SIGKILL) and reaped on destruction.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace weightcache::testing {

class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::string& stderr_path);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  // The next stdout line, or nullopt at EOF or when `timeout` passes.
  std::optional<std::string> ReadLine(std::chrono::milliseconds timeout);
  // Reads lines until one starts with `prefix`; returns it (or nullopt).
  std::optional<std::string> WaitFor(const std::string& prefix, std::chrono::milliseconds timeout);
  // Writes `line` and a newline to the child's stdin; false when it is closed.
  bool WriteLine(const std::string& line);
  void CloseStdin();
  void Kill(int sig);
  // Waits for exit; returns the wait status.
  int Wait();

 private:
  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  std::string buf_;
  bool reaped_ = false;
};

// A field of /proc/PID/io (e.g. "rchar": bytes the process read through read/pread, page
// cache included, so a reload from a hot page cache still counts); ~0 when it is not there.
uint64_t ProcIo(pid_t pid, const std::string& field);

}  // namespace weightcache::testing
