#pragma once
// Byte vocabulary several units share: sizes rounded up to an alignment, bytes as hex text.
// Pure functions, callable from any thread.

#include <cstddef>
#include <cstdint>
#include <string>

namespace weightcache {

// `v` rounded up to a multiple of `alignment` (> 0): segment sizes to a backend's granularity,
// offsets inside a segment to a tensor's alignment.
constexpr uint64_t RoundUp(uint64_t v, uint64_t alignment) {
  return (v + alignment - 1) / alignment * alignment;
}

// Lower-case hex of `n` bytes at `data`, two characters a byte (digests, tokens).
std::string HexEncode(const void* data, size_t n);

// `bytes` (at most 256) random bytes from getrandom(2), as hex: ids and one-time tokens.
// getrandom, not /dev/urandom: it needs no descriptor, so it works when the daemon's are
// exhausted by a connection flood (issue 26).
std::string RandomHex(size_t bytes);

}  // namespace weightcache
