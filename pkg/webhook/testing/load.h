// Load for the webhook's tests and benchmark (issue 47): a self-signed serving pair, slow TLS
// clients that reconnect, and a good client that times one AdmissionReview.
//
// Thread-safety: SlowClients' methods are for the thread that made it; its clients run on
// their own threads until it is destroyed. The free functions are for any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace weightcache::webhook::testing {

// Writes a P-256 key and a self-signed certificate for 127.0.0.1 / localhost as `dir`/tls.key
// and `dir`/tls.crt.
absl::Status WriteSelfSignedPair(const std::string& dir);

// An AdmissionReview of a pod annotated weightcache.io/model (the webhook patches it).
std::string GoodReview();

// Sends GoodReview() to https://127.0.0.1:`port`/mutate on a fresh connection (the
// certificate is not verified) and returns how long the answer took; an error when there was no
// 200 answer with a patch within `timeout`.
absl::StatusOr<absl::Duration> TimeReview(int port, absl::Duration timeout);

// A TCP connection to 127.0.0.1:`port` from the local address `source` (e.g. 127.0.0.2); -1
// when it did not connect within 200 ms.
int ConnectFrom(const std::string& source, int port);

// `count` clients of 127.0.0.1:`port`, client i from 127.0.1.(1 + i % 250), each in a thread
// of its own, doing by i % 3:
//   0: a TLS record header announcing 16,000 bytes, then a byte every 100 ms;
//   1: a whole ClientHello (OpenSSL's), then nothing;
//   2: nothing at all after connecting.
// Each reconnects as soon as the server closes it, until destruction.
class SlowClients {
 public:
  SlowClients(int port, int count);
  ~SlowClients();
  SlowClients(const SlowClients&) = delete;
  SlowClients& operator=(const SlowClients&) = delete;

  // Waits until every client has connected at least `rounds` times; false after `timeout`.
  bool WaitConnected(int rounds, absl::Duration timeout) const;
  // Connections made so far, all clients together.
  int64_t connects() const { return connects_.load(); }

 private:
  void Client(int i);

  const int port_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> connects_{0};
  std::vector<std::atomic<int>> rounds_;
  std::vector<std::thread> threads_;
};

}  // namespace weightcache::webhook::testing
