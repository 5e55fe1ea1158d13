// The daemon's side of compile artifacts (issue 29): the service behind the artifact RPCs
// (who may put, get or evict, asked of ArtifactRules, which the core implements over Access
// and the catalog; the metrics), the one-time tokens that hand a
// stored artifact's sealed memfd out on the handle channel, and the wire conversions. The
// store itself (budget, LRU, single flight, the directory) is pkg/artifact. Beside PutWatch,
// which bounds its puts in flight.
//
// Thread-safety: every method may be called from any thread (gRPC threads issue, the handle
// channel's thread claims and expires).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/artifact/store.h"
#include "pkg/metrics/metrics.h"
#include "pkg/net/keyed_limiter.h"
#include "pkg/server/policy/policy.h"
#include "pkg/server/publish/put_watch.h"
#include "pkg/server/wire/caller.h"
#include "pkg/server/wire/handle_channel.h"
#include "pkg/util/mutex.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

// What the artifact RPCs ask of the daemon (the core implements it: Access's rules and the
// catalog's specs). Called from gRPC threads; must be safe from any thread.
class ArtifactRules {
 public:
  virtual ~ArtifactRules() = default;
  // Whether `model` is a model this daemon knows (artifacts belong to a known model).
  virtual bool Known(const std::string& model) const = 0;
  // The rule of a put (the publish role, the model's map rule and its spec's `publishers:`;
  // `native` code: its `native_publishers:`, admins only when empty), a get (the model's map
  // rule) and an evict (admin's); PERMISSION_DENIED naming the rule.
  virtual absl::Status MayPut(const Caller& caller, const std::string& model,
                              bool native) const = 0;
  // The publish role alone, before any model is named (a put asks it before it takes a slot).
  virtual absl::Status MayPublish(const Caller& caller) const = 0;
  virtual absl::Status MayGet(const Caller& caller, const std::string& model) const = 0;
  virtual absl::Status MayEvict(const Caller& caller, const std::string& model) const = 0;
  // The pool `caller` puts into and looks in first for `model` (Access::ArtifactPool).
  virtual absl::StatusOr<std::string> Pool(const Caller& caller,
                                           const std::string& model) const = 0;
  // `model` when it is a defined model, "" otherwise (the bounded metric label).
  virtual std::string MetricModel(const std::string& model) const = 0;
  virtual bool IsAdmin(const Caller& caller) const = 0;
  // Whether native code of `model` (artifact::IsNativeCode) that `who` put into `pool` may
  // run in engines: put by an admin, or by a publisher the model's spec names for native
  // code now (`native_publishers:`: the pool's namespace, or uid:<n> for a put on the
  // engine socket). PERMISSION_DENIED saying who put it and the rule otherwise. Asked at
  // every get, so a package put before the rule (or before the spec changed) is not served.
  virtual absl::Status VouchesForNative(const std::string& model, const artifact::Publisher& who,
                                        const std::string& pool) const = 0;
};

class ArtifactGrants {
 public:
  explicit ArtifactGrants(std::chrono::seconds token_ttl) : token_ttl_(token_ttl) {}
  // A token for `a`'s descriptor, claimable once on the handle socket of `slot`.
  std::string Issue(std::shared_ptr<const artifact::Artifact> a, const std::string& slot);
  bool IsToken(const std::string& token) const;
  // PERMISSION_DENIED on another slot's socket (the token stays claimable where it belongs).
  absl::StatusOr<HandleChannel::Grant> Claim(const std::string& token, const std::string& slot);
  // A handle connection closed: true when it was an artifact's (nothing to end).
  static bool IsGrant(const std::string& lease_id);
  void ExpireTokens();

 private:
  struct Pending {
    std::shared_ptr<const artifact::Artifact> artifact;
    std::string slot;
    std::chrono::steady_clock::time_point expires;
  };
  const std::chrono::seconds token_ttl_;
  mutable Mutex mu_;
  std::map<std::string, Pending> tokens_ ABSL_GUARDED_BY(mu_);
};

// The artifact RPCs. Put needs the publish role, the model's map rule and its spec's
// `publishers:` (an artifact is code the engines of that model will run); get the model's
// map rule; evict is admin's. Each is counted in the metrics by result.
//
// Native code (artifact::IsNativeCode: an AOTInductor package, which engines dlopen): put
// only by admins and the publishers the spec names for it (`native_publishers:`; a granted
// publisher alone is not enough), and served only when VouchesForNative says its publisher
// still may; otherwise it is as absent (NOT_FOUND), and the engine builds its own.
//
// Pools (issue 47): artifacts are code, so who put one decides who runs it. With the
// namespace rules every key carries the putter's pool (Access::ArtifactPool: its pod's
// namespace, or "" for an admin), shared models included, and a pod gets its namespace's
// artifact or, failing that, an admin's; never another namespace's, whose publisher could
// otherwise plant code under the key this pod computes. Without the rules there is one pool
// (granted publishers are trusted by every engine).
//
// Puts in flight: each reserves its declared size in the store at its first message, at
// most a few per tenant unit and in all (PutWatch), and one that stalls is ended.
//
// Shares of the budget: a tenant unit's puts in flight reserve at most `reserve_per_unit`
// bytes together, and all tenant units' at most `reserve_tenants` (a KeyedLimiter keyed by
// tenant::Unit::Key()); the daemon sets the latter to the budget less one share, so one
// share of the budget is never held by the pods' puts. The admin's puts are exempt: they
// face only the store's budget (the admin is trusted, and may put artifacts larger than a
// pod's share), and the share the pods cannot hold is where they always fit. Before, one
// pod's two puts could reserve the whole budget for up to --artifact_put_total and every
// other put, the admin's included, was refused.
class ArtifactService {
 public:
  struct Options {
    std::string handle_socket;       // named in get answers on the shared socket
    std::string slot_handle_socket;  // on a slot socket: the slot's, as its engines see it
    std::string dir;                 // --artifact_dir, for Status ("" none)
    std::chrono::seconds token_ttl{10};
    PutWatch::Options puts;
    // Bytes of reservations one tenant unit's puts may hold at once, and all tenant units'
    // (kUnbounded: no shares, only the store's budget). Admin puts are not counted.
    uint64_t reserve_per_unit = net::KeyedLimiter::kUnbounded;  // --artifact_reserve_per_unit
    uint64_t reserve_tenants = net::KeyedLimiter::kUnbounded;
  };
  // `rules` and `metrics` (may be null) outlive the service.
  ArtifactService(Options options, std::unique_ptr<artifact::Store> store,
                  const ArtifactRules& rules, metrics::Metrics* metrics);
  ArtifactService(const ArtifactService&) = delete;
  ArtifactService& operator=(const ArtifactService&) = delete;

  // `read` yields the put's messages in order (false at the end of the stream); `cancel`
  // makes a pending `read` return false (the watchdog's, for a stalled put; not called
  // once Put returned). RESOURCE_EXHAUSTED at once when the caller's unit, or the daemon,
  // has the most puts in flight, or the declared size does not fit the budget beside the
  // reservations (or, a tenant's, its unit's share or the tenants' part); DEADLINE_EXCEEDED saying
  // why when the watchdog ended it.
  absl::Status Put(const Caller& caller, const std::function<bool(v1::PutArtifactRequest*)>& read,
                   v1::PutArtifactResponse* resp, const std::function<void()>& cancel);
  absl::Status Get(const Caller& caller, const v1::GetArtifactRequest& req,
                   v1::GetArtifactResponse* resp);
  absl::Status Evict(const Caller& caller, const v1::EvictArtifactsRequest& req,
                     v1::EvictArtifactsResponse* resp);
  // The artifacts `caller` may see (`filtered`: only models `visible` says, and private
  // copies of its own namespace), and the usage, into a Status answer.
  void AppendStatus(const Caller& caller, bool filtered,
                    const std::function<bool(const std::string&)>& visible,
                    v1::StatusResponse* resp) const;

  artifact::Store& store() { return *store_; }
  // Sets the resident-bytes gauge (e.g. after the keeper brought artifacts back).
  void ReportResident();
  ArtifactGrants& grants() { return grants_; }

 private:
  // The two RPCs without their metrics, and the metrics of one that ended.
  absl::Status Store(const Caller& caller, v1::PutArtifactRequest* first,
                     const std::function<bool(v1::PutArtifactRequest*)>& read,
                     v1::PutArtifactResponse* resp);
  absl::Status Serve(const Caller& caller, const v1::GetArtifactRequest& req,
                     v1::GetArtifactResponse* resp);
  void Count(const std::string& model, const char* op, const absl::Status& s, uint64_t bytes);
  // A tenant's put of `size` bytes takes them from its unit's share (held until the put
  // ends); an admin's takes nothing (an empty Slot). RESOURCE_EXHAUSTED naming the flag.
  absl::StatusOr<net::KeyedLimiter::Slot> TakeShare(const Caller& caller, uint64_t size);
  // The store's key for a wire key in `caller`'s pool, once `caller` passed `verb`'s rule
  // for its model (kPublish: a put's; kAcquire: a get's). NOT_FOUND for a model the daemon
  // does not know.
  absl::StatusOr<artifact::Key> KeyFor(const Caller& caller, const v1::ArtifactKey& key,
                                       Verb verb) const;
  // `got` unless it is native code that no rule vouches for (VouchesForNative): then
  // NOT_FOUND saying why, logged (the engine builds its own).
  absl::StatusOr<std::shared_ptr<const artifact::Artifact>> Vouched(
      absl::StatusOr<std::shared_ptr<const artifact::Artifact>> got, const Caller& caller) const;
  // A get's artifact: the caller's pool's, else (namespace rules on) an admin's.
  absl::StatusOr<std::shared_ptr<const artifact::Artifact>> Lookup(
      const Caller& caller, artifact::Key key, const v1::GetArtifactRequest& req);

  const Options options_;
  const std::unique_ptr<artifact::Store> store_;
  const ArtifactRules& rules_;
  metrics::Metrics* const metrics_;
  ArtifactGrants grants_;
  net::KeyedLimiter shares_;  // the tenant units' reservations (bytes)
  PutWatch puts_;
};

// Wire conversions.
artifact::Key KeyFromWire(const v1::ArtifactKey& k, const std::string& tenant);
void InfoToWire(const artifact::ArtifactInfo& i, v1::ArtifactInfo* out);

}  // namespace weightcache::server
