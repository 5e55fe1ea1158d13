// The peer API (internal/peer_api.h, proto/weightcache/v1/peer.proto) for other nodes'
// daemons: its own gRPC server, mutual TLS required (pkg/peer/tls.h: a peer is whoever presents a
// certificate the fleet CA signed), and Describe: the record of a ready entry, so the asker can
// fill its own copy and check every segment against the digests in it. The TCP port is the
// PeerPort's (pkg/server/wire/peer_port.h, issue 47): it accepts, caps the connections in all and
// per source address, closes those without a handshake by a deadline, and relays the bytes to the
// gRPC server, which does the TLS on a Unix socket in a private directory (gRPC 1.51 takes no
// accepted descriptor with TLS credentials). What is described: only shared entries (a namespace's
// private copy is that tenant's on this node) filled from a checkpoint (disk, a keeper adoption,
// another device, another node): an engine's published weights are the publisher's claim on this
// node, which another node has no way to check against a checkpoint.
#include "pkg/server/internal/peer_api.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/nodeid/service_account_token.h"
#include "pkg/peer/tls.h"
#include "pkg/peer/ucx_transfer.h"
#include "pkg/server/internal/grpc_status.h"
#include "pkg/server/keeper/keeper_record.h"
#include "pkg/server/wire/peer_port.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/log.h"
#include "pkg/util/status_macros.h"
#include "weightcache/v1/peer.grpc.pb.h"

namespace weightcache::server {
namespace {

std::string HostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

// The asker's node and nonce (peer.proto), when it asks for a node token: INVALID_ARGUMENT
// naming the field that is malformed.
absl::Status CheckTokenAsk(const v1::PeerDescribeRequest& req) {
  if (req.asker_node().empty() && req.nonce().empty()) return absl::OkStatus();
  WC_RETURN_IF_ERROR(nodeid::CheckNodeName(req.asker_node(), "asker_node"));
  return nodeid::CheckNonce(req.nonce(), "nonce");
}

class PeerService final : public v1::WeightCachePeer::Service {
 public:
  PeerService(PeerApi* api, std::string server_name)
      : api_(api), server_name_(std::move(server_name)) {}

  grpc::Status Describe(grpc::ServerContext* ctx, const v1::PeerDescribeRequest* req,
                        v1::PeerDescribeResponse* resp) override {
    // gRPC sees the relay's Unix socket; the port knows the TCP source behind it.
    const std::string who = api_->SourceOf(ctx->peer());
    // The CA may sign other certificates too (a webhook's, an operator's): a peer is one
    // that carries the fleet's peer name (issue 48).
    if (!peer::CarriesPeerName(*ctx->auth_context(), server_name_)) {
      const std::string name = peer::CertificateName(*ctx->auth_context());
      WC_LOG_WARN("peer %s: refused: its certificate '%s' does not carry the peer name '%s'", who,
                  name, server_name_);
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("certificate '", name, "' does not carry the fleet's peer ",
                                       "name '", server_name_, "' as a DNS SAN: not a peer"));
    }
    // A malformed ask for a node token is refused before anything is exposed.
    if (absl::Status t = CheckTokenAsk(*req); !t.ok()) {
      WC_LOG_WARN("peer %s: refused: %s", who, std::string(t.message()));
      return ToGrpc(ctx, t);
    }
    auto r = api_->Describe(req->fingerprint(), req->transfer());
    if (r.ok()) api_->AddNodeToken(*req, &*r);
    if (!r.ok()) {
      WC_LOG_INFO("peer %s: describe %s: %s", who, req->fingerprint().substr(0, 12),
                  std::string(r.status().message()));
      return ToGrpc(ctx, r.status());
    }
    WC_LOG_INFO("peer %s (%s): described %s (%s, %.1f MiB%s)", who,
                peer::CertificateName(*ctx->auth_context()), req->fingerprint().substr(0, 12),
                r->source(), static_cast<double>(r->total_bytes()) / (1 << 20),
                req->transfer() ? ", exposed for a pull" : "");
    *resp = std::move(r).value();
    return grpc::Status::OK;
  }

 private:
  PeerApi* const api_;
  const std::string server_name_;
};

}  // namespace

PeerApi::PeerApi(PeerOptions options, std::chrono::milliseconds shutdown_grace, Sources sources)
    : options_(std::move(options)), shutdown_grace_(shutdown_grace), sources_(std::move(sources)) {}

PeerApi::~PeerApi() { Stop(); }

absl::StatusOr<v1::PeerDescribeResponse> PeerApi::Describe(const std::string& fingerprint,
                                                           bool transfer) {
  if (fingerprint.empty()) return absl::InvalidArgumentError("fingerprint is empty");
  const cache::Registry& registry = *sources_.registry;
  for (const auto& e : registry.FindAll(fingerprint)) {
    if (!e->inputs.env.tenant.empty() || e->source == "publish") continue;
    auto content = registry.Content(e);
    if (!content.ok()) continue;  // loading, failed, draining or corrupt
    const auto digests = registry.Digests(e);
    v1::PeerDescribeResponse resp;
    resp.set_record(EncodeKeeperRecord(*e, **content, memory::BackendName(sources_.backend),
                                       sources_.spec_of(e->model), nullptr, digests.get()));
    resp.set_node(HostName());
    resp.set_source(e->source);
    resp.set_total_bytes((*content)->resident_bytes());
    if (transfer) {
      WC_RETURN_IF_ERROR(exposures_->Expose(*std::move(content), resp.mutable_transfer()));
    }
    return resp;
  }
  return absl::NotFoundError(
      absl::StrCat("no ready shared entry with fingerprint ", fingerprint.substr(0, 12)));
}

void PeerApi::AddNodeToken(const v1::PeerDescribeRequest& req, v1::PeerDescribeResponse* resp) {
  // Certificate identities (or no token asked): none to give.
  if (tokens_ == nullptr || req.nonce().empty()) return;
  const std::string audience =
      nodeid::PeerAudience(req.asker_node(), req.nonce(), nodeid::ClaimOf(resp->record()));
  auto token = tokens_->Token(audience);
  if (!token.ok()) {
    WC_LOG_WARN("peer API: no node token for %s's call: %s", req.asker_node(),
                std::string(token.status().message()));
    return;
  }
  resp->set_node_token(*std::move(token));
}

std::string PeerApi::SourceOf(const std::string& grpc_peer) const {
  // Set once the port runs, after gRPC started (anyone reaching gRPC's socket directly
  // would call before).
  const PeerPort* port = listener_.load();
  return port != nullptr ? port->SourceOf(grpc_peer) : grpc_peer;
}

namespace {

// A directory only this user may enter, for the gRPC server's Unix socket: under $TMPDIR (or
// /tmp), never the socket directory engines mount. Its path must leave room for the socket's
// name in sockaddr_un (108 bytes).
absl::StatusOr<std::string> MakePrivateDir() {
  std::string base = "/tmp";
  if (const char* t = ::getenv("TMPDIR"); t != nullptr && t[0] == '/' && std::strlen(t) < 60) {
    base = t;
  }
  std::string tmpl = base + "/weightcache-peer.XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoStatus(errno, "mkdtemp", tmpl);
  return tmpl;  // mkdtemp makes it 0700
}

}  // namespace

absl::Status PeerApi::Start() {
  const PeerOptions& o = options_;
  if (o.listen.empty()) return absl::OkStatus();
  WC_ASSIGN_OR_RETURN(peer::TlsMaterial tls, peer::ReadTls(o.tls));
  if (o.identity == PeerIdentity::kToken) {
    WC_ASSIGN_OR_RETURN(std::shared_ptr<const nodeid::KubeApi> kube, nodeid::KubeApi::Make(o.kube));
    WC_ASSIGN_OR_RETURN(tokens_, nodeid::ApiTokenSource::Make(std::move(kube), o.pod));
  }
  // UCX failing to start costs the transfers, not the daemon: records are still described,
  // and a pull is refused naming the reason.
  auto ucx = peer::UcxServer::Start();
  std::string why;
  if (!ucx.ok()) {
    why = std::string(ucx.status().message());
    WC_LOG_WARN("peer API: no transfers: %s", why);
  }
  exposures_ = std::make_unique<PeerExposures>(ucx.ok() ? *std::move(ucx) : nullptr, why,
                                               sources_.backend, o.transfer_hold);
  service_ = std::make_unique<PeerService>(this, o.tls.server_name);
  WC_ASSIGN_OR_RETURN(dir_, MakePrivateDir());
  const std::string backend_path = dir_ + "/grpc.sock";
  WC_RETURN_IF_ERROR(StartGrpc(tls, backend_path));
  auto port = PeerPort::Start({.listen = o.listen,
                               .backend_path = backend_path,
                               .max_connections = o.max_connections,
                               .max_connections_per_address = o.max_connections_per_address,
                               .handshake_timeout = o.handshake_timeout});
  if (!port.ok()) return port.status();  // Stop stops the gRPC server
  port_ = *std::move(port);
  listener_ = port_.get();
  port_number_ = port_->port();
  WC_LOG_INFO(
      "peer API on %s (port %d), mutual TLS, CA %s; at most %d connections, %d per address, "
      "handshakes within %d ms",
      o.listen, port_number_.load(), o.tls.ca_file, o.max_connections,
      o.max_connections_per_address, o.handshake_timeout.count());
  return absl::OkStatus();
}

absl::Status PeerApi::StartGrpc(const peer::TlsMaterial& tls, const std::string& backend_path) {
  const PeerOptions& o = options_;
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort("unix:" + backend_path, peer::ServerCredentials(tls), &bound);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(4 << 10);  // a fingerprint
  builder.SetMaxSendMessageSize(256 << 20);   // records of very large models
  grpc::ResourceQuota quota("weightcache-peer");
  quota.Resize(64ull << 20);
  quota.SetMaxThreads(16);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 16);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 << 10);
  // gRPC's own deadline for the TLS handshake and the client's HTTP/2 settings, twice the
  // port's: the port closes what completes no handshake first (and counts it); this one
  // closes a client that completed TLS but never speaks HTTP/2. An idle peer's connection is
  // ended at the door after 30 min without a byte (PeerPort::Options::idle, net::Acceptor).
  builder.AddChannelArgument(
      GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
      static_cast<int>(std::min<int64_t>(2 * o.handshake_timeout.count(), 24 * 3600 * 1000)));
  grpc_ = builder.BuildAndStart();
  if (!grpc_ || bound == 0) {
    return absl::UnavailableError(
        absl::StrCat("peer API: cannot listen on ", backend_path, " (its gRPC socket)"));
  }
  return absl::OkStatus();
}

void PeerApi::Stop() {
  // The port stops accepting; the connections it relays stay until gRPC has drained, so the
  // calls in flight get their answers.
  if (port_) port_->StopAccepting();
  if (grpc_) {
    grpc_->Shutdown(std::chrono::system_clock::now() + shutdown_grace_);
    grpc_->Wait();
    grpc_.reset();  // the server before the service it calls into
  }
  // The port object stays (its counters answer the metrics until the PeerApi goes).
  if (port_) port_->CloseConnections();
  exposures_.reset();  // no Describe runs now; pulls in flight fail at the peers
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
}

absl::StatusOr<std::unique_ptr<PeerFill>> MakePeerFill(const PeerOptions& o, int self_port,
                                                       memory::Backend* backend,
                                                       metrics::Metrics* metrics,
                                                       load::StagingPool* staging) {
  if (o.peers.empty()) return nullptr;
  PeerFillOptions f;
  WC_ASSIGN_OR_RETURN(f.peers.tls, peer::ReadTls(o.tls));
  f.peers.peers = o.peers;
  f.peers.self_port = static_cast<uint16_t>(self_port);
  f.trust = o.trust;
  if (o.identity == PeerIdentity::kToken) {
    WC_RETURN_IF_ERROR(nodeid::CheckNodeName(o.node_name, "--node_name"));
    WC_ASSIGN_OR_RETURN(std::shared_ptr<const nodeid::KubeApi> kube, nodeid::KubeApi::Make(o.kube));
    nodeid::VerifierOptions v;
    v.namespace_name = kube->namespace_name();
    v.service_account = kube->service_account();
    WC_ASSIGN_OR_RETURN(f.verifier, nodeid::ApiTokenVerifier::Make(std::move(kube), v));
    f.peers.identify_as = o.node_name;
  }
  f.peers.describe_timeout = o.describe_timeout;
  f.pull.timeout = o.pull_timeout;
  std::vector<std::string> names;
  for (const auto& p : o.peers) names.push_back(absl::StrCat(p.host, ":", p.port));
  WC_LOG_INFO("peer fill on: loads ask %s first (mutual TLS, CA %s; identities: %s)",
              absl::StrJoin(names, ","), o.tls.ca_file,
              o.identity == PeerIdentity::kToken
                  ? absl::StrCat("node tokens, this node ", o.node_name)
                  : std::string("certificate names"));
  return std::make_unique<PeerFill>(std::move(f), backend, metrics, staging);
}

}  // namespace weightcache::server
