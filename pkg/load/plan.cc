#include "pkg/load/plan.h"

#include "absl/strings/str_cat.h"

namespace weightcache::load {

namespace {
uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
}  // namespace

absl::StatusOr<Plan> PlanRank(const OpenedModel& model, const spec::Layout& layout,
                              const PlanOptions& options) {
  if (layout.tp_size != 1 || layout.pp_size != 1) {
    return absl::UnimplementedError(absl::StrCat(
        "model '", model.spec.name, "': layout tp_size ", layout.tp_size, " pp_size ",
        layout.pp_size, " is not served by this build: checkpoints are served as stored "
        "(tp_size 1, pp_size 1); tensor-parallel sharding is a separate loader feature"));
  }
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: alignment ", options.alignment, " is not a power of two"));
  }
  Plan plan;
  uint64_t cursor = 0;
  for (const auto& t : model.checkpoint.tensors()) {
    uint64_t at = AlignUp(cursor, options.alignment);
    // Start a new segment when this tensor would overflow a non-empty one.
    if (plan.segment_bytes.empty() || (at + t.nbytes > options.max_segment_bytes && at > 0)) {
      plan.segment_bytes.push_back(0);
      at = 0;
    }
    PlannedTensor p;
    p.name = t.name;
    p.dtype = t.dtype;
    p.shape = t.shape;
    p.strides.assign(t.shape.size(), 1);
    for (size_t i = t.shape.size(); i-- > 1;) p.strides[i - 1] = p.strides[i] * t.shape[i];
    p.segment = static_cast<uint32_t>(plan.segment_bytes.size() - 1);
    p.offset = at;
    p.nbytes = t.nbytes;
    p.file_index = t.file_index;
    p.file_offset = t.file_offset;
    cursor = at + t.nbytes;
    plan.segment_bytes.back() = cursor;
    plan.total_bytes += t.nbytes;
    plan.tensors.push_back(std::move(p));
  }
  if (plan.tensors.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", model.spec.name, "': the checkpoint has no tensors"));
  }
  return plan;
}

}  // namespace weightcache::load
