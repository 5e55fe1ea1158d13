#include "pkg/integrity/crypto_digest.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/escaping.h"

namespace weightcache::integrity {
namespace {

constexpr char kRootPrefix[] = "weightcache sha256-tree v1";

void Sha256Of(const void* p, size_t n, unsigned char* out) {
  unsigned int len = 0;
  if (EVP_Digest(p, n, out, &len, EVP_sha256(), nullptr) != 1 || len != kSha256Bytes) {
    std::fprintf(stderr, "weightcache: OpenSSL's SHA-256 failed\n");
    std::abort();  // no digest is better than a wrong one
  }
}

}  // namespace

std::string ChunkHashHost(const std::byte* p, uint64_t n) {
  unsigned char leaves[kLeavesPerChunk * kSha256Bytes];
  size_t count = 0;
  for (uint64_t off = 0; off < n; off += kLeafBytes, ++count) {
    Sha256Of(p + off, std::min(kLeafBytes, n - off), leaves + count * kSha256Bytes);
  }
  std::string out(kSha256Bytes, '\0');
  Sha256Of(leaves, count * kSha256Bytes, reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

std::string TreeRoot(uint64_t size, const std::string& chunk_hashes) {
  std::string in(kRootPrefix);
  for (int i = 0; i < 8; ++i) in.push_back(static_cast<char>((size >> (8 * i)) & 0xff));
  in += chunk_hashes;
  std::string out(kSha256Bytes, '\0');
  Sha256Of(in.data(), in.size(), reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

std::string CryptoDigestHost(const std::byte* p, uint64_t size) {
  std::string chunks;
  chunks.reserve(ChunkCount(size) * kSha256Bytes);
  for (uint64_t off = 0; off < size; off += kChunkBytes) {
    chunks += ChunkHashHost(p + off, std::min(kChunkBytes, size - off));
  }
  return TreeRoot(size, chunks);
}

std::string CryptoDigestText(const std::string& raw) {
  if (raw.empty()) return "none";
  return "sha256t:" + absl::BytesToHexString(raw);
}

}  // namespace weightcache::integrity
