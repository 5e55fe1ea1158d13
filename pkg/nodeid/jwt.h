// JSON Web Tokens as the Kubernetes API server signs them (RFC 7515/7519, compact form): the
// parts decoded, the issuer's keys read from its JWKS document (RFC 7517: RSA and EC P-256),
// and a signature checked with OpenSSL 3 (RS256, ES256; nothing else is accepted, "none" least
// of all). Claims are checked by the caller (service_account_token.h).
//
// Thread-safety: pure functions; a PublicKey may be shared by threads (OpenSSL keys are
// read-only once made).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

struct evp_pkey_st;

namespace weightcache::nodeid {

std::string Base64UrlEncode(std::string_view bytes);
// INVALID_ARGUMENT naming `what` for a character outside the URL-safe alphabet or a bad length.
absl::StatusOr<std::string> Base64UrlDecode(std::string_view text, const std::string& what);

// nlohmann::json members: its implicit members may throw only on a failed allocation.
// NOLINTNEXTLINE(bugprone-exception-escape)
struct Jwt {
  nlohmann::json header, claims;
  std::string signing_input;  // "<header>.<payload>" as received
  std::string signature;      // raw bytes
};
// INVALID_ARGUMENT naming the part that is not three base64url parts of JSON objects.
absl::StatusOr<Jwt> ParseJwt(std::string_view token);

// One key of the issuer's set, with the algorithm its type allows ("RS256" or "ES256").
struct PublicKey {
  std::string alg;
  std::shared_ptr<evp_pkey_st> key;
};
// kid -> key. Keys of other types or curves are skipped (an issuer may list more than this
// daemon accepts); INVALID_ARGUMENT when the document is not a JWKS or a key's fields are bad.
absl::StatusOr<std::map<std::string, PublicKey>> ParseJwks(std::string_view json);

// OK when `jwt`'s header alg is `key.alg` and its signature verifies; PERMISSION_DENIED naming
// what does not.
absl::Status VerifySignature(const Jwt& jwt, const PublicKey& key);

}  // namespace weightcache::nodeid
