#include "pkg/nodeid/node_identity.h"

#include <openssl/sha.h>

#include "absl/strings/str_cat.h"
#include "pkg/util/bytes.h"

namespace weightcache::nodeid {

std::string PeerAudience(const std::string& receiver_node, const std::string& nonce,
                         const std::string& claim) {
  return absl::StrCat(kAudiencePrefix, receiver_node, "/", nonce, "/", claim);
}

std::string ClaimOf(const std::string& answer) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(answer.data()), answer.size(), md);
  return HexEncode(md, sizeof(md));
}

std::string NewNonce() { return RandomHex(16); }

absl::Status CheckNodeName(const std::string& name, const std::string& what) {
  if (name.empty() || name.size() > 253) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a node name of ", name.size(), " characters (1 to 253 allowed)"));
  }
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": '", name, "' is not a node name (lower-case letters, digits, '-' and '.')"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNonce(const std::string& nonce, const std::string& what) {
  if (nonce.size() < 32 || nonce.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a nonce of ", nonce.size(), " characters (32 to 128 hex digits)"));
  }
  for (char c : nonce) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the nonce holds a character that is not a lower-case hex digit"));
    }
  }
  return absl::OkStatus();
}

}  // namespace weightcache::nodeid
