// A client process for the keeper's chaos test: acquires a model, checks every tensor's
// bytes against the checkpoint, releases, again, until stdin closes; daemon restarts in
// between are expected (an Acquire that fails is retried). The first lease it gets is held
// for the whole run and checked every round too: memory mapped before a daemon crash must
// keep its bytes.
//   wc_chaos_client SOCKET MODEL
// Prints "STATS ok=N wrong=N errors=N held_ok=N" at the end (exit 0), or "ERROR ..." (exit 2).
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "pkg/client/client.h"
#include "pkg/safetensors/safetensors.h"

using namespace weightcache;

namespace {

bool StdinClosed() {
  pollfd p{STDIN_FILENO, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char c;
  return ::read(STDIN_FILENO, &c, 1) <= 0;
}

// Whether every tensor of `lease` holds the checkpoint's bytes.
bool Matches(const client::Lease& lease, const std::map<std::string, std::string>& want) {
  if (lease.tensors().size() != want.size()) return false;
  for (const auto& [name, bytes] : want) {
    const auto* v = lease.Find(name);
    if (v == nullptr || v->nbytes != bytes.size() ||
        std::memcmp(v->data, bytes.data(), bytes.size()) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 4) {
    std::printf("ERROR usage: wc_chaos_client SOCKET MODEL MODEL_DIR\n");
    return 2;
  }
  auto ckpt = safetensors::Checkpoint::Open(argv[3]);
  if (!ckpt.ok()) {
    std::printf("ERROR %s\n", std::string(ckpt.status().message()).c_str());
    return 2;
  }
  std::map<std::string, std::string> want;
  for (const auto& t : ckpt->tensors()) {
    std::string b(t.nbytes, '\0');
    const auto& f = ckpt->files()[t.file_index];
    if (::pread(f.fd(), b.data(), t.nbytes, static_cast<off_t>(t.file_offset)) !=
        static_cast<ssize_t>(t.nbytes)) {
      std::printf("ERROR reading %s\n", t.name.c_str());
      return 2;
    }
    want[t.name] = std::move(b);
  }
  uint64_t ok = 0, wrong = 0, errors = 0, held_ok = 0;
  std::unique_ptr<client::Lease> held;  // mapped once, kept across daemon restarts
  std::printf("STARTED\n");
  while (!StdinClosed()) {
    auto c = client::Client::Connect(argv[1]);
    if (!c.ok()) {
      errors++;
      ::usleep(20 * 1000);
      continue;
    }
    client::AcquireOptions o;
    o.model = argv[2];
    o.wait_ready = true;
    o.timeout = std::chrono::seconds(5);
    auto lease = (*c)->Acquire(o);
    if (!lease.ok()) {
      errors++;
      ::usleep(20 * 1000);
      continue;
    }
    if (Matches(**lease, want)) {
      ok++;
    } else {
      wrong++;
      std::printf("WRONG bytes in a fresh lease\n");
    }
    if (!held) {
      held = std::move(lease).value();
    } else if (Matches(*held, want)) {
      held_ok++;
    } else {
      wrong++;
      std::printf("WRONG bytes in the lease held since the start\n");
    }
  }
  std::printf("STATS ok=%llu wrong=%llu errors=%llu held_ok=%llu\n",
              static_cast<unsigned long long>(ok), static_cast<unsigned long long>(wrong),
              static_cast<unsigned long long>(errors), static_cast<unsigned long long>(held_ok));
  return 0;
}
