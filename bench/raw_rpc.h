// The bare Acquire RPC, both ways the manifest can travel, for the Acquire benchmarks.
#pragma once

#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "weightcache/v1/weightcache.grpc.pb.h"

namespace weightcache::bench {

// The Acquire RPC alone (nothing claimed or mapped; the unclaimed leases expire), median ms
// of `reps`: the manifest as `tensors` (built for each Acquire, what clients before the
// packed manifest get) against the packed bytes serialized once per entry. Both decoded.
// `uuid`: the device asked for (empty on the host backend).
inline std::pair<double, double> RawAcquireRpcMs(const std::string& socket_dir,
                                                 const std::string& model, const std::string& uuid,
                                                 int reps) {
  auto stub = v1::WeightCache::NewStub(grpc::CreateChannel("unix:" + socket_dir + "/control.sock",
                                                           grpc::InsecureChannelCredentials()));
  auto median = [&](bool packed) {
    std::vector<double> ms;
    for (int r = 0; r < reps + 1; ++r) {
      v1::AcquireRequest req;
      req.set_model(model);
      req.mutable_layout()->set_tp_size(1);
      req.mutable_env()->set_device_uuid(uuid);
      req.set_packed_manifest(packed);
      grpc::ClientContext ctx;
      auto t0 = Clock::now();
      {  // as the client decodes it: on an arena
        google::protobuf::Arena arena;
        auto* resp = google::protobuf::Arena::CreateMessage<v1::AcquireResponse>(&arena);
        if (!stub->Acquire(&ctx, req, resp).ok()) return -1.0;
        auto* m = google::protobuf::Arena::CreateMessage<v1::TensorManifest>(&arena);
        if (packed && !m->ParseFromString(resp->tensor_manifest())) return -1.0;
      }
      if (r > 0) ms.push_back(Ms(t0, Clock::now()));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  return {median(false), median(true)};
}

}  // namespace weightcache::bench
