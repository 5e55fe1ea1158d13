#include "pkg/server/messages/manifest.h"

#include "pkg/safetensors/safetensors.h"

namespace weightcache::server {

void ToTensorEntry(const load::PlannedTensor& t, v1::TensorEntry* m) {
  m->set_name(t.name);
  m->set_dtype(std::string(safetensors::DTypeName(t.dtype)));
  m->mutable_shape()->Add(t.shape.begin(), t.shape.end());
  m->mutable_strides()->Add(t.strides.begin(), t.strides.end());
  m->set_segment(t.segment);
  m->set_offset(t.offset);
  m->set_nbytes(t.nbytes);
}

void AddTensorEntries(const load::LoadedModel& content,
                      google::protobuf::RepeatedPtrField<v1::TensorEntry>* out) {
  const auto& plan = content.plan;
  out->Reserve(static_cast<int>(plan.tensors.size() + plan.views.size()));
  for (const auto* list : {&plan.tensors, &plan.views}) {
    for (const auto& t : *list) ToTensorEntry(t, out->Add());
  }
}

std::string SerializeManifest(const load::LoadedModel& content) {
  v1::TensorManifest m;
  AddTensorEntries(content, m.mutable_tensors());
  return m.SerializeAsString();
}

std::shared_ptr<const std::string> ManifestCache::Get(
    const std::shared_ptr<const load::LoadedModel>& content) {
  {
    MutexLock l(mu_);
    auto it = items_.find(content.get());
    if (it != items_.end() && it->second.content.lock() == content) return it->second.bytes;
  }
  // Built outside the lock: a large manifest takes a millisecond or two, and Acquires of
  // other models need not wait for it. Two first Acquires may both build; one wins.
  auto bytes = std::make_shared<const std::string>(SerializeManifest(*content));
  MutexLock l(mu_);
  for (auto it = items_.begin(); it != items_.end();) {
    it = it->second.content.expired() ? items_.erase(it) : std::next(it);
  }
  auto [it, inserted] = items_.try_emplace(content.get(), Item{content, bytes});
  if (!inserted && it->second.content.lock() != content) it->second = Item{content, bytes};
  return it->second.bytes;
}

size_t ManifestCache::size_for_test() {
  MutexLock l(mu_);
  return items_.size();
}

}  // namespace weightcache::server
