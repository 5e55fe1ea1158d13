// Fleet fill (issue 30, item 5): how long N cold nodes that start at once take to fill one
// model, reading it from storage only or with peer fill (nodes that hold a segment serve it to
// others). A simulation on paper, not a network emulator: docs/peer-fill.md, "At fleet scale",
// states the model and its assumptions and keeps the table this program prints.
//
//   fleet_fill_sim --table          N = 1 ... 1,000, both strategies (the table in the doc)
//   fleet_fill_sim --nodes=200      one fleet size, both strategies
//   fleet_fill_sim --check          asserts properties of the model; exits 1 when one fails
//   flags: --model_gb=1000 --segments=256 --storage_gbps=10 --storage_node_gbps=2
//          --nic_gbps=50 --storage_readers=0 (0: storage_gbps / storage_node_gbps, rounded up)
//          --warm_nodes=0 (nodes that already hold the model and serve it) --seed=1
//          --strategy=both|storage|peer --table_nodes=1,2,5,...
//
// The model, in short: the model is S equal segments; a storage read runs at
// min(per-node cap, aggregate cap / concurrent readers); a peer transfer moves one segment at
// the full NIC rate, and each node sends one segment and receives one at a time (full duplex).
// Storage traffic takes its own path (it does not use the peer NIC). Peer fill reads each
// segment from storage exactly once, on a few nodes in turn, and every node then fetches what it
// lacks from a random idle peer, rarest segment first. Deterministic: a seeded RNG picks peers.
// Standard library only; no weightcache code is involved.
#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <queue>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Params {
  int nodes = 1000;              // cold nodes, all starting at t = 0
  int warm_nodes = 0;            // nodes that already hold the whole model (serve only)
  double model_gb = 1000;        // bytes each node needs, GB (1e9): one node's 8 shards of a 1T FP8
  int segments = 256;            // the model in equal segments (the unit of transfer)
  double storage_gbps = 10;      // aggregate storage bandwidth, shared by all readers, GB/s
  double storage_node_gbps = 2;  // one node's storage read cap, GB/s
  double nic_gbps = 50;          // per node and direction (400 Gb/s RDMA), GB/s
  int storage_readers = 0;       // peer fill: nodes reading from storage at once (0: auto)
  uint64_t seed = 1;
};

struct Result {
  double fill_s = 0;       // the last cold node holds every segment
  double storage_gb = 0;   // read from storage, all nodes together
  double peer_gb = 0;      // moved between nodes
  double last_read_s = 0;  // the last storage read ended (peer fill: the last first copy)
  bool all_filled = false;
};

// Today: every node reads the whole model from storage; all N read at once and share the
// aggregate bandwidth fairly, each capped at its own rate. Closed form: the rates never change.
Result StorageOnly(const Params& p) {
  const double rate = std::min(p.storage_node_gbps, p.storage_gbps / p.nodes);
  Result r;
  r.fill_s = p.model_gb / rate;
  r.storage_gb = p.model_gb * p.nodes;
  r.last_read_s = r.fill_s;
  r.all_filled = true;
  return r;
}

// What no strategy can beat (for the table): every byte leaves storage at least once (unless a
// warm node holds it), and a node receives at most NIC + its storage cap per second.
double FloorSeconds(const Params& p) {
  double floor = p.model_gb / (p.nic_gbps + p.storage_node_gbps);
  if (p.warm_nodes == 0) {
    floor = std::max(floor, p.model_gb / std::min(p.storage_gbps, p.nodes * p.storage_node_gbps));
  }
  return floor;
}

// A set of node ids with O(1) add, remove and membership, iterated as a vector.
class IdleSet {
 public:
  explicit IdleSet(int capacity) : pos_(capacity, -1) {}
  void Add(int v) {
    if (pos_[v] >= 0) return;
    pos_[v] = static_cast<int>(items_.size());
    items_.push_back(v);
  }
  void Remove(int v) {
    const int i = pos_[v];
    if (i < 0) return;
    const int last = items_.back();
    items_[i] = last;
    pos_[last] = i;
    items_.pop_back();
    pos_[v] = -1;
  }
  bool Contains(int v) const { return pos_[v] >= 0; }
  const std::vector<int>& items() const { return items_; }

 private:
  std::vector<int> pos_;
  std::vector<int> items_;
};

// Peer fill, event-driven. Events: a peer transfer ends (every one lasts segment / NIC), a
// storage read ends (its rate changes when the number of concurrent readers does).
class PeerFill {
 public:
  explicit PeerFill(const Params& p)
      : p_(p),
        cold_(p.nodes),
        total_(p.nodes + p.warm_nodes),
        words_((p.segments + 63) / 64),
        segment_gb_(p.model_gb / p.segments),
        tau_(segment_gb_ / p.nic_gbps),
        readers_(p.storage_readers > 0
                     ? p.storage_readers
                     : static_cast<int>(std::ceil(p.storage_gbps / p.storage_node_gbps - 1e-9))),
        have_(static_cast<size_t>(total_) * words_, 0),
        pending_(static_cast<size_t>(total_) * words_, 0),
        somewhere_(words_, 0),
        everywhere_(words_, 0),
        have_count_(total_, 0),
        copies_(p.segments, 0),
        down_busy_(total_, 0),
        up_busy_(total_, 0),
        storage_busy_(total_, 0),
        idle_up_(total_),
        idle_down_(total_),
        rng_(p.seed) {
    readers_ = std::min(readers_, cold_);
    for (int w = p.nodes; w < total_; ++w) {  // warm nodes hold everything from the start
      for (int s = 0; s < p.segments; ++s) Set(have_, w, s);
      have_count_[w] = p.segments;
      idle_up_.Add(w);
    }
    if (p.warm_nodes > 0) {
      next_seed_ = p.segments;  // nothing needs reading from storage
      for (int s = 0; s < p.segments; ++s) {
        copies_[s] = p.warm_nodes;
        Set(somewhere_, 0, s);
      }
    }
    for (int n = 0; n < cold_; ++n) idle_down_.Add(n);
  }

  Result Run() {
    StartStorageReads();
    for (int n = 0; n < cold_; ++n) TryDownload(n);
    while (filled_ < cold_) {
      const double t_peer = transfers_.empty() ? kInf : transfers_.top().end_s;
      size_t first = 0;
      double t_storage = kInf;
      if (!reads_.empty()) {
        for (size_t i = 1; i < reads_.size(); ++i) {
          if (reads_[i].remaining_gb < reads_[first].remaining_gb) first = i;
        }
        t_storage = now_ + reads_[first].remaining_gb / StorageRate();
      }
      if (t_peer == kInf && t_storage == kInf) break;  // stuck: reported as not all filled
      if (t_storage <= t_peer) {
        AdvanceStorage(t_storage);
        const StorageRead done = reads_[first];
        reads_.erase(reads_.begin() + static_cast<std::ptrdiff_t>(first));
        ++storage_reads_;
        last_read_s_ = now_;
        storage_busy_[done.node] = 0;
        Receive(done.node, done.segment);
        if (!up_busy_[done.node]) TryUpload(done.node);
        StartStorageReads();
      } else {
        // Every transfer that ends now ends first; then the freed nodes look for work, so a
        // node's choice sees all the peers that are free at this instant.
        AdvanceStorage(t_peer);
        freed_.clear();
        while (!transfers_.empty() && transfers_.top().end_s == t_peer) {
          const Transfer x = transfers_.top();
          transfers_.pop();
          ++peer_transfers_;
          up_busy_[x.src] = 0;
          idle_up_.Add(x.src);
          down_busy_[x.dst] = 0;
          Receive(x.dst, x.segment);
          if (have_count_[x.dst] < p_.segments) idle_down_.Add(x.dst);
          freed_.push_back(x.dst);
          freed_.push_back(x.src);
        }
        for (const int n : freed_) {
          TryDownload(n);
          TryUpload(n);
        }
      }
    }
    Result r;
    r.fill_s = now_;
    r.storage_gb = static_cast<double>(storage_reads_) * segment_gb_;
    r.peer_gb = static_cast<double>(peer_transfers_) * segment_gb_;
    r.last_read_s = last_read_s_;
    r.all_filled = filled_ == cold_;
    for (int n = 0; n < cold_ && r.all_filled; ++n) {
      for (int s = 0; s < p_.segments; ++s) r.all_filled = r.all_filled && Has(have_, n, s);
    }
    return r;
  }

 private:
  struct Transfer {
    double end_s;
    uint64_t seq;  // ties end in start order: the run is deterministic
    int src, dst, segment;
    bool operator>(const Transfer& o) const {
      return end_s != o.end_s ? end_s > o.end_s : seq > o.seq;
    }
  };
  struct StorageRead {
    int node, segment;
    double remaining_gb;
  };

  void Set(std::vector<uint64_t>& bits, int node, int s) {
    bits[static_cast<size_t>(node) * words_ + s / 64] |= uint64_t{1} << (s % 64);
  }
  void Clear(std::vector<uint64_t>& bits, int node, int s) {
    bits[static_cast<size_t>(node) * words_ + s / 64] &= ~(uint64_t{1} << (s % 64));
  }
  bool Has(const std::vector<uint64_t>& bits, int node, int s) const {
    return (bits[static_cast<size_t>(node) * words_ + s / 64] >> (s % 64)) & 1;
  }
  // Segments u holds that d neither holds nor is already receiving.
  uint64_t Offer(int u, int d, int w) const {
    const size_t du = static_cast<size_t>(u) * words_ + w;
    const size_t dd = static_cast<size_t>(d) * words_ + w;
    return have_[du] & ~have_[dd] & ~pending_[dd];
  }
  bool CanServe(int u, int d) const {
    for (int w = 0; w < words_; ++w) {
      if (Offer(u, d, w) != 0) return true;
    }
    return false;
  }
  // d lacks (and is not receiving) one of `segments`.
  bool Lacks(int d, const std::vector<uint64_t>& segments) const {
    const size_t base = static_cast<size_t>(d) * words_;
    for (int w = 0; w < words_; ++w) {
      if ((segments[w] & ~have_[base + w] & ~pending_[base + w]) != 0) return true;
    }
    return false;
  }
  // u holds a segment outside `segments`.
  bool Holds(int u, const std::vector<uint64_t>& segments) const {
    const size_t base = static_cast<size_t>(u) * words_;
    for (int w = 0; w < words_; ++w) {
      if ((have_[base + w] & ~segments[w]) != 0) return true;
    }
    return false;
  }
  // Rarest first: the offered segment with the fewest copies (held or on their way).
  int PickSegment(int u, int d) const {
    int best = -1;
    int best_copies = std::numeric_limits<int>::max();
    for (int w = 0; w < words_; ++w) {
      for (uint64_t c = Offer(u, d, w); c != 0; c &= c - 1) {
        const int s = w * 64 + std::countr_zero(c);
        if (copies_[s] < best_copies) {
          best = s;
          best_copies = copies_[s];
        }
      }
    }
    return best;
  }

  double StorageRate() const {
    return std::min(p_.storage_node_gbps, p_.storage_gbps / static_cast<double>(reads_.size()));
  }
  void AdvanceStorage(double t) {
    if (!reads_.empty()) {
      const double gb = (t - now_) * StorageRate();
      for (auto& r : reads_) r.remaining_gb = std::max(0.0, r.remaining_gb - gb);
    }
    now_ = t;
  }

  // Each segment is read once, in order, by up to readers_ nodes at a time taken in turn, so
  // first copies land on different nodes one after another and spreading starts early.
  void StartStorageReads() {
    while (static_cast<int>(reads_.size()) < readers_ && next_seed_ < p_.segments) {
      int n = reader_cursor_;
      while (storage_busy_[n]) n = (n + 1) % cold_;
      reader_cursor_ = (n + 1) % cold_;
      const int s = next_seed_++;
      storage_busy_[n] = 1;
      Set(pending_, n, s);
      AddCopy(s);
      reads_.push_back({n, s, segment_gb_});
    }
  }

  void AddCopy(int s) {
    if (++copies_[s] == total_) Set(everywhere_, 0, s);
  }

  void Receive(int n, int s) {
    Set(have_, n, s);
    Set(somewhere_, 0, s);
    Clear(pending_, n, s);
    if (++have_count_[n] == 1 && !up_busy_[n]) idle_up_.Add(n);
    if (have_count_[n] == p_.segments) {
      ++filled_;
      idle_down_.Remove(n);
    }
  }

  void Start(int u, int d) {
    const int s = PickSegment(u, d);
    up_busy_[u] = 1;
    down_busy_[d] = 1;
    idle_up_.Remove(u);
    idle_down_.Remove(d);
    Set(pending_, d, s);
    AddCopy(s);
    transfers_.push({now_ + tau_, seq_++, u, d, s});
  }

  // d's receive side is free: the first idle peer (from a random place) that offers anything.
  void TryDownload(int d) {
    if (!idle_down_.Contains(d) || !Lacks(d, somewhere_)) return;
    const std::vector<int>& ups = idle_up_.items();
    const size_t k = ups.size();
    if (k == 0) return;
    const size_t start = rng_() % k;
    for (size_t i = 0; i < k; ++i) {
      const int u = ups[(start + i) % k];
      if (u != d && CanServe(u, d)) return Start(u, d);
    }
  }
  // u's send side is free (or u has a new segment): the first idle node that lacks one of its.
  void TryUpload(int u) {
    if (!idle_up_.Contains(u) || !Holds(u, everywhere_)) return;
    const std::vector<int>& downs = idle_down_.items();
    const size_t k = downs.size();
    if (k == 0) return;
    const size_t start = rng_() % k;
    for (size_t i = 0; i < k; ++i) {
      const int d = downs[(start + i) % k];
      if (d != u && CanServe(u, d)) return Start(u, d);
    }
  }

  const Params p_;
  const int cold_, total_, words_;
  const double segment_gb_, tau_;
  int readers_;
  std::vector<uint64_t> have_, pending_;  // one bit per segment, words_ words per node
  // Shortcuts that skip scans which cannot succeed: segments some node holds; segments every
  // node holds or is receiving.
  std::vector<uint64_t> somewhere_, everywhere_;
  std::vector<int> have_count_, copies_;
  std::vector<char> down_busy_, up_busy_, storage_busy_;
  IdleSet idle_up_, idle_down_;  // send / receive side free (receive: cold, not yet filled)
  std::priority_queue<Transfer, std::vector<Transfer>, std::greater<>> transfers_;
  std::vector<StorageRead> reads_;
  std::vector<int> freed_;  // nodes whose transfer ended at this instant
  std::mt19937_64 rng_;
  double now_ = 0, last_read_s_ = 0;
  uint64_t seq_ = 0;
  int64_t storage_reads_ = 0, peer_transfers_ = 0;
  int next_seed_ = 0, reader_cursor_ = 0, filled_ = 0;
};

Result PeerFillRun(const Params& p) { return PeerFill(p).Run(); }

std::string Duration(double s) {
  char buf[32];
  if (s < 120) {
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  } else if (s < 2 * 3600) {
    std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  }
  return buf;
}

std::string Bytes(double gb) {
  char buf[32];
  if (gb < 1000) {
    std::snprintf(buf, sizeof buf, "%.0f GB", gb);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f TB", gb / 1000);
  }
  return buf;
}

void PrintParams(const Params& p) {
  const double segment_gb = p.model_gb / p.segments;
  std::printf(
      "model %.0f GB per node in %d segments of %.2f GB; storage %.1f GB/s aggregate, %.1f GB/s "
      "per node; NIC %.1f GB/s per direction (one segment: tau = %.3f s); warm nodes %d; "
      "seed %llu\n\n",
      p.model_gb, p.segments, segment_gb, p.storage_gbps, p.storage_node_gbps, p.nic_gbps,
      segment_gb / p.nic_gbps, p.warm_nodes, static_cast<unsigned long long>(p.seed));
}

void PrintTable(const Params& p, const std::vector<int>& sizes) {
  PrintParams(p);
  const double tau = p.model_gb / p.segments / p.nic_gbps;
  std::printf(
      "| nodes | log2 N | storage only | peer fill | speedup | read from storage (peer) | "
      "floor | last storage read ends | spread after it |\n");
  std::printf(
      "|------:|-------:|-------------:|----------:|--------:|------:|------:|------:|------:|\n");
  for (const int n : sizes) {
    Params q = p;
    q.nodes = n;
    const Result s = StorageOnly(q);
    const Result f = PeerFillRun(q);
    const double spread = f.fill_s - f.last_read_s;
    std::printf("| %5d | %6.1f | %12s | %9s | %6.0fx | %8s | %7s | %7s | %.2f s = %4.1f tau |%s\n",
                n, std::log2(static_cast<double>(n)), Duration(s.fill_s).c_str(),
                Duration(f.fill_s).c_str(), s.fill_s / f.fill_s, Bytes(f.storage_gb).c_str(),
                Duration(FloorSeconds(q)).c_str(), Duration(f.last_read_s).c_str(), spread,
                spread / tau, f.all_filled ? "" : "  NOT ALL FILLED");
  }
}

// Properties the model must have whatever the host; each prints ok/FAIL with its values.
int Check(const Params& p) {
  int failed = 0;
  auto expect = [&failed](bool ok, const std::string& what) {
    std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
    if (!ok) ++failed;
  };
  auto with_nodes = [&p](int n) {
    Params q = p;
    q.nodes = n;
    return q;
  };
  char line[256];
  std::vector<Result> storage_only, peer;  // for N = 1, 2, 10, 100, 1000
  for (const int n : {1, 2, 10, 100, 1000}) {
    const Params q = with_nodes(n);
    const Result s = storage_only.emplace_back(StorageOnly(q));
    const Result f = peer.emplace_back(PeerFillRun(q));
    std::snprintf(line, sizeof line, "N=%d: every node ends with all %d segments", n, p.segments);
    expect(f.all_filled, line);
    std::snprintf(line, sizeof line, "N=%d: peer fill reads %.0f GB from storage <= %.0f GB", n,
                  f.storage_gb, s.storage_gb);
    expect(f.storage_gb <= s.storage_gb * (1 + 1e-12), line);
    std::snprintf(line, sizeof line,
                  "N=%d: every node receives the model once: storage + peer = %.0f GB = N x %.0f",
                  n, f.storage_gb + f.peer_gb, p.model_gb);
    expect(std::abs(f.storage_gb + f.peer_gb - n * p.model_gb) <= 1e-6 * n * p.model_gb, line);
    std::snprintf(line, sizeof line, "N=%d: peer fill %.2f s is not below the floor %.2f s", n,
                  f.fill_s, FloorSeconds(q));
    expect(f.fill_s >= FloorSeconds(q) * (1 - 1e-9), line);
  }
  std::snprintf(line, sizeof line, "N=1: peer fill %.3f s equals storage only %.3f s",
                peer[0].fill_s, storage_only[0].fill_s);
  expect(std::abs(peer[0].fill_s - storage_only[0].fill_s) <= 1e-9 * storage_only[0].fill_s, line);
  std::snprintf(line, sizeof line, "N=1000: storage only %.0f s / peer fill %.1f s = %.0f >= 100",
                storage_only[4].fill_s, peer[4].fill_s, storage_only[4].fill_s / peer[4].fill_s);
  expect(storage_only[4].fill_s / peer[4].fill_s >= 100, line);
  std::snprintf(line, sizeof line, "sub-linear: peer t(1000) / t(10) = %.3f < 2 (linear: 100)",
                peer[4].fill_s / peer[2].fill_s);
  expect(peer[4].fill_s / peer[2].fill_s < 2, line);
  const double tau = p.model_gb / p.segments / p.nic_gbps;
  const double hops = (peer[4].fill_s - peer[4].last_read_s) / tau;
  std::snprintf(line, sizeof line,
                "log N: N=1000 is filled %.1f segment times after the last storage read, <= 2 x "
                "log2(1000)",
                hops);
  expect(hops <= 2 * std::log2(1000.0), line);
  const Result again = PeerFillRun(with_nodes(1000));
  std::snprintf(line, sizeof line, "deterministic: N=1000 twice gives %.6f s and %.6f s",
                peer[4].fill_s, again.fill_s);
  expect(again.fill_s == peer[4].fill_s && again.peer_gb == peer[4].peer_gb, line);
  std::printf("%s\n", failed == 0 ? "all checks passed" : "checks FAILED");
  return failed == 0 ? 0 : 1;
}

template <typename T>
bool ParseNumber(std::string_view text, T& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

bool ParseList(std::string_view text, std::vector<int>& out) {
  out.clear();
  while (!text.empty()) {
    const size_t comma = text.find(',');
    int v = 0;
    if (!ParseNumber(text.substr(0, comma), v) || v < 1) return false;
    out.push_back(v);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
  }
  return !out.empty();
}

int Usage(const char* bad) {
  std::fprintf(stderr,
               "fleet_fill_sim: bad flag '%s'\n"
               "usage: fleet_fill_sim [--table | --check] [--nodes=N] [--model_gb=1000] "
               "[--segments=256] [--storage_gbps=10] [--storage_node_gbps=2] [--nic_gbps=50] "
               "[--storage_readers=0] [--warm_nodes=0] [--seed=1] "
               "[--strategy=both|storage|peer] [--table_nodes=1,2,5,...]\n",
               bad);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Params p;
  bool table = false;
  bool check = false;
  std::string strategy = "both";
  std::vector<int> sizes = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000};
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string_view key = arg.substr(0, eq);
    const std::string_view value =
        eq == std::string_view::npos ? std::string_view() : arg.substr(eq + 1);
    bool ok = true;
    if (key == "--table" && eq == std::string_view::npos) {
      table = true;
    } else if (key == "--check" && eq == std::string_view::npos) {
      check = true;
    } else if (key == "--nodes") {
      ok = ParseNumber(value, p.nodes) && p.nodes >= 1;
    } else if (key == "--warm_nodes") {
      ok = ParseNumber(value, p.warm_nodes) && p.warm_nodes >= 0;
    } else if (key == "--model_gb") {
      ok = ParseNumber(value, p.model_gb) && p.model_gb > 0;
    } else if (key == "--segments") {
      ok = ParseNumber(value, p.segments) && p.segments >= 1;
    } else if (key == "--storage_gbps") {
      ok = ParseNumber(value, p.storage_gbps) && p.storage_gbps > 0;
    } else if (key == "--storage_node_gbps") {
      ok = ParseNumber(value, p.storage_node_gbps) && p.storage_node_gbps > 0;
    } else if (key == "--nic_gbps") {
      ok = ParseNumber(value, p.nic_gbps) && p.nic_gbps > 0;
    } else if (key == "--storage_readers") {
      ok = ParseNumber(value, p.storage_readers) && p.storage_readers >= 0;
    } else if (key == "--seed") {
      ok = ParseNumber(value, p.seed);
    } else if (key == "--strategy") {
      strategy = value;
      ok = strategy == "both" || strategy == "storage" || strategy == "peer";
    } else if (key == "--table_nodes") {
      ok = ParseList(value, sizes);
    } else {
      ok = false;
    }
    if (!ok) return Usage(argv[i]);
  }
  if (check) return Check(p);
  if (table) {
    PrintTable(p, sizes);
    return 0;
  }
  PrintParams(p);
  if (strategy != "peer") {
    const Result s = StorageOnly(p);
    std::printf("storage only: %d nodes filled in %s (%.1f s), %s read from storage\n", p.nodes,
                Duration(s.fill_s).c_str(), s.fill_s, Bytes(s.storage_gb).c_str());
  }
  if (strategy != "storage") {
    const Result f = PeerFillRun(p);
    std::printf(
        "peer fill:    %d nodes filled in %s (%.1f s), %s read from storage, %s between "
        "nodes; floor %.1f s%s\n",
        p.nodes, Duration(f.fill_s).c_str(), f.fill_s, Bytes(f.storage_gb).c_str(),
        Bytes(f.peer_gb).c_str(), FloorSeconds(p), f.all_filled ? "" : "; NOT ALL FILLED");
    if (!f.all_filled) return 1;
  }
  return 0;
}
