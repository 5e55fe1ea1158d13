#include "tests/integration/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>

namespace weightcache::testing {

Process::Process(const std::vector<std::string>& argv, const std::string& stderr_path) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) std::abort();
  // Everything the child needs is built before fork: after it, in a threaded parent, only
  // async-signal-safe calls are allowed.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (err >= 0) ::dup2(err, 2);
    ::execv(args[0], args.data());
    _exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  in_ = in[1];
  out_ = out[0];
}

Process::~Process() {
  if (!reaped_) {
    Kill(SIGKILL);
    Wait();
  }
  if (in_ >= 0) ::close(in_);
  if (out_ >= 0) ::close(out_);
}

std::optional<std::string> Process::ReadLine(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char tmp[4096];
    ssize_t n = ::read(out_, tmp, sizeof tmp);
    if (n <= 0) return std::nullopt;
    buf_.append(tmp, n);
  }
}

std::optional<std::string> Process::WaitFor(const std::string& prefix,
                                            std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    auto line = ReadLine(left);
    if (!line) return std::nullopt;
    if (line->rfind(prefix, 0) == 0) return line;
  }
}

bool Process::WriteLine(const std::string& line) {
  std::string s = line + "\n";
  size_t off = 0;
  while (in_ >= 0 && off < s.size()) {
    ssize_t n = ::write(in_, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return in_ >= 0;
}

void Process::CloseStdin() {
  if (in_ >= 0) ::close(in_);
  in_ = -1;
}

void Process::Kill(int sig) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
}

int Process::Wait() {
  int status = 0;
  if (pid_ > 0 && !reaped_) {
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
  }
  return status;
}

uint64_t ProcIo(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/io");
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v) {
    if (k == field + ":") return v;
  }
  return ~0ull;
}

}  // namespace weightcache::testing
