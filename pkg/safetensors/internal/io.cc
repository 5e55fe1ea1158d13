#include "pkg/safetensors/internal/io.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "pkg/util/errno_status.h"

namespace weightcache::safetensors::internal {

absl::Status PreadFull(int fd, void* dst, uint64_t length, uint64_t offset, std::string_view what) {
  auto* out = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < length) {
    // Linux transfers at most 0x7ffff000 bytes per call; ask for no more than 1 GiB.
    const size_t want = static_cast<size_t>(std::min<uint64_t>(length - done, 1ull << 30));
    const ssize_t n = ::pread(fd, out + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "pread", what);
    }
    if (n == 0) {
      return absl::OutOfRangeError(
          absl::StrCat(std::string(what), ": read past end of file: wanted ", length,
                       " bytes at offset ", offset, ", file ends after ", done, " of them"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ReadChunk>> SplitReads(const std::vector<ReadRequest>& requests,
                                                  uint64_t chunk_bytes) {
  if (chunk_bytes == 0) chunk_bytes = 16ull << 20;
  std::vector<ReadChunk> chunks;
  for (size_t i = 0; i < requests.size(); ++i) {
    const ReadRequest& r = requests[i];
    if (r.length == 0) continue;
    if (r.fd < 0 || r.dst == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(r.what), ": read request without a descriptor or destination"));
    }
    uint64_t end = 0;
    if (__builtin_add_overflow(r.offset, r.length, &end) ||
        end > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(r.what), ": read of ", r.length,
                                                     " bytes at offset ", r.offset,
                                                     " overflows the file offset"));
    }
    for (uint64_t off = 0; off < r.length; off += chunk_bytes) {
      chunks.push_back({i, off, std::min(chunk_bytes, r.length - off)});
    }
  }
  return chunks;
}

absl::Status WriteAll(int fd, const void* data, size_t length, std::string_view what) {
  const auto* in = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < length) {
    const size_t want = std::min<size_t>(length - done, size_t{1} << 30);
    const ssize_t n = ::write(fd, in + done, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write", what);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

size_t FindInvalidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;  // continuation byte, overlong lead (C0, C1) or F5..FF
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

std::string Basename(const std::string& path) {
  std::string_view p(path);
  while (p.size() > 1 && p.back() == '/') p.remove_suffix(1);
  const size_t slash = p.rfind('/');
  return std::string(slash == std::string_view::npos ? p : p.substr(slash + 1));
}

absl::StatusOr<std::string> Sha256Hex(std::string_view a, std::string_view b) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0;
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), a.data(), a.size()) != 1 ||
      EVP_DigestUpdate(ctx.get(), b.data(), b.size()) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), digest, &digest_len) != 1) {
    return absl::InternalError("SHA-256 (OpenSSL EVP) failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * digest_len);
  for (unsigned int i = 0; i < digest_len; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xF]);
  }
  return hex;
}

}  // namespace weightcache::safetensors::internal
