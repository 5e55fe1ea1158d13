#include "pkg/safetensors/internal/json.h"

#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/safetensors/internal/io.h"

namespace weightcache::safetensors::internal {

absl::StatusOr<nlohmann::json> ParseStrictJson(std::string_view text, const std::string& what) {
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not valid UTF-8 (ill-formed byte 0x",
                     absl::Hex(static_cast<unsigned char>(text[bad]), absl::kZeroPad2),
                     " at offset ", bad, ")"));
  }
  // nlohmann keeps the last of duplicate keys; a strict reader must refuse them (two
  // entries for one tensor name would make the file mean different things to different
  // readers).
  std::vector<std::set<std::string>> open_objects;
  std::optional<std::string> duplicate;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    switch (event) {
      case nlohmann::json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case nlohmann::json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case nlohmann::json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && !duplicate) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON: ", e.what()));
  }
  if (duplicate) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has duplicate key '", *duplicate, "'"));
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
