// Test fixture: the daemon in process on the host backend, with real sockets, serving one
// small Llama checkpoint as model "m", and a client connected to it. Test-only.
#pragma once

#include <unistd.h>

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "pkg/client/client.h"
#include "pkg/memory/backend.h"
#include "pkg/safetensors/writer.h"
#include "pkg/server/daemon.h"
#include "pkg/server/testing/hooks.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::server::testing {

inline safetensors::LlamaShape SmallLlama() {
  safetensors::LlamaShape s;
  s.layers = 1;
  s.hidden = 128;
  s.intermediate = 256;
  s.heads = 2;
  s.kv_heads = 1;
  s.vocab = 256;
  return s;
}

class DaemonInProcessTest : public ::testing::Test {
 protected:
  // The checkpoint "m" is written with this shape.
  virtual safetensors::LlamaShape CheckpointShape() const { return SmallLlama(); }
  void SetUp() override {
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "m", CheckpointShape()).ok());
    backend_ = memory::MakeHostBackend();
  }
  // Unless `o` says otherwise, this uid is granted admin and publisher on the engine socket.
  // The daemon serves "m" and the specs in `o.specs`.
  void Start(DaemonOptions o) {
    o.socket_dir = dir_ / "s";
    if (o.admin_uids.empty()) o.admin_uids = {::geteuid()};
    if (o.publish_uids.empty()) o.publish_uids = {::geteuid()};
    o.digest_store = "";
    spec::ModelSpec s;
    s.name = "m";
    s.model_dir = dir_ / "m";
    o.specs.insert(o.specs.begin(), s);  // "m", and any others the test names
    auto d = DaemonHooksAccess::Start(std::move(o), backend_.get(), &hooks_);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d).value();
    auto c = client::Client::Connect(dir_ / "s");
    ASSERT_TRUE(c.ok());
    client_ = std::move(c).value();
  }
  // Options of another daemon, started by the test itself (Daemon::Start): its own socket
  // directory `dir_/name`, this uid admin, no digest store, knowing "m" only; it preloads "m"
  // with `preload`.
  DaemonOptions OtherDaemonOptions(const std::string& name, bool preload) const {
    DaemonOptions o;
    o.socket_dir = dir_ / name;
    o.preload = preload;
    o.admin_uids = {::geteuid()};
    o.digest_store = "";
    spec::ModelSpec s;
    s.name = "m";
    s.model_dir = dir_ / "m";
    o.specs = {s};
    return o;
  }
  absl::StatusOr<std::unique_ptr<client::Lease>> Acquire() {
    client::AcquireOptions o;
    o.model = "m";
    o.wait_ready = true;
    return client_->Acquire(o);
  }

  weightcache::testing::TempDir dir_;
  std::unique_ptr<memory::Backend> backend_;
  // Set before Start (hooks.h says where each runs); declared before daemon_, which they outlive.
  FunctionHooks hooks_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<client::Client> client_;
};

}  // namespace weightcache::server::testing
