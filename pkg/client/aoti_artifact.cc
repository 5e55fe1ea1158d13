#include "pkg/client/aoti_artifact.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "pkg/util/log.h"
#include "proto/weightcache/v1/weightcache.pb.h"

namespace weightcache::client {
namespace {

constexpr char kMagicText[] = "WCAOTI01";
constexpr std::string_view kMagic = kMagicText;
constexpr int kFormat = 1;

absl::Status Bad(const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("AOTInductor artifact: ", why));
}

// The key's fields, in the order of the C struct and of Python's _FIELDS.
struct KeyField {
  const char* name;
  std::string* (*field)(v1::ArtifactKey&);
  const std::string& (*get)(const v1::ArtifactKey&);
};
#define WC_KEY_FIELD(f)                                                                 \
  KeyField {                                                                            \
#f, [](v1::ArtifactKey &                                                            \
           k) { return k.mutable_##f(); }, [](const v1::ArtifactKey& k)                 \
                                                -> const std::string& { return k.f(); } \
  }
const KeyField kKeyFields[] = {
    WC_KEY_FIELD(kind),           WC_KEY_FIELD(model),          WC_KEY_FIELD(fingerprint),
    WC_KEY_FIELD(engine),         WC_KEY_FIELD(engine_version), WC_KEY_FIELD(torch_version),
    WC_KEY_FIELD(triton_version), WC_KEY_FIELD(cuda_version),   WC_KEY_FIELD(compute_capability),
    WC_KEY_FIELD(settings_hash),
};
#undef WC_KEY_FIELD

// One JSON string as Python's json.dumps (ensure_ascii) writes it.
void AppendPythonJsonString(std::string& out, std::string_view s) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20) {
            absl::StrAppendFormat(&out, "\\u%04x", c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // UTF-8 to a code point, written as \uXXXX (a surrogate pair beyond the BMP).
    const int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    uint32_t cp = len == 4 ? c & 0x07 : len == 3 ? c & 0x0F : len == 2 ? c & 0x1F : c;
    bool ok = len > 1 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc & 0xC0) == 0x80;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {  // not UTF-8 (Python's strings always are): the byte as it is
      absl::StrAppendFormat(&out, "\\u%04x", c);
      ++i;
      continue;
    }
    if (cp >= 0x10000) {
      cp -= 0x10000;
      absl::StrAppendFormat(&out, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      absl::StrAppendFormat(&out, "\\u%04x", cp);
    }
    i += len;
  }
  out += '"';
}

absl::StatusOr<AotiConstant> ParseConstant(const nlohmann::json& e, std::string_view tail) {
  AotiConstant c;
  uint64_t offset = 0, nbytes = 0;
  try {
    c.fqn = e.at("fqn").get<std::string>();
    c.dtype = e.at("dtype").get<std::string>();
    c.shape = e.at("shape").get<std::vector<int64_t>>();
    offset = e.at("offset").get<uint64_t>();
    nbytes = e.at("nbytes").get<uint64_t>();
  } catch (const nlohmann::json::exception& err) {
    return Bad(absl::StrCat("bad constant entry ", e.dump(), ": ", err.what()));
  }
  if (offset > tail.size() || nbytes > tail.size() - offset) {
    return Bad(absl::StrCat("constant ", c.fqn, " (", c.dtype, ", ", nbytes, " bytes at ", offset,
                            ") lies outside the blob (", tail.size(),
                            " bytes follow the package)"));
  }
  c.bytes = tail.substr(offset, nbytes);
  return c;
}

}  // namespace

absl::StatusOr<AotiArtifact> ParseAotiArtifact(std::string_view blob) {
  if (blob.size() < kMagic.size() + 8 || blob.substr(0, kMagic.size()) != kMagic) {
    return Bad(absl::StrCat(blob.size(), " bytes without the ", kMagicText,
                            " header (not a weightcache.aoti artifact)"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(blob[kMagic.size() + i]);
  const size_t start = kMagic.size() + 8;
  if (n > blob.size() - start) {
    return Bad(absl::StrCat("header of ", n, " bytes, only ", blob.size() - start, " follow"));
  }
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(blob.substr(start, n));
  } catch (const nlohmann::json::exception& e) {
    return Bad(absl::StrCat("bad header: ", e.what()));
  }
  AotiArtifact out;
  uint64_t pkg_len = 0;
  nlohmann::json entries;
  try {
    if (const int format = h.at("format").get<int>(); format != kFormat) {
      return Bad(absl::StrCat("format ", format, ", this reader reads ", kFormat));
    }
    pkg_len = h.at("package_bytes").get<uint64_t>();
    for (const auto& [fqn, weight] : h.at("bindings").items()) {
      out.bindings.emplace(fqn, weight.get<std::string>());
    }
    entries = h.at("constants");
    if (!entries.is_array()) return Bad("bad header: \"constants\" is not a list");
  } catch (const nlohmann::json::exception& e) {
    return Bad(absl::StrCat("bad header: ", e.what()));
  }
  const size_t body = start + n;
  if (pkg_len > blob.size() - body) {
    return Bad(absl::StrCat("package of ", pkg_len, " bytes, only ", blob.size() - body,
                            " follow the header"));
  }
  out.package = blob.substr(body, pkg_len);
  const std::string_view tail = blob.substr(body + pkg_len);
  for (const auto& e : entries) {
    auto c = ParseConstant(e, tail);
    if (!c.ok()) return c.status();
    out.constants.push_back(*std::move(c));
  }
  return out;
}

absl::StatusOr<v1::ArtifactKey> ParseArtifactKeyJson(std::string_view json,
                                                     const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not JSON (an artifact key is a JSON object): ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": an artifact key is a JSON object, not ", j.type_name()));
  }
  v1::ArtifactKey key;
  std::vector<std::string> unknown, wrong;
  for (const auto& [name, value] : j.items()) {
    const KeyField* f = nullptr;
    for (const auto& k : kKeyFields) {
      if (name == k.name) f = &k;
    }
    if (f == nullptr) {
      unknown.push_back(name);
    } else if (!value.is_string()) {
      wrong.push_back(absl::StrCat(name, " (", value.type_name(), ")"));
    } else {
      *f->field(key) = value.get<std::string>();
    }
  }
  if (!unknown.empty() || !wrong.empty()) {
    std::vector<std::string> names;
    for (const auto& k : kKeyFields) names.emplace_back(k.name);
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", unknown.empty() ? "" : "unknown field(s) ", absl::StrJoin(unknown, ", "),
        !unknown.empty() && !wrong.empty() ? "; " : "",
        wrong.empty() ? "" : "not strings: ", absl::StrJoin(wrong, ", "),
        " (an artifact key's fields are ", absl::StrJoin(names, ", "), ", each a string)"));
  }
  if (key.kind().empty() || key.model().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": an artifact key names its kind and model (",
                     key.kind().empty() ? "kind" : "model", " is missing or empty)"));
  }
  return key;
}

std::string ArtifactKeyPythonJson(const v1::ArtifactKey& key) {
  std::vector<const KeyField*> sorted;
  for (const auto& k : kKeyFields) sorted.push_back(&k);
  std::sort(sorted.begin(), sorted.end(),
            [](const KeyField* a, const KeyField* b) { return std::strcmp(a->name, b->name) < 0; });
  std::string out = "{";
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i > 0) out += ", ";
    AppendPythonJsonString(out, sorted[i]->name);
    out += ": ";
    AppendPythonJsonString(out, sorted[i]->get(key));
  }
  out += "}";
  return out;
}

std::string AotiMarkerName(const v1::ArtifactKey& key) {
  const std::string text = ArtifactKeyPythonJson(key);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  WC_CHECK(EVP_Digest(text.data(), text.size(), md, &n, EVP_sha256(), nullptr) == 1);
  std::string hex;
  for (unsigned int i = 0; i < 16 && i < n; ++i) absl::StrAppendFormat(&hex, "%02x", md[i]);
  return hex;
}

}  // namespace weightcache::client
