// Many engines starting at once (issue 17, item 5): N engine *processes* acquire the same
// model at the same instant, each timing Connect -> Acquire -> every tensor mapped, and the
// daemon must load the model exactly once.
//
// A daemon child process (host or cuda-vmm backend, its own Prometheus registry) serves
// sparse checkpoints (bench/sparse_checkpoint.h). Per repetition this process spawns N
// engines (this binary again, with --engine); each does its own setup (on cuda: driver,
// device, primary context, as gpu_acquire_bench's engine: bench/engine.h), says ready, and
// blocks on a pipe; closing that pipe releases all of them at once. Each reports its
// timestamps (CLOCK_MONOTONIC, shared by the processes of one machine) on a result pipe and
// holds its lease until every engine has reported.
//
//   cold: the model is not loaded; every engine asks with load_on_miss + wait_ready, so all
//         of them wait on one load. The load's time is reported apart ("load s", the
//         daemon's load_seconds of the entry), and "Acquire -> mapped" is each engine's time
//         from the model being ready (estimated as the first engine's Acquire + the load's
//         time: the load starts when that Acquire arrives, within about a millisecond) to
//         its last tensor mapped. Files are identified (content digests) once before the
//         first repetition, as a daemon with a digest store has them; between repetitions
//         the model is evicted.
//   warm: the model is ready (loaded by the last cold repetition, or by a Load); the time is
//         each engine's Connect -> every tensor mapped.
// "loads" is how many loads the daemon finished while a repetition's engines ran
// (weightcache_load_duration_seconds' count): cold must be 1, warm 0, else the exit status
// is 1, as it is when any engine failed.
//
//   concurrency_bench [--engines=64] [--sizes_gib=1,8] [--tensors=1000] [--backend=host|cuda]
//                     [--reps=3] [--states=cold,warm] [--json=FILE] [--read_threads=16]
//                     [--dir=/tmp]
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/engine.h"
#include "bench/sparse_checkpoint.h"
#include "pkg/client/client.h"
#include "pkg/memory/backend.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/metrics/metrics.h"
#include "pkg/server/daemon.h"
#include "pkg/spec/spec.h"
#include "pkg/util/scoped_fd.h"
#include "pkg/util/version.h"
#include "prometheus/registry.h"
#include "weightcache/v1/weightcache.pb.h"

extern char** environ;

using namespace weightcache;
using bench::Clock;

namespace {

// The engine's inherited descriptors: the release pipe, the result pipe, the exit pipe.
constexpr int kGoFd = 3;
constexpr int kResultFd = 4;
constexpr int kDoneFd = 5;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

const char* Flag(const char* arg, const char* name) {
  const size_t n = std::strlen(name);
  return std::strncmp(arg, name, n) == 0 ? arg + n : nullptr;
}

// One line (< PIPE_BUF bytes, so engines' lines never interleave) on the result pipe.
void SendLine(const std::string& line) {
  std::string l = line.substr(0, 1000) + "\n";
  (void)!::write(kResultFd, l.data(), l.size());
}

void BlockUntilClosed(int fd) {
  char c;
  while (::read(fd, &c, 1) > 0) {
  }
}

// ---- the engine process ----

int EngineMain(int argc, char** argv) {
  std::string socket, model, backend = "host";
  size_t tensors = 0;
  bool load_on_miss = false;
  for (int i = 1; i < argc; ++i) {
    if (const char* v = Flag(argv[i], "--socket=")) socket = v;
    if (const char* v = Flag(argv[i], "--model=")) model = v;
    if (const char* v = Flag(argv[i], "--backend=")) backend = v;
    if (const char* v = Flag(argv[i], "--tensors=")) tensors = std::strtoull(v, nullptr, 10);
    if (const char* v = Flag(argv[i], "--load_on_miss=")) load_on_miss = std::atoi(v) != 0;
  }
  const std::string pid = std::to_string(::getpid());
  std::unique_ptr<bench::EngineGpu> gpu;
  if (backend == "cuda") {
    auto g = bench::EngineGpu::Open();
    if (!g.ok()) {
      SendLine("err " + pid + " engine CUDA setup: " + g.status().ToString());
      return 1;
    }
    gpu = std::move(*g);
  }
  SendLine("ready " + pid);
  BlockUntilClosed(kGoFd);  // the release: every engine wakes on the same close

  const int64_t t_start = NowNs();
  auto client = client::Client::Connect(socket);
  if (!client.ok()) {
    SendLine("err " + pid + " connect: " + client.status().ToString());
    return 1;
  }
  client::AcquireOptions ao;
  ao.model = model;
  ao.wait_ready = true;
  ao.load_on_miss = load_on_miss;
  if (gpu) ao.device_uuid = gpu->uuid();
  const int64_t t_sent = NowNs();
  auto lease = bench::AcquireMapped(**client, ao, tensors);
  const int64_t t_mapped = NowNs();
  if (!lease.ok()) {
    SendLine("err " + pid + " acquire: " + lease.status().ToString());
    return 1;
  }
  SendLine("ok " + pid + " " + std::to_string(t_start) + " " + std::to_string(t_sent) + " " +
           std::to_string(t_mapped) + " " + std::to_string((*lease)->segment_count()));
  BlockUntilClosed(kDoneFd);  // hold the lease while the others map
  return 0;
}

// ---- the daemon child ----

// Serves until `cmd` closes; answers 'c' with the number of loads finished so far.
[[noreturn]] void DaemonMain(const server::DaemonOptions& base, const std::string& backend_name,
                             int ready_fd, int cmd_fd) {
  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<memory::Backend> backend;
  if (backend_name == "cuda") {
    auto b = memory::MakeCudaBackend({});
    if (!b.ok()) {
      std::fprintf(stderr, "daemon: %s\n", b.status().ToString().c_str());
      _exit(2);
    }
    backend = std::move(*b);
  } else {
    backend = memory::MakeHostBackend();
  }
  metrics::Metrics m(*registry, {Version(), "bench", backend_name});
  server::DaemonOptions o = base;
  o.metrics = &m;
  auto d = server::Daemon::Start(o, backend.get());
  if (!d.ok()) {
    std::fprintf(stderr, "daemon: %s\n", d.status().ToString().c_str());
    _exit(2);
  }
  (void)!::write(ready_fd, "r", 1);
  char c;
  while (::read(cmd_fd, &c, 1) == 1) {
    uint64_t loads = 0;
    for (const auto& family : registry->Collect()) {
      if (family.name != "weightcache_load_duration_seconds") continue;
      for (const auto& metric : family.metric) loads += metric.histogram.sample_count;
    }
    const std::string answer = std::to_string(loads) + "\n";
    (void)!::write(ready_fd, answer.data(), answer.size());
  }
  d->reset();
  _exit(0);
}

// Lines from a pipe, with a deadline.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  // The next line; nullopt at EOF or when `timeout` passes without one.
  std::optional<std::string> Next(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n <= 0) return std::nullopt;
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
  std::string buf_;
};

struct Sample {
  int64_t start_ns = 0, sent_ns = 0, mapped_ns = 0;
  size_t segments = 0;
};

struct Round {
  int64_t release_ns = 0;
  std::vector<Sample> ok;
  std::vector<std::string> errors;
};

struct Options {
  int engines = 64;
  std::vector<double> sizes = {1, 8};
  int tensors = 1000;
  std::string backend = "host";
  int reps = 3;
  std::vector<std::string> states = {"cold", "warm"};
  std::string json;
  unsigned read_threads = 16;
  std::string dir = "/tmp";
};

// Spawns `n` engines, waits for all to be ready, releases them at once, collects their
// reports, then lets them exit (ending their leases) and reaps them.
Round RunRound(const Options& opt, const std::string& socket_dir, const std::string& model,
               bool load_on_miss) {
  Round round;
  int go[2], result[2], done[2];
  if (::pipe2(go, O_CLOEXEC) != 0 || ::pipe2(result, O_CLOEXEC) != 0 ||
      ::pipe2(done, O_CLOEXEC) != 0) {
    round.errors.push_back(std::string("pipe: ") + std::strerror(errno));
    return round;
  }
  ScopedFd go_r(go[0]), go_w(go[1]), result_r(result[0]), result_w(result[1]), done_r(done[0]),
      done_w(done[1]);
  std::vector<std::string> args = {"concurrency_bench",
                                   "--engine",
                                   "--socket=" + socket_dir,
                                   "--model=" + model,
                                   "--backend=" + opt.backend,
                                   "--tensors=" + std::to_string(opt.tensors),
                                   std::string("--load_on_miss=") + (load_on_miss ? "1" : "0")};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, go_r.get(), kGoFd);
  posix_spawn_file_actions_adddup2(&fa, result_w.get(), kResultFd);
  posix_spawn_file_actions_adddup2(&fa, done_r.get(), kDoneFd);
  std::vector<pid_t> pids;
  for (int i = 0; i < opt.engines; ++i) {
    pid_t pid = 0;
    if (int e = ::posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ); e != 0) {
      round.errors.push_back(std::string("posix_spawn: ") + std::strerror(e));
      break;
    }
    pids.push_back(pid);
  }
  posix_spawn_file_actions_destroy(&fa);
  go_r.reset();
  result_w.reset();
  done_r.reset();

  LineReader lines(result_r.get());
  size_t ready = 0, finished = 0;  // finished: reported ok or err (an err ends that engine)
  const auto kWait = std::chrono::minutes(10);
  while (ready + finished < pids.size()) {
    auto l = lines.Next(kWait);
    if (!l) break;  // every engine gone, or stuck: release what is there
    if (l->rfind("ready ", 0) == 0) ready++;
    if (l->rfind("err ", 0) == 0) {
      finished++;
      round.errors.push_back(*l);
    }
  }
  round.release_ns = NowNs();
  go_w.reset();  // the release
  while (finished < pids.size()) {
    auto l = lines.Next(kWait);
    if (!l) break;
    std::istringstream in(*l);
    std::string kind, pid;
    in >> kind >> pid;
    if (kind == "ok") {
      Sample s;
      in >> s.start_ns >> s.sent_ns >> s.mapped_ns >> s.segments;
      round.ok.push_back(s);
      finished++;
    } else if (kind == "err") {
      round.errors.push_back(*l);
      finished++;
    }
  }
  if (finished < pids.size()) {
    round.errors.push_back(std::to_string(pids.size() - finished) + " engine(s) never reported");
  }
  done_w.reset();  // the engines exit, ending their leases
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
  }
  return round;
}

class DaemonChild {
 public:
  static std::unique_ptr<DaemonChild> Start(const server::DaemonOptions& o,
                                            const std::string& backend) {
    int answer[2], cmd[2];
    if (::pipe2(answer, O_CLOEXEC) != 0 || ::pipe2(cmd, O_CLOEXEC) != 0) return nullptr;
    const pid_t pid = ::fork();
    if (pid < 0) return nullptr;
    if (pid == 0) {
      ::close(answer[0]);
      ::close(cmd[1]);
      DaemonMain(o, backend, answer[1], cmd[0]);
    }
    ::close(answer[1]);
    ::close(cmd[0]);
    std::unique_ptr<DaemonChild> d(new DaemonChild(pid, answer[0], cmd[1]));
    char c;
    if (::read(d->answer_.get(), &c, 1) != 1) return nullptr;  // it said why on stderr
    return d;
  }
  ~DaemonChild() {
    cmd_.reset();  // the daemon shuts down
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  // Loads the daemon finished so far; -1 when it does not answer.
  int64_t Loads() {
    if (::write(cmd_.get(), "c", 1) != 1) return -1;
    LineReader r(answer_.get());
    auto l = r.Next(std::chrono::seconds(30));
    return l ? std::atoll(l->c_str()) : -1;
  }
  // Loads() once it reaches `at_least`, or after `timeout`: a load is counted just after its
  // entry turns ready (and its waiters are woken), so a count read at once may miss it.
  int64_t LoadsReaching(int64_t at_least, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    int64_t n = Loads();
    while (n >= 0 && n < at_least && Clock::now() < deadline) {
      ::usleep(1000);
      n = Loads();
    }
    return n;
  }

 private:
  DaemonChild(pid_t pid, int answer, int cmd) : pid_(pid), answer_(answer), cmd_(cmd) {}
  pid_t pid_;
  ScopedFd answer_, cmd_;
};

// The ready entry of `model`: its load time in seconds, or -1.
double LoadSeconds(client::Client& c, const std::string& model) {
  auto st = c.Status();
  if (!st.ok()) return -1;
  for (const auto& e : st->entries()) {
    if (e.model() == model && e.state() == "ready") return e.load_seconds();
  }
  return -1;
}

std::string SizeLabel(double gib) {
  char b[32];
  std::snprintf(b, sizeof b, "%g GiB", gib);
  return b;
}

// One row's measurements: every engine of every repetition.
struct Row {
  std::vector<double> ms, total_ms, span_ms, load_s;
  std::vector<int64_t> loads;
  size_t segments = 0, ok_engines = 0, errors = 0;
};

// `state` of `model` over opt.reps repetitions (cold: evicted between them).
Row MeasureState(const Options& opt, const std::string& socket_dir, DaemonChild& daemon,
                 client::Client& admin, const std::string& model, bool cold,
                 int64_t* loads_expected) {
  Row row;
  for (int r = 0; r < opt.reps; ++r) {
    if (cold && r > 0) (void)admin.Evict(model, "");
    const int64_t before = daemon.Loads();
    Round round = RunRound(opt, socket_dir, model, cold);
    const int64_t after =
        cold ? daemon.LoadsReaching(before + 1, std::chrono::seconds(10)) : daemon.Loads();
    row.loads.push_back(before < 0 || after < 0 ? -1 : after - before);
    *loads_expected += cold ? 1 : 0;
    for (const auto& e : round.errors) std::fprintf(stderr, "%s: %s\n", model.c_str(), e.c_str());
    row.errors += round.errors.size();
    row.ok_engines += round.ok.size();
    if (round.ok.empty()) continue;
    // Cold: the model became ready a load's time after the first Acquire was sent.
    double ready_ns = 0;
    if (cold) {
      const double secs = LoadSeconds(admin, model);
      row.load_s.push_back(secs);
      int64_t first = round.ok.front().sent_ns;
      for (const auto& s : round.ok) first = std::min(first, s.sent_ns);
      ready_ns = static_cast<double>(first) + secs * 1e9;
    }
    int64_t last = 0;
    for (const auto& s : round.ok) {
      const double from = cold ? std::max(ready_ns, static_cast<double>(s.start_ns))
                               : static_cast<double>(s.start_ns);
      row.ms.push_back(std::max(0.0, (static_cast<double>(s.mapped_ns) - from) / 1e6));
      row.total_ms.push_back(static_cast<double>(s.mapped_ns - round.release_ns) / 1e6);
      last = std::max(last, s.mapped_ns);
      row.segments = s.segments;
    }
    row.span_ms.push_back(static_cast<double>(last - round.release_ns) / 1e6);
  }
  return row;
}

// Prints the table row and appends the JSON line; false when an engine failed or the daemon
// did not load as expected (cold 1, warm 0 per repetition).
bool PrintRow(const Options& opt, double gib, const char* state, const Row& row) {
  const bool cold = std::strcmp(state, "cold") == 0;
  const int64_t expect = cold ? 1 : 0;
  bool ok = !row.loads.empty();
  int64_t loads_max = 0;
  std::string loads_text;
  for (int64_t l : row.loads) {
    loads_max = std::max(loads_max, l);
    ok = ok && l == expect;
    loads_text += (loads_text.empty() ? "" : ",") + std::to_string(l);
  }
  if (ok) loads_text = std::to_string(expect);  // the same in every repetition
  const size_t asked = static_cast<size_t>(opt.engines) * opt.reps;
  ok = ok && row.ok_engines == asked && row.errors == 0;
  if (row.ms.empty()) {
    std::printf("| %d | %s | %d | | %s | | | | | | %s | 0 / %zu |\n", opt.engines,
                SizeLabel(gib).c_str(), opt.tensors, state, loads_text.c_str(), asked);
    return false;
  }
  const double p50 = bench::Percentile(row.ms, 0.5), p99 = bench::Percentile(row.ms, 0.99),
               mx = bench::Percentile(row.ms, 1.0);
  const double span = bench::Percentile(row.span_ms, 0.5);
  char load_cell[32] = "";
  if (!row.load_s.empty()) {
    std::snprintf(load_cell, sizeof load_cell, "%.3f", bench::Percentile(row.load_s, 0.5));
  }
  std::printf("| %d | %s | %d | %zu | %s | %s | %.2f | %.2f | %.2f | %.1f | %s | %zu / %zu |\n",
              opt.engines, SizeLabel(gib).c_str(), opt.tensors, row.segments, state, load_cell, p50,
              p99, mx, span, loads_text.c_str(), row.ok_engines, asked);
  std::fflush(stdout);
  nlohmann::json j = {{"bench", "concurrency"},
                      {"backend", opt.backend},
                      {"size_gib", gib},
                      {"tensors", opt.tensors},
                      {"engines", opt.engines},
                      {"state", state},
                      {"ms_p50", p50},
                      {"ms_p99", p99},
                      {"ms_max", mx},
                      {"loads", loads_max},
                      {"loads_per_rep", row.loads},
                      {"reps", opt.reps},
                      {"segments", row.segments},
                      {"engines_ok", row.ok_engines},
                      {"release_to_all_mapped_ms", span},
                      {"release_to_mapped_ms_p50", bench::Percentile(row.total_ms, 0.5)},
                      {"release_to_mapped_ms_p99", bench::Percentile(row.total_ms, 0.99)}};
  if (!row.load_s.empty()) j["load_s"] = bench::Percentile(row.load_s, 0.5);
  return bench::AppendJsonLine(opt.json, j) && ok;
}

bool Wants(const Options& opt, const char* state) {
  return std::find(opt.states.begin(), opt.states.end(), state) != opt.states.end();
}

int RunBench(const Options& opt) {
  std::string tmpl = opt.dir + "/wc-conc-bench.XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "mkdtemp %s: %s\n", tmpl.c_str(), std::strerror(errno));
    return 2;
  }
  const std::string root = tmpl;
  server::DaemonOptions o;
  o.socket_dir = root + "/s";
  o.admin_socket_dir = root + "/s-admin";  // the bench's evictions go there
  o.preload = false;
  o.read_threads = opt.read_threads;
  std::vector<std::string> names;
  for (double g : opt.sizes) {
    const std::string name = "c" + std::to_string(names.size());
    bench::WriteSparseCheckpoint(root + "/" + name, opt.tensors,
                                 static_cast<uint64_t>(g * (1ull << 30)));
    spec::ModelSpec s;
    s.name = name;
    s.model_dir = root + "/" + name;
    o.specs.push_back(s);
    names.push_back(name);
  }

  // The daemon: a child forked while this process is still single-threaded.
  auto daemon = DaemonChild::Start(o, opt.backend);
  if (!daemon) {
    std::fprintf(stderr, "the daemon did not start\n");
    std::filesystem::remove_all(root);
    return 2;
  }
  // Evict is the operator's: the admin socket beside the engine one (<socket_dir>-admin).
  auto admin = client::Client::Connect(o.socket_dir + "-admin");
  if (!admin.ok()) return 2;

  std::printf(
      "%d engine processes acquiring one model at once, %s backend (%d reps; p50/p99/max over "
      "all engines of all reps)\n\n",
      opt.engines, opt.backend.c_str(), opt.reps);
  std::printf(
      "| engines | weights | tensors | segments | state | load s | Acquire -> mapped p50 ms | "
      "p99 ms | max ms | release -> all mapped ms | loads | engines ok |\n");
  std::printf("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);

  int rc = 0;
  for (size_t k = 0; k < names.size(); ++k) {
    const std::string& model = names[k];
    // Identify the files once (their content digests), as a daemon that knew them already:
    // an Acquire that may not load answers a miss after opening the model.
    client::AcquireOptions probe;
    probe.model = model;
    (void)(*admin)->Acquire(probe);
    const int64_t loads_at_start = daemon->Loads();
    int64_t loads_expected = 0;  // by the daemon, for this model: checked at the end
    for (const char* state : {"cold", "warm"}) {
      const bool cold = std::strcmp(state, "cold") == 0;
      if (!Wants(opt, state)) continue;
      if (!cold && LoadSeconds(**admin, model) < 0) {  // warm without cold: load it first
        const int64_t before = daemon->Loads();
        if (auto s = (*admin)->Load(model, "", nullptr); !s.ok()) {
          std::fprintf(stderr, "load %s: %s\n", model.c_str(), s.ToString().c_str());
          rc = 1;
          continue;
        }
        daemon->LoadsReaching(before + 1, std::chrono::seconds(10));
        loads_expected++;
      }
      const Row row =
          MeasureState(opt, o.socket_dir, *daemon, **admin, model, cold, &loads_expected);
      if (!PrintRow(opt, opt.sizes[k], state, row)) rc = 1;
    }
    // A second load that finished after its repetition was counted shows up here.
    if (const int64_t n = daemon->Loads() - loads_at_start; n != loads_expected) {
      std::fprintf(stderr, "%s: the daemon loaded it %" PRId64 " times, expected %" PRId64 "\n",
                   model.c_str(), n, loads_expected);
      rc = 1;
    }
    (void)(*admin)->Evict(model, "");
  }
  admin->reset();
  daemon.reset();
  std::filesystem::remove_all(root);
  return rc;
}

Options ParseOptions(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (const char* v = Flag(a, "--engines=")) opt.engines = std::atoi(v);
    if (const char* v = Flag(a, "--sizes_gib=")) opt.sizes = bench::ParseList(v);
    if (const char* v = Flag(a, "--tensors=")) opt.tensors = std::atoi(v);
    if (const char* v = Flag(a, "--backend=")) opt.backend = v;
    if (const char* v = Flag(a, "--reps=")) opt.reps = std::max(1, std::atoi(v));
    if (const char* v = Flag(a, "--json=")) opt.json = v;
    if (const char* v = Flag(a, "--read_threads=")) opt.read_threads = std::atoi(v);
    if (const char* v = Flag(a, "--dir=")) opt.dir = v;
    if (const char* v = Flag(a, "--states=")) {
      opt.states.clear();
      std::stringstream ss(v);
      for (std::string s; std::getline(ss, s, ',');) opt.states.push_back(s);
    }
  }
  return opt;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    for (int i = 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--engine") == 0) return EngineMain(argc, argv);
    }
    const Options opt = ParseOptions(argc, argv);
    if (opt.backend != "host" && opt.backend != "cuda") {
      std::fprintf(stderr, "--backend: host or cuda, not %s\n", opt.backend.c_str());
      return 2;
    }
    return RunBench(opt);
  } catch (const std::exception& e) {  // nlohmann::json, std::string: a bug or out of memory
    std::fprintf(stderr, "concurrency_bench: %s\n", e.what());
    return 2;
  }
}
