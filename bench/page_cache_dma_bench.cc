// Can a hot load skip the CPU copy? Measures host->device DMA straight from page-cache
// pages: the file mmapped read-only, each window registered with
// cudaHostRegister(cudaHostRegisterReadOnly), copied with cudaMemcpyAsync, unregistered
// once its copy has landed -- against the loader's way (pread into pinned buffers, then
// copy), on the same hot file, in one run. An exploration for docs/benchmarks.md ("Cold
// load"), not a code path of the loader.
//
//   page_cache_dma_bench --file=/var/tmp/wc-dma.bin --gib=8 [--windows_mib=64,256,1024]
//
// The file is written (random bytes) unless it exists with the size, read once so that it
// is in the page cache, and deleted at the end unless --keep.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
constexpr double kGB = 1e9;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "page_cache_dma_bench: %s\n", what.c_str());
  std::exit(1);
}
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Args {
  std::string file = "/var/tmp/wc-dma.bin";
  double gib = 8;
  std::vector<uint64_t> windows_mib = {64, 256, 1024};
  unsigned threads = 16;
  bool keep = false;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto val = [&](const char* k) -> const char* {
      return s.rfind(k, 0) == 0 ? s.c_str() + std::strlen(k) : nullptr;
    };
    if (auto v = val("--file=")) {
      a.file = v;
    } else if (auto v = val("--gib=")) {
      a.gib = std::atof(v);
    } else if (auto v = val("--threads=")) {
      a.threads = static_cast<unsigned>(std::atoi(v));
    } else if (auto v = val("--windows_mib=")) {
      a.windows_mib.clear();
      for (const char* p = v; *p != '\0';) {
        a.windows_mib.push_back(std::strtoull(p, const_cast<char**>(&p), 10));
        if (*p == ',') ++p;
      }
    } else if (s == "--keep") {
      a.keep = true;
    } else {
      Die("unknown argument " + s);
    }
  }
  return a;
}

void WriteRandom(const std::string& path, uint64_t bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) Die("create " + path);
  std::vector<uint64_t> buf((64ull << 20) / 8);
  std::mt19937_64 rng(42);
  for (uint64_t done = 0; done < bytes;) {
    for (auto& x : buf) x = rng();
    const uint64_t n = std::min<uint64_t>(bytes - done, buf.size() * 8);
    if (::write(fd, buf.data(), n) != static_cast<ssize_t>(n)) Die("write " + path);
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
}

// Parallel preads of [off, off + n) of fd into dst (what the loader's workers do).
void ParallelPread(int fd, uint64_t off, uint64_t n, uint8_t* dst, unsigned threads) {
  std::vector<std::thread> ts;
  const uint64_t per = (n + threads - 1) / threads;
  for (unsigned t = 0; t < threads; ++t) {
    const uint64_t a = std::min<uint64_t>(n, t * per), b = std::min<uint64_t>(n, a + per);
    if (a >= b) break;
    ts.emplace_back([=] {
      for (uint64_t at = a; at < b;) {
        ssize_t r = ::pread(fd, dst + at, b - at, static_cast<off_t>(off + at));
        if (r <= 0) Die("pread");
        at += static_cast<uint64_t>(r);
      }
    });
  }
  for (auto& t : ts) t.join();
}

struct Result {
  double seconds = 0, register_seconds = 0, unregister_seconds = 0;
};

// DMA from the page cache: window k is registered while window k-1's copy runs.
Result FromPageCache(const uint8_t* map, uint64_t size, uint64_t window, uint8_t* dev) {
  Result r;
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<cudaEvent_t> done;
  std::vector<const uint8_t*> registered;
  const auto t0 = Clock::now();
  size_t oldest = 0;
  for (uint64_t off = 0; off < size; off += window) {
    const uint64_t n = std::min(window, size - off);
    auto* p = const_cast<uint8_t*>(map + off);
    auto tr = Clock::now();
    Check(cudaHostRegister(p, n, cudaHostRegisterReadOnly), "cudaHostRegister(ReadOnly)");
    r.register_seconds += Since(tr);
    Check(cudaMemcpyAsync(dev + off, p, n, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    cudaEvent_t e;
    Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    Check(cudaEventRecord(e, stream), "cudaEventRecord");
    done.push_back(e);
    registered.push_back(p);
    // Unregister the windows whose copies have landed (keeps at most a few pinned).
    while (oldest + 2 < done.size()) {
      Check(cudaEventSynchronize(done[oldest]), "cudaEventSynchronize");
      auto tu = Clock::now();
      Check(cudaHostUnregister(const_cast<uint8_t*>(registered[oldest])), "cudaHostUnregister");
      r.unregister_seconds += Since(tu);
      ++oldest;
    }
  }
  Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  r.seconds = Since(t0);
  for (; oldest < done.size(); ++oldest) {
    Check(cudaHostUnregister(const_cast<uint8_t*>(registered[oldest])), "cudaHostUnregister");
  }
  for (auto e : done) cudaEventDestroy(e);
  cudaStreamDestroy(stream);
  return r;
}

// The loader's way in miniature: parallel preads into 4 pinned buffers, copies overlapped.
Result ThroughPinned(int fd, uint64_t size, uint64_t window, unsigned threads, uint8_t* dev) {
  Result r;
  constexpr int kBuffers = 4;
  std::vector<uint8_t*> bufs(kBuffers);
  std::vector<cudaEvent_t> ev(kBuffers);
  auto tr = Clock::now();
  for (int i = 0; i < kBuffers; ++i) {
    Check(cudaHostAlloc(reinterpret_cast<void**>(&bufs[i]), window, cudaHostAllocPortable),
          "cudaHostAlloc");
    Check(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming), "cudaEventCreate");
  }
  r.register_seconds = Since(tr);  // pinning (the daemon's pool pays it once)
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<bool> used(kBuffers, false);
  const auto t0 = Clock::now();
  int k = 0;
  for (uint64_t off = 0; off < size; off += window, k = (k + 1) % kBuffers) {
    const uint64_t n = std::min(window, size - off);
    if (used[k]) Check(cudaEventSynchronize(ev[k]), "cudaEventSynchronize");
    ParallelPread(fd, off, n, bufs[k], threads);
    Check(cudaMemcpyAsync(dev + off, bufs[k], n, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    Check(cudaEventRecord(ev[k], stream), "cudaEventRecord");
    used[k] = true;
  }
  Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  r.seconds = Since(t0);
  for (int i = 0; i < kBuffers; ++i) {
    cudaFreeHost(bufs[i]);
    cudaEventDestroy(ev[i]);
  }
  cudaStreamDestroy(stream);
  return r;
}

bool SameBytes(int fd, const uint8_t* dev, uint64_t size) {
  std::vector<uint8_t> want(1 << 20), got(1 << 20);
  for (uint64_t off : {uint64_t{0}, size / 2, size - want.size()}) {
    if (::pread(fd, want.data(), want.size(), static_cast<off_t>(off)) !=
        static_cast<ssize_t>(want.size())) {
      return false;
    }
    Check(cudaMemcpy(got.data(), dev + off, got.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (want != got) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  const uint64_t size = static_cast<uint64_t>(a.gib * (1ull << 30)) / (1 << 20) * (1 << 20);
  struct stat st {};
  if (::stat(a.file.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) != size) {
    auto t0 = Clock::now();
    WriteRandom(a.file, size);
    std::printf("wrote %.2f GB of random bytes to %s in %.1f s\n", size / kGB, a.file.c_str(),
                Since(t0));
  }
  int fd = ::open(a.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("open " + a.file);
  auto* map = static_cast<const uint8_t*>(::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0));
  if (map == MAP_FAILED) Die("mmap");
  // Hot: read it all once through the page cache.
  {
    std::vector<uint8_t> scratch(64 << 20);
    auto t0 = Clock::now();
    for (uint64_t off = 0; off < size; off += scratch.size()) {
      ParallelPread(fd, off, std::min<uint64_t>(scratch.size(), size - off), scratch.data(), 1);
    }
    std::printf("warm-up read (1 thread): %.2f GB/s\n", size / kGB / Since(t0));
  }
  int dev_count = 0;
  Check(cudaGetDeviceCount(&dev_count), "cudaGetDeviceCount");
  int ro = 0;
  cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, 0);
  std::printf("devices %d, cudaDevAttrHostRegisterReadOnlySupported %d\n", dev_count, ro);
  uint8_t* dev = nullptr;
  Check(cudaMalloc(reinterpret_cast<void**>(&dev), size), "cudaMalloc");

  std::printf("\n| way | window | GB/s | s | register/pin s | unregister s | bytes |\n");
  std::printf("|---|--:|--:|--:|--:|--:|---|\n");
  for (uint64_t w_mib : a.windows_mib) {
    const uint64_t w = w_mib << 20;
    for (int way = 0; way < 2; ++way) {
      Check(cudaMemset(dev, 0, size), "cudaMemset");
      Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      Result r =
          way == 0 ? FromPageCache(map, size, w, dev) : ThroughPinned(fd, size, w, a.threads, dev);
      std::printf(
          "| %s | %llu MiB | %.2f | %.3f | %.3f | %.3f | %s |\n",
          way == 0 ? "DMA from registered page cache" : "pread into 4 pinned buffers + copy",
          static_cast<unsigned long long>(w_mib), size / kGB / r.seconds, r.seconds,
          r.register_seconds, r.unregister_seconds, SameBytes(fd, dev, size) ? "ok" : "WRONG");
      std::fflush(stdout);
    }
  }
  cudaFree(dev);
  ::munmap(const_cast<uint8_t*>(map), size);
  ::close(fd);
  if (!a.keep) ::unlink(a.file.c_str());
  return 0;
}
