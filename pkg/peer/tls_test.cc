// Reading the peer TLS files: each bad input named.
#include "pkg/peer/tls.h"

#include <fstream>

#include "gtest/gtest.h"
#include "pkg/peer/testing/test_ca.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::peer {
namespace {

class PeerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ca = testing::TestCa::Create(dir_.path(), "fleet");
    ASSERT_TRUE(ca.ok()) << ca.status();
    auto leaf = ca->Issue("node", kDefaultServerName);
    ASSERT_TRUE(leaf.ok()) << leaf.status();
    files_ = {leaf->cert_file, leaf->key_file, ca->ca_file()};
  }
  weightcache::testing::TempDir dir_;
  TlsFiles files_;
};

TEST_F(PeerTlsTest, ReadsTheThreeFiles) {
  auto m = ReadTls(files_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_NE(m->cert_pem.find("BEGIN CERTIFICATE"), std::string::npos);
  EXPECT_NE(m->key_pem.find("PRIVATE KEY"), std::string::npos);
  EXPECT_EQ(m->server_name, kDefaultServerName);
}

TEST_F(PeerTlsTest, EachBadFileIsNamed) {
  TlsFiles f = files_;
  f.key_file = "";
  EXPECT_EQ(ReadTls(f).status().message(), "peer TLS key is not set");
  f = files_;
  f.ca_file = dir_.path() + "/missing.crt";
  EXPECT_EQ(ReadTls(f).status().message(),
            "peer TLS CA " + dir_.path() + "/missing.crt: cannot be read");
  f = files_;
  f.cert_file = files_.key_file;  // a key where the certificate belongs
  EXPECT_EQ(ReadTls(f).status().message(),
            "peer TLS certificate " + files_.key_file + ": holds no PEM CERTIFICATE block");
  f = files_;
  f.key_file = files_.cert_file;
  EXPECT_EQ(ReadTls(f).status().code(), absl::StatusCode::kInvalidArgument);
  f = files_;
  f.ca_file = dir_.path();  // a directory: named, never read
  EXPECT_EQ(ReadTls(f).status().message(),
            "peer TLS CA " + dir_.path() + ": is a directory, not a regular file");
  f = files_;
  f.server_name = "";
  EXPECT_EQ(ReadTls(f).status().message(), "peer TLS server name is empty");
}

}  // namespace
}  // namespace weightcache::peer
