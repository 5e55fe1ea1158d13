#include "pkg/safetensors/internal/json.h"

#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/safetensors/internal/io.h"
#include "pkg/util/untrusted_text.h"

namespace weightcache::safetensors::internal {
namespace {

// SAX handler that records the first key repeated within one object; parse errors throw
// (as nlohmann::json::parse does) so both passes report them the same way.
struct DuplicateKeyFinder {
  using json = nlohmann::json;
  std::vector<std::set<std::string>> open_objects;
  std::optional<std::string> duplicate;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    open_objects.emplace_back();
    return true;
  }
  bool key(json::string_t& k) {
    if (!open_objects.empty() && !open_objects.back().insert(k).second && !duplicate) {
      duplicate = k;
    }
    return true;
  }
  bool end_object() {
    if (!open_objects.empty()) open_objects.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const json::exception& ex) {
    throw ex;  // rethrown as the concrete type below by nlohmann's own parse
  }
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseStrictJson(std::string_view text, const std::string& what) {
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not valid UTF-8 (ill-formed byte 0x",
                     absl::Hex(static_cast<unsigned char>(text[bad]), absl::kZeroPad2),
                     " at offset ", bad, ")"));
  }
  if (BracketNestingDepth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    return absl::InvalidArgumentError(absl::StrCat(what, " nests arrays/objects deeper than ",
                                                   kMaxJsonDepth, " levels (refused unparsed)"));
  }
  // nlohmann keeps the last of duplicate keys; a strict reader must refuse them (two
  // entries for one tensor name would make the file mean different things to different
  // readers). A SAX pass finds them in linear time (nlohmann's callback parser rescans the
  // parent object at every nested object's end: quadratic in the tensor count).
  DuplicateKeyFinder finder;
  nlohmann::json value;
  try {
    nlohmann::json::sax_parse(text.begin(), text.end(), &finder);
    if (!finder.duplicate) value = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    // nlohmann quotes the offending token, which may be most of the header.
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not valid JSON: ", EscapeTruncated(e.what(), 256)));
  }
  const std::optional<std::string>& duplicate = finder.duplicate;
  if (duplicate) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has duplicate key '", EscapeTruncated(*duplicate), "'"));
  }
  return value;
}

std::string Brief(const nlohmann::json& value) {
  std::string s = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  constexpr size_t kMax = 80;
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

}  // namespace weightcache::safetensors::internal
