// The webhook's mutation on AdmissionReview v1 fixtures: each patch is decoded from the
// response, applied to the pod with nlohmann::json::patch (RFC 6902) and the result compared
// with the expected pod.
#include "pkg/webhook/mutate.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/escaping.h"
#include "nlohmann/json.hpp"

namespace weightcache::webhook {
namespace {

using nlohmann::json;

json Review(const json& pod, const std::string& operation = "CREATE") {
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", "705ab4f5-6393-11e8-b7cc-42010a800002"},
            {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
            {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
            {"namespace", "engines"},
            {"operation", operation},
            {"object", pod}}}};
}

struct Answer {
  json response;
  json patch = json::array();  // decoded; empty when the response has none
  json patched;                // the pod with the patch applied
};

Answer Ask(const json& pod, const std::string& operation = "CREATE",
           const MutateOptions& options = {}) {
  absl::StatusOr<std::string> text = ReviewAdmission(Review(pod, operation).dump(), options);
  EXPECT_TRUE(text.ok()) << text.status();
  Answer a;
  if (!text.ok()) return a;
  const json out = json::parse(*text);
  EXPECT_EQ(out["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(out["kind"], "AdmissionReview");
  a.response = out["response"];
  EXPECT_EQ(a.response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
  EXPECT_EQ(a.response["allowed"], true);
  if (a.response.contains("patch")) {
    EXPECT_EQ(a.response["patchType"], "JSONPatch");
    std::string decoded;
    EXPECT_TRUE(absl::Base64Unescape(a.response["patch"].get<std::string>(), &decoded));
    a.patch = json::parse(decoded);
    EXPECT_FALSE(a.patch.empty()) << "a patch is sent only when there is something to add";
  } else {
    EXPECT_FALSE(a.response.contains("patchType"));
  }
  a.patched = pod.patch(a.patch);
  return a;
}

json Pod(const json& annotations, const json& containers, const json& init = nullptr) {
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", "engine"}, {"namespace", "engines"}}},
              {"spec", {{"containers", containers}}}};
  if (!annotations.is_null()) pod["metadata"]["annotations"] = annotations;
  if (!init.is_null()) pod["spec"]["initContainers"] = init;
  return pod;
}

const json kModelEnvVar = json::parse(R"({"name": "WEIGHTCACHE_MODEL", "valueFrom": {"fieldRef":
    {"fieldPath": "metadata.annotations['weightcache.io/model']"}}})");
const json kFingerprintEnvVar = json::parse(R"({"name": "WEIGHTCACHE_FINGERPRINT", "valueFrom":
    {"fieldRef": {"fieldPath": "metadata.annotations['weightcache.io/fingerprint']"}}})");
const json kResources = json::parse(
    R"({"requests": {"weightcache.io/client": "1"}, "limits": {"weightcache.io/client": "1"}})");

TEST(Mutate, AnnotatedPodGetsResourceAndEnvWithTheExactPatch) {
  const json pod = Pod({{"weightcache.io/model", "llama-8b"}},
                       json::parse(R"([{"name": "engine", "image": "vllm"}])"));
  Answer a = Ask(pod);
  EXPECT_EQ(a.patch, json::parse(R"([
    {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "WEIGHTCACHE_MODEL",
      "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['weightcache.io/model']"}}}]},
    {"op": "add", "path": "/spec/containers/0/resources", "value": {
      "requests": {"weightcache.io/client": "1"}, "limits": {"weightcache.io/client": "1"}}}])"));
  json want = pod;
  want["spec"]["containers"][0]["env"] = json::array({kModelEnvVar});
  want["spec"]["containers"][0]["resources"] = kResources;
  EXPECT_EQ(a.patched, want);
  EXPECT_FALSE(a.response.contains("warnings"));
}

// With the CSI volume (--inject=csi) an engine pod gets its own sockets: one inline volume of
// the driver, mounted in each selected container where WEIGHTCACHE_SOCKET points, and no
// extended resource (so no device plugin and no hostPath). A second review adds nothing.
TEST(Mutate, CsiAnnotatedPodGetsItsOwnVolumeMountedAndNoResource) {
  const json pod = Pod({{"weightcache.io/model", "llama-8b"}, {"weightcache.io/containers", "a"}},
                       json::parse(R"([{"name": "a", "image": "vllm"}, {"name": "side"}])"));
  const MutateOptions csi{.csi_volume = true};
  Answer a = Ask(pod, "CREATE", csi);
  json want = pod;
  want["spec"]["containers"][0]["env"] = json::array(
      {kModelEnvVar, {{"name", "WEIGHTCACHE_SOCKET"}, {"value", "/run/weightcache/control.sock"}}});
  want["spec"]["containers"][0]["volumeMounts"] =
      json::parse(R"([{"name": "weightcache", "mountPath": "/run/weightcache"}])");
  want["spec"]["volumes"] =
      json::parse(R"([{"name": "weightcache", "csi": {"driver": "csi.weightcache.io"}}])");
  EXPECT_EQ(a.patched, want) << a.patch.dump();
  EXPECT_TRUE(Ask(a.patched, "CREATE", csi).patch.empty());
  // A pod that has volumes and mounts already keeps them; ours are appended.
  json busy = pod;
  busy["spec"]["volumes"] = json::parse(R"([{"name": "data", "emptyDir": {}}])");
  busy["spec"]["containers"][0]["volumeMounts"] =
      json::parse(R"([{"name": "data", "mountPath": "/data"}])");
  Answer b = Ask(busy, "CREATE", csi);
  ASSERT_EQ(b.patched["spec"]["volumes"].size(), 2u);
  EXPECT_EQ(b.patched["spec"]["volumes"][1]["csi"]["driver"], "csi.weightcache.io");
  ASSERT_EQ(b.patched["spec"]["containers"][0]["volumeMounts"].size(), 2u);
  EXPECT_FALSE(b.patched["spec"]["containers"][1].contains("volumeMounts"));
}

TEST(Mutate, PodWithoutAnnotationIsAllowedUnchanged) {
  const json pod = Pod({{"other", "x"}}, json::parse(R"([{"name": "engine"}])"));
  Answer a = Ask(pod);
  EXPECT_TRUE(a.patch.empty());
  EXPECT_EQ(a.patched, pod);
  EXPECT_EQ(Ask(Pod(nullptr, json::parse(R"([{"name": "engine"}])"))).patch, json::array());
}

TEST(Mutate, AlreadyPatchedPodGetsNoPatchAndSecondRunIsEmpty) {
  const json pod = Pod({{"weightcache.io/model", "llama-8b"}},
                       json::parse(R"([{"name": "a"}, {"name": "b", "env": []}])"));
  Answer first = Ask(pod);
  ASSERT_FALSE(first.patch.empty());
  Answer second = Ask(first.patched);
  EXPECT_TRUE(second.patch.empty()) << second.patch.dump();
  EXPECT_EQ(second.patched, first.patched);
}

TEST(Mutate, ExistingValuesAreKeptAndOnlyWhatIsMissingAdded) {
  // A user-set WEIGHTCACHE_MODEL (a literal) wins; requests without limits get a limit of the
  // same quantity (extended resources need them equal); other env and resources stay.
  const json pod = Pod({{"weightcache.io/model", "llama-8b"}}, json::parse(R"([{
      "name": "engine",
      "env": [{"name": "WEIGHTCACHE_MODEL", "value": "pinned"}, {"name": "X", "value": "1"}],
      "resources": {"requests": {"cpu": "2", "weightcache.io/client": "1"},
                    "limits": {"memory": "1Gi"}}}])"));
  Answer a = Ask(pod);
  EXPECT_EQ(a.patch, json::parse(R"([{"op": "add",
      "path": "/spec/containers/0/resources/limits/weightcache.io~1client", "value": "1"}])"));
  json want = pod;
  want["spec"]["containers"][0]["resources"]["limits"]["weightcache.io/client"] = "1";
  EXPECT_EQ(a.patched, want);
}

TEST(Mutate, LimitsOnlyGetRequestsOfTheSameQuantity) {
  const json pod = Pod({{"weightcache.io/model", "m"}}, json::parse(R"([{"name": "engine",
      "env": [{"name": "WEIGHTCACHE_MODEL", "value": "m"}],
      "resources": {"limits": {"weightcache.io/client": "1"}}}])"));
  Answer a = Ask(pod);
  json want = pod;
  want["spec"]["containers"][0]["resources"]["requests"] = {{"weightcache.io/client", "1"}};
  EXPECT_EQ(a.patched, want);
}

// Finding (issue 25): a limit written as a number (2, not "2") got a request of "1", and the
// API server refused the pod (an extended resource's request must equal its limit).
TEST(Mutate, ANumericLimitIsCopiedAsWritten) {
  const json pod = Pod({{"weightcache.io/model", "m"}}, json::parse(R"([{"name": "engine",
      "env": [{"name": "WEIGHTCACHE_MODEL", "value": "m"}],
      "resources": {"limits": {"weightcache.io/client": 2}}}])"));
  Answer a = Ask(pod);
  json want = pod;
  want["spec"]["containers"][0]["resources"]["requests"] = {{"weightcache.io/client", 2}};
  EXPECT_EQ(a.patched, want);
}

TEST(Mutate, EveryContainerButNeverInitContainers) {
  const json pod = Pod({{"weightcache.io/model", "m"}},
                       json::parse(R"([{"name": "a"}, {"name": "b", "env": [{"name": "Y"}]}])"),
                       json::parse(R"([{"name": "init"}])"));
  Answer a = Ask(pod);
  json want = pod;
  want["spec"]["containers"][0]["env"] = json::array({kModelEnvVar});
  want["spec"]["containers"][0]["resources"] = kResources;
  want["spec"]["containers"][1]["env"] = json::array({{{"name", "Y"}}, kModelEnvVar});
  want["spec"]["containers"][1]["resources"] = kResources;
  EXPECT_EQ(a.patched, want);
  EXPECT_EQ(a.patched["spec"]["initContainers"], pod["spec"]["initContainers"]);
}

TEST(Mutate, ContainersAnnotationSelects) {
  const json pod = Pod({{"weightcache.io/model", "m"}, {"weightcache.io/containers", " b , c"}},
                       json::parse(R"([{"name": "a"}, {"name": "b"}, {"name": "c"}])"),
                       json::parse(R"([{"name": "b"}])"));
  Answer a = Ask(pod);
  json want = pod;
  for (int i : {1, 2}) {
    want["spec"]["containers"][i]["env"] = json::array({kModelEnvVar});
    want["spec"]["containers"][i]["resources"] = kResources;
  }
  EXPECT_EQ(a.patched, want);
  EXPECT_FALSE(a.response.contains("warnings"));
}

TEST(Mutate, MissingContainerIsAWarningAndTheOthersArePatched) {
  const json pod = Pod({{"weightcache.io/model", "m"}, {"weightcache.io/containers", "a,engnie"}},
                       json::parse(R"([{"name": "a"}, {"name": "engine"}])"));
  Answer a = Ask(pod);
  json want = pod;
  want["spec"]["containers"][0]["env"] = json::array({kModelEnvVar});
  want["spec"]["containers"][0]["resources"] = kResources;
  EXPECT_EQ(a.patched, want);
  ASSERT_EQ(a.response["warnings"].size(), 1U);
  EXPECT_EQ(a.response["warnings"][0],
            "weightcache: annotation weightcache.io/containers names container \"engnie\", "
            "which the pod does not have");
}

TEST(Mutate, FingerprintAnnotationAloneOrWithModel) {
  const json containers = json::parse(R"([{"name": "engine"}])");
  Answer only = Ask(Pod({{"weightcache.io/fingerprint", "sha256:ab"}}, containers));
  EXPECT_EQ(only.patched["spec"]["containers"][0]["env"], json::array({kFingerprintEnvVar}));
  EXPECT_EQ(only.patched["spec"]["containers"][0]["resources"], kResources);
  Answer both = Ask(Pod(
      {{"weightcache.io/model", "m"}, {"weightcache.io/fingerprint", "sha256:ab"}}, containers));
  EXPECT_EQ(both.patched["spec"]["containers"][0]["env"],
            json::array({kModelEnvVar, kFingerprintEnvVar}));
}

TEST(Mutate, EmptyAnnotationIsIgnoredWithAWarning) {
  Answer a = Ask(Pod({{"weightcache.io/model", ""}}, json::parse(R"([{"name": "engine"}])")));
  EXPECT_TRUE(a.patch.empty());
  ASSERT_EQ(a.response["warnings"].size(), 1U);
  EXPECT_NE(a.response["warnings"][0].get<std::string>().find("weightcache.io/model is empty"),
            std::string::npos);
}

TEST(Mutate, OnlyCreateIsMutated) {
  const json pod = Pod({{"weightcache.io/model", "m"}}, json::parse(R"([{"name": "engine"}])"));
  EXPECT_TRUE(Ask(pod, "UPDATE").patch.empty());
}

TEST(Mutate, OtherKindsAreAllowedWithAWarning) {
  json review = Review(json::object());
  review["request"]["kind"] = {{"group", "apps"}, {"version", "v1"}, {"kind", "Deployment"}};
  absl::StatusOr<std::string> text = ReviewAdmission(review.dump());
  ASSERT_TRUE(text.ok()) << text.status();
  const json r = json::parse(*text)["response"];
  EXPECT_EQ(r["allowed"], true);
  EXPECT_FALSE(r.contains("patch"));
  EXPECT_NE(r["warnings"][0].get<std::string>().find("\"apps\"/\"Deployment\""), std::string::npos);
}

TEST(Mutate, EscapesJsonPointer) {
  EXPECT_EQ(EscapeJsonPointer("weightcache.io/client"), "weightcache.io~1client");
  EXPECT_EQ(EscapeJsonPointer("a~b/c"), "a~0b~1c");
}

void ExpectInvalid(const std::string& body, const std::string& message) {
  absl::StatusOr<std::string> r = ReviewAdmission(body);
  ASSERT_FALSE(r.ok()) << *r;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status();
}

TEST(Mutate, MalformedReviewsAreClearErrors) {
  ExpectInvalid("{\"apiVersion\": ", "request body is not JSON");
  ExpectInvalid("[1]", "not a JSON object");
  ExpectInvalid(std::string(10000, '['), "nested deeper than 128");
  json v1beta1 = Review(json::object());
  v1beta1["apiVersion"] = "admission.k8s.io/v1beta1";
  ExpectInvalid(v1beta1.dump(), "\"admission.k8s.io/v1beta1\"/\"AdmissionReview\", want");
  json pod_kind = Review(json::object());
  pod_kind["kind"] = "Pod";
  ExpectInvalid(pod_kind.dump(), "want admission.k8s.io/v1 AdmissionReview");
  json no_request = Review(json::object());
  no_request.erase("request");
  ExpectInvalid(no_request.dump(), "no request object");
  json no_uid = Review(json::object());
  no_uid["request"].erase("uid");
  ExpectInvalid(no_uid.dump(), "request.uid is missing");
  json no_object = Review(json::object());
  no_object["request"]["object"] = "x";
  ExpectInvalid(no_object.dump(), "request.object is not an object");
}

TEST(Mutate, WrongTypesInThePodAreWarningsNotCrashes) {
  Answer a = Ask(Pod({{"weightcache.io/model", "m"}},
                     json::parse(R"([{"name": "a", "env": 3, "resources": []}, 7])")));
  EXPECT_TRUE(a.patch.empty());
  EXPECT_EQ(a.response["warnings"].size(), 3U);
}

}  // namespace
}  // namespace weightcache::webhook
