#include "pkg/webhook/server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "pkg/util/log.h"
#include "pkg/util/untrusted_text.h"
#include "pkg/webhook/internal/front.h"
#include "pkg/webhook/mutate.h"

namespace weightcache::webhook {

struct KeyPair {
  X509* cert = nullptr;
  STACK_OF(X509) * chain = nullptr;
  EVP_PKEY* key = nullptr;
  KeyPair() = default;
  KeyPair(const KeyPair&) = delete;
  KeyPair& operator=(const KeyPair&) = delete;
  ~KeyPair() {
    X509_free(cert);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
  }
};

namespace {

constexpr size_t kMaxPemBytes = 1 << 20;

// OpenSSL's queued errors as text (and the queue emptied).
std::string SslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? "no OpenSSL error queued" : out;
}

absl::StatusOr<std::string> ReadPem(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::string text(kMaxPemBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxPemBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": larger than ", kMaxPemBytes, " bytes"));
  }
  return text;
}

using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;

absl::StatusOr<std::shared_ptr<const KeyPair>> LoadPair(const std::string& cert_file,
                                                        const std::string& key_file) {
  absl::StatusOr<std::string> cert_pem = ReadPem(cert_file);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadPem(key_file);
  if (!key_pem.ok()) return key_pem.status();
  ERR_clear_error();
  auto pair = std::make_shared<KeyPair>();
  Bio cert_bio(BIO_new_mem_buf(cert_pem->data(), static_cast<int>(cert_pem->size())), &BIO_free);
  pair->cert = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr);
  if (pair->cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert_file, ": no PEM certificate: ", SslErrors()));
  }
  pair->chain = sk_X509_new_null();
  while (X509* extra = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr)) {
    sk_X509_push(pair->chain, extra);
  }
  ERR_clear_error();  // the loop ends on "no start line"
  Bio key_bio(BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size())), &BIO_free);
  pair->key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
  if (pair->key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_file, ": no PEM private key: ", SslErrors()));
  }
  if (X509_check_private_key(pair->cert, pair->key) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(key_file, ": the key does not match ", cert_file,
                                                   "'s certificate: ", SslErrors()));
  }
  return std::shared_ptr<const KeyPair>(std::move(pair));
}

// Identity of a file's current content: a replaced file (new inode) or a rewritten one
// (mtime, size) changes it.
std::string Stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return absl::StrCat("error ", errno);
  return absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec,
                      ":", st.st_size);
}

// Validates "IPv4:port"; returns the host and port.
absl::StatusOr<std::pair<std::string, int>> ParseAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  in_addr ip{};
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port > 65535 || inet_pton(AF_INET, address.substr(0, colon).c_str(), &ip) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("webhook address ", QuoteTruncated(address),
                                                   ": want IPv4:port, e.g. 0.0.0.0:8443"));
  }
  return std::pair{address.substr(0, colon), static_cast<int>(port)};
}

constexpr const char* kText = "text/plain; charset=utf-8";

// Registers /mutate and /healthz and the error and exception handlers.
void Route(httplib::Server& http, uint64_t max_body_bytes, const MutateOptions& mutate) {
  http.Post("/mutate", [mutate](const httplib::Request& req, httplib::Response& res) {
    absl::StatusOr<std::string> answer = ReviewAdmission(req.body, mutate);
    if (!answer.ok()) {
      WC_LOG_WARN("webhook: /mutate from %s: %s", req.remote_addr,
                  std::string(answer.status().message()));
      res.status = 400;
      res.set_content(absl::StrCat(answer.status().message(), "\n"), kText);
      return;
    }
    res.set_content(*answer, "application/json");
  });
  http.Get("/healthz",
           [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", kText); });
  http.set_error_handler(
      [limit = max_body_bytes](const httplib::Request& req, httplib::Response& res) {
        if (res.status == 413) {
          res.set_content(absl::StrCat("request body larger than ", limit, " bytes\n"), kText);
        } else if (res.status == 404) {
          res.set_content(absl::StrCat("no ", req.method, " ", QuoteTruncated(req.path),
                                       " here: POST /mutate, GET /healthz\n"),
                          kText);
        }
      });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(std::move(ep));
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        WC_LOG_ERROR("webhook: internal error: %s", what);
        res.status = 500;
        res.set_content(absl::StrCat("webhook internal error: ", what, "\n"), kText);
      });
}

}  // namespace

// httplib's request parsing, routing and response writing, run by the front's workers on a
// connection whose TLS session the front set up (httplib never listens here).
class Router : public httplib::Server {
 public:
  bool Serve(httplib::Stream& stream, bool close, bool& closed) {
    return process_request(stream, close, closed, nullptr);
  }
};

Server::Server(ServerOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  absl::StatusOr<std::pair<std::string, int>> address = ParseAddress(options.address);
  if (!address.ok()) return address.status();
  if (options.num_threads < 1 || options.request_timeout_ms < 1 ||
      options.connection_deadline_ms < 1 || options.handshake_timeout_ms < 1 ||
      options.listen_backlog < 1 || options.max_connections < 1 ||
      options.max_connections_per_source < 1 || options.max_queued_per_source < 1 ||
      options.queue_deadline_ms < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "webhook: num_threads (", options.num_threads, "), request_timeout_ms (",
        options.request_timeout_ms, "), connection_deadline_ms (", options.connection_deadline_ms,
        "), handshake_timeout_ms (", options.handshake_timeout_ms, "), listen_backlog (",
        options.listen_backlog, "), max_connections (", options.max_connections,
        "), max_connections_per_source (", options.max_connections_per_source,
        "), max_queued_per_source (", options.max_queued_per_source, ") and queue_deadline_ms (",
        options.queue_deadline_ms, ") must be >= 1"));
  }
  std::unique_ptr<Server> server(new Server(std::move(options)));
  const ServerOptions& o = server->options_;
  server->stamp_ = Stamp(o.cert_file) + "|" + Stamp(o.key_file);
  absl::StatusOr<std::shared_ptr<const KeyPair>> pair = LoadPair(o.cert_file, o.key_file);
  if (!pair.ok()) return pair.status();
  {
    absl::MutexLock lock(&server->mu_);
    server->pair_ = *std::move(pair);
  }

  // Every handshake takes the current pair through the certificate callback.
  server->ctx_ = {SSL_CTX_new(TLS_server_method()), &SSL_CTX_free};
  SSL_CTX* ctx = server->ctx_.get();
  if (ctx == nullptr || SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
    return absl::InternalError(absl::StrCat("webhook: TLS context: ", SslErrors()));
  }
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);  // idle connections keep no 16 KiB buffers
  Server* self = server.get();
  SSL_CTX_set_cert_cb(ctx, &Server::CertCallback, self);

  server->router_ = std::make_unique<Router>();
  Router& router = *server->router_;
  router.set_payload_max_length(o.max_body_bytes);
  router.set_keep_alive_timeout(5);
  Route(router, o.max_body_bytes, o.mutate);

  internal::FrontOptions f;
  f.listen_backlog = o.listen_backlog;
  f.handshake_timeout_ms = o.handshake_timeout_ms;
  f.request_deadline_ms = o.connection_deadline_ms;
  f.io_timeout_ms = o.request_timeout_ms;
  f.idle_timeout_ms = 5000;
  f.max_connections = o.max_connections;
  f.max_connections_per_source = o.max_connections_per_source;
  f.num_threads = o.num_threads;
  f.max_body_bytes = o.max_body_bytes;
  f.buffer_budget_bytes = o.buffer_budget_bytes;
  f.max_queued_per_source = o.max_queued_per_source;
  f.queue_deadline_ms = o.queue_deadline_ms;
  const auto& [host, port] = *address;
  absl::StatusOr<std::unique_ptr<internal::Front>> front = internal::Front::Start(
      host, port, ctx, f, [&router](httplib::Stream& s, bool close, bool& closed) {
        return router.Serve(s, close, closed);
      });
  if (!front.ok()) return front.status();
  server->front_ = *std::move(front);
  server->port_ = server->front_->port();
  server->watcher_ = std::thread([self] { self->Watch(); });
  WC_LOG_INFO("webhook: serving HTTPS /mutate /healthz on %s (port %d), certificate %s", o.address,
              server->port_, o.cert_file);
  return server;
}

Server::~Server() {
  stop_.Notify();
  if (watcher_.joinable()) watcher_.join();
  front_.reset();  // joins its threads before the router and the context go
}

ConnectionStats Server::connection_stats() const { return front_->stats(); }

int Server::reloads() const {
  absl::MutexLock lock(&mu_);
  return reloads_;
}

std::shared_ptr<const KeyPair> Server::current() const {
  absl::MutexLock lock(&mu_);
  return pair_;
}

void Server::Watch() {
  while (!stop_.WaitForNotificationWithTimeout(options_.reload_interval)) MaybeReload();
}

void Server::MaybeReload() {
  const std::string stamp = Stamp(options_.cert_file) + "|" + Stamp(options_.key_file);
  if (stamp == stamp_) return;
  stamp_ = stamp;  // a bad pair is reported once per change, not on every poll
  absl::StatusOr<std::shared_ptr<const KeyPair>> pair =
      LoadPair(options_.cert_file, options_.key_file);
  if (!pair.ok()) {
    WC_LOG_ERROR("webhook: certificate changed but not loaded (still serving the previous one): %s",
                 std::string(pair.status().message()));
    return;
  }
  absl::MutexLock lock(&mu_);
  pair_ = *std::move(pair);
  ++reloads_;
  WC_LOG_INFO("webhook: serving the new certificate from %s (reload %d)", options_.cert_file,
              reloads_);
}

int Server::CertCallback(ssl_st* ssl, void* self) {
  std::shared_ptr<const KeyPair> pair = static_cast<Server*>(self)->current();
  // Takes its own references: the pair may be replaced while this connection lives.
  return SSL_use_cert_and_key(ssl, pair->cert, pair->key, pair->chain, 1) == 1 ? 1 : 0;
}

}  // namespace weightcache::webhook
