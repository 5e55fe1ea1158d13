// Publishing: an engine donates the weights it processed itself. BeginPublish reserves the
// budget and registers a `loading` entry under a fingerprint that includes the engine's
// identity and recipe (so concurrent publishers of one key are single-flight: the first
// publishes, the others are told to wait), allocates the segments and issues a token. The
// publisher presents the token on the handle channel and receives the WRITABLE segment
// descriptors (the only writable ones ever handed out; only to the uid that began). That
// connection is the publish: when it closes before the commit (exit, SIGKILL), or the token
// is not claimed in time, the publish is aborted: segments freed, no entry left.
// CommitPublish checks the tensor list against the begin (a difference aborts), seals the
// segments (host: F_SEAL_WRITE, which the kernel refuses while any writable mapping of the
// memfd remains: the publisher must have unmapped first) and the entry becomes ready; later
// Acquires map it read-only like a loaded entry. The publish library's interface to the core.
//
// Thread-safety: every method may be called from any thread (gRPC threads begin, commit and
// abort; the handle channel's thread claims, closes and expires). Lifetimes: the backend,
// registry, base (PublishBase) and metrics outlive the PublishManager; destroy it before the
// registry (entries still publishing then fail as cancelled).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/load/model.h"
#include "pkg/load/plan.h"
#include "pkg/memory/backend.h"
#include "pkg/server/wire/caller.h"
#include "pkg/server/wire/handle_channel.h"
#include "pkg/spec/spec.h"
#include "pkg/util/mutex.h"
#include "pkg/util/unix_socket.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::metrics {
class Metrics;
}  // namespace weightcache::metrics

namespace weightcache::server {

// Packs a publisher's tensors (in name order) into segments of at most `max_segment_bytes`
// (a larger tensor gets one of its own), each at a multiple of `alignment`. INVALID_ARGUMENT
// naming the tensor for an empty list, an empty or repeated name, an unknown dtype, a
// negative dimension or nbytes that is not product(shape) x dtype size.
absl::StatusOr<load::Plan> PlanPublished(
    const google::protobuf::RepeatedPtrField<v1::PublishTensor>& tensors, uint64_t alignment,
    uint64_t max_segment_bytes);

// What a publish asks of the daemon's models (the core implements it): where the request
// places the weights, and the base checkpoint opened.
class PublishBase {
 public:
  struct Placement {
    spec::Layout layout;
    spec::Environment env;    // the request's; the tenant is the publish's own
    std::string device_uuid;  // the asked device, else the placement rule's for the rank
  };
  virtual ~PublishBase() = default;
  // INVALID_ARGUMENT naming the field the request got wrong.
  virtual absl::StatusOr<Placement> Place(const v1::Layout& layout,
                                          const v1::Environment& env) const = 0;
  // The base checkpoint's spec, opened (`refresh`: its files identified as they are now).
  virtual absl::StatusOr<std::shared_ptr<const load::OpenedModel>> Open(const std::string& model,
                                                                        bool refresh) = 0;
};

class PublishManager {
 public:
  struct Options {
    std::chrono::seconds token_ttl{10};     // an unclaimed token aborts its publish after this
    std::chrono::seconds commit_wait{600};  // a commit's wait for the entry to turn ready
    metrics::Metrics* metrics = nullptr;    // optional
    // The door (the core's Access): the policy's publish rule for a model (empty: commit and
    // abort, which the session's owner check binds), and the namespace whose copy a model's
    // published weights are ("" for a shared model). Null: every caller passes, no namespace.
    std::function<absl::Status(const Caller&, const std::string& model)> authorize;
    std::function<absl::StatusOr<std::string>(const Caller&, const std::string& model)> tenant_of;
  };
  PublishManager(Options options, memory::Backend* backend, cache::Registry& registry,
                 PublishBase& base, std::string handle_socket);
  ~PublishManager();
  PublishManager(const PublishManager&) = delete;
  PublishManager& operator=(const PublishManager&) = delete;

  // The RPCs as the gRPC adapter calls them: the publish rule first (Options::authorize; a
  // refusal is PERMISSION_DENIED naming it), Begin's namespace from Options::tenant_of.
  absl::Status Begin(const Caller& caller, const v1::BeginPublishRequest& req,
                     v1::BeginPublishResponse* resp);
  absl::Status Abort(const Caller& caller, const v1::AbortPublishRequest& req);

  // The RPCs' work; the caller has passed the policy's publish rule (policy.h). `slot`: the socket
  // the call came in on (empty: the shared one). Commit and abort only by the uid that began, on
  // the socket it began on; the token is claimable only on the handle socket beside that one.
  // `tenant`: the publisher's namespace when the base model keeps private copies (isolation:
  // namespace; the published entry is that namespace's), else empty.
  absl::Status Begin(const PeerCred& caller, const std::string& slot, const std::string& tenant,
                     const v1::BeginPublishRequest& req, v1::BeginPublishResponse* resp);
  // Its wait for the entry to turn ready ends when the caller is gone or at its deadline.
  // Asks the publish rule first (Options::authorize).
  absl::Status Commit(const Caller& caller, const v1::CommitPublishRequest& req,
                      v1::CommitPublishResponse* resp);
  absl::Status Abort(const PeerCred& caller, const std::string& slot,
                     const v1::AbortPublishRequest& req);

  // Handle channel. Whether `token` is a publish token (else it is a lease's).
  bool IsToken(const std::string& token) const;
  // The writable descriptors of the token's publish, once, to the uid that began it, on the
  // handle socket of `slot` (another slot's: PERMISSION_DENIED, the token stays valid).
  absl::StatusOr<HandleChannel::Grant> Claim(const std::string& token, const PeerCred& peer,
                                             const std::string& slot);
  // A handle connection closed; true when it was a publish's (aborted unless committed).
  bool OnClose(const std::string& id);
  // Aborts the publishes whose tokens were not claimed in time.
  void ExpireTokens();

  // Who published the entry at `key` (source "publish", or adopted from the keeper with its
  // publisher); nullopt when unknown.
  std::optional<v1::PublisherInfo> PublisherOf(const cache::Key& key) const;
  // Remembers who published `key` (at a commit; at adoption, from the keeper's record).
  // Forgets the publishers of keys no longer in the registry.
  void RecordPublisher(const cache::Key& key, const v1::PublisherInfo& who);

 private:
  struct Session;
  struct Target;
  // Begin's steps.
  absl::StatusOr<Target> Resolve(const std::string& tenant, const v1::BeginPublishRequest& req);
  absl::StatusOr<std::vector<std::unique_ptr<memory::Segment>>> AllocateSegments(
      Session& s, const load::Plan& plan);
  void Issue(const std::shared_ptr<Session>& s,
             std::vector<std::unique_ptr<memory::Segment>> segments, load::Plan plan,
             const v1::BeginPublishRequest& req, v1::BeginPublishResponse* resp);
  // Ends `s` without serving it (its segments freed, its entry removed) and counts it.
  void AbortSession(const std::shared_ptr<Session>& s, const std::string& why,
                    const std::string& result);
  absl::StatusOr<std::shared_ptr<Session>> Owned(const PeerCred& caller, const std::string& slot,
                                                 const std::string& id);
  void Count(const std::string& model, const std::string& result);

  const Options options_;
  memory::Backend* const backend_;
  cache::Registry& registry_;
  PublishBase& base_;
  const std::string handle_socket_;

  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);  // by id
  std::map<std::string, std::string> tokens_ ABSL_GUARDED_BY(mu_);  // token -> id, unclaimed
  std::map<cache::Key, v1::PublisherInfo> published_ ABSL_GUARDED_BY(mu_);
};

}  // namespace weightcache::server
