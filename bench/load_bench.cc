// Cold load into GPU memory (issue 4's benchmark), in one run on the same files:
//   (a) raw read throughput of the checkpoint files: parallel preads, O_DIRECT and through
//       the page cache, cold (page cache dropped) and hot;
//   (b) our load: OpenModel -> PlanRank -> LoadRank on the cuda-vmm backend (pinned staging
//       ring), for several LoadOptions, cold and hot, with the loader's per-stage timings;
//   (c) the engines' baseline, safetensors.torch.load_file(path, device="cuda") per file, in
//       the machine's Python (--torch_script), cold and hot.
// Checkpoints: Llama-shaped (the tensor names and shapes of Llama-3-8B, layers chosen for the
// size), BF16 values drawn at random (no zero pages, nothing compressible), sharded like HF
// (<= 5 GB per file), written by this program under --dir and deleted after.
//
// "Cold": sync + /proc/sys/vm/drop_caches (root), else posix_fadvise(DONTNEED) per file;
// either way checked with mincore, and the method is printed.
//
//   load_bench --dir=/var/tmp/wc-load-bench --sizes_gib=8,32
//     --configs=8:256:4:off,16:1024:8:on --torch_script=bench/torch_load_baseline.py
// With --tp=1,2,4,8 (issue 17) it runs the tensor-parallel sweep instead, with the loader's
// defaults (16:256:4:auto) unless --configs is given (cold rows: the first config; hot: each,
// so "16:256:4:auto,16:256:4:auto:fp8" shows whether online fp8 stays hidden; --tp_states=hot
// skips the cold rows and (c)): for each tp, every rank loaded
// together onto the one GPU in one pass over the files (LoadRanks), cold and hot, and for
// tp > 1 rank 0 alone (hot); (a) and (c) as above. --json=FILE appends one JSON line per row
// (bench/run-all, bench/plot_benchmarks.py).
// A config is threads:staging_MiB:buffers:direct[:fp8] (direct: off | on | auto; fp8: the
// spec asks quantization fp8_block, so every linear weight is quantized on the GPU while
// the load streams, and the GB/s count the bf16 bytes read). Without a GPU it
// falls back to the host backend (a smoke test of the checkpoint and the reads).
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/dense_checkpoint.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/load/plan.h"
#include "pkg/load/staging_pool.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/internal/cuda_segment.h"
#include "pkg/memory/mapping.h"
#include "pkg/safetensors/writer.h"
#include "pkg/util/scoped_fd.h"

namespace wc = weightcache;
namespace {

using wc::bench::Checkpoint;
using wc::bench::DropCache;
using wc::bench::Resident;

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
constexpr double kGB = 1e9;
constexpr double kH2DCap = 55.0;  // GB/s, the issue's pinned host->device figure

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "load_bench: %s\n", what.c_str());
  std::exit(1);
}

struct Args {
  std::string dir = "/var/tmp/wc-load-bench";
  std::vector<double> sizes_gib = {8, 32};
  std::vector<std::string> configs = {"8:256:4:off", "8:256:4:on", "16:1024:8:off", "16:1024:8:on",
                                      "32:1024:8:on"};
  std::string hot_configs = "";  // empty: every config whose direct is off or auto
  unsigned raw_threads = 16;
  uint64_t raw_chunk = 8ull << 20;
  std::string python = "python3";
  std::string torch_script;
  double deadline_s = 1e9;  // skip what would start after this many seconds
  bool keep = false;
  bool tp_cold = true;  // --tp_states=hot: the sweep's hot rows only
  // Non-empty: the tensor-parallel sweep instead of the config exploration (see main).
  std::vector<int> tp;
  bool configs_given = false;
  std::string json;  // append one JSON line per measured row here
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto val = [&](const char* key) -> const char* {
      size_t n = std::strlen(key);
      return s.compare(0, n, key) == 0 ? s.c_str() + n : nullptr;
    };
    if (auto v = val("--dir=")) {
      a.dir = v;
    } else if (auto v = val("--sizes_gib=")) {
      a.sizes_gib.clear();
      for (auto p : absl::StrSplit(v, ',')) {
        double d;
        if (!absl::SimpleAtod(p, &d)) Die(s);
        a.sizes_gib.push_back(d);
      }
    } else if (auto v = val("--configs=")) {
      a.configs = absl::StrSplit(v, ',');
      a.configs_given = true;
    } else if (auto v = val("--raw_threads=")) {
      a.raw_threads = static_cast<unsigned>(std::atoi(v));
    } else if (auto v = val("--python=")) {
      a.python = v;
    } else if (auto v = val("--torch_script=")) {
      a.torch_script = v;
    } else if (auto v = val("--deadline_s=")) {
      a.deadline_s = std::atof(v);
    } else if (auto v = val("--tp=")) {
      for (auto p : absl::StrSplit(v, ',')) a.tp.push_back(std::atoi(std::string(p).c_str()));
    } else if (auto v = val("--json=")) {
      a.json = v;
    } else if (s == "--keep") {
      a.keep = true;
    } else if (auto v = val("--tp_states=")) {
      a.tp_cold = std::string(v).find("cold") != std::string::npos;
    } else {
      Die("unknown flag " + s);
    }
  }
  return a;
}

// ---- the checkpoint
// ------------------------------------------------------------------------

// ---- (a) raw reads
// -------------------------------------------------------------------------

using wc::bench::RawRead;

// ---- pinned host->device reference
// ----------------------------------------------------------

double PinnedH2D() {
  const size_t n = 1ull << 30;
  void* h = nullptr;
  void* d = nullptr;
  if (cudaHostAlloc(&h, n, cudaHostAllocPortable) != cudaSuccess ||
      cudaMalloc(&d, n) != cudaSuccess) {
    Die("cudaHostAlloc/cudaMalloc failed");
  }
  std::memset(h, 0x5a, n);
  cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
  std::vector<double> v;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    v.push_back(static_cast<double>(n) / kGB / Since(t0));
  }
  cudaFree(d);
  cudaFreeHost(h);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- (b) our load
// ---------------------------------------------------------------------------

// A config keeps its own staging pool for the whole run, as the daemon keeps one: its
// first load pins the ring, later ones (the other cache state, the next size) reuse it.
struct Config {
  std::string text;
  wc::load::LoadOptions opts;
  std::shared_ptr<wc::load::StagingPool> pool;
  bool fp8 = false;  // ":fp8": quantization fp8_block, online on the GPU while loading
};

Config ParseConfig(const std::string& s) {
  std::vector<std::string> p = absl::StrSplit(s, ':');
  if (p.size() != 4 && !(p.size() == 5 && p[4] == "fp8")) {
    Die("config " + s + ": want threads:staging_MiB:buffers:direct[:fp8]");
  }
  Config c;
  c.text = s;
  c.opts.read_threads = static_cast<unsigned>(std::atoi(p[0].c_str()));
  c.opts.staging_bytes = static_cast<uint64_t>(std::atoll(p[1].c_str())) << 20;
  c.opts.staging_buffers = static_cast<unsigned>(std::atoi(p[2].c_str()));
  c.opts.direct_io = p[3] == "on"    ? wc::load::DirectIo::kOn
                     : p[3] == "off" ? wc::load::DirectIo::kOff
                                     : wc::load::DirectIo::kAuto;
  c.fp8 = p.size() == 5;
  c.pool = wc::load::MakePinnedStagingPool(c.opts.staging_bytes);
  c.opts.staging_pool = c.pool.get();
  return c;
}

struct LoadResult {
  double seconds = 0;
  double open_seconds = 0;  // OpenModel + PlanRank
  bool verified = false;
  wc::load::LoadStats stats;
};

// 256 bytes at the start, middle and end of every contiguous tensor of a cuda-vmm load,
// file against GPU memory, through a read-only mapping as an engine has it. Dies on a
// difference; false when the load is not in GPU memory or cannot be mapped.
bool VerifySampled(const wc::load::LoadedModel& loaded,
                   const std::vector<wc::safetensors::File>& files) {
  if (loaded.segments.empty() ||
      wc::memory::internal::AsCudaSegment(loaded.segments[0].get()) == nullptr) {
    return false;
  }
  std::vector<wc::ScopedFd> fds;
  std::vector<uint64_t> sizes;
  for (const auto& seg : loaded.segments) {
    fds.emplace_back(::dup(seg->fd()));
    sizes.push_back(seg->size());
  }
  auto map = wc::memory::MapReadOnly(wc::memory::BackendKind::kCudaVmm, std::move(fds), sizes,
                                     loaded.device_uuid);
  if (!map.ok()) {
    std::printf("  verify: MapReadOnly: %s (bytes not checked)\n",
                std::string(map.status().message()).c_str());
    return false;
  }
  for (const auto& t : loaded.plan.tensors) {
    if (!t.pieces.empty() || t.quant.has_value() || !t.scale_of.empty() || t.nbytes == 0) {
      continue;  // read in pieces, quantized, or written by a quantization: no file range
    }
    const uint64_t n = std::min<uint64_t>(256, t.nbytes);
    for (uint64_t at : {uint64_t{0}, t.nbytes / 2 / 256 * 256, t.nbytes - n}) {
      at = std::min(at, t.nbytes - n);
      uint8_t want[256], got[256];
      if (::pread(files[t.file_index].fd(), want, n, static_cast<off_t>(t.file_offset + at)) !=
          static_cast<ssize_t>(n)) {
        Die("verify: pread " + t.name);
      }
      absl::Status cs =
          wc::memory::CopyToHost(wc::memory::BackendKind::kCudaVmm, loaded.device_uuid,
                                 (*map)->base(t.segment) + t.offset + at, n, got);
      if (!cs.ok()) Die(absl::StrCat("verify: CopyToHost ", t.name, ": ", cs.message()));
      if (std::memcmp(want, got, n) != 0) {
        Die(absl::StrCat("verify: WRONG BYTES in ", t.name, " at +", at));
      }
    }
  }
  return true;
}

// The benchmark's model at `tp`, opened (OpenModel hashes every file: content identity);
// dies on an error. BenchPlanOptions: what the daemon plans with on `backend`.
std::shared_ptr<const wc::load::OpenedModel> OpenBenchModel(const std::string& dir, bool fp8,
                                                            int tp) {
  wc::spec::ModelSpec s;
  s.name = "bench";
  s.model_dir = dir;
  s.tp_size = tp;
  if (fp8) s.quantization = "fp8_block";
  auto model = wc::load::OpenModel(s);
  if (!model.ok()) Die(std::string(model.status().message()));
  return *model;
}

wc::load::PlanOptions BenchPlanOptions(const wc::memory::Backend& backend) {
  wc::load::PlanOptions popts;
  popts.loader_reads_pieces = true;
  popts.alignment = backend.tensor_alignment();
  popts.max_segment_bytes = backend.max_segment_bytes();
  return popts;
}

LoadResult OurLoad(wc::memory::Backend& backend, const std::string& dir,
                   const wc::load::LoadOptions& opts, bool fp8) {
  auto t0 = Clock::now();
  const auto model = OpenBenchModel(dir, fp8, 1);
  auto plan = wc::load::PlanRank(*model, wc::spec::Layout{}, BenchPlanOptions(backend));
  if (!plan.ok()) Die(std::string(plan.status().message()));
  const double open_seconds = Since(t0);
  auto loaded = wc::load::LoadRank(*model, *plan, backend, "", "bench", opts, nullptr);
  if (!loaded.ok()) Die(std::string(loaded.status().message()));
  LoadResult r{Since(t0), open_seconds, false, (*loaded)->stats};
  // Check the bytes (outside the timing), through a read-only mapping of the sealed
  // segments as an engine has it (the daemon's own device pointers are gone after Seal).
  r.verified = VerifySampled(**loaded, model->checkpoint.files());
  return r;  // the segments are freed here
}

// The ranks `ranks` of tp `tp` loaded together onto the one GPU (LoadRanks: each byte read
// once), bytes checked by sampling: 256 bytes at the start, middle and end of every rank's
// contiguous tensors, file against GPU memory.
struct GroupResult {
  double seconds = 0;       // LoadRanks alone
  double open_seconds = 0;  // OpenModel (content identity: hashes every file) + PlanRank
  uint64_t rank_bytes = 0;  // what landed in the ranks (sum of their tensors' bytes)
  uint64_t rank0_bytes = 0;
  bool verified = false;
  wc::load::LoadStats stats;
};

// `before_load` runs between opening and loading: OpenModel reads every file to identify it
// by content, so a cold measurement empties the page cache there (a daemon with a digest
// store skips that pass for files it has identified before).
GroupResult GroupLoad(wc::memory::Backend& backend, const std::string& dir,
                      const wc::load::LoadOptions& opts, bool fp8, int tp,
                      const std::vector<int>& ranks, const std::function<void()>& before_load) {
  const auto t_open = Clock::now();
  const auto model = OpenBenchModel(dir, fp8, tp);
  const wc::load::PlanOptions popts = BenchPlanOptions(backend);
  std::vector<wc::load::Plan> plans;
  GroupResult g;
  for (int r : ranks) {
    auto plan = wc::load::PlanRank(*model, wc::spec::Layout{tp, r, 1, 0}, popts);
    if (!plan.ok()) Die(std::string(plan.status().message()));
    g.rank_bytes += plan->total_bytes;
    if (r == ranks[0]) g.rank0_bytes = plan->total_bytes;
    plans.push_back(std::move(*plan));
  }
  g.open_seconds = Since(t_open);
  if (before_load) before_load();
  auto t0 = Clock::now();
  auto loaded =
      wc::load::LoadRanks(*model, std::move(plans), backend, std::vector<std::string>(ranks.size()),
                          std::vector<std::string>(ranks.size(), "bench"), opts, nullptr);
  if (!loaded.ok()) Die(std::string(loaded.status().message()));
  g.seconds = Since(t0);
  g.stats = (*loaded)[0]->stats;
  g.verified = true;
  for (const auto& rank : *loaded) {
    g.verified = VerifySampled(*rank, model->checkpoint.files()) && g.verified;
  }
  return g;
}

void AppendJson(const std::string& path, const std::string& line) {
  if (path.empty()) return;
  FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) Die(path + ": " + std::strerror(errno));
  std::fprintf(f, "%s\n", line.c_str());
  std::fclose(f);
}

// ---- (c) the torch baseline
// ---------------------------------------------------------------

double TorchLoad(const Args& a, const Checkpoint& c) {
  std::string cmd = absl::StrCat(a.python, " ", a.torch_script);
  for (const auto& f : c.files) absl::StrAppend(&cmd, " ", f);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char line[512];
  double seconds = -1;
  while (std::fgets(line, sizeof line, p) != nullptr) {
    std::fputs(line, stdout);
    if (std::strncmp(line, "seconds=", 8) == 0) seconds = std::atof(line + 8);
  }
  int rc = ::pclose(p);
  return rc == 0 ? seconds : -1;
}

// ---- table
// --------------------------------------------------------------------------------

struct Row {
  std::string what, cache;
  double gbs = 0, seconds = 0;
  std::string stages;
};

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  const auto start = Clock::now();
  auto left = [&] { return a.deadline_s - Since(start); };
  std::vector<Config> configs;
  for (const auto& s : a.configs) configs.push_back(ParseConfig(s));
  // The tensor-parallel sweep measures the loader's defaults unless told otherwise.
  if (!a.tp.empty() && !a.configs_given) configs = {ParseConfig("16:256:4:auto")};
  auto backend = wc::memory::MakeCudaBackend();
  const bool gpu = backend.ok();
  if (!gpu) {
    std::printf("no GPU (%s): host backend, smoke test only\n",
                std::string(backend.status().message()).c_str());
    backend = wc::memory::MakeHostBackend();
  }
  const double h2d = gpu ? PinnedH2D() : 0;
  std::printf("pinned H2D (cudaMemcpy, 1 GiB, median of 5): %.1f GB/s\n", h2d);
  std::fflush(stdout);

  // Later (larger) sizes: the first config (the old defaults), the first size's
  // fastest cold one, with direct=on turned into auto (the same cold, page cache
  // when hot), and the loader's defaults when listed.
  std::vector<Config> all = configs;
  size_t best_index = 0;
  for (size_t si = 0; si < a.sizes_gib.size(); ++si) {
    const double gib = a.sizes_gib[si];
    if (si == 1 && all.size() > 1) {
      Config b = all[best_index];
      if (b.opts.direct_io == wc::load::DirectIo::kOn) {
        b.opts.direct_io = wc::load::DirectIo::kAuto;
        b.text = b.text.substr(0, b.text.rfind(':')) + ":auto";
      }
      configs = {all[0]};
      if (b.text != all[0].text) configs.push_back(b);
      // And the loader's defaults, when listed: what the daemon runs.
      const wc::load::LoadOptions d;
      for (const Config& c : all) {
        const auto& o = c.opts;
        if (o.read_threads == d.read_threads && o.staging_bytes == d.staging_bytes &&
            o.staging_buffers == d.staging_buffers && o.direct_io == d.direct_io && !c.fp8 &&
            c.text != all[0].text && c.text != b.text) {
          configs.push_back(c);
        }
      }
    }
    if (left() < 30) {
      std::printf("\n[skipped %.0f GiB: deadline]\n", gib);
      continue;
    }
    const std::string dir = absl::StrCat(a.dir, "/llama-", gib, "g");
    auto tw = Clock::now();
    auto written = wc::bench::WriteDenseLlama(dir, gib);
    if (!written.ok()) Die(std::string(written.status().message()));
    Checkpoint c = *std::move(written);
    const double wsec = Since(tw);
    std::printf(
        "\n## %.2f GiB checkpoint (%d layers, %zu files, %.2f GB of "
        "tensors): written in "
        "%.1f s (%.2f GB/s incl. fsync)\n",
        c.bytes / double(1ull << 30), c.layers, c.files.size(), c.bytes / kGB, wsec,
        c.file_bytes / kGB / wsec);
    std::fflush(stdout);
    std::vector<Row> rows;
    std::string method;
    auto drop = [&] {
      std::string m = DropCache(c.files);
      if (method.empty()) method = m;
      if (m != method) method += "/" + m;
    };
    auto log = [&](const Row& r) {
      rows.push_back(r);
      std::printf("  %-44s %-5s %7.2f GB/s %7.2f s  %s   [t=%.0f s]\n", r.what.c_str(),
                  r.cache.c_str(), r.gbs, r.seconds, r.stages.c_str(), Since(start));
      std::fflush(stdout);
    };
    // Estimated seconds of one cold pass, from the first raw read.
    double pass = 0;
    auto fits = [&](double passes) { return left() > passes * pass + 10; };

    // (a) raw reads.
    double raw_cold = 0, raw_hot = 0;
    for (bool direct : {true, false}) {
      if (direct && si > 0) continue;  // O_DIRECT raw on the first size only (time)
      drop();
      const double g = RawRead(c.files, direct, a.raw_threads, a.raw_chunk);
      if (pass == 0) pass = c.file_bytes / kGB / g;
      raw_cold = std::max(raw_cold, g);
      log({absl::StrFormat("(a) raw pread, %s, %u threads, %llu MiB",
                           direct ? "O_DIRECT" : "page cache", a.raw_threads,
                           static_cast<unsigned long long>(a.raw_chunk >> 20)),
           "cold", g, c.file_bytes / kGB / g, ""});
    }
    // The page-cache pass left the files resident (if memory allows): hot.
    const double resident = Resident(c.files);
    raw_hot = RawRead(c.files, false, a.raw_threads, a.raw_chunk);
    log({absl::StrFormat("(a) raw pread, page cache, %u threads", a.raw_threads), "hot", raw_hot,
         c.file_bytes / kGB / raw_hot, absl::StrFormat("resident before: %.0f%%", 100 * resident)});

    if (!a.tp.empty()) {
      const Config* cfp = &configs[0];  // the config of the rows being measured
      const char* be = gpu ? "cuda" : "host";
      const int tensors = c.layers * 9 + 3;
      auto json_row = [&](int tp, const char* cache, const char* path, double seconds, double gbps,
                          double per_rank, uint64_t bytes_read, const char* extra) {
        AppendJson(
            a.json,
            absl::StrFormat(
                R"({"bench":"load","backend":"%s","size_gib":%.2f,"tensors":%d,"tp":%d,)"
                R"("state":"%s","path":"%s","config":"%s","seconds":%.4f,"gbps":%.3f,)"
                R"("per_rank_gbps":%.3f,"bytes_read":%llu%s})",
                be, c.bytes / double(1ull << 30), tensors, tp, cache, path, cfp->text, seconds,
                gbps, per_rank, static_cast<unsigned long long>(bytes_read), extra));
      };
      for (const auto& r : rows) {  // (a): the reads' ceiling, same thread count
        json_row(1, r.cache.c_str(), "raw_read", r.seconds, r.gbs, r.gbs,
                 static_cast<uint64_t>(r.seconds * r.gbs * kGB),
                 absl::StrFormat(R"(,"what":"%s")", r.what).c_str());
      }
      std::map<std::pair<int, std::string>, double> group_gbps;
      auto tp_row = [&](int tp, const char* cache, bool rank0_only) {
        std::vector<int> ranks;
        for (int r = 0; r < (rank0_only ? 1 : tp); ++r) ranks.push_back(r);
        const bool cold = std::string(cache) == "cold";
        GroupResult g = GroupLoad(**backend, dir, cfp->opts, cfp->fp8, tp, ranks,
                                  cold ? std::function<void()>(drop) : std::function<void()>());
        // Online fp8 lands fewer bytes than it reads: count the bf16 bytes read, as (b) does.
        const double gbps =
            (cfp->fp8 ? static_cast<double>(g.stats.bytes_read) : g.rank_bytes) / kGB / g.seconds;
        const double per_rank = g.rank0_bytes / kGB / g.seconds;
        if (!rank0_only) group_gbps[{tp, cfp == &configs[0] ? cache : cfp->text}] = gbps;
        const auto& st = g.stats;
        log({absl::StrFormat("(b) weightcache tp %d, %s %s", tp,
                             rank0_only ? "rank 0 alone" : "all ranks, one pass,", cfp->text),
             cache, gbps, g.seconds,
             absl::StrFormat("read %.2f GB (%.2fx the tensors), rank 0 %.2f GB/s, read-wait "
                             "%.2f s, copy-wait %.3f s, direct %u/%u files; before it open+plan "
                             "%.2f s%s%s",
                             st.bytes_read / kGB, st.bytes_read / static_cast<double>(c.bytes),
                             per_rank, st.read_seconds, st.wait_seconds, st.direct_files, st.files,
                             g.open_seconds, cold ? " then page cache dropped" : "",
                             g.verified ? ", bytes ok" : "")});
        json_row(tp, cache, rank0_only ? "weightcache-rank0" : "weightcache", g.seconds, gbps,
                 per_rank, st.bytes_read,
                 absl::StrFormat(R"(,"ranks":%zu,"verified":%s,"open_seconds":%.3f)", ranks.size(),
                                 g.verified ? "true" : "false", g.open_seconds)
                     .c_str());
      };
      for (int tp : a.tp) {
        if (!a.tp_cold || !fits(2.5)) break;
        tp_row(tp, "cold", false);  // drops the page cache after opening
      }
      if (!a.torch_script.empty() && a.tp_cold && fits(2.5)) {
        drop();
        const double tc = TorchLoad(a, c);
        if (tc > 0) {
          log({"(c) safetensors.torch.load_file(device=cuda)", "cold", c.bytes / kGB / tc, tc, ""});
          json_row(1, "cold", "safetensors", tc, c.bytes / kGB / tc, c.bytes / kGB / tc, c.bytes,
                   "");
        }
        const double th = fits(1) ? TorchLoad(a, c) : -1;
        if (th > 0) {
          log({"(c) safetensors.torch.load_file(device=cuda)", "hot", c.bytes / kGB / th, th, ""});
          json_row(1, "hot", "safetensors", th, c.bytes / kGB / th, c.bytes / kGB / th, c.bytes,
                   "");
        }
      }
      // Hot: every config given (e.g. the defaults and the same with :fp8, online
      // quantization in the load), each tp; rank 0 alone for the first config.
      for (const Config& cf : configs) {
        cfp = &cf;
        // Untimed: pins this config's staging ring (the cold rows did it for the first
        // config unless --tp_states=hot), as a daemon's pool is pinned by its first load.
        if (fits(1)) GroupLoad(**backend, dir, cf.opts, cf.fp8, 1, {0}, {});
        for (int tp : a.tp) {
          if (!fits(0.5)) break;
          RawRead(c.files, false, a.raw_threads, a.raw_chunk);  // all resident
          tp_row(tp, "hot", false);
          if (tp > 1 && &cf == &configs[0] && fits(0.5)) tp_row(tp, "hot", true);
        }
      }
      std::printf("\n### %.2f GiB (%.2f GB), tensor-parallel sweep, cold = %s\n\n",
                  c.bytes / double(1ull << 30), c.bytes / kGB, method.c_str());
      std::printf("| case | cache | GB/s | s | stages |\n|---|---|--:|--:|---|\n");
      for (const auto& r : rows) {
        std::printf("| %s | %s | %.2f | %.2f | %s |\n", r.what.c_str(), r.cache.c_str(), r.gbs,
                    r.seconds, r.stages.c_str());
      }
      const double cap_hot = std::min(raw_hot, kH2DCap);
      if (group_gbps.count({1, "hot"})) {
        const double t1 = group_gbps[{1, "hot"}];
        std::printf(
            "\ngoal hot tp 1 >= 90%% of min((a) hot %u threads, 55) = %.2f: %.2f GB/s = "
            "%.0f %% -> %s\n",
            a.raw_threads, cap_hot, t1, 100 * t1 / cap_hot, t1 >= 0.9 * cap_hot ? "MET" : "missed");
        for (int tp : a.tp) {
          if (tp == 1 || !group_gbps.count({tp, "hot"})) continue;
          const double g = group_gbps[{tp, "hot"}];
          std::printf(
              "goal hot tp %d (all ranks, one GPU) >= 90%% of tp 1: %.2f / %.2f = %.0f %% "
              "-> %s\n",
              tp, g, t1, 100 * g / t1, g >= 0.9 * t1 ? "MET" : "missed");
        }
        for (const Config& cf : configs) {  // the same loads with online fp8
          if (!cf.fp8) continue;
          for (int tp : a.tp) {
            const auto q = group_gbps.find({tp, cf.text});
            const auto plain = group_gbps.find({tp, "hot"});
            if (q == group_gbps.end() || plain == group_gbps.end()) continue;
            std::printf(
                "online fp8 in the load, tp %d hot: %.2f GB/s read against %.2f without "
                "(%.0f %%)\n",
                tp, q->second, plain->second, 100 * q->second / plain->second);
          }
        }
      }
      std::fflush(stdout);
      if (!a.keep) wc::bench::RemoveCheckpoint(c);
      continue;
    }

    // (b) cold, then (c) cold.
    auto run_ours = [&](const Config& cf, const char* cache) {
      LoadResult r = OurLoad(**backend, dir, cf.opts, cf.fp8);
      const auto& s = r.stats;
      log({"(b) weightcache LoadRank " + cf.text, cache, c.bytes / kGB / r.seconds, r.seconds,
           absl::StrFormat("open+plan %.3f s, alloc %.3f s, staging %.3f s (%u/%u buffers "
                           "reused), read-wait %.2f s, copy-wait %.3f s, direct "
                           "%u/%u files%s",
                           r.open_seconds, s.alloc_seconds, s.staging_seconds, s.staging_reused,
                           s.staging_buffers, s.read_seconds, s.wait_seconds, s.direct_files,
                           s.files, r.verified ? ", bytes ok" : "")});
      return r.seconds;
    };
    double best_cold = 1e30;
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      if (!fits(1.5)) break;
      drop();
      const double t = run_ours(configs[ci], "cold");
      if (t < best_cold && si == 0) best_index = ci;
      best_cold = std::min(best_cold, t);
    }
    double torch_cold = -1, torch_hot = -1;
    if (!a.torch_script.empty() && fits(2.5)) {
      drop();
      torch_cold = TorchLoad(a, c);
      if (torch_cold > 0) {
        log({"(c) safetensors.torch.load_file(device=cuda)", "cold", c.bytes / kGB / torch_cold,
             torch_cold, ""});
      }
      if (fits(1)) {
        torch_hot = TorchLoad(a, c);
        if (torch_hot > 0) {
          log({"(c) safetensors.torch.load_file(device=cuda)", "hot", c.bytes / kGB / torch_hot,
               torch_hot, absl::StrFormat("resident before: %.0f%%", 100 * Resident(c.files))});
        }
      }
    }
    // (b) hot: the files are in the page cache after (c).
    double best_hot = 1e30;
    for (const auto& cf : configs) {
      if (cf.opts.direct_io == wc::load::DirectIo::kOn || !fits(0.5)) continue;
      RawRead(c.files, false, a.raw_threads,
              a.raw_chunk);  // make sure it is all resident
      best_hot = std::min(best_hot, run_ours(cf, "hot"));
    }
    // What the pool saves: the last hot config once more with an empty pool (a daemon's
    // first load after its start pins the ring).
    for (auto it = configs.rbegin(); it != configs.rend(); ++it) {
      if (it->opts.direct_io == wc::load::DirectIo::kOn || !fits(0.5)) continue;
      Config fresh = *it;
      fresh.text += " new pool";
      fresh.pool = wc::load::MakePinnedStagingPool(fresh.opts.staging_bytes);
      fresh.opts.staging_pool = fresh.pool.get();
      run_ours(fresh, "hot");
      break;
    }

    const double cap_cold = std::min(raw_cold, kH2DCap), cap_hot = std::min(raw_hot, kH2DCap);
    std::printf("\n### %.2f GiB (%.2f GB), cold = %s\n\n", c.bytes / double(1ull << 30),
                c.bytes / kGB, method.c_str());
    std::printf(
        "| case | cache | GB/s | s | vs min((a), 55) | vs (c) same "
        "cache | stages |\n");
    std::printf("|---|---|--:|--:|--:|--:|---|\n");
    for (const auto& r : rows) {
      const bool hot = r.cache == "hot";
      const double cap = hot ? cap_hot : cap_cold;
      const double tc = hot ? torch_hot : torch_cold;
      std::printf(
          "| %s | %s | %.2f | %.2f | %s | %s | %s |\n", r.what.c_str(), r.cache.c_str(), r.gbs,
          r.seconds,
          r.what.rfind("(b)", 0) == 0 ? absl::StrFormat("%.0f %%", 100 * r.gbs / cap).c_str() : "",
          r.what.rfind("(b)", 0) == 0 && tc > 0 ? absl::StrFormat("%.2f x", tc / r.seconds).c_str()
                                                : "",
          r.stages.c_str());
    }
    std::printf(
        "\n(a) best cold %.2f GB/s, hot %.2f GB/s; pinned H2D measured "
        "%.1f GB/s.\n",
        raw_cold, raw_hot, h2d);
    if (best_cold < 1e30) {
      const double g = c.bytes / kGB / best_cold;
      std::printf(
          "goal (b) >= 90%% of min((a), 55) cold: %.2f / %.2f GB/s = "
          "%.0f %% -> %s\n",
          g, cap_cold, 100 * g / cap_cold, g >= 0.9 * cap_cold ? "MET" : "missed");
      if (torch_cold > 0) {
        std::printf("goal (b) >= 3x (c) cold: %.2fx -> %s\n", torch_cold / best_cold,
                    torch_cold / best_cold >= 3 ? "MET" : "missed");
      }
    }
    if (best_hot < 1e30) {
      const double g = c.bytes / kGB / best_hot;
      std::printf("hot: (b) %.2f GB/s = %.0f %% of min((a) hot, 55) = %.2f", g, 100 * g / cap_hot,
                  cap_hot);
      if (torch_hot > 0) std::printf("; %.2fx (c) hot", torch_hot / best_hot);
      std::printf("\n");
    }
    std::fflush(stdout);
    if (!a.keep) wc::bench::RemoveCheckpoint(c);
  }
  return 0;
}
