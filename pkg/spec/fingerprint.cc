#include "pkg/spec/fingerprint.h"

#include <openssl/evp.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/util/bytes.h"
#include "pkg/util/log.h"

namespace weightcache::spec {
namespace {

// First line of Canonical(); bumped when the encoding itself changes.
constexpr const char* kFormatLine = "weightcache-fingerprint=2";

// The tensor layout that Canonical() leaves out (the only one before the field existed).
constexpr const char* kDefaultTensorLayout = "hf";

// Hashes are shown by this many hex digits in FormatDiff when that tells them apart.
constexpr size_t kShortHash = 12;

// Percent-escapes every byte that the line structure relies on ('\n' ends a line, '=' ends
// a key, '[' and ']' delimit a file name, '%' is the escape itself) and every other control
// byte, so that no field value can forge another line or field: the encoding is injective.
std::string Escape(const std::string& value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(value.size());
  for (char ch : value) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f || c == '%' || c == '=' || c == '[' || c == ']') {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    } else {
      out.push_back(ch);
    }
  }
  return out;
}

bool FileLess(const FileDigest& a, const FileDigest& b) {
  return std::tie(a.name, a.size, a.content) < std::tie(b.name, b.size, b.content);
}

bool FileEqual(const FileDigest& a, const FileDigest& b) {
  return a.name == b.name && a.size == b.size && a.content == b.content;
}

// The non-file fields, in canonical order, as (field, value) pairs.
std::vector<std::pair<std::string, std::string>> HeadFields(const FingerprintInputs& in) {
  return {{"architecture", in.architecture}, {"revision", in.revision}};
}

std::vector<std::pair<std::string, std::string>> TailFields(const FingerprintInputs& in) {
  return {
      {"tp_size", absl::StrCat(in.layout.tp_size)},
      {"tp_rank", absl::StrCat(in.layout.tp_rank)},
      {"pp_size", absl::StrCat(in.layout.pp_size)},
      {"pp_rank", absl::StrCat(in.layout.pp_rank)},
      {"tensor_layout",
       in.tensor_layout.empty() ? std::string(kDefaultTensorLayout) : in.tensor_layout},
      {"quant_method", in.quant_method},
      {"quant_config_sha256", in.quant_config_sha256},
      {"dtype", in.dtype},
      {"compute_capability", in.env.compute_capability},
      {"loader_format_version", absl::StrCat(in.env.loader_format_version)},
      {"engine", in.env.engine},
      {"engine_version", in.env.engine_version},
      {"framework_version", in.env.framework_version},
      {"recipe", in.env.recipe},
      {"tenant", in.env.tenant},
  };
}

// The files grouped by name, each group sorted; names in byte order.
std::map<std::string, std::vector<FileDigest>> FilesByName(const FingerprintInputs& in) {
  std::map<std::string, std::vector<FileDigest>> by_name;
  for (const FileDigest& f : in.files) by_name[f.name].push_back(f);
  for (auto& [name, group] : by_name) std::sort(group.begin(), group.end(), FileLess);
  return by_name;
}

std::string DescribeFiles(const std::vector<FileDigest>& group) {
  if (group.empty()) return "absent";
  std::vector<std::string> parts;
  for (const FileDigest& f : group) {
    parts.push_back(absl::StrCat("size ", f.size, " content ", f.content));
  }
  return absl::StrJoin(parts, " + ");
}

void AddIfDifferent(const std::string& field, const std::string& cached, const std::string& asked,
                    std::vector<FieldDiff>* out) {
  if (cached != asked) out->push_back(FieldDiff{field, cached, asked});
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string ShowValue(const std::string& value) { return value.empty() ? "\"\"" : value; }

}  // namespace

std::string FingerprintInputs::Canonical() const {
  std::vector<FileDigest> sorted = files;
  std::sort(sorted.begin(), sorted.end(), FileLess);
  std::string out = absl::StrCat(kFormatLine, "\n");
  for (const auto& [field, value] : HeadFields(*this)) {
    absl::StrAppend(&out, field, "=", Escape(value), "\n");
  }
  for (const FileDigest& f : sorted) {
    const std::string name = Escape(f.name);
    absl::StrAppend(&out, "file[", name, "].size=", f.size, "\n");
    absl::StrAppend(&out, "file[", name, "].content=", Escape(f.content), "\n");
  }
  for (const auto& [field, value] : TailFields(*this)) {
    if (field == "tensor_layout" && value == kDefaultTensorLayout) continue;
    // Published weights' fields: absent from the encoding when empty (loaded weights).
    // and a private copy's namespace: absent for shared entries.
    if ((field == "framework_version" || field == "recipe" || field == "tenant") && value.empty()) {
      continue;
    }
    absl::StrAppend(&out, field, "=", Escape(value), "\n");
  }
  return out;
}

std::string FingerprintInputs::Digest() const {
  const std::string canonical = Canonical();
  return Sha256Hex(canonical.data(), canonical.size());
}

std::vector<FieldDiff> Diff(const FingerprintInputs& cached, const FingerprintInputs& asked) {
  std::vector<FieldDiff> out;
  const auto cached_head = HeadFields(cached);
  const auto asked_head = HeadFields(asked);
  for (size_t i = 0; i < cached_head.size(); ++i) {
    AddIfDifferent(cached_head[i].first, cached_head[i].second, asked_head[i].second, &out);
  }

  // Files by name over the union of both sides.
  const auto cached_files = FilesByName(cached);
  const auto asked_files = FilesByName(asked);
  std::map<std::string, std::pair<std::vector<FileDigest>, std::vector<FileDigest>>> all;
  for (const auto& [name, group] : cached_files) all[name].first = group;
  for (const auto& [name, group] : asked_files) all[name].second = group;
  for (const auto& [name, sides] : all) {
    const auto& [c, a] = sides;
    const std::string prefix = absl::StrCat("files[", name, "]");
    if (c.size() == 1 && a.size() == 1) {
      AddIfDifferent(prefix + ".size", absl::StrCat(c[0].size), absl::StrCat(a[0].size), &out);
      AddIfDifferent(prefix + ".content", c[0].content, a[0].content, &out);
    } else if (!std::equal(c.begin(), c.end(), a.begin(), a.end(), FileEqual)) {
      // Present on one side only (or listed more than once): describe the whole entry.
      out.push_back(FieldDiff{prefix, DescribeFiles(c), DescribeFiles(a)});
    }
  }

  const auto cached_tail = TailFields(cached);
  const auto asked_tail = TailFields(asked);
  for (size_t i = 0; i < cached_tail.size(); ++i) {
    AddIfDifferent(cached_tail[i].first, cached_tail[i].second, asked_tail[i].second, &out);
  }
  return out;
}

std::string FormatDiff(const std::vector<FieldDiff>& diffs) {
  std::vector<std::string> parts;
  parts.reserve(diffs.size());
  for (const FieldDiff& d : diffs) {
    std::string cached = d.cached;
    std::string asked = d.asked;
    // Abbreviate hashes when the short forms still differ.
    if ((EndsWith(d.field, "sha256") || EndsWith(d.field, ".content")) &&
        cached.substr(0, kShortHash) != asked.substr(0, kShortHash)) {
      if (cached.size() > kShortHash) cached = cached.substr(0, kShortHash) + "...";
      if (asked.size() > kShortHash) asked = asked.substr(0, kShortHash) + "...";
    }
    parts.push_back(
        absl::StrCat(d.field, ": cached ", ShowValue(cached), ", asked ", ShowValue(asked)));
  }
  return absl::StrJoin(parts, "; ");
}

std::string Sha256Hex(const void* data, size_t size) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  // Fails only if OpenSSL itself is broken (no SHA-256, out of memory): a bug, not input.
  WC_CHECK(EVP_Digest(data, size, md, &md_len, EVP_sha256(), nullptr) == 1);
  WC_CHECK(md_len == 32);
  return HexEncode(md, md_len);
}

}  // namespace weightcache::spec
