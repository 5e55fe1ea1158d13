#include "tests/integration/daemon_harness.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/unix_socket.h"

namespace weightcache::testing {

absl::StatusOr<StartedDaemon> StartDaemon(
    const std::vector<std::string>& argv, const std::string& socket_dir,
    const std::string& log_path, const std::function<bool(const v1::StatusResponse&)>& ready,
    std::chrono::milliseconds timeout) {
  StartedDaemon d;
  d.process = std::make_unique<Process>(argv, log_path);
  const std::string control = socket_dir + "/control.sock";
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::access(control.c_str(), F_OK) == 0) {
      auto c = client::Client::Connect(socket_dir);
      if (c.ok()) {
        auto st = (*c)->Status();
        if (st.ok() && (!ready || ready(*st))) {
          d.client = std::move(c).value();
          return d;
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a bounded poll
  }
  return absl::DeadlineExceededError("weightcached did not become ready; its log:\n" +
                                     ReadFileOrEmpty(log_path));
}

std::unique_ptr<Process> StartKeeper(const std::string& keeper_path, const std::string& socket,
                                     const std::string& log_path) {
  auto p = std::make_unique<Process>(std::vector<std::string>{keeper_path, "--socket=" + socket},
                                     log_path);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ConnectUnix(socket, SOCK_SEQPACKET).ok()) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a bounded poll
  }
  ADD_FAILURE() << "keeper did not start: " << ReadFileOrEmpty(log_path);
  return p;
}

std::unique_ptr<client::Client> AdminClient(const std::string& socket_dir) {
  auto c = client::Client::Connect(socket_dir + "-admin/control.sock");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(c).value() : nullptr;
}

v1::StatusResponse WaitForStatus(client::Client& c,
                                 const std::function<bool(const v1::StatusResponse&)>& pred,
                                 std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  v1::StatusResponse last;
  while (std::chrono::steady_clock::now() < deadline) {
    auto st = c.Status();
    if (st.ok()) {
      last = *st;
      if (pred(last)) return last;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a bounded poll
  }
  ADD_FAILURE() << "condition not reached; last status: " << last.DebugString();
  return last;
}

ToolRun RunTool(const std::vector<std::string>& argv, const std::string& err_path) {
  Process p(argv, err_path);
  ToolRun r;
  while (auto l = p.ReadLine(std::chrono::seconds(20))) r.out += *l + "\n";
  const int status = p.Wait();
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out += ReadFileOrEmpty(err_path);
  return r;
}

bool WaitForLogLine(const std::string& path, const std::string& line,
                    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (ReadFileOrEmpty(path).find(line) == std::string::npos) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a bounded poll
  }
  return true;
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string CheckpointTensorBytes(const std::string& dir, const std::string& name) {
  auto ck = safetensors::Checkpoint::Open(dir);
  if (!ck.ok()) return "";
  const safetensors::TensorInfo* t = ck->Find(name);
  if (t == nullptr) return "";
  std::string out(t->nbytes, '\0');
  const ssize_t r = ::pread(ck->files()[t->file_index].fd(), out.data(), out.size(),
                            static_cast<off_t>(t->file_offset));
  return r == static_cast<ssize_t>(out.size()) ? out : "";
}

safetensors::LlamaShape SmallLlama() {
  safetensors::LlamaShape s;
  s.layers = 2;
  s.hidden = 256;
  s.intermediate = 512;
  s.heads = 4;
  s.kv_heads = 2;
  s.vocab = 1024;
  return s;
}

int MetricsPort(const std::string& log_path) {
  std::smatch m;
  const std::string log = ReadFileOrEmpty(log_path);
  // The metrics server's line: the peer API logs a "(port N)" of its own.
  return std::regex_search(log, m, std::regex("metrics http: [^\n]*\\(port ([0-9]+)\\)"))
             ? std::stoi(m[1])
             : -1;
}

std::string Scrape(int port) {
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "";
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
  if (!WriteAll(fd.get(), req).ok()) return "";
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd.get(), buf, sizeof buf)) > 0;) out.append(buf, n);
  return out;
}

}  // namespace weightcache::testing
