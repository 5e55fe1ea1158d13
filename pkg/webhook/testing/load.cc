#include "pkg/webhook/testing/load.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace weightcache::webhook::testing {
namespace {

absl::Status WritePem(const std::string& path, const std::function<int(FILE*)>& write) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return absl::InternalError(absl::StrCat(path, ": cannot create"));
  const int ok = write(f);
  std::fclose(f);
  return ok == 1 ? absl::OkStatus() : absl::InternalError(absl::StrCat(path, ": PEM write"));
}

// Waits up to 100 ms for the server; false once it closed the connection (data it sends, such
// as a ServerHello, is read and dropped).
bool StillOpen(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 100) <= 0) return true;
  char buf[4096];
  return ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0;
}

}  // namespace

absl::Status WriteSelfSignedPair(const std::string& dir) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), &X509_free);
  if (key == nullptr || cert == nullptr) return absl::InternalError("EC key or X509 not made");
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 86400);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509_EXTENSION* san =
      X509V3_EXT_conf_nid(nullptr, nullptr, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1");
  X509_add_ext(cert.get(), san, -1);
  X509_EXTENSION_free(san);
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) {
    return absl::InternalError("X509_sign failed");
  }
  if (absl::Status s = WritePem(dir + "/tls.key",
                                [&](FILE* f) {
                                  return PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0,
                                                              nullptr, nullptr);
                                });
      !s.ok()) {
    return s;
  }
  return WritePem(dir + "/tls.crt", [&](FILE* f) { return PEM_write_X509(f, cert.get()); });
}

int ConnectFrom(const std::string& source, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const timeval limit{0, 200 * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source.c_str(), &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string GoodReview() {
  return R"({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
  "request": {"uid": "u-47", "operation": "CREATE",
    "kind": {"group": "", "version": "v1", "kind": "Pod"},
    "object": {"apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": "engine", "annotations": {"weightcache.io/model": "llama-8b"}},
      "spec": {"containers": [{"name": "engine", "image": "vllm"}]}}}})";
}

absl::StatusOr<absl::Duration> TimeReview(int port, absl::Duration timeout) {
  const auto limit = absl::ToChronoMilliseconds(timeout);
  const absl::Time start = absl::Now();
  httplib::SSLClient client("127.0.0.1", port);
  client.enable_server_certificate_verification(false);
  client.set_tcp_nodelay(true);  // as Go's net/http (the API server): no Nagle wait on the body
  client.set_connection_timeout(limit);
  client.set_read_timeout(limit);
  client.set_write_timeout(limit);
  httplib::Result res = client.Post("/mutate", GoodReview(), "application/json");
  const absl::Duration took = absl::Now() - start;
  if (!res) {
    return absl::UnavailableError(absl::StrCat("review: no answer after ",
                                               absl::FormatDuration(took), ": ",
                                               httplib::to_string(res.error())));
  }
  if (res->status != 200 || res->body.find("\"uid\":\"u-47\"") == std::string::npos ||
      res->body.find("\"patch\"") == std::string::npos) {
    return absl::InternalError(
        absl::StrCat("review: answered ", res->status, " without the patch: ", res->body));
  }
  if (took > timeout) {
    return absl::DeadlineExceededError(
        absl::StrCat("review: answered after ", absl::FormatDuration(took)));
  }
  return took;
}

std::unique_ptr<TlsClient> TlsClient::Connect(const std::string& source, int port,
                                              absl::Duration timeout) {
  static SSL_CTX* const ctx = SSL_CTX_new(TLS_client_method());  // shared, never freed
  const int fd = ConnectFrom(source, port);
  if (fd < 0) return nullptr;
  const timeval limit = absl::ToTimeval(timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1 || SSL_connect(ssl) != 1) {
    SSL_free(ssl);
    ::close(fd);
    return nullptr;
  }
  return std::unique_ptr<TlsClient>(new TlsClient(fd, ssl));
}

TlsClient::~TlsClient() {
  SSL_free(ssl_);
  ::close(fd_);
}

bool TlsClient::Send(std::string_view bytes) {
  while (!bytes.empty()) {
    const int n = SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size()));
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string TlsClient::Receive(absl::Duration timeout, bool& closed) {
  const absl::Time until = absl::Now() + timeout;
  std::string got;
  closed = false;
  char buf[4096];
  for (;;) {
    if (SSL_pending(ssl_) == 0) {
      pollfd p{fd_, POLLIN, 0};
      const int left = static_cast<int>(absl::ToInt64Milliseconds(until - absl::Now()));
      if (left <= 0 || ::poll(&p, 1, left) != 1) return got;
    }
    const int n = SSL_read(ssl_, buf, sizeof(buf));
    if (n > 0) {
      got.append(buf, static_cast<size_t>(n));
    } else if (SSL_get_error(ssl_, n) != SSL_ERROR_WANT_READ) {
      closed = true;  // close_notify, end of stream or a reset
      return got;
    }
  }
}

SlowClients::SlowClients(int port, int count) : port_(port), rounds_(count) {
  for (int i = 0; i < count; ++i) threads_.emplace_back([this, i] { Client(i); });
}

SlowClients::~SlowClients() {
  stop_ = true;
  for (std::thread& t : threads_) t.join();
}

bool SlowClients::WaitConnected(int rounds, absl::Duration timeout) const {
  const absl::Time until = absl::Now() + timeout;
  for (const std::atomic<int>& r : rounds_) {
    while (r.load() < rounds) {
      if (absl::Now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a poll of counters
    }
  }
  return true;
}

void SlowClients::Client(int i) {
  const std::string source = absl::StrCat("127.0.1.", 1 + i % 250);
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()),
                                                        &SSL_CTX_free);
  while (!stop_) {
    const int fd = ConnectFrom(source, port_);
    if (fd < 0) continue;
    ++connects_;
    ++rounds_[static_cast<size_t>(i)];
    std::unique_ptr<SSL, decltype(&SSL_free)> ssl(nullptr, &SSL_free);
    bool open = true;
    if (i % 3 == 0) {
      open = ::send(fd, "\x16\x03\x01\x3e\x80", 5, MSG_NOSIGNAL) == 5;
    } else if (i % 3 == 1) {
      ssl.reset(SSL_new(ctx.get()));
      SSL_set_fd(ssl.get(), fd);
      const timeval once{0, 1};  // SSL_connect sends the ClientHello and gives up waiting
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &once, sizeof(once));
      SSL_connect(ssl.get());
    }
    while (open && !stop_ && StillOpen(fd)) {
      if (i % 3 == 0) open = ::send(fd, "\x00", 1, MSG_NOSIGNAL) == 1;
    }
    ssl.reset();
    ::close(fd);
  }
}

}  // namespace weightcache::webhook::testing
