#include "pkg/server/policy/policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/server/policy/namespace_rules.h"

namespace weightcache::server {
namespace {

template <typename T>
bool Has(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

Decision Deny(std::string rule, std::string reason) {
  return {false, std::move(rule), std::move(reason)};
}

}  // namespace

const char* SocketKindName(SocketKind kind) {
  switch (kind) {
    case SocketKind::kEngine:
      return "engine socket";
    case SocketKind::kSlot:
      return "slot socket";
    case SocketKind::kPod:
      return "pod socket";
    case SocketKind::kAdmin:
      return "admin socket";
  }
  return "socket";
}

const char* VerbName(Verb verb) {
  switch (verb) {
    case Verb::kAcquire:
      return "acquire";
    case Verb::kLoad:
      return "load";
    case Verb::kStatus:
      return "status";
    case Verb::kDefine:
      return "define";
    case Verb::kEvict:
      return "evict";
    case Verb::kRelease:
      return "release";
    case Verb::kPublish:
      return "publish";
    case Verb::kVerify:
      return "verify";
  }
  return "call";
}

Policy::Policy(PolicyOptions options, NamespaceRules* rules)
    : options_(std::move(options)), rules_(rules) {}

bool Policy::IsAdmin(const Caller& c) const {
  switch (c.socket) {
    case SocketKind::kAdmin:
      return true;
    case SocketKind::kEngine:
      return Has(options_.admin_uids, c.cred.uid) || Has(options_.admin_gids, c.cred.gid);
    case SocketKind::kSlot:
    case SocketKind::kPod:
      return false;
  }
  return false;
}

bool Policy::NamesPod(const Caller& c) const {
  return c.socket == SocketKind::kPod || (c.socket == SocketKind::kSlot && rules_ != nullptr);
}

absl::StatusOr<kube::PodRef> Policy::PodOfCaller(const Caller& c) const {
  if (c.socket == SocketKind::kPod) {
    return kube::PodRef{.ns = c.unit.pod_namespace, .name = c.unit.pod_name, .container = ""};
  }
  if (c.socket == SocketKind::kSlot && rules_ != nullptr) return rules_->PodOf(c.slot, c.accepted);
  return absl::FailedPreconditionError(absl::StrCat(Who(c), " names no pod"));
}

std::string Policy::PodWhere(const Caller& c) {
  if (c.socket == SocketKind::kPod) return c.unit.Describe();
  return absl::StrCat("the pod on slot ", c.slot);
}

bool Policy::IsPublisher(const Caller& c, std::string* why) const {
  if (IsAdmin(c)) return true;
  if (c.socket == SocketKind::kEngine) {
    return Has(options_.publish_uids, c.cred.uid) || Has(options_.publish_gids, c.cred.gid);
  }
  if (!NamesPod(c) || options_.publish_namespaces.empty()) return false;
  auto pod = PodOfCaller(c);
  if (!pod.ok()) {
    *why = absl::StrCat("; ", PodWhere(c),
                        " could not be identified (fail closed): ", pod.status().message());
    return false;
  }
  if (Has(options_.publish_namespaces, pod->ns)) return true;
  *why = absl::StrCat("; this pod (", pod->ns, "/", pod->name, ") is in '", pod->ns, "'");
  return false;
}

std::string Policy::Who(const Caller& c) const {
  std::string of;
  if (c.socket == SocketKind::kPod) {
    of = " of " + c.unit.Describe();
  } else if (!c.slot.empty()) {
    of = " of slot " + c.slot;
  }
  return absl::StrCat("uid ", c.cred.uid, " (gid ", c.cred.gid, ") on the ",
                      SocketKindName(c.socket), of);
}

absl::StatusOr<std::string> Policy::TenantOf(const Caller& c, const std::string& model) const {
  if (!NamesPod(c)) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", model,
                     "' keeps a private copy per Kubernetes namespace (isolation: "
                     "namespace) and ",
                     Who(c), " names none: ask from a pod through its slot socket"));
  }
  auto pod = PodOfCaller(c);
  if (!pod.ok()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "model '", model, "' keeps a private copy per namespace (isolation: namespace) and ",
        PodWhere(c), " could not be identified (fail closed): ", pod.status().message()));
  }
  return pod->ns;
}

Decision Policy::MapRule(const Caller& caller, const Object& object) const {
  if (!object.tenant.empty() && !IsAdmin(caller)) {
    // A private copy: its namespace's pods only (an open rule does not open it to others).
    auto ns = TenantOf(caller, object.model);
    if (!ns.ok()) return Deny("namespace", std::string(ns.status().message()));
    if (*ns != object.tenant) {
      return Deny("namespace",
                  absl::StrCat("this entry of model '", object.model,
                               "' is another namespace's private copy (isolation: namespace); "
                               "this pod is in '",
                               *ns, "'"));
    }
  }
  if (!object.allowed_namespaces) return Decision::Allow();
  if (caller.socket == SocketKind::kPod && !object.allowed_namespaces->empty()) {
    // The kubelet named the pod: its namespace is known without the slot's lookup.
    const auto& allowed = *object.allowed_namespaces;
    if (std::find(allowed.begin(), allowed.end(), caller.unit.pod_namespace) != allowed.end()) {
      return Decision::Allow();
    }
    return Deny("namespace",
                absl::StrCat("model '", object.model, "' may be mapped from namespaces [",
                             absl::StrJoin(allowed, ", "), "] only; ", caller.unit.Describe(),
                             " is in '", caller.unit.pod_namespace, "'"));
  }
  if (rules_ == nullptr) return Decision::Allow();
  absl::Status s = rules_->MayMap({caller.slot, caller.accepted, IsAdmin(caller)}, object.model,
                                  *object.allowed_namespaces);
  if (s.ok()) return Decision::Allow();
  return Deny("namespace", std::string(s.message()));
}

Decision Policy::PublishersRule(const Caller& caller, const Object& object) const {
  if (IsAdmin(caller)) return Decision::Allow();
  const std::vector<std::string>& named =
      object.native ? object.native_publishers : object.publishers;
  if (named.empty() && !object.native) return Decision::Allow();
  std::string me, why;
  if (NamesPod(caller)) {
    auto pod = PodOfCaller(caller);
    if (!pod.ok()) {
      why = absl::StrCat(PodWhere(caller),
                         " could not be identified (fail closed): ", pod.status().message());
    } else {
      me = pod->ns;
      why = absl::StrCat("this pod (", pod->ns, "/", pod->name, ") is in '", pod->ns, "'");
    }
  } else if (caller.socket == SocketKind::kEngine) {
    me = absl::StrCat("uid:", caller.cred.uid);
    why = absl::StrCat("this peer is ", me);
  } else {
    why = "nothing names this caller's namespace";
  }
  if (!me.empty() && Has(named, me)) return Decision::Allow();
  if (object.native) {
    return Deny("native_publishers",
                absl::StrCat(Who(caller), " may not publish native code (an artifact engines ",
                             "dlopen) for model '", object.model,
                             "': only admins and the publishers its spec names for it may "
                             "(native_publishers: [",
                             absl::StrJoin(named, ", "), "]) and ", why));
  }
  return Deny("publishers", absl::StrCat(Who(caller), " may not publish for model '", object.model,
                                         "': its spec names who may (publishers: [",
                                         absl::StrJoin(named, ", "), "]) and ", why));
}

Decision Policy::Decide(const Caller& caller, Verb verb, const Object& object) const {
  const std::string admin_hint =
      options_.admin_socket.empty()
          ? std::string(" (--admin_uids/--admin_gids)")
          : absl::StrCat(" (the admin socket ", options_.admin_socket,
                         ", or --admin_uids/--admin_gids on the engine socket)");
  switch (verb) {
    case Verb::kAcquire:
    case Verb::kStatus:
      return MapRule(caller, object);
    case Verb::kLoad: {
      Decision d = MapRule(caller, object);
      if (!d.allowed || object.undeclared_placement.empty() || IsAdmin(caller)) return d;
      return Deny("placement",
                  absl::StrCat(Who(caller), " may not load model '", object.model,
                               "' so: ", object.undeclared_placement,
                               "; engines load the layouts the spec declares, on this daemon's "
                               "devices at their own environment, and an admin",
                               admin_hint, " anything else"));
    }
    case Verb::kDefine:
    case Verb::kEvict:
    case Verb::kVerify:
      if (IsAdmin(caller)) return Decision::Allow();
      return Deny("admin",
                  absl::StrCat(Who(caller), " may not ",
                               verb == Verb::kEvict    ? "evict"
                               : verb == Verb::kVerify ? "verify resident weights"
                                                       : "define models (an inline spec)",
                               ": that needs an admin peer", admin_hint,
                               verb == Verb::kDefine ? "; load a known model by name" : ""));
    case Verb::kRelease: {
      if (IsAdmin(caller)) return Decision::Allow();
      const std::string lease = absl::StrCat("lease ", object.lease.substr(0, 12));
      // Issue 47: every engine pod runs as root, so "the same uid" let any pod end every
      // other pod's leases. The owner is the unit that acquired it; the reason does not name
      // another tenant's pod. A peer whose pid the daemon cannot see (no hostPID) cannot be
      // told from other such peers: it releases nothing (its handle connection still ends
      // its lease when closed).
      if (caller.unit.kind == tenant::UnitKind::kUnknown) {
        return Deny("lease_owner",
                    absl::StrCat(lease, ": this connection's pod could not be told (",
                                 caller.unit.Describe(),
                                 ": run the daemon with hostPID); close the lease's handle "
                                 "connection to end it, or ask an admin",
                                 admin_hint));
      }
      if (object.owner_unit && *object.owner_unit != caller.unit.Key()) {
        const std::string owner = object.owner_slot.empty()
                                      ? std::string("pod or process")
                                      : "slot's pod (" + SocketOfSlot(object.owner_slot) + ")";
        return Deny("lease_owner",
                    absl::StrCat(lease, " was acquired by another ", owner,
                                 " than this connection's (", caller.unit.Describe(),
                                 "); only the pod that acquired it (outside Kubernetes, the "
                                 "process) or an admin",
                                 admin_hint, " may release it"));
      }
      return Decision::Allow();
    }
    case Verb::kPublish: {
      std::string why;
      if (!IsPublisher(caller, &why)) {
        const std::string grant =
            caller.socket == SocketKind::kSlot || caller.socket == SocketKind::kPod
                ? std::string("its pod's namespace in --publish_namespaces")
                : std::string("a peer in --publish_uids/--publish_gids");
        return Deny("publish",
                    absl::StrCat(Who(caller), " may not publish weights: that needs ", grant,
                                 " or the admin socket (no peer publishes unless "
                                 "granted)",
                                 why));
      }
      if (Decision d = PublishersRule(caller, object); !d.allowed) return d;
      // Published weights are served under the base model's name: its rule guards who may
      // publish them too.
      return MapRule(caller, object);
    }
  }
  return Deny("unknown", absl::StrCat("unknown verb for ", Who(caller)));
}

}  // namespace weightcache::server
