#include "pkg/spec/spec.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/spec/internal/fields.h"
#include "pkg/spec/internal/read_file.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/untrusted_text.h"

namespace weightcache::spec {
using internal::Invalid;
using internal::Quote;
namespace {

// Keys of one spec, in the order ToYaml writes them.
constexpr const char* kKeys[] = {"version",
                                 "name",
                                 "model_dir",
                                 "architecture",
                                 "revision",
                                 "tp_size",
                                 "tp_ranks",
                                 "pp_size",
                                 "pp_rank",
                                 "dtype",
                                 "quantization",
                                 "layout",
                                 "allowed_namespaces",
                                 "isolation",
                                 "publishers",
                                 "native_publishers",
                                 "digests",
                                 "segment_digests"};

std::string KnownKeys() { return absl::StrJoin(kKeys, ", "); }

bool IsKnownKey(const std::string& key) {
  for (const char* k : kKeys) {
    if (key == k) return true;
  }
  return false;
}

// Prefixes `status` with "<source>: <path>." so that a field error reads
// "specs.yaml: models[1].tp_size: must be >= 1, got 0".
absl::Status InContext(const absl::Status& status, const std::string& source,
                       const std::string& path) {
  if (status.ok()) return status;
  std::string prefix = path.empty() ? source + ": " : absl::StrCat(source, ": ", path, ".");
  return absl::Status(status.code(), prefix + std::string(status.message()));
}

// Strict decimal integer: optional '-', digits, nothing else, within int range.
bool ParseInt(const std::string& text, int* out) {
  if (text.empty()) return false;
  long long value = 0;  // NOLINT(google-runtime-int): from_chars overload
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) return false;
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    return false;
  }
  *out = static_cast<int>(value);
  return true;
}

// ---- Setting fields from text (shared by the YAML and the flag forms) ----

// What a raw value looks like before it is typed.
struct RawScalar {
  std::string text;
  bool quoted = false;  // a YAML/JSON string literal: never an integer
};

absl::Status SetInt(const std::string& key, const RawScalar& raw, int* out) {
  if (raw.quoted || !ParseInt(raw.text, out)) {
    return Invalid(key, absl::StrCat("must be an integer, got ", raw.quoted ? "string " : "",
                                     Quote(raw.text)));
  }
  return absl::OkStatus();
}

// Sets the scalar field `key` of `spec` (every key but tp_ranks).
absl::Status SetScalar(const std::string& key, const RawScalar& raw, ModelSpec* spec) {
  if (key == "version") return SetInt(key, raw, &spec->version);
  if (key == "tp_size") return SetInt(key, raw, &spec->tp_size);
  if (key == "pp_size") return SetInt(key, raw, &spec->pp_size);
  if (key == "pp_rank") return SetInt(key, raw, &spec->pp_rank);
  std::string* field = nullptr;
  if (key == "name") field = &spec->name;
  if (key == "model_dir") field = &spec->model_dir;
  if (key == "architecture") field = &spec->architecture;
  if (key == "revision") field = &spec->revision;
  if (key == "dtype") field = &spec->dtype;
  if (key == "quantization") field = &spec->quantization;
  if (key == "layout") field = &spec->layout;
  if (key == "isolation") field = &spec->isolation;
  if (field == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown key ", Quote(key), " (known: ", KnownKeys(), ")"));
  }
  *field = raw.text;
  return absl::OkStatus();
}

// ---- YAML ----

std::string NodeKind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return Quote(node.Scalar());
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

// A scalar that may be an integer: plain, or explicitly tagged !!int.
RawScalar ToRaw(const YAML::Node& node) {
  const std::string& tag = node.Tag();
  return RawScalar{node.Scalar(), tag != "?" && tag != "tag:yaml.org,2002:int"};
}

// A YAML list of scalars under `key` (tp_ranks, allowed_namespaces): `add` takes each item
// with its key "key[i]"; `list` and `item` describe the expected values in errors.
absl::Status ForEachScalar(
    const std::string& key, const YAML::Node& value, const char* list, const char* item,
    const std::function<absl::Status(const std::string&, const YAML::Node&)>& add) {
  if (!value.IsSequence()) {
    return Invalid(key, absl::StrCat("must be ", list, ", got ", NodeKind(value)));
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string item_key = absl::StrCat(key, "[", i, "]");
    if (!value[i].IsScalar()) {
      return Invalid(item_key, absl::StrCat("must be ", item, ", got ", NodeKind(value[i])));
    }
    WC_RETURN_IF_ERROR(add(item_key, value[i]));
  }
  return absl::OkStatus();
}

// `digests:`, a mapping of file name to SHA-256; hex digits are lowercased (sha256sum prints
// lowercase, some tools uppercase) so that one digest has one spelling in the fingerprint.
// What the names and values must be is Validate's.
absl::Status SetDigests(const YAML::Node& value, ModelSpec* spec) {
  if (!value.IsMap()) {
    return Invalid("digests", absl::StrCat("must be a mapping of checkpoint file name to its "
                                           "SHA-256, got ",
                                           NodeKind(value)));
  }
  spec->digests.clear();
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!it->first.IsScalar()) {
      return Invalid("digests", absl::StrCat("keys must be file names, got ", NodeKind(it->first)));
    }
    const std::string file = it->first.Scalar();
    const std::string field = absl::StrCat("digests[", Quote(file), "]");
    if (!it->second.IsScalar()) {
      return Invalid(field,
                     absl::StrCat("must be a SHA-256 (64 hex digits), got ", NodeKind(it->second)));
    }
    std::string digest = it->second.Scalar();
    for (auto& c : digest) {
      if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');
    }
    if (!spec->digests.emplace(file, std::move(digest)).second) {
      return Invalid(field, "duplicate file name");
    }
  }
  return absl::OkStatus();
}

// `segment_digests:`, a mapping of fingerprint to the list of its segments' digests; hex
// digits lowercased. What they must be is Validate's.
absl::Status SetSegmentDigests(const YAML::Node& value, ModelSpec* spec) {
  if (!value.IsMap()) {
    return Invalid("segment_digests",
                   absl::StrCat("must be a mapping of fingerprint to the list of its segments' "
                                "digests, got ",
                                NodeKind(value)));
  }
  spec->segment_digests.clear();
  auto lower = [](std::string s) {
    for (auto& c : s) {
      if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');
    }
    return s;
  };
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!it->first.IsScalar()) {
      return Invalid("segment_digests",
                     absl::StrCat("keys must be fingerprints, got ", NodeKind(it->first)));
    }
    const std::string fp = lower(it->first.Scalar());
    const std::string field = absl::StrCat("segment_digests[", Quote(fp), "]");
    if (!it->second.IsSequence()) {
      return Invalid(field,
                     absl::StrCat("must be a list of segment digests, got ", NodeKind(it->second)));
    }
    std::vector<std::string> list;
    for (size_t i = 0; i < it->second.size(); ++i) {
      if (!it->second[i].IsScalar()) {
        return Invalid(
            absl::StrCat(field, "[", i, "]"),
            absl::StrCat("must be a digest (64 hex digits), got ", NodeKind(it->second[i])));
      }
      list.push_back(lower(it->second[i].Scalar()));
    }
    if (!spec->segment_digests.emplace(fp, std::move(list)).second) {
      return Invalid(field, "duplicate fingerprint");
    }
  }
  return absl::OkStatus();
}

absl::Status SetFromNode(const std::string& key, const YAML::Node& value, ModelSpec* spec) {
  if (value.IsNull()) return absl::OkStatus();  // an explicit null keeps the default
  if (key == "digests") return SetDigests(value, spec);
  if (key == "segment_digests") return SetSegmentDigests(value, spec);
  if (key == "publishers" || key == "native_publishers") {
    auto& list = key == "publishers" ? spec->publishers : spec->native_publishers;
    list.clear();
    return ForEachScalar(key, value, "a list of namespace names and uid:<n>",
                         "a namespace name or uid:<n>",
                         [&](const std::string&, const YAML::Node& item) {
                           list.push_back(item.Scalar());
                           return absl::OkStatus();
                         });
  }
  if (key == "allowed_namespaces") {
    spec->allowed_namespaces.clear();
    return ForEachScalar(key, value, "a list of namespace names", "a namespace name",
                         [&](const std::string&, const YAML::Node& item) {
                           spec->allowed_namespaces.push_back(item.Scalar());
                           return absl::OkStatus();
                         });
  }
  if (key == "tp_ranks") {
    spec->tp_ranks.clear();
    return ForEachScalar(key, value, "a list of integers", "an integer",
                         [&](const std::string& item_key, const YAML::Node& item) {
                           int rank = 0;
                           WC_RETURN_IF_ERROR(SetInt(item_key, ToRaw(item), &rank));
                           spec->tp_ranks.push_back(rank);
                           return absl::OkStatus();
                         });
  }
  if (!value.IsScalar()) {
    bool is_int = key == "version" || key == "tp_size" || key == "pp_size" || key == "pp_rank";
    return Invalid(key, absl::StrCat("must be ", is_int ? "an integer" : "a string", ", got ",
                                     NodeKind(value)));
  }
  return SetScalar(key, ToRaw(value), spec);
}

// One spec mapping; `path` is "" for a single-spec file or "models[i]".
absl::StatusOr<ModelSpec> SpecFromNode(const YAML::Node& node, const std::string& source,
                                       const std::string& path) {
  const std::string where = path.empty() ? source : absl::StrCat(source, ": ", path);
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a spec must be a mapping, got ", NodeKind(node)));
  }
  ModelSpec spec;
  std::set<std::string> seen;
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (!it->first.IsScalar()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": keys must be strings, got ", NodeKind(it->first)));
    }
    const std::string key = it->first.Scalar();
    if (!IsKnownKey(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown key ", Quote(key), " (known: ", KnownKeys(), ")"));
    }
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate key ", Quote(key)));
    }
    WC_RETURN_IF_ERROR(InContext(SetFromNode(key, it->second, &spec), source, path));
  }
  WC_RETURN_IF_ERROR(InContext(Validate(spec), source, path));
  return spec;
}

// A limit below exceeded (told apart from malformed YAML).
class SpecLimitExceeded : public YAML::ParserException {
 public:
  using YAML::ParserException::ParserException;
};

// Counts the YAML events of a document without building nodes and throws (a
// YAML::ParserException, marked where it happened) once collections nest deeper than
// kMaxSpecDepth or the document holds more than kMaxSpecNodes nodes. yaml-cpp's own depth
// guard stops only at 2000 levels, after hundreds of MB of nodes.
class SpecShapeLimit : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& /*mark*/) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t /*anchor*/) override { Node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t /*anchor*/) override { Node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string& /*tag*/, YAML::anchor_t /*anchor*/,
                const std::string& /*value*/) override {
    Node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string& /*tag*/,
                       YAML::anchor_t /*anchor*/, YAML::EmitterStyle::value /*style*/) override {
    Enter(mark);
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& mark, const std::string& /*tag*/, YAML::anchor_t /*anchor*/,
                  YAML::EmitterStyle::value /*style*/) override {
    Enter(mark);
  }
  void OnMapEnd() override { --depth_; }

 private:
  void Node(const YAML::Mark& mark) {
    if (++nodes_ > kMaxSpecNodes) {
      throw SpecLimitExceeded(
          mark, absl::StrCat("more than ", kMaxSpecNodes, " values (refused unparsed)"));
    }
  }
  void Enter(const YAML::Mark& mark) {
    Node(mark);
    if (++depth_ > kMaxSpecDepth) {
      throw SpecLimitExceeded(mark,
                              absl::StrCat("lists and mappings nested deeper than ", kMaxSpecDepth,
                                           " levels (a spec needs 4; refused unparsed)"));
    }
  }
  size_t depth_ = 0;
  size_t nodes_ = 0;
};

absl::Status MalformedYaml(const YAML::Exception& e, const std::string& source) {
  // yaml-cpp's marks are 0-based.
  return absl::InvalidArgumentError(absl::StrCat(
      source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": malformed YAML/JSON: ", e.msg));
}

// The size and shape limits, checked before YAML::Load builds any node.
absl::Status CheckSpecText(const std::string& text, const std::string& source) {
  if (text.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": spec text is ", text.size(),
                                                   " bytes, above the limit of ", kMaxSpecBytes,
                                                   " (refused unparsed)"));
  }
  // yaml-cpp's scanner reads ahead through every '[' of "[[[[..." before its parser sees the
  // first one (hundreds of MB for 900 KiB): bound the flow nesting before yaml-cpp sees it.
  if (BracketNestingDepth(text, kMaxSpecDepth) > kMaxSpecDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": lists and mappings nested deeper than ", kMaxSpecDepth,
                     " levels (a spec needs 4; refused unparsed)"));
  }
  std::istringstream in(text);
  YAML::Parser parser(in);
  SpecShapeLimit limit;
  try {
    parser.HandleNextDocument(limit);
  } catch (const SpecLimitExceeded& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  } catch (const YAML::Exception& e) {
    return MalformedYaml(e, source);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<ModelSpec>> ParseSpecs(const std::string& text,
                                                  const std::string& source) {
  WC_RETURN_IF_ERROR(CheckSpecText(text, source));
  YAML::Node loaded;
  try {
    loaded = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return MalformedYaml(e, source);
  }
  const YAML::Node& root = loaded;  // const: lookups must never insert
  if (root.IsNull()) return absl::InvalidArgumentError(source + ": empty, expected a spec");
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a spec mapping or `models:`, got ", NodeKind(root)));
  }

  std::vector<ModelSpec> specs;
  if (!root["models"]) {
    WC_ASSIGN_OR_RETURN(ModelSpec spec, SpecFromNode(root, source, ""));
    specs.push_back(std::move(spec));
    return specs;
  }

  // A list: `models:` must be the only top-level key, so a misplaced spec key is not ignored.
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : NodeKind(it->first);
    if (key != "models") {
      return absl::InvalidArgumentError(absl::StrCat(source, ": unknown key ", Quote(key),
                                                     " beside `models:` (keys go in each model)"));
    }
  }
  if (root.size() != 1) {
    return absl::InvalidArgumentError(source + ": duplicate key \"models\"");
  }
  const YAML::Node models = root["models"];
  // An empty list is valid: a daemon that knows no model yet (the Helm chart's default).
  if (!models.IsSequence()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": models: must be a list, got ", NodeKind(models)));
  }
  std::map<std::string, size_t> names;
  for (size_t i = 0; i < models.size(); ++i) {
    const std::string path = absl::StrCat("models[", i, "]");
    WC_ASSIGN_OR_RETURN(ModelSpec spec, SpecFromNode(models[i], source, path));
    auto [it, inserted] = names.emplace(spec.name, i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", path, ".name: duplicate name ",
                                                     Quote(spec.name), " (also models[", it->second,
                                                     "])"));
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

absl::StatusOr<std::vector<ModelSpec>> LoadSpecFile(const std::string& path) {
  WC_ASSIGN_OR_RETURN(std::string text, internal::ReadTextFile(path));
  return ParseSpecs(text, path);
}

absl::StatusOr<ModelSpec> ParseSpecFlag(const std::string& flag) {
  const std::string source = "flag";
  ModelSpec spec;
  std::set<std::string> seen;
  std::string last_key;
  size_t start = 0;
  while (start <= flag.size()) {
    size_t comma = flag.find(',', start);
    if (comma == std::string::npos) comma = flag.size();
    const std::string item = flag.substr(start, comma - start);
    start = comma + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      // "tp_ranks=0,1,2", "allowed_namespaces=a,b": a bare value continues the list.
      if (last_key == "allowed_namespaces" && !item.empty()) {
        spec.allowed_namespaces.push_back(item);
        continue;
      }
      if (last_key == "publishers" && !item.empty()) {
        spec.publishers.push_back(item);
        continue;
      }
      if (last_key == "native_publishers" && !item.empty()) {
        spec.native_publishers.push_back(item);
        continue;
      }
      if (last_key == "tp_ranks" && !item.empty()) {
        int rank = 0;
        WC_RETURN_IF_ERROR(InContext(
            SetInt(absl::StrCat("tp_ranks[", spec.tp_ranks.size(), "]"), RawScalar{item}, &rank),
            source, ""));
        spec.tp_ranks.push_back(rank);
        continue;
      }
      if (item.empty() && flag.empty()) break;
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": expected key=value, got ", Quote(item)));
    }
    const std::string key = item.substr(0, eq);
    const std::string value = item.substr(eq + 1);
    if (!IsKnownKey(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": unknown key ", Quote(key), " (known: ", KnownKeys(), ")"));
    }
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": duplicate key ", Quote(key)));
    }
    last_key = key;
    if (key == "digests" || key == "segment_digests") {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", key,
                       ": a mapping, which the flag form cannot hold; pin digests in a spec file "
                       "(--spec_file)"));
    }
    if (key == "allowed_namespaces") {
      spec.allowed_namespaces.clear();
      if (!value.empty()) spec.allowed_namespaces.push_back(value);
      continue;
    }
    if (key == "publishers" || key == "native_publishers") {
      auto& list = key == "publishers" ? spec.publishers : spec.native_publishers;
      list.clear();
      if (!value.empty()) list.push_back(value);
      continue;
    }
    if (key == "tp_ranks") {
      spec.tp_ranks.clear();
      if (value.empty()) continue;  // "tp_ranks=": all ranks
      int rank = 0;
      WC_RETURN_IF_ERROR(InContext(SetInt("tp_ranks[0]", RawScalar{value}, &rank), source, ""));
      spec.tp_ranks.push_back(rank);
      continue;
    }
    WC_RETURN_IF_ERROR(InContext(SetScalar(key, RawScalar{value}, &spec), source, ""));
  }
  WC_RETURN_IF_ERROR(InContext(Validate(spec), source, ""));
  return spec;
}

std::string ToYaml(const ModelSpec& spec) {
  // Strings are always double-quoted so that values such as "null", "1" or "a: b" come back
  // as the same strings; integers are plain.
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "version" << YAML::Value << spec.version;
  out << YAML::Key << "name" << YAML::Value << YAML::DoubleQuoted << spec.name;
  out << YAML::Key << "model_dir" << YAML::Value << YAML::DoubleQuoted << spec.model_dir;
  out << YAML::Key << "architecture" << YAML::Value << YAML::DoubleQuoted << spec.architecture;
  out << YAML::Key << "revision" << YAML::Value << YAML::DoubleQuoted << spec.revision;
  out << YAML::Key << "tp_size" << YAML::Value << spec.tp_size;
  out << YAML::Key << "tp_ranks" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (int rank : spec.tp_ranks) out << rank;
  out << YAML::EndSeq;
  out << YAML::Key << "pp_size" << YAML::Value << spec.pp_size;
  out << YAML::Key << "pp_rank" << YAML::Value << spec.pp_rank;
  out << YAML::Key << "dtype" << YAML::Value << YAML::DoubleQuoted << spec.dtype;
  out << YAML::Key << "quantization" << YAML::Value << YAML::DoubleQuoted << spec.quantization;
  out << YAML::Key << "layout" << YAML::Value << YAML::DoubleQuoted << spec.layout;
  // Only when set: the canonical YAML of an open model stays what it always was.
  if (!spec.allowed_namespaces.empty()) {
    out << YAML::Key << "allowed_namespaces" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const auto& ns : spec.allowed_namespaces) out << YAML::DoubleQuoted << ns;
    out << YAML::EndSeq;
  }
  if (spec.isolation != kIsolationShared) {
    out << YAML::Key << "isolation" << YAML::Value << YAML::DoubleQuoted << spec.isolation;
  }
  if (!spec.publishers.empty()) {
    out << YAML::Key << "publishers" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const auto& p : spec.publishers) out << YAML::DoubleQuoted << p;
    out << YAML::EndSeq;
  }
  if (!spec.native_publishers.empty()) {
    out << YAML::Key << "native_publishers" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const auto& p : spec.native_publishers) out << YAML::DoubleQuoted << p;
    out << YAML::EndSeq;
  }
  if (!spec.digests.empty()) {
    out << YAML::Key << "digests" << YAML::Value << YAML::BeginMap;
    for (const auto& [file, digest] : spec.digests) {
      out << YAML::Key << YAML::DoubleQuoted << file << YAML::Value << YAML::DoubleQuoted << digest;
    }
    out << YAML::EndMap;
  }
  if (!spec.segment_digests.empty()) {
    out << YAML::Key << "segment_digests" << YAML::Value << YAML::BeginMap;
    for (const auto& [fp, list] : spec.segment_digests) {
      out << YAML::Key << YAML::DoubleQuoted << fp << YAML::Value << YAML::Flow << YAML::BeginSeq;
      for (const auto& d : list) out << YAML::DoubleQuoted << d;
      out << YAML::EndSeq;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace weightcache::spec
