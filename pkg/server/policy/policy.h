// Authorization in one place: every RPC asks Policy::Decide(caller, verb, object) and gets
// allow or deny with the rule that decided and a reason to show the caller. The rules, as a
// table (roles first, then the object's own rule):
//
//   verb      needs                         then
//   acquire   -                             the model's namespace rule (map rule); a
//                                           private copy (isolation: namespace): only its
//                                           namespace's pods, and admins
//   load      -                             map rule (an inline spec is `define`); a
//                                           placement the spec does not declare: admin
//   status    -                             map rule per model shown (admins see all)
//   define    admin                         -
//   evict     admin                         -
//   verify    admin                         - (a resident check spends device bandwidth)
//   release   the lease's owner, or admin   the owner is the tenant unit that acquired it:
//                                           its pod (slot with namespace rules), outside
//                                           Kubernetes its process; never 'the same uid'
//   publish   publisher                     the spec's `publishers:` when it names any
//                                           (admins excepted), then the map rule of the
//                                           base model; native code (an artifact the
//                                           engine dlopens): the spec's
//                                           `native_publishers:` (empty: admins only)
//
// Roles are granted, never implied (issue 25: every root engine was admin and publisher):
//   - admin socket (--admin_socket_dir, a directory no engine pod mounts): admin and
//     publisher; reaching it is the credential (the directory is 0700, the daemon's).
//   - engine socket (<socket_dir>/control.sock): admin only for --admin_uids/--admin_gids,
//     publisher only for --publish_uids/--publish_gids (or admin); nobody by default, the
//     daemon's own uid and root included.
//   - slot sockets (namespace rules, one pod each): never admin; publisher when the pod on the
//     slot is in --publish_namespaces (uids say nothing there: pods of every tenant run as
//     root).
//
// Thread-safety: Decide may be called from any thread (the namespace rules lock their own
// cache). Lifetimes: `rules` (may be null: namespace rules off) outlives the policy.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pkg/kube/pod_resources.h"
#include "pkg/server/wire/caller.h"

namespace weightcache::server {

class NamespaceRules;

struct PolicyOptions {
  std::vector<uid_t> admin_uids;  // admins on the engine socket (never on slot sockets)
  std::vector<gid_t> admin_gids;
  std::vector<uid_t> publish_uids;  // publishers on the engine socket
  std::vector<gid_t> publish_gids;
  // Namespace rules on: pods of these namespaces may publish through their slot socket.
  std::vector<std::string> publish_namespaces;
  // For messages: where the admin socket is ("" when there is none).
  std::string admin_socket;
};

enum class Verb { kAcquire, kLoad, kStatus, kDefine, kEvict, kRelease, kPublish, kVerify };
// "acquire" | "load" | ...
const char* VerbName(Verb verb);

// What the verb acts on; only the fields the verb's row of the table reads are needed.
struct Object {
  std::string model;  // acquire, load, status, publish
  // The model's spec's allowed_namespaces (empty: open to all); nullopt: the model is not
  // known (its lookup fails later with NOT_FOUND, which says more than a refusal).
  std::optional<std::vector<std::string>> allowed_namespaces;
  // release: the tenant unit that acquired the lease (tenant::Unit::Key; "" for a lease
  // recorded without one: only admins may release it) and the slot it was acquired on.
  std::optional<std::string> owner_unit;
  std::string owner_slot;
  std::string lease;  // for messages
  // publish: the model's spec's `publishers:` (namespace names, "uid:<n>"); empty: any
  // publisher.
  std::vector<std::string> publishers;
  // publish: native code (artifact::IsNativeCode): the spec's `native_publishers:` decide
  // in place of `publishers:`, and an empty list admits admins only.
  bool native = false;
  std::vector<std::string> native_publishers;
  // A private copy's namespace (spec isolation: namespace) when the verb acts on one entry:
  // only pods of that namespace (and admins) may map or see it.
  std::string tenant;
  // load: why the asked placement (layout, device, environment) is not one the model's
  // spec declares, as Admission::UndeclaredPlacement says; empty: declared. Issue 25: any
  // engine loaded any layout on any GPU, each a new entry, until the GPUs were full.
  std::string undeclared_placement;
};

struct Decision {
  bool allowed = false;
  std::string rule;    // the rule that decided: "admin", "publish", "namespace", "lease_owner"
  std::string reason;  // for the caller, naming the rule and what would satisfy it
  static Decision Allow() { return {true, "", ""}; }
};

class Policy {
 public:
  Policy(PolicyOptions options, NamespaceRules* rules);

  Decision Decide(const Caller& caller, Verb verb, const Object& object) const;

  bool IsAdmin(const Caller& caller) const;
  // May publish: admin, or granted on this kind of socket (see the table above). On a slot
  // socket this asks who holds the slot (PodResources): `why` says what was found.
  bool IsPublisher(const Caller& caller, std::string* why) const;
  // The namespace whose private copy of `model` (isolation: namespace) this caller gets: the
  // namespace of the pod on its slot. FAILED_PRECONDITION on any other socket (nothing there
  // names a namespace), PERMISSION_DENIED when the pod cannot be identified (fail closed).
  absl::StatusOr<std::string> TenantOf(const Caller& caller, const std::string& model) const;

 private:
  Decision MapRule(const Caller& caller, const Object& object) const;
  // The spec's `publishers:` for a non-admin publisher: its pod's namespace (slot socket) or
  // "uid:<uid>" (engine socket) must be listed.
  Decision PublishersRule(const Caller& caller, const Object& object) const;
  std::string Who(const Caller& caller) const;
  // Whether the caller's connection names its pod: a pod socket (the kubelet named it), or a
  // slot socket with namespace rules (the kubelet's PodResources says who holds the slot).
  bool NamesPod(const Caller& caller) const;
  // That pod (NamesPod only); an error when the slot's holder cannot be told.
  absl::StatusOr<kube::PodRef> PodOfCaller(const Caller& caller) const;
  // "the pod on slot weightcache-3" / "pod team-a/engine-0", for messages.
  static std::string PodWhere(const Caller& caller);

  const PolicyOptions options_;
  NamespaceRules* const rules_;
};

}  // namespace weightcache::server
