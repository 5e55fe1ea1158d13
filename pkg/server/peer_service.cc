// The peer API (proto/weightcache/v1/peer.proto) for other nodes' daemons: its own gRPC
// server on TCP, mutual TLS required (pkg/peer/tls.h: a peer is whoever presents a
// certificate the fleet CA signed), and Describe: the record of a ready entry, so the asker
// can fill its own copy and check every segment against the digests in it.
// What is described: only shared entries (a namespace's private copy is that tenant's on
// this node) filled from a checkpoint (disk, a keeper adoption, another device, another
// node): an engine's published weights are the publisher's claim on this node, which
// another node has no way to check against a checkpoint.
#include <unistd.h>

#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/peer/ucx_transfer.h"
#include "pkg/server/internal/daemon_impl.h"
#include "pkg/server/internal/grpc_status.h"
#include "pkg/server/keeper/keeper_record.h"
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

class PeerService final : public v1::WeightCachePeer::Service {
 public:
  explicit PeerService(Daemon::Impl* impl) : impl_(impl) {}

  grpc::Status Describe(grpc::ServerContext* ctx, const v1::PeerDescribeRequest* req,
                        v1::PeerDescribeResponse* resp) override {
    auto r = impl_->DescribeForPeer(req->fingerprint(), req->transfer());
    if (!r.ok()) {
      WC_LOG_INFO("peer %s: describe %s: %s", ctx->peer(), req->fingerprint().substr(0, 12),
                  std::string(r.status().message()));
      return ToGrpc(ctx, r.status());
    }
    WC_LOG_INFO("peer %s: described %s (%s, %.1f MiB%s)", ctx->peer(),
                req->fingerprint().substr(0, 12), r->source(),
                static_cast<double>(r->total_bytes()) / (1 << 20),
                req->transfer() ? ", exposed for a pull" : "");
    *resp = std::move(r).value();
    return grpc::Status::OK;
  }

 private:
  Daemon::Impl* const impl_;
};

}  // namespace

absl::StatusOr<v1::PeerDescribeResponse> Daemon::Impl::DescribeForPeer(
    const std::string& fingerprint, bool transfer) {
  if (fingerprint.empty()) return absl::InvalidArgumentError("fingerprint is empty");
  for (const auto& e : registry_.FindAll(fingerprint)) {
    if (!e->inputs.env.tenant.empty() || e->source == "publish") continue;
    auto content = registry_.Content(e);
    if (!content.ok()) continue;  // loading, failed, draining or corrupt
    const auto digests = registry_.Digests(e);
    v1::PeerDescribeResponse resp;
    resp.set_record(EncodeKeeperRecord(
        *e, **content, memory::BackendName(backend_->kind()),
        RecordedSpec{models_.SpecYaml(e->model), models_.DefinedInline(e->model)}, nullptr,
        digests.get()));
    resp.set_node(HostName());
    resp.set_source(e->source);
    resp.set_total_bytes((*content)->resident_bytes());
    if (transfer) {
      WC_RETURN_IF_ERROR(peer_exposures_->Expose(*std::move(content), resp.mutable_transfer()));
    }
    return resp;
  }
  return absl::NotFoundError(
      absl::StrCat("no ready shared entry with fingerprint ", fingerprint.substr(0, 12)));
}

absl::Status Daemon::Impl::StartPeerServer() {
  const PeerOptions& o = options_.peer;
  if (o.listen.empty()) return absl::OkStatus();
  WC_ASSIGN_OR_RETURN(peer::TlsMaterial tls, peer::ReadTls(o.tls));
  // UCX failing to start costs the transfers, not the daemon: records are still described,
  // and a pull is refused naming the reason.
  auto ucx = peer::UcxServer::Start();
  std::string why;
  if (!ucx.ok()) {
    why = std::string(ucx.status().message());
    WC_LOG_WARN("peer API: no transfers: %s", why);
  }
  peer_exposures_ = std::make_unique<PeerExposures>(ucx.ok() ? *std::move(ucx) : nullptr, why,
                                                    backend_->kind(), o.transfer_hold);
  peer_service_ = std::make_unique<PeerService>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, peer::ServerCredentials(tls), &peer_port_);
  builder.RegisterService(peer_service_.get());
  builder.SetMaxReceiveMessageSize(4 << 10);  // a fingerprint
  builder.SetMaxSendMessageSize(256 << 20);   // records of very large models
  grpc::ResourceQuota quota("weightcache-peer");
  quota.Resize(64ull << 20);
  quota.SetMaxThreads(16);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 16);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 << 10);
  peer_grpc_ = builder.BuildAndStart();
  if (!peer_grpc_ || peer_port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("peer API: cannot listen on ", o.listen, " (--peer_listen)"));
  }
  WC_LOG_INFO("peer API on %s (port %d), mutual TLS, CA %s", o.listen, peer_port_, o.tls.ca_file);
  return absl::OkStatus();
}

absl::Status Daemon::Impl::StartPeerFill() {
  const PeerOptions& o = options_.peer;
  if (o.peers.empty()) return absl::OkStatus();
  PeerFillOptions f;
  WC_ASSIGN_OR_RETURN(f.peers.tls, peer::ReadTls(o.tls));
  f.peers.peers = o.peers;
  f.peers.self_port = static_cast<uint16_t>(peer_port_);
  f.peers.describe_timeout = o.describe_timeout;
  f.pull.timeout = o.pull_timeout;
  peer_fill_ =
      std::make_unique<PeerFill>(std::move(f), backend_, options_.metrics, staging_pool_.get());
  admission_.SetPeerFill(peer_fill_.get());
  std::vector<std::string> names;
  for (const auto& p : o.peers) names.push_back(absl::StrCat(p.host, ":", p.port));
  WC_LOG_INFO("peer fill on: loads ask %s first (mutual TLS, CA %s)", absl::StrJoin(names, ","),
              o.tls.ca_file);
  return absl::OkStatus();
}

}  // namespace weightcache::server
