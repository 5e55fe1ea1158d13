// Keys, ids and the records that describe artifacts (store.h).
#include <sys/types.h>

#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/artifact/store.h"
#include "pkg/identity/identity.h"

namespace weightcache::artifact {
namespace {

constexpr size_t kMaxField = 256;

// Every field of a key, in the order the id hashes them (const or not, as `k` is).
template <typename K>
auto Fields(K& k) {
  using S = std::conditional_t<std::is_const_v<K>, const std::string, std::string>;
  return std::vector<std::pair<const char*, S*>>{{"kind", &k.kind},
                                                 {"model", &k.model},
                                                 {"fingerprint", &k.fingerprint},
                                                 {"engine", &k.engine},
                                                 {"engine_version", &k.engine_version},
                                                 {"torch_version", &k.torch_version},
                                                 {"triton_version", &k.triton_version},
                                                 {"cuda_version", &k.cuda_version},
                                                 {"compute_capability", &k.compute_capability},
                                                 {"settings_hash", &k.settings_hash},
                                                 {"tenant", &k.tenant}};
}

}  // namespace

absl::Status ValidateKey(const Key& key) {
  for (const auto& [name, value] : Fields(key)) {
    if (value->size() > kMaxField) {
      return absl::InvalidArgumentError(absl::StrCat("artifact key field '", name, "' is ",
                                                     value->size(), " bytes; at most ", kMaxField));
    }
    for (const char c : *value) {
      if (c <= ' ' || c > '~') {
        return absl::InvalidArgumentError(
            absl::StrCat("artifact key field '", name,
                         "' holds a character that is not printable ASCII or is a space (byte ",
                         static_cast<int>(static_cast<unsigned char>(c)), ")"));
      }
    }
  }
  for (const auto* required : {"kind", "model", "fingerprint"}) {
    for (const auto& [name, value] : Fields(key)) {
      if (std::string_view(name) == required && value->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("artifact key field '", name, "' is required"));
      }
    }
  }
  return absl::OkStatus();
}

std::string IdOf(const Key& key) {
  std::string encoded;
  for (const auto& [name, value] : Fields(key)) {
    absl::StrAppend(&encoded, name, "=", value->size(), ":", *value, ";");
  }
  return "art-" + identity::Sha256Hex(encoded);
}

std::string EncodeRecord(const Artifact& a) {
  nlohmann::json key;
  for (const auto& [name, value] : Fields(a.key())) key[name] = *value;
  const nlohmann::json j = {{"format", 1},
                            {"id", a.id()},
                            {"key", key},
                            {"bytes", a.bytes()},
                            {"sha256", a.sha256()},
                            {"publisher",
                             {{"pid", a.publisher().pid},
                              {"uid", a.publisher().uid},
                              {"slot", a.publisher().slot},
                              {"unix_seconds", a.publisher().unix_seconds},
                              {"admin", a.publisher().admin}}}};
  return j.dump(1);
}

absl::StatusOr<Record> DecodeRecord(std::string_view json) {
  Record r;
  try {
    const auto j = nlohmann::json::parse(json);
    if (j.at("format").get<int>() != 1) {
      return absl::InvalidArgumentError("artifact record: format is not 1");
    }
    for (const auto& [name, value] : Fields(r.key)) {
      *value = j.at("key").at(name).get<std::string>();
    }
    r.id = j.at("id").get<std::string>();
    r.bytes = j.at("bytes").get<uint64_t>();
    r.sha256 = j.at("sha256").get<std::string>();
    r.publisher.pid = j.at("publisher").at("pid").get<pid_t>();
    r.publisher.uid = j.at("publisher").at("uid").get<uid_t>();
    r.publisher.slot = j.at("publisher").at("slot").get<std::string>();
    r.publisher.unix_seconds = j.at("publisher").at("unix_seconds").get<double>();
    // Records before issue 47 have no "admin": not an admin's put.
    r.publisher.admin = j.at("publisher").value("admin", false);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("artifact record: ", e.what()));
  }
  if (auto v = ValidateKey(r.key); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("artifact record: ", v.message()));
  }
  if (IdOf(r.key) != r.id) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact record: id ", r.id, " is not its key's (", IdOf(r.key), ")"));
  }
  if (r.bytes == 0 || r.sha256.size() != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact record ", r.id, ": bytes must be > 0 and sha256 64 hex digits"));
  }
  return r;
}

}  // namespace weightcache::artifact
