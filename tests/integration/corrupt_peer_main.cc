// wc_corrupt_peer: the corrupt fleet member of pkg/peer/testing/corrupt_peer.h as a process of
// its own, for tests that run it in a network namespace. Prints "ready <port>" once it serves,
// then serves until its stdin closes.
//   wc_corrupt_peer <listen> <cert> <key> <ca> <honest host:port> <fingerprint> <bad segment>
// (its one certificate serves both as server and as client: a fleet member's).
#include <cstdio>
#include <iostream>
#include <string>

#include "pkg/peer/testing/corrupt_peer.h"

int main(int argc, char** argv) {
  using namespace weightcache::peer;
  if (argc != 8) {
    std::fprintf(stderr,
                 "usage: %s <listen> <cert> <key> <ca> <honest host:port> <fingerprint> "
                 "<bad segment>\n",
                 argv[0]);
    return 2;
  }
  const TlsFiles files{argv[2], argv[3], argv[4]};
  auto tls = ReadTls(files);
  if (!tls.ok()) {
    std::fprintf(stderr, "wc_corrupt_peer: %s\n", std::string(tls.status().message()).c_str());
    return 1;
  }
  testing::CorruptPeerOptions o;
  o.listen = argv[1];
  o.server_files = files;
  o.client_tls = *tls;
  o.honest_address = argv[5];
  o.fingerprint = argv[6];
  o.bad_segment = std::stoi(argv[7]);
  auto peer = testing::CorruptPeer::Start(o);
  if (!peer.ok()) {
    std::fprintf(stderr, "wc_corrupt_peer: %s\n", std::string(peer.status().message()).c_str());
    return 1;
  }
  std::printf("ready %d\n", (*peer)->port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}
