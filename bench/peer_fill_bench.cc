// Peer fill (issue 30) against a cold disk load, two daemons in one process on one machine:
// A loads the checkpoint from disk (its page cache dropped first: "cold"), B fills the same
// model-rank from A over UCX (loopback TCP, mutual TLS on the peer API), on the same backend
// (host memory, or GPU memory through host staging on both sides). Both share a digest store,
// so B never reads the checkpoint. Prints one table row per run; B's bytes are compared with
// A's, every segment.
//
//   peer_fill_bench [--backend=auto|host|cuda-vmm] [--gib=4] [--dir=/var/tmp/wc-peer-fill]
//                   [--runs=1] [--prepare]
// --prepare writes the checkpoint (--dir/m) and a fleet CA with one daemon certificate
// (--dir/daemon.{crt,key}, --dir/fleet-ca.crt), prints their paths and exits: what
// bench/peer_fill_netns.sh runs two weightcached processes in network namespaces with.
// --gib=0 writes a small checkpoint (tens of MB: a smoke run; the disk figure is then not
// a disk figure). UCX_TLS defaults to tcp. The table and its command are kept in
// docs/benchmarks.md ("Peer fill").
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "bench/dense_checkpoint.h"
#include "pkg/client/client.h"
#include "pkg/memory/cuda_backend.h"
#include "pkg/memory/mapping.h"
#include "pkg/peer/testing/test_ca.h"
#include "pkg/safetensors/writer.h"
#include "pkg/server/daemon.h"
#include "weightcache/v1/weightcache.pb.h"

namespace wc = weightcache;

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "peer_fill_bench: %s\n", what.c_str());
  std::exit(1);
}

struct Args {
  std::string backend = "auto";
  double gib = 4;
  std::string dir = "/var/tmp/wc-peer-fill";
  int runs = 1;
  bool prepare = false;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return s.compare(0, n, flag) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = value("--backend=")) {
      a.backend = v;
    } else if (const char* v = value("--gib=")) {
      if (!absl::SimpleAtod(v, &a.gib) || a.gib < 0) Die("--gib: a size in GiB, >= 0: " + s);
    } else if (const char* v = value("--dir=")) {
      a.dir = v;
    } else if (const char* v = value("--runs=")) {
      if (!absl::SimpleAtoi(v, &a.runs) || a.runs < 1) Die("--runs: a positive count: " + s);
    } else if (s == "--prepare") {
      a.prepare = true;
    } else {
      Die("unknown flag " + s);
    }
  }
  return a;
}

struct Node {
  std::unique_ptr<wc::server::Daemon> daemon;
  std::unique_ptr<wc::client::Client> client;
};

Node Start(const std::string& dir, const std::string& name, const wc::peer::TlsFiles& tls,
           const std::vector<wc::peer::PeerName>& peers, wc::memory::Backend* backend) {
  wc::server::DaemonOptions o;
  o.socket_dir = dir + "/" + name;
  o.preload = false;
  o.admin_uids = {::geteuid()};
  o.digest_store = dir + "/digests.json";
  wc::spec::ModelSpec s;
  s.name = "m";
  s.model_dir = dir + "/m";
  o.specs = {s};
  o.peer.listen = "127.0.0.1:0";
  o.peer.tls = tls;
  o.peer.peers = peers;
  // One holder, one certificate: the bench measures the transfer, not the anchor (issue 48).
  o.peer.trust = wc::server::PeerTrust::kSingle;
  auto d = wc::server::Daemon::Start(std::move(o), backend);
  if (!d.ok()) Die(std::string(d.status().message()));
  auto c = wc::client::Client::Connect(dir + "/" + name);
  if (!c.ok()) Die(std::string(c.status().message()));
  return {std::move(d).value(), std::move(c).value()};
}

std::unique_ptr<wc::client::Lease> Acquire(Node& n) {
  wc::client::AcquireOptions o;
  o.model = "m";
  o.wait_ready = true;
  o.load_on_miss = true;
  o.timeout = std::chrono::minutes(30);
  auto l = n.client->Acquire(o);
  if (!l.ok()) Die(std::string(l.status().message()));
  return std::move(l).value();
}

wc::v1::EntryInfo Entry(Node& n) {
  auto st = n.client->Status();
  if (!st.ok()) Die(std::string(st.status().message()));
  for (const auto& e : st->entries()) {
    if (e.model() == "m" && e.state() == "ready") return e;
  }
  Die("no ready entry of m");
}

// Whether every segment of `b` equals `a`'s (read through the backend: GPU memory is copied
// to the host in pieces).
bool SameBytes(const wc::client::Lease& a, const wc::client::Lease& b, wc::memory::BackendKind k) {
  if (a.segment_count() != b.segment_count()) return false;
  constexpr uint64_t kPiece = 256ull << 20;
  std::vector<char> x, y;
  for (size_t i = 0; i < a.segment_count(); ++i) {
    if (a.segment_size(i) != b.segment_size(i)) return false;
    for (uint64_t off = 0; off < a.segment_size(i); off += kPiece) {
      const uint64_t n = std::min(kPiece, a.segment_size(i) - off);
      x.resize(n);
      y.resize(n);
      if (!wc::memory::CopyToHost(k, a.device_uuid(), a.segment_base(i) + off, n, x.data()).ok() ||
          !wc::memory::CopyToHost(k, b.device_uuid(), b.segment_base(i) + off, n, y.data()).ok()) {
        return false;
      }
      if (std::memcmp(x.data(), y.data(), n) != 0) return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  ::setenv("UCX_TLS", "tcp", 0);
  auto backend = wc::memory::MakeBackend(a.backend);
  if (!backend.ok()) Die(std::string(backend.status().message()));
  const wc::memory::BackendKind kind = (*backend)->kind();
  std::filesystem::remove_all(a.dir);
  std::filesystem::create_directories(a.dir);
  std::vector<std::string> files;
  if (a.gib > 0) {
    auto c = wc::bench::WriteDenseLlama(a.dir + "/m", a.gib);
    if (!c.ok()) Die(std::string(c.status().message()));
    files = c->files;
  } else {
    wc::safetensors::LlamaShape shape;
    shape.layers = 2;
    shape.hidden = 1024;
    shape.intermediate = 4096;
    shape.heads = 8;
    shape.kv_heads = 2;
    shape.vocab = 8192;
    if (auto s = wc::safetensors::WriteLlamaCheckpoint(a.dir + "/m", shape); !s.ok()) {
      Die(std::string(s.message()));
    }
    for (const auto& e : std::filesystem::directory_iterator(a.dir + "/m")) {
      if (e.path().extension() == ".safetensors") files.push_back(e.path());
    }
  }
  auto ca = wc::peer::testing::TestCa::Create(a.dir, "fleet");
  if (!ca.ok()) Die(std::string(ca.status().message()));
  auto la = ca->Issue("a", wc::peer::kDefaultServerName);
  auto lb = ca->Issue("b", wc::peer::kDefaultServerName);
  if (!la.ok() || !lb.ok()) Die("certificates");
  const wc::peer::TlsFiles ta{la->cert_file, la->key_file, ca->ca_file()};
  const wc::peer::TlsFiles tb{lb->cert_file, lb->key_file, ca->ca_file()};
  if (a.prepare) {
    std::printf("checkpoint %s/m\ncert %s\nkey %s\nca %s\n", a.dir.c_str(), la->cert_file.c_str(),
                la->key_file.c_str(), ca->ca_file().c_str());
    return 0;
  }

  std::printf(
      "| backend | model | disk load (A) | GB/s | peer fill (B from A) | GB/s | B read | "
      "same bytes |\n|---|---:|---:|---:|---:|---:|---:|---|\n");
  {
    // Identity first: a daemon that opens the model hashes its files (a read, into the page
    // cache) and keeps the digests in the store both daemons then use.
    Node prime = Start(a.dir, "a", ta, {}, backend->get());
    (void)Acquire(prime);
  }
  for (int run = 0; run < a.runs; ++run) {
    Node node_a = Start(a.dir, "a", ta, {}, backend->get());
    const std::string cold = wc::bench::DropCache(files);
    auto lease_a = Acquire(node_a);
    const wc::v1::EntryInfo ea = Entry(node_a);
    Node node_b =
        Start(a.dir, "b", tb, {{"127.0.0.1", static_cast<uint16_t>(node_a.daemon->peer_port())}},
              backend->get());
    auto lease_b = Acquire(node_b);
    const wc::v1::EntryInfo eb = Entry(node_b);
    if (eb.source() != "peer_fill" || eb.bytes_read() != 0) {
      Die(absl::StrFormat("B was filled from %s reading %d bytes, not from its peer", eb.source(),
                          eb.bytes_read()));
    }
    const bool same = SameBytes(*lease_a, *lease_b, kind);
    const double gb = static_cast<double>(ea.bytes()) / 1e9;
    std::printf(
        "| %s | %.2f GB, %u segments | %.3f s (%s) | %.2f | %.3f s | %.2f | %llu B | %s |\n",
        wc::memory::BackendName(kind), gb, ea.segments(), ea.load_seconds(), cold.c_str(),
        gb / ea.load_seconds(), eb.load_seconds(), gb / eb.load_seconds(),
        static_cast<unsigned long long>(eb.bytes_read()), same ? "yes" : "NO");
    std::fflush(stdout);
    if (!same) return 1;
    lease_b.reset();
    lease_a.reset();
    node_b = {};
    node_a = {};
  }
  std::filesystem::remove_all(a.dir);
  return 0;
}
