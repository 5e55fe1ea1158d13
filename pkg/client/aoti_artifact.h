// The AOTInductor package artifact as weightcache.aoti writes it (python/weightcache/aoti.py,
// `pack`), read by a C++ engine without Python (docs/engines.md, "A C++ engine"):
//
//   "WCAOTI01" | u64 little-endian header length | JSON header | package | constants' bytes
//
// The header: {"format": 1, "package_bytes": N, "bindings": {package constant FQN: mapped
// weight name}, "constants": [{"fqn", "dtype", "shape", "offset", "nbytes"}]} (offsets from
// the end of the package). Every length and offset is checked against the blob; a blob that
// is not one is INVALID_ARGUMENT naming what is wrong (the same refusals as Python's unpack).
//
// And the artifact key a C++ engine asks for: the JSON object weightcache.aoti prints as a
// package's key (`json.dump(fn.key, f)` of the AotiModel it returned), read into the proto.
//
// Thread-safety: pure functions. The views point into the blob given: valid while it is.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace weightcache::v1 {
class ArtifactKey;
}  // namespace weightcache::v1

namespace weightcache::client {

inline constexpr std::string_view kAotiPackageKind = "aoti-package";

struct AotiConstant {
  std::string fqn;
  std::string dtype;  // torch's name without "torch.": "float32", "bfloat16", "int64", ...
  std::vector<int64_t> shape;
  std::string_view bytes;  // raw, little-endian, C order
};

struct AotiArtifact {
  std::string_view package;                     // the .pt2 archive
  std::map<std::string, std::string> bindings;  // package constant FQN -> mapped weight name
  std::vector<AotiConstant> constants;          // the package's other constants
};

absl::StatusOr<AotiArtifact> ParseAotiArtifact(std::string_view blob);

// The key from its JSON text (an object of the ArtifactKey's string fields; unknown fields and
// non-strings are refused naming them). `what` names the text in errors (e.g. its file).
absl::StatusOr<v1::ArtifactKey> ParseArtifactKeyJson(std::string_view json,
                                                     const std::string& what);

// json.dumps(key, sort_keys=True) as Python writes it: the name of a key's load marker
// (weightcache.aoti.marker_path) is its SHA-256, so a C++ and a Python engine of one key
// share one marker.
std::string ArtifactKeyPythonJson(const v1::ArtifactKey& key);

// The file name of a key's load marker: the first 32 hex digits of the SHA-256 of
// ArtifactKeyPythonJson (weightcache.aoti.marker_path's name).
std::string AotiMarkerName(const v1::ArtifactKey& key);

}  // namespace weightcache::client
