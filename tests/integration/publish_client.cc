// A publisher process for the publish tests: begins a publish of three tensors whose bytes
// follow from a seed, writes them and commits, stopping between the steps so the test can
// SIGKILL it there.
//   wc_publish_client SOCKET MODEL RECIPE SEED MODE
// MODE: commit (no stops) | step (waits for a stdin line after "MAPPED", "HALF" and "WRITTEN")
//       | mismatch (commits a different tensor list) | mapped (commits once while a second
//       writable mapping remains, then unmaps and commits again) | mapped-lib (the same
//       through the client library's Publish::Commit both times)
// Output lines: "JOINED <fingerprint> <state>", "MAPPED <publish id> <fingerprint>", "HALF",
// "WRITTEN", "COMMIT1 <code> <message>" (mapped), "COMMITTED <fingerprint>",
// "ERROR <code> <message>" (exit 2), then "READ-ONLY OK|BAD", "BYTES OK|BAD <name>" after
// acquiring what it published and "READY"; it then holds the lease until stdin closes.
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pkg/client/client.h"
#include "tests/integration/publish_pattern.h"
#include "weightcache/v1/weightcache.grpc.pb.h"

using namespace weightcache;

namespace {

int Fail(const absl::Status& s) {
  std::printf("ERROR %s %s\n", absl::StatusCodeToString(s.code()).c_str(),
              std::string(s.message()).c_str());
  return 2;
}

void WaitForLine() {
  std::string line;
  std::getline(std::cin, line);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 6) {
    std::printf("ERROR usage: wc_publish_client SOCKET MODEL RECIPE SEED MODE\n");
    return 2;
  }
  const std::string socket = argv[1], model = argv[2], recipe = argv[3], mode = argv[5];
  const uint32_t seed = static_cast<uint32_t>(std::stoul(argv[4]));
  auto c = client::Client::Connect(socket);
  if (!c.ok()) return Fail(c.status());
  client::PublishOptions o;
  o.model = model;
  o.identity = testing::PatternIdentity(recipe);
  o.tensors = testing::PatternTensors();
  auto p = (*c)->BeginPublish(o);
  if (!p.ok()) return Fail(p.status());
  if ((*p)->joined()) {
    std::printf("JOINED %s\n", (*p)->fingerprint().c_str());
  } else {
    std::printf("MAPPED %s %s\n", (*p)->id().c_str(), (*p)->fingerprint().c_str());
    if (mode == "step") WaitForLine();
    const auto& views = (*p)->tensors();
    for (size_t i = 0; i < views.size(); ++i) {
      testing::FillPattern(views[i], seed, (*p)->Data(views[i]));
      if (i == views.size() / 2) {
        std::printf("HALF\n");
        if (mode == "step") WaitForLine();
      }
    }
    std::printf("WRITTEN\n");
    if (mode == "step") WaitForLine();
    if (mode == "mapped-lib") {
      const client::TensorView& first = views.front();
      auto* base = static_cast<std::byte*>((*p)->Data(first)) - first.offset;
      void* dup = ::mremap(base, 0, 2u << 20, MREMAP_MAYMOVE);  // see "mapped" below
      if (dup == MAP_FAILED) return Fail(absl::InternalError("mremap duplicate failed"));
      const absl::Status s = (*p)->Commit();
      std::printf("COMMIT1 %d %s\n", static_cast<int>(s.code()), std::string(s.message()).c_str());
      ::munmap(dup, 2u << 20);
    }
    if (mode == "mismatch" || mode == "mapped") {
      // Raw CommitPublish: the client library would always send the begun list.
      void* dup = nullptr;
      const client::TensorView& first = views.front();
      if (mode == "mapped") {
        // A second writable mapping of the same pages (mremap of a shared mapping with
        // old_size 0 duplicates it): the daemon's seal must fail while it exists.
        auto* base = static_cast<std::byte*>((*p)->Data(first)) - first.offset;
        dup = ::mremap(base, 0, 2u << 20, MREMAP_MAYMOVE);
        if (dup == MAP_FAILED) return Fail(absl::InternalError("mremap duplicate failed"));
      }
      auto channel =
          grpc::CreateChannel("unix:" + (*c)->socket_path(), grpc::InsecureChannelCredentials());
      auto stub = v1::WeightCache::NewStub(channel);
      v1::CommitPublishRequest req;
      req.set_publish_id((*p)->id());
      for (const auto& t : o.tensors) {
        auto* m = req.add_tensors();
        m->set_name(t.name);
        m->set_dtype(std::string(safetensors::DTypeName(t.dtype)));
        m->mutable_shape()->Add(t.shape.begin(), t.shape.end());
        m->set_nbytes(mode == "mismatch" && t.name == "b.bias" ? t.nbytes / 2 : t.nbytes);
      }
      v1::CommitPublishResponse resp;
      grpc::ClientContext ctx;
      grpc::Status s = stub->CommitPublish(&ctx, req, &resp);
      std::printf("COMMIT1 %d %s\n", static_cast<int>(s.error_code()), s.error_message().c_str());
      if (mode == "mismatch") return 0;
      ::munmap(dup, 2u << 20);
    }
    if (auto s = (*p)->Commit(); !s.ok()) return Fail(s);
    std::printf("COMMITTED %s\n", (*p)->fingerprint().c_str());
  }
  // What it published, read-only, as any later engine maps it.
  client::AcquireOptions a;
  a.model = model;
  a.published = o.identity;
  a.wait_ready = true;
  auto lease = (*c)->Acquire(a);
  if (!lease.ok()) return Fail(lease.status());
  std::printf("READ-ONLY %s\n", ::mprotect(const_cast<std::byte*>((*lease)->segment_base(0)), 4096,
                                           PROT_READ | PROT_WRITE) != 0
                                    ? "OK"
                                    : "BAD");
  std::string bad = testing::CheckPattern(**lease, seed);
  std::printf("BYTES %s\n", bad.empty() ? "OK" : ("BAD " + bad).c_str());
  std::printf("READY\n");
  char ch;
  while (::read(STDIN_FILENO, &ch, 1) > 0) {
  }
  return 0;
}
