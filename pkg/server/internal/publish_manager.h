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
// Acquires map it read-only like a loaded entry. Not a public header.
//
// Thread-safety: every method may be called from any thread (gRPC threads begin, commit and
// abort; the handle channel's thread claims, closes and expires). Lifetimes: the options,
// backend, registry, admission and catalog outlive the PublishManager; destroy it before the
// registry (entries still publishing then fail as cancelled).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "pkg/cache/registry.h"
#include "pkg/load/plan.h"
#include "pkg/memory/backend.h"
#include "pkg/server/internal/admission.h"
#include "pkg/server/internal/model_catalog.h"
#include "pkg/server/options.h"
#include "pkg/server/wire/caller.h"
#include "pkg/server/wire/handle_channel.h"
#include "pkg/util/mutex.h"
#include "pkg/util/unix_socket.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

// Packs a publisher's tensors (in name order) into segments of at most `max_segment_bytes`
// (a larger tensor gets one of its own), each at a multiple of `alignment`. INVALID_ARGUMENT
// naming the tensor for an empty list, an empty or repeated name, an unknown dtype, a
// negative dimension or nbytes that is not product(shape) x dtype size.
absl::StatusOr<load::Plan> PlanPublished(
    const google::protobuf::RepeatedPtrField<v1::PublishTensor>& tensors, uint64_t alignment,
    uint64_t max_segment_bytes);

class PublishManager {
 public:
  PublishManager(const DaemonOptions& options, memory::Backend* backend, cache::Registry& registry,
                 Admission& admission, ModelCatalog& models, std::string handle_socket);
  ~PublishManager();
  PublishManager(const PublishManager&) = delete;
  PublishManager& operator=(const PublishManager&) = delete;

  // The RPCs; the caller has passed the policy's publish rule (policy.h). `slot`: the socket the
  // call came in on (empty: the shared one). Commit and abort only by the uid that began, on the
  // socket it began on; the token is claimable only on the handle socket beside that one.
  // `tenant`: the publisher's namespace when the base model keeps private copies (isolation:
  // namespace; the published entry is that namespace's), else empty.
  absl::Status Begin(const PeerCred& caller, const std::string& slot, const std::string& tenant,
                     const v1::BeginPublishRequest& req, v1::BeginPublishResponse* resp);
  // Its wait for the entry to turn ready ends when the caller is gone or at its deadline.
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

  const DaemonOptions& options_;
  memory::Backend* const backend_;
  cache::Registry& registry_;
  Admission& admission_;
  ModelCatalog& models_;
  const std::string handle_socket_;

  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);  // by id
  std::map<std::string, std::string> tokens_ ABSL_GUARDED_BY(mu_);  // token -> id, unclaimed
  std::map<cache::Key, v1::PublisherInfo> published_ ABSL_GUARDED_BY(mu_);
};

}  // namespace weightcache::server
