// The mutation of the admission webhook: a pod annotated weightcache.io/model (or
// weightcache.io/fingerprint) gets, in each selected container, the extended resource
// weightcache.io/client: 1 (request and limit), or with MutateOptions::csi_volume the pod's
// own CSI volume mounted (see MutateOptions), and the env WEIGHTCACHE_MODEL /
// WEIGHTCACHE_FINGERPRINT from the annotation through the Downward API, so the annotation alone
// is enough for an engine pod.
//
// Rules (docs/kubernetes.md, "Admission webhook"):
//   - selected containers: all of spec.containers, or those named by the comma-separated
//     annotation weightcache.io/containers; init and ephemeral containers never;
//   - idempotent: what a container already has is kept (an env var of that name with any
//     value or source, a request or limit of the resource with any quantity); a pod that
//     carries everything already gets no patch;
//   - a name in weightcache.io/containers that the pod lacks is a warning (AdmissionReview
//     `warnings`), never a denial: the containers that do exist are still patched, and an
//     engine without the env loads from disk as it would without the webhook;
//   - a review that is not an AdmissionReview v1 with a request, a uid and an object is an
//     error (InvalidArgument naming the field); a request for another kind than Pod is
//     allowed unchanged with a warning (the webhook configuration selects pods only).
//
// Pure functions of their input: callable from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace weightcache::webhook {

inline constexpr char kModelAnnotation[] = "weightcache.io/model";
inline constexpr char kFingerprintAnnotation[] = "weightcache.io/fingerprint";
inline constexpr char kContainersAnnotation[] = "weightcache.io/containers";
inline constexpr char kResourceName[] = "weightcache.io/client";
inline constexpr char kModelEnv[] = "WEIGHTCACHE_MODEL";
inline constexpr char kFingerprintEnv[] = "WEIGHTCACHE_FINGERPRINT";

inline constexpr char kSocketEnv[] = "WEIGHTCACHE_SOCKET";
inline constexpr char kVolumeName[] = "weightcache";

// What the webhook gives an engine pod to reach the daemon.
struct MutateOptions {
  // false: the device plugin's extended resource (weightcache.io/client: 1), whose Allocate
  // mounts the socket directory. true: an inline CSI volume of `csi_driver` (one per pod,
  // named "weightcache") mounted at `mount_path` in each selected container, with
  // WEIGHTCACHE_SOCKET=<mount_path>/control.sock: the pod's own sockets, so the daemon knows
  // the pod from the socket (pkg/kube/csi_plugin.h), and no extended resource.
  bool csi_volume = false;
  std::string csi_driver = "csi.weightcache.io";
  std::string mount_path = "/run/weightcache";
};

struct Mutation {
  nlohmann::json patch = nlohmann::json::array();  // RFC 6902 operations; empty: nothing to do
  std::vector<std::string> warnings;
};

// The JSON pointer (RFC 6901) escaping of one path segment: "~" -> "~0", "/" -> "~1".
std::string EscapeJsonPointer(std::string_view segment);

// The patch for one Pod object (its JSON). `pod` is not trusted: wrong types are skipped with
// a warning, never a crash.
Mutation MutatePod(const nlohmann::json& pod, const MutateOptions& options = {});

// Answers one AdmissionReview v1 request body: the AdmissionReview response (JSON text).
// InvalidArgument naming what is wrong when the body is not a well-formed AdmissionReview v1
// request.
absl::StatusOr<std::string> ReviewAdmission(std::string_view body,
                                            const MutateOptions& options = {});

}  // namespace weightcache::webhook
