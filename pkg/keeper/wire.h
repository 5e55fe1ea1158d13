// The keeper's wire format: messages on a Unix SOCK_SEQPACKET socket between the daemon
// (or weightcachectl) and weightcache-keeper. The keeper treats an entry as a key, an opaque
// body (the daemon's serialized record: manifest, fingerprint inputs, content identity,
// spec) and its segment descriptors; it never interprets the body.
//
// A message is a 24-byte header (magic "WCK1", op, status code, key length, body length,
// descriptor count), the key and the body, split into datagrams of at most kMaxChunkBytes.
// Its descriptors follow in datagrams of their own, at most kMaxFdsPerMessage each (one
// byte of payload), only when the receiver has agreed to take them (see server.h: a
// deposit is answered kProceed first, so a keeper at its descriptor limit refuses before
// any descriptor crosses).
//
// Thread-safety: free functions on a socket the caller owns; one message at a time per
// socket. Parsing (ParseHeader) is pure and bounded, so what a peer sends is checked before
// anything is allocated for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "pkg/util/scoped_fd.h"

namespace weightcache::keeper {

enum class Op : uint16_t {
  kDeposit = 1,  // key, body, nfds announced: keep (replacing an entry of the same key)
  kProceed = 2,  // keeper -> depositor: send the descriptors now
  kOk = 3,       // done (a deposit kept, a drop done; stats: the body)
  kError = 4,    // refused: code and the body (message)
  kDrop = 5,     // key: close the entry's descriptors
  kAdopt = 6,    // send every entry (kEntry each, then kEnd); the keeper keeps holding them
  kEntry = 7,    // key, body, nfds: followed by its descriptors
  kEnd = 8,      // end of an adopt listing; body: the entry count
  kStats = 9,    // answered kOk with "entries=N fds=N max_fds=N"
};
const char* OpName(Op op);

// What the keeper sends a peer it accepts, before any request (kOk with this body); a
// refused peer gets kError instead, then the connection closes.
inline constexpr const char* kGreeting = "weightcache-keeper 1";

inline constexpr size_t kHeaderBytes = 24;
inline constexpr size_t kMaxChunkBytes = 64 << 10;
inline constexpr size_t kMaxKeyBytes = 1024;
inline constexpr size_t kMaxBodyBytes = 256u << 20;  // manifests of the largest models
inline constexpr uint32_t kMaxFdsPerEntry = 1u << 16;

struct Message {
  Op op = Op::kOk;
  int code = 0;  // absl::StatusCode of a kError
  std::string key;
  std::string body;
  uint32_t nfds = 0;  // descriptors that follow (or that a deposit announces)
};
// A message of `op` with every other field at its default (no partial aggregate init).
inline Message MessageOf(Op op) {
  Message m;
  m.op = op;
  return m;
}

struct Header {
  Op op;
  int code;
  uint32_t key_bytes;
  uint32_t body_bytes;
  uint32_t nfds;
};
// The header at the start of `data`: INVALID_ARGUMENT naming the field when the magic, the
// op or a length is out of bounds.
absl::StatusOr<Header> ParseHeader(std::string_view data);

// Sends header, key and body (the descriptors go separately, SendFds).
absl::Status SendMessage(int sock, const Message& m);
// Receives one message (header, key, body). UNAVAILABLE when the peer closed.
absl::StatusOr<Message> RecvMessage(int sock);
// Sends `fds` (dup'ed by the kernel) in datagrams of at most kMaxFdsPerMessage.
absl::Status SendFds(int sock, const std::vector<int>& fds);
// Receives exactly `n` descriptors (close-on-exec). RESOURCE_EXHAUSTED when the kernel
// dropped some (this process at its descriptor limit).
absl::StatusOr<std::vector<ScopedFd>> RecvFds(int sock, uint32_t n);

// A kError message for `s`, and back.
Message ErrorMessage(const absl::Status& s);
absl::Status StatusOf(const Message& m);

}  // namespace weightcache::keeper
