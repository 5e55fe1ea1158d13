// wc_gpu_attacker: the integrity test's hostile engine (issue 27). It acquires a model like
// any engine -- the Acquire RPC, then the handle channel's descriptors -- but imports segment
// `seg` READ-WRITE (what "read-only" on cuda-vmm cannot stop: docs/gpu.md) and writes 0xFF
// over `n` bytes at `offset` with a kernel, then exits (its lease ends).
//   wc_gpu_attacker <socket_dir> <model> <seg> <offset> <n>
// Exit 0 when the write landed; 1 with a message otherwise.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/memory/mapping.h"
#include "pkg/util/unix_socket.h"
#include "tests/gpu/gpu_testkit.h"
#include "weightcache/v1/weightcache.grpc.pb.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "wc_gpu_attacker: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace weightcache;
  uint32_t seg = 0;
  uint64_t offset = 0, n = 0;
  if (argc != 6 || !absl::SimpleAtoi(argv[3], &seg) || !absl::SimpleAtoi(argv[4], &offset) ||
      !absl::SimpleAtoi(argv[5], &n)) {
    return Fail("usage: wc_gpu_attacker <socket_dir> <model> <seg> <offset> <n>");
  }
  const std::string dir = argv[1];
  auto channel =
      grpc::CreateChannel("unix:" + dir + "/control.sock", grpc::InsecureChannelCredentials());
  auto stub = v1::WeightCache::NewStub(channel);
  v1::AcquireRequest req;
  req.set_model(argv[2]);
  req.set_wait_ready(true);
  v1::AcquireResponse resp;
  grpc::ClientContext ctx;
  if (auto s = stub->Acquire(&ctx, req, &resp); !s.ok())
    return Fail("Acquire: " + s.error_message());
  if (static_cast<int>(seg) >= resp.segments_size()) return Fail("no such segment");
  auto conn = ConnectUnix(dir + "/handle.sock");
  if (!conn.ok()) return Fail(conn.status().ToString());
  if (auto s = WriteAll(conn->get(), "WCH1 " + resp.token() + "\n"); !s.ok()) {
    return Fail(s.ToString());
  }
  std::vector<ScopedFd> fds;
  while (fds.size() < static_cast<size_t>(resp.segments_size())) {
    auto got = RecvWithFds(conn->get(), 4096);
    if (!got.ok()) return Fail(got.status().ToString());
    if (got->data.rfind("FDS ", 0) != 0) return Fail("handle channel: " + got->data);
    for (auto& fd : got->fds) fds.push_back(std::move(fd));
  }
  std::vector<ScopedFd> mine;
  mine.push_back(std::move(fds[seg]));
  const std::string uuid = resp.device_uuid();
  auto writable = memory::MapWritable(memory::BackendKind::kCudaVmm, std::move(mine),
                                      {resp.segments(static_cast<int>(seg)).size()}, uuid);
  if (!writable.ok()) return Fail("import read-write: " + writable.status().ToString());
  auto ordinal = memory::internal::CudaOrdinalOfUuid(uuid);
  if (!ordinal.ok()) return Fail(ordinal.status().ToString());
  const std::string err = gputest::KernelWrite((*writable)->writable_base(0) + offset, n, *ordinal);
  if (!err.empty()) return Fail("kernel write: " + err);
  std::printf("WROTE %llu bytes of 0xFF at segment %u + %llu on %s\n",
              static_cast<unsigned long long>(n), seg, static_cast<unsigned long long>(offset),
              uuid.c_str());
  return 0;
}
