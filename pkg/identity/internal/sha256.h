// One SHA-256 (OpenSSL's EVP: SHA-NI where the CPU has it, about 1.3 GB/s a core), owned:
// identity.cc's digests and sha256_file.cc's plain file hash. One thread at a time.
#pragma once

#include <openssl/evp.h>

#include <array>
#include <cstddef>
#include <string>

#include "pkg/util/bytes.h"
#include "pkg/util/log.h"

namespace weightcache::identity::internal {

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) { Reset(); }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Reset() { WC_CHECK(ctx_ != nullptr && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) == 1); }
  void Update(const void* p, size_t n) { WC_CHECK(EVP_DigestUpdate(ctx_, p, n) == 1); }
  std::array<unsigned char, 32> Final() {
    std::array<unsigned char, 32> d{};
    unsigned int n = 0;
    WC_CHECK(EVP_DigestFinal_ex(ctx_, d.data(), &n) == 1 && n == d.size());
    return d;
  }
  std::string HexFinal() {
    const auto d = Final();
    return HexEncode(d.data(), d.size());
  }

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace weightcache::identity::internal
