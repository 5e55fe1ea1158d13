#include "pkg/peer/testing/corrupt_peer.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/integrity/crypto_digest.h"
#include "pkg/peer/client.h"
#include "pkg/peer/ucx_transfer.h"
#include "pkg/util/bytes.h"
#include "weightcache/v1/keeper_record.pb.h"
#include "weightcache/v1/peer.grpc.pb.h"

namespace weightcache::peer::testing {

namespace {

class Service final : public v1::WeightCachePeer::Service {
 public:
  Service(std::string fingerprint, v1::PeerDescribeResponse answer,
          CorruptPeerOptions::TokenPlay play, std::unique_ptr<PeerClient> honest)
      : fingerprint_(std::move(fingerprint)),
        answer_(std::move(answer)),
        play_(play),
        honest_(std::move(honest)) {}
  grpc::Status Describe(grpc::ServerContext*, const v1::PeerDescribeRequest* req,
                        v1::PeerDescribeResponse* resp) override {
    if (req->fingerprint() != fingerprint_) {
      return {grpc::StatusCode::NOT_FOUND, "not held here"};
    }
    *resp = answer_;
    if (!req->transfer()) resp->clear_transfer();
    if (play_ == CorruptPeerOptions::TokenPlay::kRelay && !req->nonce().empty()) {
      auto relayed = honest_->Describe(fingerprint_, std::chrono::seconds(10), false, nullptr,
                                       req->asker_node(), req->nonce());
      if (relayed.ok()) resp->set_node_token(relayed->node_token());
    }
    return grpc::Status::OK;
  }

 private:
  const std::string fingerprint_;
  const v1::PeerDescribeResponse answer_;  // with the replayed token, if any
  const CorruptPeerOptions::TokenPlay play_;
  const std::unique_ptr<PeerClient> honest_;
};

}  // namespace

struct CorruptPeer::State {
  std::vector<std::vector<std::byte>> copies;  // exposed: outlive the UCX server's use
  std::unique_ptr<UcxServer> ucx;
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  ~State() {
    if (server) server->Shutdown(std::chrono::system_clock::now());
    ucx.reset();  // unexposes before the copies go
  }
};

CorruptPeer::CorruptPeer(std::unique_ptr<State> s) : s_(std::move(s)) {}
CorruptPeer::~CorruptPeer() = default;
int CorruptPeer::port() const { return s_->port; }

absl::StatusOr<std::unique_ptr<CorruptPeer>> CorruptPeer::Start(const CorruptPeerOptions& o) {
  auto s = std::make_unique<State>();
  auto honest = PeerClient::Make(o.honest_address, o.client_tls);
  const bool replay = o.token_play == CorruptPeerOptions::TokenPlay::kReplay;
  auto answer =
      honest->Describe(o.fingerprint, std::chrono::seconds(10), /*transfer=*/true, nullptr,
                       replay ? o.replay_as_node : "", replay ? RandomHex(16) : "");
  if (!answer.ok()) return answer.status();
  const v1::PeerTransfer& t = answer->transfer();
  if (o.bad_segment < 0 || o.bad_segment >= t.regions_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad_segment ", o.bad_segment, " of ", t.regions_size()));
  }
  auto puller = UcxPuller::Create();
  if (!puller.ok()) return puller.status();
  auto ucx = UcxServer::Start();
  if (!ucx.ok()) return ucx.status();
  s->ucx = *std::move(ucx);
  v1::PeerTransfer mine;
  mine.set_worker_address(s->ucx->worker_address());
  mine.set_hold_ms(t.hold_ms());
  s->copies.resize(t.regions_size());
  for (int i = 0; i < t.regions_size(); ++i) {
    auto& copy = s->copies[i];
    copy.resize(t.regions(i).length());
    PullOptions po;
    if (auto st = (*puller)->Pull(t.worker_address(), t.regions(i).token(), 0, copy.data(),
                                  copy.size(), po);
        !st.ok()) {
      return st;
    }
    if (i == o.bad_segment && !copy.empty()) copy[0] ^= std::byte{0xff};
    auto region = s->ucx->Expose(copy.data(), copy.size());
    if (!region.ok()) return region.status();
    auto* r = mine.add_regions();
    r->set_length(region->length);
    r->set_token(region->token);
  }
  if (o.forge_record) {
    v1::KeeperRecord r;
    if (!r.ParseFromString(answer->record()) || r.segment_sha256_size() <= o.bad_segment) {
      return absl::InvalidArgumentError("corrupt peer: the honest record cannot be forged");
    }
    const auto& bad = s->copies[o.bad_segment];
    r.set_segment_sha256(o.bad_segment, integrity::CryptoDigestHost(bad.data(), bad.size()));
    answer->set_record(r.SerializeAsString());
  }
  *answer->mutable_transfer() = mine;
  answer->set_node("corrupt-peer");
  auto tls = ReadTls(o.server_files);
  if (!tls.ok()) return tls.status();
  if (!replay) answer->clear_node_token();
  s->service =
      std::make_unique<Service>(o.fingerprint, *std::move(answer), o.token_play, std::move(honest));
  grpc::ServerBuilder b;
  b.AddListeningPort(o.listen, ServerCredentials(*tls), &s->port);
  b.RegisterService(s->service.get());
  s->server = b.BuildAndStart();
  if (!s->server || s->port == 0) {
    return absl::UnavailableError(absl::StrCat("corrupt peer: cannot listen on ", o.listen));
  }
  return std::unique_ptr<CorruptPeer>(new CorruptPeer(std::move(s)));
}

}  // namespace weightcache::peer::testing
