// Test-only: a throwaway certificate authority (EC P-256, OpenSSL) and certificates it
// signs, written as PEM files, for tests of mutual TLS between daemons.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace weightcache::peer::testing {

struct PemFiles {
  std::string cert_file, key_file;
};

class TestCa {
 public:
  // A CA named `name`, its certificate and key written under `dir` as <name>-ca.{crt,key}.
  static absl::StatusOr<TestCa> Create(const std::string& dir, const std::string& name);
  // A certificate for both TLS server and client use, with DNS SAN `dns_name`, signed by this
  // CA: <dir>/<file_stem>.{crt,key}.
  absl::StatusOr<PemFiles> Issue(const std::string& file_stem, const std::string& dns_name) const;

  const std::string& ca_file() const { return ca_.cert_file; }

 private:
  std::string dir_, name_;
  PemFiles ca_;
};

}  // namespace weightcache::peer::testing
