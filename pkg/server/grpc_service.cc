// The gRPC adapter: decodes requests, calls Daemon::Impl, and converts absl::Status to
// grpc::Status in exactly one place (ToGrpc, internal/grpc_status.h). A bad request never takes the
// daemon down: every handler returns a status.
#include <chrono>

#include "pkg/server/internal/daemon_impl.h"
#include "pkg/server/internal/grpc_status.h"
#include "weightcache/v1/weightcache.grpc.pb.h"

namespace weightcache::server {
namespace {

class GrpcService final : public v1::WeightCache::Service {
 public:
  explicit GrpcService(Daemon::Impl* impl) : impl_(impl) {}

  // Who calls, bound to this call: waits end when its client gives up or at its deadline.
  absl::StatusOr<Caller> CallerOf(grpc::ServerContext* ctx) {
    // A call whose connection is gone is never run: its descriptor number may already
    // name another connection (the table checks the socket too; this is the cheap half).
    if (ctx->IsCancelled()) return absl::CancelledError("the caller went away before its call ran");
    auto caller = impl_->access().CallerOf(ctx->peer());
    if (!caller.ok()) return caller;
    caller->gone = [ctx] { return ctx->IsCancelled(); };
    if (const auto d = ctx->deadline(); d != std::chrono::system_clock::time_point::max()) {
      caller->deadline = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             d - std::chrono::system_clock::now());
    }
    return caller;
  }

  grpc::Status Acquire(grpc::ServerContext* ctx, const v1::AcquireRequest* req,
                       v1::AcquireResponse* resp) override {
    auto t0 = std::chrono::steady_clock::now();
    auto caller = CallerOf(ctx);
    if (!caller.ok()) return ToGrpc(ctx, caller.status());
    std::string model;
    metrics::AcquireResult result;
    absl::Status s = impl_->acquire().Acquire(*caller, *req, resp, &model, &result);
    if (auto* m = impl_->options().metrics; m != nullptr) {
      m->OnAcquire(impl_->access().MetricModel(model), result,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return ToGrpc(ctx, s);
  }

  grpc::Status Release(grpc::ServerContext* ctx, const v1::ReleaseRequest* req,
                       v1::ReleaseResponse*) override {
    auto caller = CallerOf(ctx);
    if (!caller.ok()) return ToGrpc(ctx, caller.status());
    return ToGrpc(ctx, impl_->leases().Release(*caller, req->lease_id()));
  }

  grpc::Status Load(grpc::ServerContext* ctx, const v1::LoadRequest* req,
                    grpc::ServerWriter<v1::LoadProgress>* writer) override {
    auto caller = CallerOf(ctx);
    if (!caller.ok()) return ToGrpc(ctx, caller.status());
    return ToGrpc(ctx, impl_->model_verbs().Load(*caller, *req, [&](const v1::LoadProgress& p) {
      return !ctx->IsCancelled() && writer->Write(p);
    }));
  }

  grpc::Status Evict(grpc::ServerContext* ctx, const v1::EvictRequest* req,
                     v1::EvictResponse* resp) override {
    auto caller = CallerOf(ctx);
    if (!caller.ok()) return ToGrpc(ctx, caller.status());
    return ToGrpc(ctx, impl_->model_verbs().Evict(*caller, *req, resp));
  }

  grpc::Status BeginPublish(grpc::ServerContext* ctx, const v1::BeginPublishRequest* req,
                            v1::BeginPublishResponse* resp) override {
    auto caller = CallerOf(ctx);
    if (!caller.ok()) return ToGrpc(ctx, caller.status());
    return ToGrpc(ctx, impl_->publishes().Begin(*caller, *req, resp));
  }

  grpc::Status CommitPublish(grpc::ServerContext* ctx, const v1::CommitPublishRequest* req,
                             v1::CommitPublishResponse* resp) override {
    auto caller = CallerOf(ctx);
    if (!caller.ok()) return ToGrpc(ctx, caller.status());
    return ToGrpc(ctx, impl_->publishes().Commit(*caller, *req, resp));
  }

  grpc::Status AbortPublish(grpc::ServerContext* ctx, const v1::AbortPublishRequest* req,
                            v1::AbortPublishResponse*) override {
    auto caller = CallerOf(ctx);
    if (!caller.ok()) return ToGrpc(ctx, caller.status());
    return ToGrpc(ctx, impl_->publishes().Abort(*caller, *req));
  }

  grpc::Status VerifyResident(grpc::ServerContext* ctx, const v1::VerifyResidentRequest* req,
                              v1::VerifyResidentResponse* resp) override {
    auto caller = CallerOf(ctx);
    if (!caller.ok()) return ToGrpc(ctx, caller.status());
    return ToGrpc(ctx, impl_->integrity().VerifyResident(*caller, *req, resp));
  }

  grpc::Status PutArtifact(grpc::ServerContext* ctx,
                           grpc::ServerReader<v1::PutArtifactRequest>* reader,
                           v1::PutArtifactResponse* resp) override {
    auto caller = CallerOf(ctx);
    if (!caller.ok()) return ToGrpc(ctx, caller.status());
    // Counted per tenant unit, its size reserved, a stalled one ended (artifacts.h): the
    // watchdog cancels the call, whose pending Read then returns false.
    return ToGrpc(ctx, impl_->artifacts().Put(
                           *caller, [&](v1::PutArtifactRequest* m) { return reader->Read(m); },
                           resp, [ctx] { ctx->TryCancel(); }));
  }

  grpc::Status GetArtifact(grpc::ServerContext* ctx, const v1::GetArtifactRequest* req,
                           v1::GetArtifactResponse* resp) override {
    auto caller = CallerOf(ctx);
    if (!caller.ok()) return ToGrpc(ctx, caller.status());
    return ToGrpc(ctx, impl_->artifacts().Get(*caller, *req, resp));
  }

  grpc::Status EvictArtifacts(grpc::ServerContext* ctx, const v1::EvictArtifactsRequest* req,
                              v1::EvictArtifactsResponse* resp) override {
    auto caller = CallerOf(ctx);
    if (!caller.ok()) return ToGrpc(ctx, caller.status());
    return ToGrpc(ctx, impl_->artifacts().Evict(*caller, *req, resp));
  }

  grpc::Status Status(grpc::ServerContext* ctx, const v1::StatusRequest*,
                      v1::StatusResponse* resp) override {
    auto caller = CallerOf(ctx);
    if (!caller.ok()) return ToGrpc(ctx, caller.status());
    impl_->status().Status(*caller, resp);
    return grpc::Status::OK;
  }

 private:
  Daemon::Impl* const impl_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeGrpcService(Daemon::Impl* impl) {
  return std::make_unique<GrpcService>(impl);
}

std::unique_ptr<grpc::Server> BuildControlServer(grpc::Service* service, uint64_t memory_bytes,
                                                 int max_threads) {
  grpc::ServerBuilder builder;
  // No listening port: ControlListener accepts (peer credentials, caps, EMFILE back-off)
  // and hands each connection over.
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(1 << 20);  // requests are small; bound them
  builder.SetMaxSendMessageSize(256 << 20);   // manifests of very large models
  // Memory and threads bounded: a flood of streams or connections costs at most this.
  grpc::ResourceQuota quota("weightcache-control");
  quota.Resize(memory_bytes);
  quota.SetMaxThreads(max_threads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 16);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 << 10);
  // Idle connections (no call, no byte for 30 min) are ended at the door, not here
  // (ControlListener::Options::idle, net::Acceptor).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10 * 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 3);
  return builder.BuildAndStart();
}

}  // namespace weightcache::server
