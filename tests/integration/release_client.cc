// Test helper: Release(lease_id) through the client library; prints "OK" or the status.
//   wc_release_client SOCKET_DIR LEASE_ID
#include <cstdio>

#include "pkg/client/client.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  auto c = weightcache::client::Client::Connect(argv[1]);
  if (!c.ok()) {
    std::printf("%s\n", c.status().ToString().c_str());
    return 1;
  }
  auto s = (*c)->Release(argv[2]);
  std::printf("%s\n", s.ok() ? "OK" : s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
