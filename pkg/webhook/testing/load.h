// Load for the webhook's tests and benchmark (issues 47, 56): a self-signed serving pair, slow TLS
// clients that reconnect, a good client that times one AdmissionReview, and a TLS client that
// sends raw bytes (a head and no body) and reads the raw answer.
//
// Thread-safety: SlowClients' methods are for the thread that made it; its clients run on
// their own threads until it is destroyed. A TlsClient is for one thread at a time. The free
// functions are for any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct ssl_st;

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

// A TLS connection from the local address `source` to 127.0.0.1:`port` (the certificate is not
// verified) that sends and reads raw HTTP.
class TlsClient {
 public:
  // Connects and completes the handshake; nullptr when either fails within `timeout`.
  static std::unique_ptr<TlsClient> Connect(const std::string& source, int port,
                                            absl::Duration timeout);
  ~TlsClient();
  TlsClient(const TlsClient&) = delete;
  TlsClient& operator=(const TlsClient&) = delete;

  bool Send(std::string_view bytes);
  // What the server sends until it closes the connection (then `closed` is true) or `timeout`
  // passes.
  std::string Receive(absl::Duration timeout, bool& closed);

 private:
  TlsClient(int fd, ssl_st* ssl) : fd_(fd), ssl_(ssl) {}
  int fd_;
  ssl_st* ssl_;
};

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
