#include "cmd/weightcachectl/commands.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "cmd/weightcachectl/pin.h"
#include "pkg/client/client.h"
#include "pkg/load/loader.h"
#include "pkg/load/model.h"
#include "pkg/load/plan.h"
#include "pkg/memory/backend.h"
#include "pkg/memory/mapping.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/safetensors/writer.h"
#include "pkg/spec/spec.h"
#include "pkg/util/size_flag.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::ctl {
namespace {

// The code of the last error printed (the caller adds which socket refused).
absl::StatusCode last_error_code = absl::StatusCode::kOk;

int Error(const absl::Status& s) {
  last_error_code = s.code();
  std::fprintf(stderr, "weightcachectl: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
               std::string(s.message()).c_str());
  return 2;
}

std::string Layout(const v1::Layout& l) {
  return absl::StrFormat("tp %d/%d pp %d/%d", l.tp_rank(), std::max(1u, l.tp_size()), l.pp_rank(),
                         std::max(1u, l.pp_size()));
}

// How an entry was filled, when not from disk.
const char* SourceNote(const std::string& source) {
  if (source == "peer") return " (peer copy)";
  if (source == "keeper") return " (from the keeper)";
  if (source == "publish") return " (published)";
  return "";
}

// "-" for an empty field, for the table.
const char* Or(const std::string& v) { return v.empty() ? "-" : v.c_str(); }

// When a publisher committed what it put, in UTC.
std::string PublishedAt(const v1::PublisherInfo& p) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ",
                          absl::FromUnixSeconds(static_cast<int64_t>(p.published_unix_seconds())),
                          absl::UTCTimeZone());
}

// Compile artifacts (issue 29): what they are for, who put them, where they are kept.
void PrintArtifacts(const v1::StatusResponse& st) {
  if (st.artifacts().empty()) return;
  const auto& u = st.artifact_usage();
  std::printf("\nartifacts: %s of %s in memory%s%s\n", FormatBytes(u.resident_bytes()).c_str(),
              FormatBytes(u.budget_bytes()).c_str(), u.dir().empty() ? "" : ", kept in ",
              u.dir().c_str());
  std::printf("%-16s %-16s %-20s %10s %-9s %s\n", "ID", "KIND", "MODEL", "BYTES", "WHERE",
              "PUT BY");
  for (const auto& a : st.artifacts()) {
    const auto& p = a.publisher();
    std::printf("%-16s %-16s %-20s %10s %-9s pid %d uid %d, %s\n", a.id().substr(0, 16).c_str(),
                a.key().kind().c_str(), a.key().model().c_str(), FormatBytes(a.bytes()).c_str(),
                a.resident() ? (a.on_disk() ? "mem+disk" : "memory") : "disk", p.pid(), p.uid(),
                PublishedAt(p).c_str());
    const auto& k = a.key();
    std::printf(
        "  for fingerprint %s, torch %s, triton %s, cuda %s, sm %s, engine %s %s, settings "
        "%s%s%s\n",
        k.fingerprint().substr(0, 12).c_str(), Or(k.torch_version()), Or(k.triton_version()),
        Or(k.cuda_version()), Or(k.compute_capability()), Or(k.engine()),
        k.engine_version().c_str(), Or(k.settings_hash()), a.tenant().empty() ? "" : ", namespace ",
        a.tenant().c_str());
  }
}

// One cache entry's row of the status table, and the lines under it that only some entries
// have (publisher, namespace, other names, error, leases).
void PrintEntry(const v1::EntryInfo& e) {
  std::string bytes =
      e.state() == "loading"
          ? absl::StrFormat("%.0f%%", e.bytes_done() * 100.0 / std::max<uint64_t>(1, e.bytes()))
          : FormatBytes(e.bytes());
  std::printf("%-20s %-8s %-15s %11s %12s %8u %5u %6u %-12s %s%s\n", e.model().c_str(),
              e.state().c_str(), Layout(e.layout()).c_str(), bytes.c_str(),
              FormatBytes(e.tensor_bytes()).c_str(), e.tensors(), e.segments(), e.lease_count(),
              e.fingerprint().substr(0, 12).c_str(), e.device_uuid().c_str(),
              SourceNote(e.source()));
  if (e.has_publisher()) {
    const auto& p = e.publisher();
    std::printf("  published by %s %s (%s), recipe %s, pid %d uid %d, %s\n", p.engine().c_str(),
                p.engine_version().c_str(), p.framework_version().c_str(), p.recipe().c_str(),
                p.pid(), p.uid(), PublishedAt(p).c_str());
  }
  if (!e.tenant().empty()) {
    std::printf("  private copy of namespace %s (isolation: namespace)\n", e.tenant().c_str());
  }
  if (e.names_size() > 1) {
    std::string names;
    for (const auto& n : e.names()) absl::StrAppend(&names, names.empty() ? "" : ", ", n);
    std::printf("  names: %s\n", names.c_str());
  }
  if (!e.error().empty()) {
    std::printf("  %s: %s\n", e.state() == "stale" ? "changed on disk" : "error",
                e.error().c_str());
  }
  for (const auto& l : e.leases()) {
    const std::string pod = l.owner_pod().empty() ? "" : " (" + l.owner_pod() + ")";
    std::printf("  lease %s pid %d uid %d age %.1fs %s%s\n", l.lease_id().substr(0, 12).c_str(),
                l.pid(), l.uid(), l.age_seconds(), l.owner().c_str(), pod.c_str());
  }
  // Leases of other pods are shown only as a count (docs/security.md, "A tenant is a pod").
  if (e.lease_count() > static_cast<uint32_t>(e.leases_size())) {
    std::printf("  %u more lease(s) of other pods\n",
                e.lease_count() - static_cast<uint32_t>(e.leases_size()));
  }
}

// Per-device residency: which GPU holds how much of the cache; then the pinned staging memory.
void PrintDevices(const v1::StatusResponse& st) {
  std::printf("\n%-44s %-14s %7s %11s %11s %11s\n", "DEVICE", "NAME", "ENTRIES", "CACHE", "FREE",
              "TOTAL");
  for (const auto& d : st.devices()) {
    std::printf("%-44s %-14s %7u %11s %11s %11s\n", d.device_uuid().c_str(), d.name().c_str(),
                d.entries(), FormatBytes(d.cache_bytes()).c_str(),
                FormatBytes(d.free_bytes()).c_str(), FormatBytes(d.total_bytes()).c_str());
  }
  if (st.has_staging()) {
    std::printf("staging (pinned host memory): %s idle, %s in use\n",
                FormatBytes(st.staging().idle_bytes()).c_str(),
                FormatBytes(st.staging().in_use_bytes()).c_str());
  }
}

// The daemon's counters since start: known models, Acquire outcomes, bytes hashed.
void PrintCounters(const v1::StatusResponse& st) {
  std::printf("known models: ");
  for (int i = 0; i < st.known_models_size(); ++i) {
    std::printf("%s%s", i ? ", " : "", st.known_models(i).c_str());
  }
  std::printf(
      "\nacquire: %lu hit, %lu peer copy, %lu miss, %lu mismatch, %lu stale, %lu rejected, "
      "%lu denied, %lu error\n",
      static_cast<unsigned long>(st.acquire_hits()),
      static_cast<unsigned long>(st.acquire_peer_copies()),
      static_cast<unsigned long>(st.acquire_misses()),
      static_cast<unsigned long>(st.acquire_mismatches()),
      static_cast<unsigned long>(st.acquire_stale()),
      static_cast<unsigned long>(st.acquire_rejected()),
      static_cast<unsigned long>(st.acquire_denied()),
      static_cast<unsigned long>(st.acquire_errors()));
  std::printf("content digests: %s read to hash checkpoint files since start\n",
              FormatBytes(st.hashed_bytes()).c_str());
}

// The keeper (issue 16): whether a restarted daemon would find its entries there.
void PrintKeeper(const v1::StatusResponse& st) {
  if (!st.has_keeper()) {
    std::printf(
        "keeper: none (--keeper_socket=off): a restarted daemon loads its models from disk "
        "again\n");
    return;
  }
  const auto& k = st.keeper();
  std::printf("keeper %s: %s; %lu entries adopted at start, %lu dropped, %lu descriptors held\n",
              k.socket().c_str(), k.up() ? "connected" : "NOT connected",
              static_cast<unsigned long>(k.adopted_entries()),
              static_cast<unsigned long>(k.dropped_entries()),
              static_cast<unsigned long>(k.descriptors()));
  if (k.artifacts() > 0 || k.adopted_artifacts() > 0) {
    std::printf("  compile artifacts: %lu held by the keeper, %lu taken back at start\n",
                static_cast<unsigned long>(k.artifacts()),
                static_cast<unsigned long>(k.adopted_artifacts()));
  }
  if (k.pending_entries() > 0) {
    std::printf("  %lu entries not in step with the keeper yet (deposits or drops to do)\n",
                static_cast<unsigned long>(k.pending_entries()));
  }
  if (k.impostor_refusals() > 0) {
    std::printf("  IMPOSTOR refused %lu times (the keeper must run as uid %u): %s\n",
                static_cast<unsigned long>(k.impostor_refusals()), k.keeper_uid(),
                k.impostor().c_str());
  }
  if (!k.last_error().empty()) std::printf("  last keeper error: %s\n", k.last_error().c_str());
}

// Integrity findings (issue 48; shown to admins only): every corruption the daemon found,
// leased or not, and what it did about a clean copy.
void PrintFindings(const v1::StatusResponse& st) {
  if (st.integrity_findings().empty()) return;
  std::printf("\nintegrity findings (newest last):\n");
  for (const auto& f : st.integrity_findings()) {
    std::printf("  %.0fs ago %s %s rank %u on %s (was %s, %u lease holder(s) told): %s; %s\n",
                f.seconds_ago(), f.model().c_str(), f.fingerprint().substr(0, 12).c_str(),
                f.layout().tp_rank(), f.device_uuid().c_str(), f.was().c_str(), f.leases_told(),
                f.detail().c_str(), f.reload().c_str());
  }
}

int Status(client::Client& c) {
  auto st = c.Status();
  if (!st.ok()) return Error(st.status());
  std::printf("weightcached %s, backend %s, socket %s\n", st->version().c_str(),
              st->backend().c_str(), c.socket_path().c_str());
  // RESIDENT: memory the entry holds (segments, granule-rounded); TENSOR BYTES: the tensors'
  // own bytes, what verify compares.
  std::printf("%-20s %-8s %-15s %11s %12s %8s %5s %6s %-12s %s\n", "MODEL", "STATE", "LAYOUT",
              "RESIDENT", "TENSOR BYTES", "TENSORS", "SEGS", "LEASES", "FINGERPRINT", "DEVICE");
  for (const auto& e : st->entries()) PrintEntry(e);
  if (st->entries().empty()) std::printf("(no cache entries)\n");
  PrintArtifacts(*st);
  PrintDevices(*st);
  PrintCounters(*st);
  PrintKeeper(*st);
  PrintFindings(*st);
  return 0;
}

// The `digests:` block of a model the daemon has hashed (pin.h).
int Pin(client::Client& c, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return Error(absl::InvalidArgumentError("usage: weightcachectl pin MODEL"));
  }
  auto st = c.Status();
  if (!st.ok()) return Error(st.status());
  auto block = PinBlock(*st, args[0]);
  if (!block.ok()) return Error(block.status());
  std::fputs(block->c_str(), stdout);
  return 0;
}

// Known models: what each spec names and which of its ranks are cached.
int List(client::Client& c) {
  auto st = c.Status();
  if (!st.ok()) return Error(st.status());
  std::printf("%-20s %-5s %-5s %-10s %-7s %-14s %s\n", "MODEL", "TP", "PP", "QUANT", "LAYOUT",
              "CACHED RANKS", "MODEL DIR");
  for (const auto& m : st->models()) {
    std::string ranks;
    for (uint32_t r : m.cached_ranks()) absl::StrAppend(&ranks, ranks.empty() ? "" : ",", r);
    if (!m.refused().empty()) ranks = "refused";
    std::printf("%-20s %-5u %-5u %-10s %-7s %-14s %s\n", m.name().c_str(), m.tp_size(), m.pp_size(),
                m.quantization().c_str(), m.layout().c_str(), ranks.empty() ? "-" : ranks.c_str(),
                m.model_dir().c_str());
    if (!m.refused().empty()) std::printf("  refused: %s\n", m.refused().c_str());
    if (!m.allowed_namespaces().empty()) {
      std::printf("  namespaces: %s (only pods there may map it)\n",
                  absl::StrJoin(m.allowed_namespaces(), ", ").c_str());
    }
    if (m.isolation() == "namespace") {
      std::printf("  isolation: namespace (a private copy per namespace, none shared)\n");
    }
  }
  if (st->models().empty()) std::printf("(no known models)\n");
  return 0;
}

void PrintProgress(const v1::LoadProgress& p, bool tty) {
  double frac = p.bytes_total() ? static_cast<double>(p.bytes_done()) / p.bytes_total() : 0;
  // Under 10 ms (a model that was already cached) a rate would be noise.
  double rate = p.elapsed_seconds() >= 0.01 ? p.bytes_done() / p.elapsed_seconds() : 0;
  double eta = rate > 0 ? (p.bytes_total() - p.bytes_done()) / rate : 0;
  std::string line = absl::StrFormat("%5.1f%% %s / %s  %s  ETA %.0fs  %s", frac * 100,
                                     FormatBytes(p.bytes_done()), FormatBytes(p.bytes_total()),
                                     rate > 0 ? absl::StrFormat("%.2f GB/s", rate / 1e9) : "- GB/s",
                                     eta, p.current_file());
  if (tty) {
    constexpr int kWidth = 30;
    int fill = static_cast<int>(frac * kWidth);
    std::printf("\r[%s%s] %s\033[K", std::string(fill, '#').c_str(),
                std::string(kWidth - fill, '.').c_str(), line.c_str());
    std::fflush(stdout);
  } else {
    std::printf("%s\n", line.c_str());
  }
}

int Load(client::Client& c, const std::vector<std::string>& args, const Context& ctx) {
  std::string yaml;
  if (!ctx.spec_file.empty()) {
    std::ifstream in(ctx.spec_file);
    if (!in) return Error(absl::NotFoundError("cannot read spec file " + ctx.spec_file));
    std::stringstream ss;
    ss << in.rdbuf();
    yaml = ss.str();
  } else if (args.size() != 1) {
    return Error(absl::InvalidArgumentError("load: give one MODEL name or --spec=FILE"));
  }
  std::string model = args.empty() ? "" : args[0];
  v1::Layout one_rank;
  if (ctx.tp_rank >= 0) {
    one_rank.set_tp_size(static_cast<uint32_t>(ctx.tp_size));
    one_rank.set_tp_rank(static_cast<uint32_t>(ctx.tp_rank));
  }
  auto last = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  v1::LoadProgress final_p;
  bool printed = false;
  auto s = c.Load(
      model, yaml,
      [&](const v1::LoadProgress& p) {
        final_p = p;
        if (!printed) {
          std::string ranks;
          for (const auto& r : p.ranks()) {
            absl::StrAppend(&ranks, ranks.empty() ? "" : ",", r.layout().tp_rank());
          }
          std::printf("loading %s: tp rank%s %s of %u\n", p.model().c_str(),
                      p.ranks_size() == 1 ? "" : "s", ranks.c_str(),
                      p.ranks_size() ? std::max(1u, p.ranks(0).layout().tp_size()) : 1u);
          printed = true;
        }
        // A load that failed before reading anything has no progress to show.
        if (p.state() == "failed" && p.bytes_done() == 0) return;
        auto now = std::chrono::steady_clock::now();
        if (p.state() != "loading" || ctx.tty || now - last >= std::chrono::seconds(1)) {
          PrintProgress(p, ctx.tty);
          last = now;
        }
      },
      ctx.tp_rank >= 0 ? &one_rank : nullptr);
  if (ctx.tty && printed) std::printf("\n");
  if (!s.ok()) return Error(s);
  std::printf("ready: %s in %.2fs\n", FormatBytes(final_p.bytes_total()).c_str(),
              final_p.elapsed_seconds());
  for (const auto& r : final_p.ranks()) {
    std::printf("  %s on %s: fingerprint %s\n", Layout(r.layout()).c_str(), r.device_uuid().c_str(),
                r.fingerprint().c_str());
  }
  return 0;
}

int Evict(client::Client& c, const std::vector<std::string>& args, const Context& ctx) {
  if (ctx.fingerprint.empty() && args.size() != 1) {
    return Error(absl::InvalidArgumentError("evict: give one MODEL name or --fingerprint=FP"));
  }
  auto r = c.EvictDetailed(args.empty() ? "" : args[0], ctx.fingerprint);
  if (!r.ok()) return Error(r.status());
  std::printf("evicted %u entr%s", r->evicted(), r->evicted() == 1 ? "y" : "ies");
  if (r->draining() > 0) {
    std::printf(" (%u still mapped by clients: draining until their leases end)", r->draining());
  }
  std::printf("\n");
  if (r->other_names_size() > 0) {
    std::string names;
    for (const auto& n : r->other_names()) absl::StrAppend(&names, names.empty() ? "" : ", ", n);
    std::printf("also served as (these names lose them too): %s\n", names.c_str());
  }
  return 0;
}

// evict-artifacts MODEL | ID: every artifact of a model, or one by its id (art-...).
int EvictArtifacts(client::Client& c, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return Error(absl::InvalidArgumentError("evict-artifacts: give one MODEL name or artifact ID"));
  }
  const bool by_id = args[0].rfind("art-", 0) == 0;
  auto n = c.EvictArtifacts(by_id ? args[0] : "", by_id ? "" : args[0]);
  if (!n.ok()) return Error(n.status());
  std::printf("evicted %u artifact%s\n", *n, *n == 1 ? "" : "s");
  return 0;
}

// verify --resident: one line per entry; exit 1 when any is corrupt or could not be checked.
int VerifyResident(client::Client& c, const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return Error(absl::InvalidArgumentError("verify --resident: give one MODEL name"));
  }
  auto r = c.VerifyResident(args[0]);
  if (!r.ok()) return Error(r.status());
  int bad = 0;
  for (const auto& e : r->entries()) {
    std::printf("%-7s %s tp %u/%u on %s: %u segments, %s in %.3f s%s%s\n", e.result().c_str(),
                args[0].c_str(), e.layout().tp_rank(), e.layout().tp_size(),
                e.device_uuid().c_str(), e.segments(), FormatBytes(e.bytes()).c_str(), e.seconds(),
                e.detail().empty() ? "" : ": ", e.detail().c_str());
    if (e.result() != "clean") ++bad;
  }
  if (bad > 0) {
    std::printf("verify --resident FAILED: %d of %d entries not clean%s\n", bad, r->entries_size(),
                " (a corrupt entry is out of service; a clean copy is loading)");
    return 1;
  }
  std::printf("verify --resident OK: %d entries match their digests\n", r->entries_size());
  return 0;
}

// What verify maps: the entry named by --fingerprint or by the one MODEL argument, waited for
// until ready.
absl::StatusOr<client::AcquireOptions> VerifyAcquireOptions(const std::vector<std::string>& args,
                                                            const Context& ctx) {
  client::AcquireOptions o;
  if (!ctx.fingerprint.empty()) {
    o.fingerprint = ctx.fingerprint;
  } else if (args.size() == 1) {
    o.model = args[0];
  } else {
    return absl::InvalidArgumentError("verify: give one MODEL name or --fingerprint=FP");
  }
  o.tp_size = ctx.tp_size;
  o.tp_rank = std::max(0, ctx.tp_rank);
  o.wait_ready = true;
  o.load_on_miss = ctx.load_on_miss;
  return o;
}

// What verify compares the mapping with. The opened model and the host backend outlive the
// loaded copy (members are destroyed in reverse order), as they did as locals of one function.
struct LocalCopy {
  std::string model_dir;
  std::shared_ptr<const load::OpenedModel> model;
  std::unique_ptr<memory::Backend> host;
  std::unique_ptr<load::LoadedModel> loaded;
};

// What the daemon should serve: the same spec and rank loaded here, from the same files,
// by the same loader (tensor-parallel pieces, fused views, online quantization), into
// host memory. Every mapped tensor must equal its counterpart byte for byte.
absl::StatusOr<LocalCopy> LoadLocalCopy(const client::Lease& l, const Context& ctx) {
  if (l.spec_yaml().empty()) {
    return absl::FailedPreconditionError(
        "verify: the daemon sent no spec with the lease (a daemon older than this CLI?)");
  }
  auto specs = spec::ParseSpecs(l.spec_yaml(), "the daemon's spec of '" + l.model() + "'");
  if (!specs.ok()) return specs.status();
  spec::ModelSpec sp = specs->at(0);
  if (!ctx.model_dir.empty()) sp.model_dir = ctx.model_dir;
  LocalCopy copy;
  copy.model_dir = sp.model_dir;
  load::OpenOptions oo;
  oo.content_digests = false;  // every byte is compared below: no identity needed
  auto opened = load::OpenModel(sp, oo);
  if (!opened.ok()) return opened.status();
  copy.model = *std::move(opened);
  load::PlanOptions popts;
  popts.loader_reads_pieces = true;
  auto plan =
      load::PlanRank(*copy.model, {l.tp_size(), l.tp_rank(), l.pp_size(), l.pp_rank()}, popts);
  if (!plan.ok()) return plan.status();
  copy.host = memory::MakeHostBackend();
  auto local =
      load::LoadRank(*copy.model, *plan, *copy.host, "", "weightcachectl-verify", {}, nullptr);
  if (!local.ok()) return local.status();
  copy.loaded = *std::move(local);
  return copy;
}

// Tallies of comparing a mapping with its local copy; `bad` counts tensors unexpected,
// missing or different (the first ten are printed).
struct Comparison {
  size_t bad = 0, checked = 0;
  uint64_t bytes = 0;
};

// Compares every mapped tensor with the local copy's, byte for byte. An error only when a
// tensor could not be read at all.
absl::StatusOr<Comparison> CompareTensors(const client::Lease& l, const load::LoadedModel& local) {
  const auto kind =
      l.backend() == "cuda-vmm" ? memory::BackendKind::kCudaVmm : memory::BackendKind::kHost;
  std::map<std::string, const load::PlannedTensor*> want;
  for (const auto* list : {&local.plan.tensors, &local.plan.views}) {
    for (const auto& t : *list) want[t.name] = &t;
  }
  Comparison r;
  std::vector<uint8_t> expected, mapped;
  for (const auto& v : l.tensors()) {
    auto it = want.find(v.name);
    if (it == want.end()) {
      if (r.bad++ < 10) std::printf("UNEXPECTED %s (not in the local plan)\n", v.name.c_str());
      continue;
    }
    const load::PlannedTensor& t = *it->second;
    want.erase(it);
    if (v.dtype != t.dtype || v.shape != t.shape || v.nbytes != t.nbytes) {
      if (r.bad++ < 10) std::printf("DIFFERENT %s (dtype/shape)\n", v.name.c_str());
      continue;
    }
    expected.resize(t.nbytes);
    int fd = local.segments[t.segment]->fd();
    if (::pread(fd, expected.data(), t.nbytes, static_cast<off_t>(t.offset)) !=
        static_cast<ssize_t>(t.nbytes)) {
      return absl::InternalError("verify: reading the local copy of " + t.name);
    }
    // Device memory (cuda-vmm) is copied to the host first; host mappings are read in place.
    const void* have = v.data;
    if (kind == memory::BackendKind::kCudaVmm) {
      mapped.resize(t.nbytes);
      if (auto s = memory::CopyToHost(kind, l.device_uuid(), v.data, t.nbytes, mapped.data());
          !s.ok()) {
        return s;
      }
      have = mapped.data();
    }
    if (std::memcmp(have, expected.data(), t.nbytes) != 0) {
      if (r.bad++ < 10) std::printf("DIFFERENT %s\n", v.name.c_str());
      continue;
    }
    r.checked++;
    r.bytes += t.nbytes;
  }
  for (const auto& [name, t] : want) {
    if (r.bad++ < 10) std::printf("MISSING %s\n", name.c_str());
  }
  return r;
}

int Verify(client::Client& c, const std::vector<std::string>& args, const Context& ctx) {
  if (ctx.resident) return VerifyResident(c, args);
  auto o = VerifyAcquireOptions(args, ctx);
  if (!o.ok()) return Error(o.status());
  auto lease = c.Acquire(*o);
  if (!lease.ok()) return Error(lease.status());
  const auto& l = **lease;
  std::printf("mapped %s: %zu tensors, %s in %zu segments, fingerprint %s, map time %.3f ms\n",
              l.model().c_str(), l.tensors().size(), FormatBytes(l.total_bytes()).c_str(),
              l.segment_count(), l.fingerprint().c_str(), l.map_seconds() * 1e3);
  auto local = LoadLocalCopy(l, ctx);
  if (!local.ok()) return Error(local.status());
  auto r = CompareTensors(l, *local->loaded);
  if (!r.ok()) return Error(r.status());
  if (r->bad != 0) {
    std::printf("verify FAILED: %zu difference(s) against %s\n", r->bad, local->model_dir.c_str());
    return 1;
  }
  std::printf("verify OK: %zu tensors, %s identical to tp %d/%d of %s\n", r->checked,
              FormatBytes(r->bytes).c_str(), l.tp_rank(), l.tp_size(), local->model_dir.c_str());
  return 0;
}

}  // namespace

int DemoCheckpoint(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return Error(absl::InvalidArgumentError("demo-checkpoint: give the output DIR"));
  }
  safetensors::LlamaShape shape;  // ~40 MB of seeded bf16 with real Llama tensor names
  if (auto s = safetensors::WriteLlamaCheckpoint(args[0], shape); !s.ok()) return Error(s);
  std::printf("wrote a Llama-shaped bf16 checkpoint (%d layers, hidden %d) to %s\n", shape.layers,
              shape.hidden, args[0].c_str());
  return 0;
}

namespace {

int RunCommand(const std::string& command, const std::vector<std::string>& args, const Context& ctx,
               client::Client& client) {
  auto* c = &client;
  if (command == "status") return Status(*c);
  if (command == "list") return List(*c);
  if (command == "load") return Load(*c, args, ctx);
  if (command == "evict") return Evict(*c, args, ctx);
  if (command == "verify") return Verify(*c, args, ctx);
  if (command == "evict-artifacts") return EvictArtifacts(*c, args);
  if (command == "pin") return Pin(*c, args);
  return Error(absl::InvalidArgumentError(
      absl::StrCat("unknown command '", command,
                   "' (status, list, load, evict, evict-artifacts, verify, pin)")));
}

}  // namespace

int Run(const std::string& command, const std::vector<std::string>& args, const Context& ctx) {
  if (command == "demo-checkpoint") return DemoCheckpoint(args);
  // No socket named (neither --socket nor $WEIGHTCACHE_SOCKET, which engine pods get): the
  // admin socket when this machine has one (the host, or the daemon's pod), else the engine
  // socket, where admin operations are refused unless --admin_uids grants them.
  std::string socket = ctx.socket;
  if (socket.empty() && std::getenv(client::kSocketEnv) == nullptr &&
      ::access(client::kDefaultAdminSocket, F_OK) == 0) {
    socket = client::kDefaultAdminSocket;
  }
  auto c = client::Client::Connect(socket);
  if (!c.ok()) return Error(c.status());
  const int rc = RunCommand(command, args, ctx, **c);
  if (rc != 0 && last_error_code == absl::StatusCode::kPermissionDenied) {
    std::fprintf(stderr, "weightcachectl: refused on %s\n", (*c)->socket_path().c_str());
  }
  return rc;
}

}  // namespace weightcache::ctl
