#include "pkg/safetensors/internal/io.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pkg/util/bytes.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/untrusted_text.h"

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

std::string TensorPrefix(const std::string& path, const std::string& name) {
  return absl::StrCat(path, ": tensor '", EscapeTruncated(name), "'");
}

absl::Status CheckTensorName(const std::string& path, const std::string& name,
                             const Limits& limits) {
  if (name.size() > limits.max_name_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(TensorPrefix(path, name), ": name is ",
                                                   name.size(), " bytes, above the limit of ",
                                                   limits.max_name_bytes));
  }
  if (const size_t at = FindControlChar(name); at != std::string_view::npos) {
    const auto c = static_cast<unsigned char>(name[at]);
    const unsigned code = c == 0xC2 ? static_cast<unsigned char>(name[at + 1]) : c;
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: name holds control character U+%04X at byte %d", TensorPrefix(path, name), code, at));
  }
  return absl::OkStatus();
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
  return HexEncode(digest, digest_len);
}

}  // namespace weightcache::safetensors::internal
