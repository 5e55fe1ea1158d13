// The core's side of publishing (publish/publish_manager.h): a publish request's placement
// checked by Admission (the node's devices and the placement rule), the base model opened by
// the catalog. Not a public header.
//
// Thread-safety: as Admission and ModelCatalog (any thread). Lifetimes: the backend,
// admission and catalog outlive it.
#pragma once

#include <memory>
#include <string>

#include "pkg/memory/backend.h"
#include "pkg/server/internal/admission.h"
#include "pkg/server/internal/model_catalog.h"
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

}  // namespace weightcache::server
