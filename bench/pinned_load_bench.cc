// What checking pinned digests in the load's own pass costs (issue 58's benchmarks), on the
// files of one run, cold (page cache dropped) and hot:
//   (a) the storage's own rate: parallel O_DIRECT preads of every byte, cold;
//   (b) the same tensor-parallel group load (LoadRanks: every rank of tp, one GPU) with the
//       files' identity already known (a daemon's digest store: nothing hashed) and with the
//       spec's pinned digests (each file's SHA-256 follows the load's reads), interleaved
//       (unpinned, pinned, unpinned, ...) so that drift shows as spread, not as a difference;
//       each row says the bytes this process read from storage (/proc/self/io read_bytes)
//       against the checkpoint's size, and the bytes the check hashed from the load's reads
//       and read itself;
//   (c) first sight: a single-file checkpoint never seen and not pinned, whose fingerprint is
//       needed before any byte is placed (OpenModel hashes it, then the load), against the
//       same load with the identity known.
// Checkpoints: dense random BF16 Llama shapes (bench/dense_checkpoint.h), written under --dir
// and deleted after. Without a GPU it runs on the host backend (a smoke test).
//
//   pinned_load_bench --dir=/var/tmp/wc-pin --gib=8 --tp=1,8 --reps=2 --first_sight_gib=8
//                     (--gib=0: (c) only; --first_sight_gib=0: no (c))
//                     [--hot=0] [--side_by_side=N] (files every load, known and pinned,
//                     reads in turn; by default a pinned load 4, a known one 1: one after another)
//                     [--hold_mib=N] (a pinned load's chunks held ahead of the hash: 512)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/dense_checkpoint.h"
#include "pkg/identity/identity.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/load/plan.h"
#include "pkg/load/staging_pool.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/mapping.h"

namespace wc = weightcache;
namespace {

using wc::bench::Clock;
double Since(Clock::time_point t0) { return wc::bench::Ms(t0, Clock::now()) / 1e3; }
constexpr double kGB = 1e9;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "pinned_load_bench: %s\n", what.c_str());
  std::exit(1);
}

struct Args {
  std::string dir = "/var/tmp/wc-pinned-bench";
  double gib = 8;
  std::vector<int> tp = {1, 8};
  int reps = 2;
  double first_sight_gib = 8;  // 0: no (c)
  bool hot = true;
  size_t side_by_side = 0;  // the loader's default
  uint64_t hold_mib = wc::load::LoadOptions{}.pin_hold_bytes >> 20;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const auto eq = s.find('=');
    const std::string key = s.substr(0, eq), v = eq == std::string::npos ? "" : s.substr(eq + 1);
    bool ok = true;
    if (key == "--dir") {
      a.dir = v;
    } else if (key == "--gib") {
      ok = absl::SimpleAtod(v, &a.gib) && a.gib >= 0;
    } else if (key == "--first_sight_gib") {
      ok = absl::SimpleAtod(v, &a.first_sight_gib) && a.first_sight_gib >= 0;
    } else if (key == "--reps") {
      ok = absl::SimpleAtoi(v, &a.reps) && a.reps > 0;
    } else if (key == "--tp") {
      a.tp.clear();
      for (auto p : absl::StrSplit(v, ',')) {
        int t = 0;
        ok = ok && absl::SimpleAtoi(p, &t) && t > 0;
        a.tp.push_back(t);
      }
    } else if (key == "--side_by_side") {
      ok = absl::SimpleAtoi(v, &a.side_by_side) && a.side_by_side > 0;
    } else if (key == "--hold_mib") {
      ok = absl::SimpleAtoi(v, &a.hold_mib) && a.hold_mib > 0;
    } else if (key == "--hot") {
      a.hot = v != "0" && v != "false";
    } else {
      Die("unknown flag " + s);
    }
    if (!ok) Die(absl::StrFormat("%s: not a valid value for %s", v, key));
  }
  return a;
}

// Bytes this process caused to be fetched from storage (O_DIRECT included).
uint64_t StorageReadBytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "read_bytes:") return value;
  }
  return 0;
}

// Each file's SHA-256, hashed once here (untimed): the admin's pins, and a store that knows
// every file version (a daemon that loaded them before).
std::map<std::string, std::string> Pins(const wc::bench::Checkpoint& c,
                                        wc::identity::DigestStore* store) {
  wc::spec::ModelSpec s;
  s.name = "bench";
  s.model_dir = c.dir;
  auto m = wc::load::OpenModel(s, {.digests = store});
  if (!m.ok()) Die(std::string(m.status().message()));
  std::map<std::string, std::string> pins;
  for (const auto& f : (*m)->files) pins[f.name] = f.digest.substr(f.digest.find(':') + 1);
  return pins;
}

std::unique_ptr<wc::identity::DigestStore> EmptyStore() {
  auto s = wc::identity::DigestStore::Open("");
  if (!s.ok()) Die(std::string(s.status().message()));
  return std::move(s).value();
}

struct Row {
  int tp = 1;
  std::string cache, mode;
  double seconds = 0, open_seconds = 0;
  uint64_t storage = 0, followed = 0, reread = 0;
};

struct Bench {
  wc::memory::Backend* backend;
  wc::load::LoadOptions opts;
  std::vector<Row> rows;

  // One group load of every rank of `tp`. `pins` empty: the identity from `known` (nothing
  // hashed); else pinned, with a fresh store (the check follows every file). `first_sight`:
  // not pinned, a fresh store: OpenModel hashes every file first (timed with the load).
  Row Load(const wc::bench::Checkpoint& c, int tp, bool cold, const std::string& mode,
           const std::map<std::string, std::string>& pins, wc::identity::DigestStore* known) {
    if (cold) wc::bench::DropCache(c.files);
    wc::spec::ModelSpec s;
    s.name = "bench";
    s.model_dir = c.dir;
    s.tp_size = tp;
    s.digests = pins;
    auto fresh = EmptyStore();
    const uint64_t storage0 = StorageReadBytes();
    const auto t0 = Clock::now();
    auto m = wc::load::OpenModel(s, {.digests = known != nullptr ? known : fresh.get()});
    if (!m.ok()) Die(std::string(m.status().message()));
    wc::load::PlanOptions popts;
    popts.loader_reads_pieces = true;
    popts.alignment = backend->tensor_alignment();
    popts.max_segment_bytes = backend->max_segment_bytes();
    std::vector<wc::load::Plan> plans;
    for (int r = 0; r < tp; ++r) {
      auto p = wc::load::PlanRank(**m, wc::spec::Layout{tp, r, 1, 0}, popts);
      if (!p.ok()) Die(std::string(p.status().message()));
      plans.push_back(std::move(*p));
    }
    Row row{tp, cold ? "cold" : "hot", mode, 0, Since(t0)};
    const size_t n = plans.size();
    auto loaded = wc::load::LoadRanks(**m, std::move(plans), *backend, std::vector<std::string>(n),
                                      std::vector<std::string>(n, mode), opts, nullptr);
    if (!loaded.ok()) Die(std::string(loaded.status().message()));
    row.seconds = Since(t0);
    row.storage = StorageReadBytes() - storage0;
    row.followed = (*loaded)[0]->stats.pin_followed_bytes;
    row.reread = (*loaded)[0]->stats.pin_reread_bytes;
    rows.push_back(row);
    const auto& st = (*loaded)[0]->stats;
    std::printf(
        "  %s tp %d %s: %.2f s (open %.2f s), storage %.2f GB, hashed from the load "
        "%.2f GB, read again %.2f GB; readers waited for room %.2f s, holes read %llu, "
        "reads' end to the check's verdict %.2f s; hashers in SHA-256 %.2f s (%.2f GB/s "
        "while hashing)\n",
        row.cache.c_str(), tp, mode.c_str(), row.seconds, row.open_seconds, row.storage / kGB,
        row.followed / kGB, row.reread / kGB, st.pin_room_wait_seconds,
        static_cast<unsigned long long>(st.pin_holes_filled), st.pin_finish_seconds,
        st.pin_hash_seconds,
        st.pin_hash_seconds > 0 ? row.followed / kGB / st.pin_hash_seconds : 0.0);
    std::fflush(stdout);
    return row;
  }
};

// Rows of one (tp, cache, mode): median (min-max) of seconds; bytes of the last run.
void PrintTable(const std::vector<Row>& rows, double bytes, double file_bytes,
                const std::string& against) {
  using Key = std::tuple<int, std::string, std::string>;
  std::map<Key, std::vector<double>> seconds;
  std::map<Key, const Row*> last;
  std::vector<Key> order;
  for (const auto& r : rows) {
    const Key k{r.tp, r.cache, r.mode};
    if (seconds[k].empty()) order.push_back(k);
    seconds[k].push_back(r.seconds);
    last[k] = &r;
  }
  auto median = [&](const Key& k) { return wc::bench::Percentile(seconds.at(k), 0.5); };
  std::printf(
      "\n| tp | cache | load | runs | s median (min-max) | GB/s | vs %s | storage read "
      "/ files | hashed from the load GB | read again GB |\n",
      against.c_str());
  std::printf("|--:|---|---|--:|--:|--:|--:|--:|--:|--:|\n");
  for (const auto& k : order) {
    const auto& [tp, cache, mode] = k;
    const std::vector<double>& s = seconds[k];
    const double med = median(k);
    const Key base{tp, cache, against};
    const std::string vs =
        seconds.count(base) ? absl::StrFormat("%.0f %%", 100 * median(base) / med) : "-";
    const Row& l = *last[k];
    std::printf("| %d | %s | %s | %zu | %.2f (%.2f-%.2f) | %.2f | %s | %.2f | %.2f | %.2f |\n", tp,
                cache.c_str(), mode.c_str(), s.size(), med, *std::min_element(s.begin(), s.end()),
                *std::max_element(s.begin(), s.end()), bytes / kGB / med, vs.c_str(),
                l.storage / file_bytes, l.followed / kGB, l.reread / kGB);
  }
}

uint64_t FileBytes(const wc::bench::Checkpoint& c) {
  uint64_t n = 0;
  for (const auto& f : c.files) {
    struct stat st {};
    if (::stat(f.c_str(), &st) == 0) n += static_cast<uint64_t>(st.st_size);
  }
  return n;
}

// (a) and (b): the sharded checkpoint of --gib.
void RunSharded(const Args& a, Bench& b) {
  auto c = wc::bench::WriteDenseLlama(a.dir + "/sharded", a.gib);
  if (!c.ok()) Die(std::string(c.status().message()));
  const double file_bytes = static_cast<double>(FileBytes(*c));
  std::printf("\n## (b) %.2f GB in %zu files: pinned against known, cold = %s\n", c->bytes / kGB,
              c->files.size(), wc::bench::DropCache(c->files).c_str());
  const double raw = wc::bench::RawRead(c->files, true, 16, 8ull << 20);
  std::printf("(a) storage, O_DIRECT, 16 threads, 8 MiB: %.2f GB/s (cold)\n", raw);
  auto known = EmptyStore();
  const auto pins = Pins(*c, known.get());
  for (int tp : a.tp) b.Load(*c, tp, false, "known", {}, known.get());  // untimed warm-up
  b.rows.clear();
  for (int tp : a.tp) {
    for (int r = 0; r < a.reps; ++r) {
      b.Load(*c, tp, true, "known", {}, known.get());
      b.Load(*c, tp, true, "pinned", pins, nullptr);
    }
    for (int r = 0; a.hot && r < a.reps; ++r) {
      b.Load(*c, tp, false, "known", {}, known.get());
      b.Load(*c, tp, false, "pinned", pins, nullptr);
    }
  }
  PrintTable(b.rows, c->bytes, file_bytes, "known");
  std::printf("\n(a) storage %.2f GB/s; the cold rows' GB/s against it: each row / %.2f.\n", raw,
              raw);
  wc::bench::RemoveCheckpoint(*c);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  auto backend = wc::memory::MakeCudaBackend();
  const bool gpu = backend.ok();
  if (!gpu) {
    std::printf("no GPU (%s): host backend, smoke test only\n",
                std::string(backend.status().message()).c_str());
    backend = wc::memory::MakeHostBackend();
  }
  Bench b{backend->get(), {}, {}};
  b.opts.files_side_by_side = a.side_by_side;
  b.opts.pin_hold_bytes = a.hold_mib << 20;
  std::unique_ptr<wc::load::StagingPool> pool;
  if (gpu) {  // the daemon's: pinned once, reused by every load
    pool = wc::load::MakePinnedStagingPool(b.opts.staging_bytes);
    b.opts.staging_pool = pool.get();
  }
  const std::string side_by_side =
      a.side_by_side == 0
          ? absl::StrFormat("pinned %zu, known 1", wc::load::LoadOptions::kPinnedFilesSideBySide)
          : absl::StrFormat("%zu, pinned and known", a.side_by_side);
  std::printf(
      "hardware threads %u; loader defaults: %u read threads, %llu MiB staging in %u "
      "buffers, direct I/O auto; files read side by side: %s; pinned loads hold %llu MiB "
      "ahead of the hash\n",
      std::thread::hardware_concurrency(), b.opts.read_threads,
      static_cast<unsigned long long>(b.opts.staging_bytes >> 20), b.opts.staging_buffers,
      side_by_side.c_str(), static_cast<unsigned long long>(a.hold_mib));

  // (a), (b)
  if (a.gib > 0) RunSharded(a, b);

  // (c)
  if (a.first_sight_gib > 0) {
    auto one = wc::bench::WriteDenseLlama(a.dir + "/single", a.first_sight_gib, UINT64_MAX);
    if (!one.ok()) Die(std::string(one.status().message()));
    std::printf(
        "\n## (c) first sight of one %.2f GB file (not pinned, never seen) against the "
        "load with its identity known\n",
        one->bytes / kGB);
    auto seen = EmptyStore();
    Pins(*one, seen.get());
    b.rows.clear();
    for (int r = 0; r < a.reps; ++r) {
      b.Load(*one, 1, true, "known", {}, seen.get());
      b.Load(*one, 1, true, "first sight", {}, nullptr);
    }
    for (int r = 0; a.hot && r < a.reps; ++r) {
      b.Load(*one, 1, false, "known", {}, seen.get());
      b.Load(*one, 1, false, "first sight", {}, nullptr);
    }
    PrintTable(b.rows, one->bytes, static_cast<double>(FileBytes(*one)), "known");
    wc::bench::RemoveCheckpoint(*one);
  }
  return 0;
}
