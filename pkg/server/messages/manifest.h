// The tensor manifest of a loaded model, serialized once (a v1::TensorManifest: its tensors,
// then the fused views that alias them) and handed to every Acquire that asks for the packed
// form. A model's content never changes while it is loaded, so neither do these bytes: an
// Acquire of 2,000 tensors then copies one string instead of building and serializing 2,000
// messages. Not a public header.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "pkg/load/loader.h"
#include "pkg/util/mutex.h"
#include "weightcache/v1/weightcache.pb.h"

namespace weightcache::server {

class ManifestCache {
 public:
  // The serialized manifest of `content`, built on the first call for that content. Bytes of
  // a content that was freed are dropped; a later content at the same address is rebuilt.
  std::shared_ptr<const std::string> Get(const std::shared_ptr<const load::LoadedModel>& content);

  size_t size_for_test();

 private:
  struct Item {
    std::weak_ptr<const load::LoadedModel> content;
    std::shared_ptr<const std::string> bytes;
  };
  Mutex mu_;
  std::unordered_map<const load::LoadedModel*, Item> items_ ABSL_GUARDED_BY(mu_);
};

// One planned tensor as the wire names it (Acquire manifests, keeper records).
void ToTensorEntry(const load::PlannedTensor& t, v1::TensorEntry* m);

// The manifest of `content`: its tensors, then the fused views that alias them (engine
// layouts), appended to `out` (an Acquire's `tensors` for clients that do not ask for the
// packed form).
void AddTensorEntries(const load::LoadedModel& content,
                      google::protobuf::RepeatedPtrField<v1::TensorEntry>* out);

// The serialized v1::TensorManifest of `content` (what ManifestCache keeps).
std::string SerializeManifest(const load::LoadedModel& content);

}  // namespace weightcache::server
