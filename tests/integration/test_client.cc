// A client process for the multi-process tests. It acquires a model, checks every byte
// against the checkpoint on disk, reports the identity of the pages it mapped and whether
// a write into them is refused, then holds the lease until stdin closes.
//   wc_test_client SOCKET MODEL
// Output lines: "INODE <dev>:<inode>", "BYTES OK|BYTES BAD <name>", "WRITE REFUSED|WRITE
// ALLOWED", "READY", and on a failure "ERROR <message>" (exit 2).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "pkg/client/client.h"
#include "pkg/safetensors/safetensors.h"

using namespace weightcache;

namespace {

// "dev:inode" of the file behind the mapping that starts at `addr`, from /proc/self/maps.
std::string MappingIdentity(const void* addr) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  char want[32];
  std::snprintf(want, sizeof want, "%lx-", reinterpret_cast<unsigned long>(addr));
  while (std::getline(maps, line)) {
    if (line.rfind(want, 0) != 0) continue;
    char range[64], perms[8], offset[32], dev[16];
    unsigned long inode = 0;
    if (std::sscanf(line.c_str(), "%63s %7s %31s %15s %lu", range, perms, offset, dev, &inode) ==
        5) {
      return std::string(dev) + ":" + std::to_string(inode) + " " + perms;
    }
  }
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 3) {
    std::printf("ERROR usage: wc_test_client SOCKET MODEL\n");
    return 2;
  }
  auto c = client::Client::Connect(argv[1]);
  if (!c.ok()) {
    std::printf("ERROR %s\n", std::string(c.status().message()).c_str());
    return 2;
  }
  client::AcquireOptions o;
  o.model = argv[2];
  o.wait_ready = true;
  auto lease = (*c)->Acquire(o);
  if (!lease.ok()) {
    std::printf("ERROR %s\n", std::string(lease.status().ToString()).c_str());
    return 2;
  }
  std::printf("LEASE %s\n", (*lease)->id().c_str());
  std::printf("INODE %s\n", MappingIdentity((*lease)->segment_base(0)).c_str());

  auto ckpt = safetensors::Checkpoint::Open((*lease)->model_dir());
  if (!ckpt.ok()) {
    std::printf("ERROR %s\n", std::string(ckpt.status().message()).c_str());
    return 2;
  }
  bool ok = ckpt->tensors().size() == (*lease)->tensors().size();
  std::vector<char> buf;
  for (const auto& t : ckpt->tensors()) {
    const auto* v = (*lease)->Find(t.name);
    buf.resize(t.nbytes);
    const auto& f = ckpt->files()[t.file_index];
    if (::pread(f.fd(), buf.data(), t.nbytes, static_cast<off_t>(t.file_offset)) !=
            static_cast<ssize_t>(t.nbytes) ||
        v == nullptr || v->nbytes != t.nbytes || std::memcmp(v->data, buf.data(), t.nbytes) != 0) {
      std::printf("BYTES BAD %s\n", t.name.c_str());
      ok = false;
      break;
    }
  }
  if (ok) std::printf("BYTES OK\n");

  // A write into the mapping must fault: try it in a child so this process survives.
  pid_t pid = ::fork();
  if (pid == 0) {
    // Die by the signal itself, not through a sanitizer's SEGV handler.
    std::signal(SIGSEGV, SIG_DFL);
    auto* p =
        const_cast<volatile uint8_t*>(reinterpret_cast<const uint8_t*>((*lease)->segment_base(0)));
    p[0] = static_cast<uint8_t>(p[0] + 1);
    _exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  bool mprotect_refused = ::mprotect(const_cast<std::byte*>((*lease)->segment_base(0)), 4096,
                                     PROT_READ | PROT_WRITE) != 0;
  std::printf("WRITE %s\n", WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV && mprotect_refused
                                ? "REFUSED"
                                : "ALLOWED");
  std::printf("READY\n");
  // Hold the lease until the test closes our stdin (or kills us).
  char ch;
  while (::read(STDIN_FILENO, &ch, 1) > 0) {
  }
  return 0;
}
