// wc_gpu_helper: the "other process" of the GPU tests. It talks over the socket inherited as
// descriptor 3 (SCM_RIGHTS, see fd_channel.h) and reports through its exit status:
//   check    <uuid> <seed> <size>...  receive the FDs, map them read-only into one VA range,
//                                     check the layout and that every byte equals the pattern
//   write-ro <uuid> <seed> <size>     receive, map read-only, write with a kernel: the write
//                                     must fault (exit 0 when it did)
//   export   <seed> <size>...         be the exporter: allocate on the first GPU, fill, seal,
//                                     send the FDs with "<uuid>" as payload, then wait for
//                                     the socket to close (or a SIGKILL)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/memory/mapping.h"
#include "tests/gpu/fd_channel.h"
#include "tests/gpu/gpu_testkit.h"

namespace weightcache::gputest {
namespace {

constexpr int kSock = 3;
enum Exit {
  kOk = 0,
  kUsage = 2,
  kMapFailed = 10,
  kMismatch = 11,
  kLayout = 12,
  kNoFault = 13,
  kSetupFailed = 14
};

int Fail(int code, const std::string& what) {
  std::fprintf(stderr, "wc_gpu_helper: %s\n", what.c_str());
  return code;
}

absl::StatusOr<std::unique_ptr<memory::SegmentMapping>> ReceiveAndMap(
    const std::string& uuid, const std::vector<uint64_t>& sizes) {
  auto got = RecvFds(kSock);
  if (!got.ok()) return got.status();
  return memory::MapReadOnly(memory::BackendKind::kCudaVmm, std::move(got->fds), sizes, uuid);
}

int Check(const std::string& uuid, uint64_t seed, const std::vector<uint64_t>& sizes) {
  auto m = ReceiveAndMap(uuid, sizes);
  if (!m.ok()) return Fail(kMapFailed, std::string(m.status().ToString()));
  auto ordinal = memory::internal::CudaOrdinalOfUuid(uuid);
  if (!ordinal.ok()) return Fail(kMapFailed, std::string(ordinal.status().ToString()));
  // One VA range: segment i starts where segment i-1 ends.
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if ((*m)->base(i) != (*m)->base(0) + total) return Fail(kLayout, "segments not contiguous");
    total += sizes[i];
  }
  // One copy over the whole range: it crosses every segment boundary, so it succeeds only if
  // the single read-only cuMemSetAccess covered them all.
  std::vector<unsigned char> host(total);
  std::string err = CopyToHost(host.data(), (*m)->base(0), total, *ordinal);
  if (!err.empty()) return Fail(kMismatch, "device->host copy: " + err);
  uint64_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t bad = FirstMismatch(host.data() + off, sizes[i], seed, static_cast<uint32_t>(i));
    if (bad >= 0) {
      return Fail(kMismatch,
                  "segment " + std::to_string(i) + " differs at byte " + std::to_string(bad));
    }
    off += sizes[i];
  }
  std::printf("wc_gpu_helper check: %zu segments, %llu bytes on ordinal %d match\n", sizes.size(),
              static_cast<unsigned long long>(total), *ordinal);
  return kOk;
}

int WriteReadOnly(const std::string& uuid, const std::vector<uint64_t>& sizes) {
  auto m = ReceiveAndMap(uuid, sizes);
  if (!m.ok()) return Fail(kMapFailed, std::string(m.status().ToString()));
  auto ordinal = memory::internal::CudaOrdinalOfUuid(uuid);
  if (!ordinal.ok()) return Fail(kMapFailed, std::string(ordinal.status().ToString()));
  std::string err = KernelWrite(const_cast<std::byte*>((*m)->base(0)), 4096, *ordinal);
  if (err.empty()) return Fail(kNoFault, "a kernel wrote to the read-only mapping");
  std::printf("wc_gpu_helper write-ro: the write faulted as expected: %s\n", err.c_str());
  std::fflush(stdout);
  // The context is now unusable; leave without tearing down through it.
  std::_Exit(kOk);
}

int Export(uint64_t seed, const std::vector<uint64_t>& sizes) {
  auto backend = memory::MakeCudaBackend();
  if (!backend.ok()) return Fail(kSetupFailed, std::string(backend.status().ToString()));
  std::vector<std::unique_ptr<memory::Segment>> segs;
  std::vector<int> fds;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto seg = (*backend)->Allocate("", sizes[i], "helper-export");
    if (!seg.ok()) return Fail(kSetupFailed, std::string(seg.status().ToString()));
    std::vector<unsigned char> data((*seg)->size());
    FillPattern(data.data(), data.size(), seed, static_cast<uint32_t>(i));
    if (auto s = (*seg)->CopyIn(0, data.data(), data.size()); !s.ok()) {
      return Fail(kSetupFailed, std::string(s.ToString()));
    }
    if (auto s = (*seg)->Seal(); !s.ok()) return Fail(kSetupFailed, std::string(s.ToString()));
    fds.push_back((*seg)->fd());
    segs.push_back(std::move(seg).value());
  }
  if (auto s = SendFds(kSock, fds, segs.front()->device_uuid()); !s.ok()) {
    return Fail(kSetupFailed, std::string(s.ToString()));
  }
  char c;
  while (::read(kSock, &c, 1) > 0) {
  }
  return kOk;
}

}  // namespace
}  // namespace weightcache::gputest

int main(int argc, char** argv) {
  using namespace weightcache::gputest;
  if (argc < 3) return Fail(kUsage, "usage: wc_gpu_helper check|write-ro|export ...");
  std::string mode = argv[1];
  std::vector<uint64_t> sizes;
  if (mode == "export") {
    uint64_t seed = std::strtoull(argv[2], nullptr, 0);
    for (int i = 3; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 0));
    if (sizes.empty()) return Fail(kUsage, "export: no sizes");
    return Export(seed, sizes);
  }
  if (argc < 5) return Fail(kUsage, "check|write-ro <uuid> <seed> <size>...");
  std::string uuid = argv[2];
  uint64_t seed = std::strtoull(argv[3], nullptr, 0);
  for (int i = 4; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 0));
  if (mode == "check") return Check(uuid, seed, sizes);
  if (mode == "write-ro") return WriteReadOnly(uuid, sizes);
  return Fail(kUsage, "unknown mode " + mode);
}
