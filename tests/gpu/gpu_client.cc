// An engine process for the whole-stack GPU tests (stack_gpu_test.cc): acquires a model from
// a cuda-vmm daemon, checks every tensor's bytes with a checksum computed by a kernel on the
// mapped device memory against the checkpoint on disk, then serves commands on stdin.
//   wc_gpu_client SOCKET MODEL DEVICE_UUID
// Lines out: "IDS uid=<uid> pid=<pid>", "CONTEXT_FREE <bytes>" (cudaMemGetInfo once this
// process's context exists), "MAPPED_FREE <bytes>" (after mapping), "BYTES OK" | "BYTES BAD
// <name> <why>", "READY"; on a failure "ERROR <message>" (exit 2).
// Commands in: "check" (again -> BYTES ...), "write" (a kernel writes into the first tensor
// -> "WRITE FAULTED <cuda error>" | "WRITE SUCCEEDED"), EOF (release and exit).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "pkg/client/client.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/safetensors/safetensors.h"
#include "tests/gpu/gpu_testkit.h"

using namespace weightcache;

namespace {

int Fail(const std::string& why) {
  std::printf("ERROR %s\n", why.c_str());
  return 2;
}

// The device checksum of every mapped tensor against the host checksum of the file's bytes.
std::string Check(const client::Lease& lease, int ordinal,
                  const std::map<std::string, uint64_t>& want) {
  if (lease.tensors().size() != want.size()) {
    return "tensor count " + std::to_string(lease.tensors().size()) +
           " != " + std::to_string(want.size());
  }
  for (const auto& v : lease.tensors()) {
    uint64_t got = 0;
    std::string err = gputest::DeviceChecksum(v.data, v.nbytes, ordinal, &got);
    if (!err.empty()) return v.name + " " + err;
    auto it = want.find(v.name);
    if (it == want.end() || it->second != got) return v.name + " checksum differs";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 4) return Fail("usage: wc_gpu_client SOCKET MODEL DEVICE_UUID");
  std::printf("IDS uid=%d pid=%d\n", static_cast<int>(::getuid()), static_cast<int>(::getpid()));
  auto ordinal = memory::internal::CudaOrdinalOfUuid(argv[3]);
  if (!ordinal.ok()) return Fail(ordinal.status().ToString());
  uint64_t free_bytes = 0, total = 0;
  if (auto e = gputest::MemInfo(*ordinal, &free_bytes, &total); !e.empty()) return Fail(e);
  std::printf("CONTEXT_FREE %llu\n", static_cast<unsigned long long>(free_bytes));

  // WC_ACQUIRE_RETRY_S=N: retry connecting and acquiring for up to N s (a daemon that is
  // restarting), then print "ACQUIRED_AT <CLOCK_REALTIME ns>" (the keeper's GPU script times
  // a restart to the first Acquire with it).
  const char* retry_env = std::getenv("WC_ACQUIRE_RETRY_S");
  // WC_ACQUIRE_ON_GO=1: acquire only after a line on stdin (the script sends it once the
  // daemon it means has been started, so an earlier daemon cannot answer).
  if (std::getenv("WC_ACQUIRE_ON_GO") != nullptr) {
    std::string go;
    std::getline(std::cin, go);
  }
  const auto retry_until =
      std::chrono::steady_clock::now() + std::chrono::seconds(retry_env ? std::atoi(retry_env) : 0);
  absl::StatusOr<std::unique_ptr<client::Lease>> lease = absl::UnavailableError("not tried");
  while (true) {
    auto c = client::Client::Connect(argv[1]);
    if (c.ok()) {
      client::AcquireOptions o;
      o.model = argv[2];
      o.device_uuid = argv[3];
      o.wait_ready = true;
      lease = (*c)->Acquire(o);
      if (lease.ok()) break;
    } else {
      lease = c.status();
    }
    if (std::chrono::steady_clock::now() >= retry_until) return Fail(lease.status().ToString());
    ::usleep(2000);
  }
  if (retry_env != nullptr) {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    std::printf("ACQUIRED_AT %lld%09ld\n", static_cast<long long>(ts.tv_sec), ts.tv_nsec);
  }
  if ((*lease)->backend() != "cuda-vmm" || (*lease)->device_uuid() != argv[3]) {
    return Fail("lease on " + (*lease)->backend() + " " + (*lease)->device_uuid());
  }
  if (auto e = gputest::MemInfo(*ordinal, &free_bytes, &total); !e.empty()) return Fail(e);
  std::printf("MAPPED_FREE %llu\n", static_cast<unsigned long long>(free_bytes));

  auto ckpt = safetensors::Checkpoint::Open((*lease)->model_dir());
  if (!ckpt.ok()) return Fail(ckpt.status().ToString());
  std::map<std::string, uint64_t> want;
  std::vector<char> buf;
  for (const auto& t : ckpt->tensors()) {
    buf.resize(t.nbytes);
    const auto& f = ckpt->files()[t.file_index];
    std::vector<safetensors::ReadRequest> req{
        {f.fd(), t.file_offset, t.nbytes, buf.data(), t.name}};
    if (auto s = safetensors::ReadRanges(req, {}); !s.ok()) return Fail(s.ToString());
    want[t.name] = gputest::HostChecksum(buf.data(), buf.size());
  }
  auto report = [&] {
    std::string bad = Check(**lease, *ordinal, want);
    std::printf(bad.empty() ? "BYTES OK\n" : "BYTES BAD %s\n", bad.c_str());
  };
  report();
  std::printf("READY\n");
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "check") {
      report();
    } else if (line == "write") {
      const auto& v = (*lease)->tensors().front();
      std::string e = gputest::KernelWrite(const_cast<void*>(v.data), 4096, *ordinal);
      std::printf(e.empty() ? "WRITE SUCCEEDED\n" : "WRITE FAULTED %s\n", e.c_str());
    }
  }
  return 0;
}
