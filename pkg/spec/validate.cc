// Validation of a ModelSpec: bounds, names, enumerations and the access lists
// (allowed_namespaces, publishers). Apart from the parsing (spec.cc), which calls Validate on
// every spec it reads.
#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/spec/internal/fields.h"
#include "pkg/spec/spec.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/untrusted_text.h"

namespace weightcache::spec {
using internal::Invalid;
using internal::Quote;
namespace {
constexpr int kMaxParallelSize = 1024;
constexpr size_t kMaxNameLength = 63;
// Most entries of allowed_namespaces (a node shared by more teams than this lists none).
constexpr size_t kMaxAllowedNamespaces = 256;
constexpr size_t kMaxNamespaceLength = 63;
constexpr const char* kDtypes[] = {"auto", "bf16", "fp16", "fp32"};
constexpr const char* kQuantizations[] = {"auto", "none", "fp8_block"};
constexpr const char* kLayouts[] = {"hf", "sglang", "vllm"};
constexpr const char* kIsolations[] = {kIsolationShared, kIsolationNamespace};

template <size_t N>
bool OneOf(const std::string& value, const char* const (&allowed)[N]) {
  for (const char* a : allowed) {
    if (value == a) return true;
  }
  return false;
}

bool IsNameChar(char c, bool first) {
  if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) return true;
  return !first && (c == '.' || c == '_' || c == '-');
}

bool IsValidName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0)) return false;
  }
  return true;
}

// Free-text fields: bounded, well-formed UTF-8 without control characters, so that they
// print as themselves in messages and manifests and round-trip through ToYaml.
constexpr size_t kMaxPathLength = 4096;
constexpr size_t kMaxTextLength = 256;

absl::Status CheckText(const std::string& field, const std::string& value, size_t max) {
  if (value.size() > max) {
    return Invalid(field, absl::StrCat("must be at most ", max, " bytes, got ", value.size(), ": ",
                                       Quote(value)));
  }
  if (const size_t at = FindInvalidUtf8(value); at != std::string::npos) {
    return Invalid(field, absl::StrCat("must be UTF-8, got byte ", at, " of ", Quote(value)));
  }
  if (const size_t at = FindControlChar(value); at != std::string::npos) {
    return Invalid(field, absl::StrCat("must not hold control characters, got one at byte ", at,
                                       " of ", Quote(value)));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsNamespaceName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNamespaceLength) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    const bool inner = i > 0 && i + 1 < name.size();
    if (!alnum && !(inner && c == '-')) return false;
  }
  return true;
}

namespace {

// An access list of a spec (allowed_namespaces, publishers): bounded, no repeats, each entry
// passing `entry` (its error text, "" when fine); errors name the spec (the list is an access
// rule, so an operator needs to see which model's rule is wrong).
absl::Status ValidateList(const ModelSpec& spec, const char* field,
                          const std::vector<std::string>& list, const char* noun,
                          const std::function<std::string(const std::string&)>& entry) {
  if (list.size() > kMaxAllowedNamespaces) {
    return Invalid(field, absl::StrCat("model ", Quote(spec.name), " lists ", list.size(), " ",
                                       noun, "s, more than ", kMaxAllowedNamespaces));
  }
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = absl::StrCat(field, "[", i, "]");
    if (const std::string why = entry(list[i]); !why.empty()) {
      return Invalid(at, absl::StrCat("model ", Quote(spec.name), ": ", Quote(list[i]), why));
    }
    auto [it, inserted] = seen.emplace(list[i], i);
    if (!inserted) {
      return Invalid(at, absl::StrCat("model ", Quote(spec.name), ": duplicate ", noun, " ",
                                      Quote(list[i]), " (also ", field, "[", it->second, "])"));
    }
  }
  return absl::OkStatus();
}

bool AllDigits(const std::string& t) {
  return !t.empty() && t.find_first_not_of("0123456789") == std::string::npos;
}

absl::Status ValidateNamespaces(const ModelSpec& spec) {
  return ValidateList(spec, "allowed_namespaces", spec.allowed_namespaces, "namespace",
                      [](const std::string& ns) -> std::string {
                        if (IsNamespaceName(ns)) return "";
                        return absl::StrCat(
                            " is not a Kubernetes namespace name (a DNS-1123 label: lower-case "
                            "letters, digits and '-', starting and ending with a letter or "
                            "digit, at most ",
                            kMaxNamespaceLength, " characters)");
                      });
}

// publishers: each a namespace name or uid:<n>; a bare number is ambiguous (a namespace may
// be all digits) and refused with the way to write a uid.
absl::Status ValidatePublisherList(const ModelSpec& spec, const char* field,
                                   const std::vector<std::string>& list) {
  return ValidateList(spec, field, list, "publisher", [](const std::string& p) -> std::string {
    if (AllDigits(p)) return absl::StrCat(" is ambiguous: write a uid as \"uid:", p, "\"");
    if (p.rfind("uid:", 0) == 0) {
      const std::string n = p.substr(4);
      if (!AllDigits(n) || n.size() > 10 || std::stoull(n) > 0xffffffffull) {
        return " is not uid:<n> with n a uid (0 to 4294967295)";
      }
      return "";
    }
    if (IsNamespaceName(p)) return "";
    return " is neither a Kubernetes namespace name (a DNS-1123 label) nor uid:<n>";
  });
}

absl::Status ValidatePublishers(const ModelSpec& spec) {
  WC_RETURN_IF_ERROR(ValidatePublisherList(spec, "publishers", spec.publishers));
  return ValidatePublisherList(spec, "native_publishers", spec.native_publishers);
}

// Pinned digests (spec `digests`): each key a plain checkpoint file name, each value a
// SHA-256. Whether they cover the checkpoint is known only once its files are listed
// (load::OpenModel).
constexpr size_t kMaxFileNameLength = 255;  // NAME_MAX

absl::Status ValidateDigests(const ModelSpec& spec) {
  for (const auto& [file, digest] : spec.digests) {
    const std::string field = absl::StrCat("digests[", Quote(file), "]");
    const std::string model = absl::StrCat("model ", Quote(spec.name), ": ");
    WC_RETURN_IF_ERROR(CheckText(field, file, kMaxFileNameLength));
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == ".." ||
        file.size() <= std::string_view(".safetensors").size() ||
        file.compare(file.size() - 12, 12, ".safetensors") != 0) {
      return Invalid(field, model +
                                "must name a checkpoint file of model_dir (a file name "
                                "ending in .safetensors, no directory)");
    }
    if (!IsSha256Hex(digest)) {
      return Invalid(field, absl::StrCat(model, "must be the file's SHA-256, 64 hex digits, got ",
                                         Quote(digest), " (", digest.size(), " characters)"));
    }
  }
  return absl::OkStatus();
}

// Pinned segment digests: each key a fingerprint and each value a non-empty list of
// segment digests, all 64 hex digits.
absl::Status ValidateSegmentDigests(const ModelSpec& spec) {
  const std::string model = absl::StrCat("model ", Quote(spec.name), ": ");
  for (const auto& [fp, list] : spec.segment_digests) {
    const std::string field = absl::StrCat("segment_digests[", Quote(fp), "]");
    if (!IsSha256Hex(fp)) {
      return Invalid(field, absl::StrCat(model, "keys must be fingerprints, 64 hex digits, got ",
                                         fp.size(), " characters"));
    }
    if (list.empty()) return Invalid(field, model + "lists no segment digest");
    for (size_t i = 0; i < list.size(); ++i) {
      if (!IsSha256Hex(list[i])) {
        return Invalid(absl::StrCat(field, "[", i, "]"),
                       absl::StrCat(model, "must be a segment's digest, 64 hex digits, got ",
                                    Quote(list[i]), " (", list[i].size(), " characters)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsSha256Hex(const std::string& digest) {
  return digest.size() == 64 && std::all_of(digest.begin(), digest.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

absl::Status Validate(const ModelSpec& spec) {
  if (spec.version != kSpecVersion) {
    return Invalid("version", absl::StrCat("must be ", kSpecVersion, ", got ", spec.version));
  }
  if (spec.name.empty()) return Invalid("name", "required");
  if (!IsValidName(spec.name)) {
    return Invalid("name",
                   absl::StrCat("must match [a-z0-9][a-z0-9._-]{0,62}, got ", Quote(spec.name)));
  }
  if (spec.model_dir.empty()) return Invalid("model_dir", "required");
  for (const auto& [field, value, max] : {std::tuple<const char*, const std::string&, size_t>{
                                              "model_dir", spec.model_dir, kMaxPathLength},
                                          {"architecture", spec.architecture, kMaxTextLength},
                                          {"revision", spec.revision, kMaxTextLength}}) {
    WC_RETURN_IF_ERROR(CheckText(field, value, max));
  }
  if (spec.tp_size < 1) {
    return Invalid("tp_size", absl::StrCat("must be >= 1, got ", spec.tp_size));
  }
  if (spec.tp_size > kMaxParallelSize) {
    return Invalid("tp_size",
                   absl::StrCat("must be <= ", kMaxParallelSize, ", got ", spec.tp_size));
  }
  std::map<int, size_t> ranks_seen;
  for (size_t i = 0; i < spec.tp_ranks.size(); ++i) {
    const int rank = spec.tp_ranks[i];
    const std::string field = absl::StrCat("tp_ranks[", i, "]");
    if (rank < 0 || rank >= spec.tp_size) {
      return Invalid(field,
                     absl::StrCat("must be in [0, ", spec.tp_size, ") (tp_size), got ", rank));
    }
    auto [it, inserted] = ranks_seen.emplace(rank, i);
    if (!inserted) {
      return Invalid(field,
                     absl::StrCat("duplicate rank ", rank, " (also tp_ranks[", it->second, "])"));
    }
  }
  if (spec.pp_size < 1) {
    return Invalid("pp_size", absl::StrCat("must be >= 1, got ", spec.pp_size));
  }
  if (spec.pp_size > kMaxParallelSize) {
    return Invalid("pp_size",
                   absl::StrCat("must be <= ", kMaxParallelSize, ", got ", spec.pp_size));
  }
  if (spec.pp_rank < 0 || spec.pp_rank >= spec.pp_size) {
    return Invalid("pp_rank", absl::StrCat("must be in [0, ", spec.pp_size, ") (pp_size), got ",
                                           spec.pp_rank));
  }
  if (!OneOf(spec.dtype, kDtypes)) {
    return Invalid("dtype", absl::StrCat("must be one of ", absl::StrJoin(kDtypes, ", "), ", got ",
                                         Quote(spec.dtype)));
  }
  if (!OneOf(spec.quantization, kQuantizations)) {
    return Invalid("quantization",
                   absl::StrCat("must be one of ", absl::StrJoin(kQuantizations, ", "), ", got ",
                                Quote(spec.quantization)));
  }
  if (!OneOf(spec.layout, kLayouts)) {
    return Invalid("layout", absl::StrCat("must be one of ", absl::StrJoin(kLayouts, ", "),
                                          ", got ", Quote(spec.layout)));
  }
  if (!OneOf(spec.isolation, kIsolations)) {
    return Invalid("isolation",
                   absl::StrCat("model ", Quote(spec.name), ": must be one of ",
                                absl::StrJoin(kIsolations, ", "), ", got ", Quote(spec.isolation)));
  }
  WC_RETURN_IF_ERROR(ValidateNamespaces(spec));
  WC_RETURN_IF_ERROR(ValidateDigests(spec));
  WC_RETURN_IF_ERROR(ValidateSegmentDigests(spec));
  return ValidatePublishers(spec);
}

}  // namespace weightcache::spec
