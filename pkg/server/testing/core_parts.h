// Test fixture: the core's shared parts without a daemon (host backend, a real registry,
// catalog, admission and access) and model "m", a tiny checkpoint, for the unit suites of the
// services that take those parts (integrity, preloads, model verbs). Test-only.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pkg/cache/registry.h"
#include "pkg/memory/backend.h"
#include "pkg/safetensors/writer.h"
#include "pkg/server/internal/access.h"
#include "pkg/server/internal/admission.h"
#include "pkg/server/internal/model_catalog.h"
#include "pkg/server/options.h"
#include "tests/testutil/temp_dir.h"

namespace weightcache::server::testing {

// The admin on the engine socket; uid 0 is an engine (no role).
inline constexpr uid_t kAdmin = 7;

// A caller of uid `uid` (gid 0) on `socket` (a slot socket: `slot`'s), accepted now.
// Its tenant unit: the slot on a slot socket, else a process of its own (pid uid + 1).
inline Caller On(uid_t uid, SocketKind socket = SocketKind::kEngine, std::string slot = "") {
  Caller c;
  c.cred.uid = uid;
  c.cred.pid = static_cast<pid_t>(uid + 1);
  c.socket = socket;
  c.slot = std::move(slot);
  if (c.slot.empty()) {
    c.unit.kind = tenant::UnitKind::kProcess;
    c.unit.pid = c.cred.pid;
    c.unit.start_ticks = 1;
  } else {
    c.unit = tenant::Unit::OfSlot(c.slot, c.cred.pid);
  }
  c.accepted = std::chrono::steady_clock::now();
  return c;
}
// The pod on slot `slot` (uid 0, as the chart's engines run).
inline Caller OnSlot(std::string slot) { return On(0, SocketKind::kSlot, std::move(slot)); }

// A spec that is never opened (its directory does not exist): for rules, not loads.
inline spec::ModelSpec Spec(const std::string& name, std::vector<std::string> allowed = {},
                            bool private_copies = false) {
  spec::ModelSpec s;
  s.name = name;
  s.model_dir = "/nonexistent/" + name;
  s.allowed_namespaces = std::move(allowed);
  if (private_copies) s.isolation = spec::kIsolationNamespace;
  return s;
}

class CorePartsTest : public ::testing::Test {
 protected:
  // `extra` specs are known besides "m", which `m_namespaces` may map (empty: all).
  void MakeParts(std::vector<spec::ModelSpec> extra = {},
                 std::vector<std::string> m_namespaces = {}) {
    ASSERT_TRUE(safetensors::WriteLlamaCheckpoint(dir_ / "m", safetensors::TinyLlama()).ok());
    spec::ModelSpec m;
    m.name = "m";
    m.model_dir = dir_ / "m";
    m.allowed_namespaces = std::move(m_namespaces);
    options_.specs = std::move(extra);
    options_.specs.push_back(m);
    backend_ = memory::MakeHostBackend();
    models_ =
        std::make_unique<ModelCatalog>(options_.specs, 1, std::vector<std::string>{}, nullptr);
    admission_ = std::make_unique<Admission>(options_, backend_.get(), registry_, nullptr);
    PolicyOptions po;
    po.admin_uids = {kAdmin};
    access_ = std::make_unique<Access>(po, nullptr, *models_, nullptr, 16, nullptr);
  }
  // Stop the unit under test first (its threads use the parts), then call this.
  void StopParts() {
    registry_.Stop();
    registry_.JoinLoads();
  }

  weightcache::testing::TempDir dir_;
  DaemonOptions options_;
  std::unique_ptr<memory::Backend> backend_;
  cache::Registry registry_{0};
  std::unique_ptr<ModelCatalog> models_;
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<Access> access_;
};

}  // namespace weightcache::server::testing
