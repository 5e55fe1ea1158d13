// The core's side of publishing (publish/publish_manager.h): a publish request's placement
// checked by Admission (the node's devices and the placement rule), the base model opened by
// the catalog; and of compile artifacts (publish/artifact_service.h): Access's rules and the
// catalog's specs. Not a public header.
//
// Thread-safety: as Admission and ModelCatalog (any thread). Lifetimes: the backend,
// admission and catalog outlive it.
#pragma once

#include <memory>
#include <string>

#include "pkg/memory/backend.h"
#include "pkg/server/internal/access.h"
#include "pkg/server/internal/admission.h"
#include "pkg/server/internal/model_catalog.h"
#include "pkg/server/options.h"
#include "pkg/server/publish/artifact_service.h"
#include "pkg/server/publish/publish_manager.h"

namespace weightcache::server {

class CorePublishBase final : public PublishBase {
 public:
  CorePublishBase(memory::Backend* backend, Admission& admission, ModelCatalog& models)
      : backend_(backend), admission_(admission), models_(models) {}
  absl::StatusOr<Placement> Place(const v1::Layout& layout,
                                  const v1::Environment& env) const override;
  absl::StatusOr<std::shared_ptr<const load::OpenedModel>> Open(const std::string& model,
                                                                bool refresh) override {
    return models_.Open(model, refresh);
  }

 private:
  memory::Backend* const backend_;
  Admission& admission_;
  ModelCatalog& models_;
};

// The daemon's artifact service: the store (--artifact_budget_bytes, --artifact_dir, ...),
// its puts in flight bounded per the options, its rules `rules` (outlives it). The store's
// error when it cannot be opened (the directory).
absl::StatusOr<std::unique_ptr<ArtifactService>> MakeArtifactService(const DaemonOptions& options,
                                                                     const ArtifactRules& rules);

class CoreArtifactRules final : public ArtifactRules {
 public:
  CoreArtifactRules(const Access& access, const ModelCatalog& models)
      : access_(access), models_(models) {}
  bool Known(const std::string& model) const override { return models_.Spec(model).has_value(); }
  absl::Status MayPublish(const Caller& caller) const override {
    return access_.AuthorizePublish(caller, "");
  }
  absl::Status MayPut(const Caller& caller, const std::string& model, bool native) const override {
    return access_.AuthorizePublish(caller, model, native);
  }
  absl::Status MayGet(const Caller& caller, const std::string& model) const override {
    return access_.Authorize(caller, Verb::kAcquire, access_.ModelObject(model));
  }
  absl::Status MayEvict(const Caller& caller, const std::string& model) const override {
    Object o;
    o.model = model;
    return access_.Authorize(caller, Verb::kEvict, o);
  }
  absl::StatusOr<std::string> Pool(const Caller& caller, const std::string& model) const override {
    return access_.ArtifactPool(caller, model);
  }
  std::string MetricModel(const std::string& model) const override {
    return access_.MetricModel(model);
  }
  bool IsAdmin(const Caller& caller) const override { return access_.IsAdmin(caller); }
  absl::Status VouchesForNative(const std::string& model, const artifact::Publisher& who,
                                const std::string& pool) const override;

 private:
  const Access& access_;
  const ModelCatalog& models_;
};

}  // namespace weightcache::server
