// A per-test temporary directory, removed with everything in it on destruction.
// Paths are short (under /tmp) so Unix socket paths inside stay below 108 bytes.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace weightcache::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/wc.XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) ::abort();
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  std::string File(const std::string& name) const { return *this / name; }

 private:
  std::string path_;
};

}  // namespace weightcache::testing
