// Every RPC's door: who calls (the control connection's peer, refused past its connection
// cap), whether the policy lets it (policy.h; a refusal is counted in the metrics and logged,
// naming the rule), and which namespace's copy of a model it maps. Owns the policy and the
// namespace rules; reads the catalog's specs (a model's allowed namespaces, its isolation).
// Not a public header.
//
// Thread-safety: every method may be called from any thread once made. Lifetimes: the
// catalog, the metrics and what `peer_of` reads outlive the Access.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/server/internal/model_catalog.h"
#include "pkg/server/options.h"
#include "pkg/server/policy/namespace_rules.h"
#include "pkg/server/policy/policy.h"
#include "pkg/server/wire/caller.h"
#include "pkg/spec/spec.h"

namespace weightcache::metrics {
class Metrics;
}  // namespace weightcache::metrics

namespace weightcache::server {

class Access {
 public:
  // The caller behind gRPC's peer string ("fd:N"): the control listener's answer; nullopt
  // for a connection it does not know.
  using PeerLookup = std::function<std::optional<Caller>(const std::string& grpc_peer)>;

  // `rules`: the namespace rules (null: off). `max_connections_per_pod`: the cap an over-cap
  // caller is told of.
  Access(PolicyOptions policy, std::unique_ptr<NamespaceRules> rules, const ModelCatalog& models,
         PeerLookup peer_of, size_t max_connections_per_pod, metrics::Metrics* metrics);
  // The daemon's: the policy and the namespace rules from its options (the rules' error when
  // they cannot be made).
  static absl::StatusOr<std::unique_ptr<Access>> FromOptions(const DaemonOptions& options,
                                                             const ModelCatalog& models,
                                                             PeerLookup peer_of);
  Access(const Access&) = delete;
  Access& operator=(const Access&) = delete;

  // Who calls. PERMISSION_DENIED for an unknown connection, RESOURCE_EXHAUSTED (counted) for
  // a uid over its connection cap. Every RPC starts here.
  absl::StatusOr<Caller> CallerOf(const std::string& grpc_peer) const;
  // The policy's decision, refused as PERMISSION_DENIED naming the rule (counted, logged).
  absl::Status Authorize(const Caller& caller, Verb verb, const Object& object) const;
  // The same decision, not counted as a refusal: for Acquire, whose result metric counts it.
  absl::Status Check(const Caller& caller, Verb verb, const Object& object) const;
  bool Allows(const Caller& caller, Verb verb, const Object& object) const;
  // The publish rule for `model` (empty: commit and abort, which the session's owner checks
  // bind), with the model's namespaces when it is known. `native`: native code (an artifact
  // engines dlopen): the spec's native_publishers decide (Policy's table).
  absl::Status AuthorizePublish(const Caller& caller, const std::string& model,
                                bool native = false) const;
  // PERMISSION_DENIED with `message`, counted under `rule` and logged.
  absl::Status Refuse(const std::string& rule, const std::string& message) const;
  bool IsAdmin(const Caller& c) const { return policy_.IsAdmin(c); }
  // Namespace rules on: callers see only what they may map (Status, artifacts).
  bool rules_on() const { return rules_ != nullptr; }

  // The object of a verb on model `name`: its spec's namespace list when known.
  Object ModelObject(const std::string& name) const;
  // The namespace whose private copy of model `name` (isolation: namespace) `caller` maps:
  // its pod's (Policy::TenantOf); "" for a shared model.
  absl::StatusOr<std::string> TenantFor(const Caller& caller, const std::string& name) const;
  // The pool of compile artifacts `caller` puts into and looks in first for model `name`
  // (issue 47: a shared model's artifacts were one pool, so one namespace's publisher could
  // plant code under the key another's engines compute). With the namespace rules: its pod's
  // namespace on a slot socket (PERMISSION_DENIED when the pod cannot be identified), "" for
  // an admin (the pool every pod may also read), "uid:<uid>" for a granted publisher on the
  // engine socket. Without them: "" (a private model's namespace, as TenantFor).
  absl::StatusOr<std::string> ArtifactPool(const Caller& caller, const std::string& name) const;
  // The copies a Load of `spec` fills: {""} for a shared model; for a private one, the
  // caller's namespace from a slot socket, every allowed namespace's from any other (an
  // admin's or a preload's, `caller` null; FAILED_PRECONDITION when the spec lists none).
  absl::StatusOr<std::vector<std::string>> TenantsToLoad(const Caller* caller,
                                                         const spec::ModelSpec& spec) const;
  // `name` when it is a defined model, "" otherwise: the metric label for a request naming
  // it (unknown names from any peer would fill the bounded label slots, issue 26).
  std::string MetricModel(const std::string& name) const;

 private:
  const std::unique_ptr<NamespaceRules> rules_;  // before policy_, which points at it
  const Policy policy_;
  const ModelCatalog& models_;
  const PeerLookup peer_of_;
  const size_t max_connections_per_pod_;
  metrics::Metrics* const metrics_;
};

// OK unless `spec` asks for private copies (isolation: namespace) without the namespace
// rules (`rules_enabled`), which alone say each caller's namespace.
absl::Status CheckIsolation(const spec::ModelSpec& spec, bool rules_enabled);

}  // namespace weightcache::server
