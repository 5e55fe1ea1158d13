#include "pkg/webhook/mutate.h"

#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "pkg/util/untrusted_text.h"

namespace weightcache::webhook {
namespace {

using nlohmann::json;

// Deeper than any Pod; refused before parsing so that "[[[[..." costs no stack.
constexpr size_t kMaxNesting = 128;

const json* Member(const json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// The annotation's value when it is a non-empty string.
std::string Annotation(const json& pod, const char* key, std::vector<std::string>& warnings) {
  const json* meta = Member(pod, "metadata");
  const json* annotations = meta != nullptr ? Member(*meta, "annotations") : nullptr;
  const json* value = annotations != nullptr ? Member(*annotations, key) : nullptr;
  if (value == nullptr) return "";
  if (!value->is_string() || value->get_ref<const std::string&>().empty()) {
    warnings.push_back(
        absl::StrCat("weightcache: annotation ", key, " is empty or not a string: ignored"));
    return "";
  }
  return value->get<std::string>();
}

json FieldRefEnv(const char* env, const char* annotation) {
  return {
      {"name", env},
      {"valueFrom",
       {{"fieldRef", {{"fieldPath", absl::StrCat("metadata.annotations['", annotation, "']")}}}}}};
}

json AddOp(std::string path, json value) {
  return {{"op", "add"}, {"path", std::move(path)}, {"value", std::move(value)}};
}

bool HasEnv(const json& env, const char* name) {
  for (const json& e : env) {
    const json* n = Member(e, "name");
    if (n != nullptr && n->is_string() && n->get_ref<const std::string&>() == name) return true;
  }
  return false;
}

std::string StringField(const json& object, const char* key);

// Appends to `out` what container `c` (at `base`) lacks.
void MutateContainer(const json& c, const std::string& base, const std::vector<json>& want_env,
                     const MutateOptions& options, Mutation& out) {
  const std::string name = EscapeTruncated(
      Member(c, "name") != nullptr && c["name"].is_string() ? c["name"].get<std::string>() : "?",
      64);
  // Env: the user's own value of a variable wins.
  const json* env = Member(c, "env");
  if (env == nullptr) {
    if (!want_env.empty()) out.patch.push_back(AddOp(base + "/env", json(want_env)));
  } else if (!env->is_array()) {
    out.warnings.push_back(absl::StrCat("weightcache: container ", name, ": env is not a list"));
  } else {
    for (const json& e : want_env) {
      if (!HasEnv(*env, e["name"].get_ref<const std::string&>().c_str())) {
        out.patch.push_back(AddOp(base + "/env/-", e));
      }
    }
  }
  if (options.csi_volume) {
    // The pod's volume, mounted where the env says, unless the container mounts something
    // there or mounts the volume already.
    const json* mounts = Member(c, "volumeMounts");
    const json mount = {{"name", kVolumeName}, {"mountPath", options.mount_path}};
    if (mounts == nullptr) {
      out.patch.push_back(AddOp(base + "/volumeMounts", json::array({mount})));
    } else if (!mounts->is_array()) {
      out.warnings.push_back(
          absl::StrCat("weightcache: container ", name, ": volumeMounts is not a list"));
    } else {
      bool present = false;
      for (const json& m : *mounts) {
        present |= m.is_object() && (StringField(m, "name") == kVolumeName ||
                                     StringField(m, "mountPath") == options.mount_path);
      }
      if (!present) out.patch.push_back(AddOp(base + "/volumeMounts/-", mount));
    }
    return;
  }
  // Resources: request and limit of an extended resource must be equal, so a side that is
  // missing takes the other side's quantity.
  const std::string resource = EscapeJsonPointer(kResourceName);
  const json* resources = Member(c, "resources");
  if (resources == nullptr) {
    out.patch.push_back(AddOp(base + "/resources", {{"requests", {{kResourceName, "1"}}},
                                                    {"limits", {{kResourceName, "1"}}}}));
    return;
  }
  if (!resources->is_object()) {
    out.warnings.push_back(
        absl::StrCat("weightcache: container ", name, ": resources is not an object"));
    return;
  }
  auto quantity = [&](const char* side) -> const json* {
    const json* s = Member(*resources, side);
    return s != nullptr ? Member(*s, kResourceName) : nullptr;
  };
  for (const auto& [side, other] : {std::pair{"requests", "limits"}, {"limits", "requests"}}) {
    if (quantity(side) != nullptr) continue;
    const json* o = quantity(other);
    // The other side's quantity as written (a string "2" or a number 2): a request and a
    // limit that differ make the API server refuse the pod.
    const json q = o != nullptr && (o->is_string() || o->is_number()) ? *o : json("1");
    const json* s = Member(*resources, side);
    if (s == nullptr) {
      out.patch.push_back(AddOp(absl::StrCat(base, "/resources/", side), {{kResourceName, q}}));
    } else if (s->is_object()) {
      out.patch.push_back(AddOp(absl::StrCat(base, "/resources/", side, "/", resource), q));
    } else {
      out.warnings.push_back(
          absl::StrCat("weightcache: container ", name, ": resources.", side, " is not an object"));
    }
  }
}

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("AdmissionReview: ", what));
}

std::string StringField(const json& object, const char* key) {
  const json* v = Member(object, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : "";
}

}  // namespace

std::string EscapeJsonPointer(std::string_view segment) {
  std::string out;
  out.reserve(segment.size());
  for (char ch : segment) {
    if (ch == '~') {
      out += "~0";
    } else if (ch == '/') {
      out += "~1";
    } else {
      out += ch;
    }
  }
  return out;
}

Mutation MutatePod(const json& pod, const MutateOptions& options) {
  Mutation out;
  const std::string model = Annotation(pod, kModelAnnotation, out.warnings);
  const std::string fingerprint = Annotation(pod, kFingerprintAnnotation, out.warnings);
  if (model.empty() && fingerprint.empty()) return out;
  std::vector<json> want_env;
  if (!model.empty()) want_env.push_back(FieldRefEnv(kModelEnv, kModelAnnotation));
  if (!fingerprint.empty()) {
    want_env.push_back(FieldRefEnv(kFingerprintEnv, kFingerprintAnnotation));
  }
  if (options.csi_volume) {
    want_env.push_back({{"name", kSocketEnv}, {"value", options.mount_path + "/control.sock"}});
  }

  const json* spec = Member(pod, "spec");
  const json* containers = spec != nullptr ? Member(*spec, "containers") : nullptr;
  if (containers == nullptr || !containers->is_array()) {
    out.warnings.emplace_back("weightcache: pod has no spec.containers list: not changed");
    return out;
  }
  // Selection by weightcache.io/containers; absent or naming nothing: every container.
  std::set<std::string, std::less<>> named;
  const std::string list = Annotation(pod, kContainersAnnotation, out.warnings);
  for (absl::string_view n : absl::StrSplit(list, ',')) {
    n = absl::StripAsciiWhitespace(n);
    if (!n.empty()) named.emplace(n);
  }
  std::set<std::string, std::less<>> found;
  for (size_t i = 0; i < containers->size(); ++i) {
    const json& c = (*containers)[i];
    if (!c.is_object()) {
      out.warnings.push_back(
          absl::StrCat("weightcache: spec.containers[", i, "] is not an object"));
      continue;
    }
    const std::string name = StringField(c, "name");
    if (!named.empty() && named.count(name) == 0) continue;
    found.insert(name);
    MutateContainer(c, absl::StrCat("/spec/containers/", i), want_env, options, out);
  }
  if (options.csi_volume && !found.empty()) {
    // One volume per pod: its containers share the pod's sockets.
    const json volume = {{"name", kVolumeName}, {"csi", {{"driver", options.csi_driver}}}};
    const json* volumes = Member(*spec, "volumes");
    if (volumes == nullptr) {
      out.patch.push_back(AddOp("/spec/volumes", json::array({volume})));
    } else if (!volumes->is_array()) {
      out.warnings.emplace_back("weightcache: spec.volumes is not a list: no volume added");
    } else {
      bool present = false;
      for (const json& v : *volumes)
        present |= v.is_object() && StringField(v, "name") == kVolumeName;
      if (!present) out.patch.push_back(AddOp("/spec/volumes/-", volume));
    }
  }
  for (const std::string& n : named) {
    if (found.count(n) == 0) {
      out.warnings.push_back(absl::StrCat("weightcache: annotation ", kContainersAnnotation,
                                          " names container ", QuoteTruncated(n, 64),
                                          ", which the pod does not have"));
    }
  }
  return out;
}

absl::StatusOr<std::string> ReviewAdmission(std::string_view body, const MutateOptions& options) {
  if (BracketNestingDepth(body, kMaxNesting) > kMaxNesting) {
    return Invalid(absl::StrCat("JSON nested deeper than ", kMaxNesting, " levels"));
  }
  json review;
  try {
    review = json::parse(body);
  } catch (const json::exception& e) {
    return Invalid(absl::StrCat("request body is not JSON: ", e.what()));
  }
  if (!review.is_object()) return Invalid("request body is not a JSON object");
  const std::string api_version = StringField(review, "apiVersion");
  const std::string kind = StringField(review, "kind");
  if (kind != "AdmissionReview" || api_version != "admission.k8s.io/v1") {
    return Invalid(absl::StrCat("apiVersion/kind is ", QuoteTruncated(api_version), "/",
                                QuoteTruncated(kind),
                                ", want admission.k8s.io/v1 AdmissionReview "
                                "(admissionReviewVersions: [v1])"));
  }
  const json* request = Member(review, "request");
  if (request == nullptr || !request->is_object()) return Invalid("no request object");
  const std::string uid = StringField(*request, "uid");
  if (uid.empty()) return Invalid("request.uid is missing or not a string");

  Mutation m;
  const json* rkind = Member(*request, "kind");
  const std::string group = rkind != nullptr ? StringField(*rkind, "group") : "";
  const std::string object_kind = rkind != nullptr ? StringField(*rkind, "kind") : "";
  const std::string operation = StringField(*request, "operation");
  if (!group.empty() || object_kind != "Pod") {
    m.warnings.push_back(absl::StrCat("weightcache: webhook got a ", QuoteTruncated(group, 64), "/",
                                      QuoteTruncated(object_kind, 64),
                                      "; only core Pods are mutated (check the "
                                      "MutatingWebhookConfiguration's rules)"));
  } else if (operation == "CREATE") {  // containers are immutable after creation
    const json* object = Member(*request, "object");
    if (object == nullptr || !object->is_object())
      return Invalid("request.object is not an object");
    m = MutatePod(*object, options);
  }

  json response = {{"uid", uid}, {"allowed", true}};
  if (!m.patch.empty()) {
    response["patchType"] = "JSONPatch";
    response["patch"] = absl::Base64Escape(m.patch.dump());
  }
  if (!m.warnings.empty()) response["warnings"] = m.warnings;
  json out = {{"apiVersion", "admission.k8s.io/v1"},
              {"kind", "AdmissionReview"},
              {"response", std::move(response)}};
  return out.dump();
}

}  // namespace weightcache::webhook
