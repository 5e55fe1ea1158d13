#include "pkg/server/keeper/keeper_record.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pkg/integrity/crypto_digest.h"
#include "pkg/integrity/digest.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/server/messages/layout_proto.h"
#include "pkg/server/messages/manifest.h"
#include "pkg/util/status_macros.h"

namespace weightcache::server {
namespace {

// KeeperRecord.format: bump when a field's meaning changes; an older record is then dropped
// (and reloaded from disk) instead of being misread.
// 2 (issue 48): segment_sha256 replaced segment_digest_folds, whose key was public. A record
// of format 1 is refused: its memory is freed and loaded again.
constexpr uint32_t kRecordFormat = 2;

absl::StatusOr<load::PlannedTensor> GetTensor(const v1::TensorEntry& m, const v1::KeeperRecord& r) {
  load::PlannedTensor t;
  t.name = m.name();
  auto dtype = safetensors::ParseDType(m.dtype());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", m.name(), ": dtype '", m.dtype(), "' is unknown"));
  }
  t.dtype = *dtype;
  t.shape.assign(m.shape().begin(), m.shape().end());
  t.strides.assign(m.strides().begin(), m.strides().end());
  t.segment = m.segment();
  t.offset = m.offset();
  t.nbytes = m.nbytes();
  if (t.segment >= static_cast<uint32_t>(r.segment_sizes_size()) ||
      t.offset > r.segment_sizes(static_cast<int>(t.segment)) ||
      t.nbytes > r.segment_sizes(static_cast<int>(t.segment)) - t.offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", m.name(), ": [", t.offset, ", +", t.nbytes, ") of segment ", t.segment,
        " lies outside the record's ", r.segment_sizes_size(), " segments"));
  }
  return t;
}

}  // namespace

std::string EncodeKeeperRecord(const cache::Entry& e, const load::LoadedModel& content,
                               const std::string& backend, const RecordedSpec& spec,
                               const v1::PublisherInfo* publisher,
                               const std::vector<integrity::SegmentDigest>* digests) {
  v1::KeeperRecord r;
  if (digests != nullptr) {
    for (const auto& d : *digests) r.add_segment_sha256(d.sha256);
  }
  if (publisher != nullptr) *r.mutable_publisher() = *publisher;
  r.set_format(kRecordFormat);
  r.set_model(e.model);
  r.set_fingerprint(e.fingerprint);
  r.set_device_uuid(e.device_uuid);
  r.set_backend(backend);
  // How the bytes were first filled (load::LoadedModel::origin), not how this daemon got them:
  // an entry adopted from the keeper still says it came from disk.
  r.set_source(content.origin.empty() ? e.source : content.origin);
  r.set_spec_yaml(spec.yaml);
  r.set_defined_inline(spec.defined_inline);
  r.set_model_dir(content.model_dir);
  r.set_content_id(content.content_id);
  const spec::FingerprintInputs& in = e.inputs;
  r.set_architecture(in.architecture);
  r.set_revision(in.revision);
  for (const auto& f : in.files) {
    auto* d = r.add_digests();
    d->set_name(f.name);
    d->set_size(f.size);
    d->set_content(f.content);
  }
  LayoutToProto(in.layout, r.mutable_layout());
  r.set_tensor_layout(in.tensor_layout);
  r.set_quant_method(in.quant_method);
  r.set_quant_config_sha256(in.quant_config_sha256);
  r.set_dtype(in.dtype);
  r.set_compute_capability(in.env.compute_capability);
  r.set_loader_format_version(in.env.loader_format_version);
  r.set_engine(in.env.engine);
  r.set_engine_version(in.env.engine_version);
  r.set_framework_version(in.env.framework_version);
  r.set_recipe(in.env.recipe);
  r.set_tenant(in.env.tenant);
  for (const auto& f : e.files) {
    auto* s = r.add_files();
    s->set_name(f.name);
    s->set_path(f.path);
    s->set_dev(f.stat.dev);
    s->set_ino(f.stat.ino);
    s->set_size(f.stat.size);
    s->set_mtime_ns(f.stat.mtime_ns);
    s->set_ctime_ns(f.stat.ctime_ns);
    s->set_digest(f.digest);
    s->set_digest_source(static_cast<uint32_t>(f.digest_source));
  }
  for (const auto& s : content.segments) r.add_segment_sizes(s->size());
  for (auto b : content.plan.segment_bytes) r.add_segment_used(b);
  r.set_total_bytes(content.plan.total_bytes);
  for (const auto& t : content.plan.tensors) ToTensorEntry(t, r.add_tensors());
  for (const auto& t : content.plan.views) ToTensorEntry(t, r.add_views());
  return r.SerializeAsString();
}

cache::DigestCheckFn AdoptionDigestCheck(const v1::KeeperRecord& r) {
  std::vector<std::string> want(r.segment_sha256().begin(), r.segment_sha256().end());
  return [want](const std::vector<integrity::SegmentDigest>& got) -> absl::Status {
    if (got.size() != want.size()) {
      return absl::DataLossError(absl::StrCat("adopted ", got.size(), " segments; the record has ",
                                              want.size(), " digests"));
    }
    std::string changed;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i].sha256.empty() || got[i].sha256 != want[i]) {
        absl::StrAppend(&changed, changed.empty() ? "" : ", ", i, " (",
                        integrity::CryptoDigestText(got[i].sha256), " where the record has ",
                        integrity::CryptoDigestText(want[i]), ")");
      }
    }
    if (changed.empty()) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(
        "the memory changed while the keeper held it (no daemon watched it): segment(s) ", changed,
        " of ", got.size(), " differ from their digests at deposit; not adopted"));
  };
}

absl::StatusOr<AdoptableRecord> DecodeKeeperRecord(const std::string& body) {
  AdoptableRecord out;
  v1::KeeperRecord& r = out.record;
  if (!r.ParseFromString(body)) {
    return absl::InvalidArgumentError(
        absl::StrCat("keeper record of ", body.size(), " bytes does not parse"));
  }
  if (r.format() != kRecordFormat) {
    return absl::InvalidArgumentError(absl::StrCat("keeper record format ", r.format(),
                                                   "; this daemon reads format ", kRecordFormat));
  }
  spec::FingerprintInputs& in = out.inputs;
  in.architecture = r.architecture();
  in.revision = r.revision();
  for (const auto& d : r.digests()) in.files.push_back({d.name(), d.size(), d.content()});
  in.layout = LayoutFromProto(r.layout());
  in.tensor_layout = r.tensor_layout();
  in.quant_method = r.quant_method();
  in.quant_config_sha256 = r.quant_config_sha256();
  in.dtype = r.dtype();
  in.env.compute_capability = r.compute_capability();
  in.env.loader_format_version = r.loader_format_version();
  in.env.engine = r.engine();
  in.env.engine_version = r.engine_version();
  in.env.framework_version = r.framework_version();
  in.env.recipe = r.recipe();
  in.env.tenant = r.tenant();
  if (const std::string fp = in.Digest(); fp != r.fingerprint()) {
    return absl::InvalidArgumentError(
        absl::StrCat("keeper record of model '", r.model(), "': its fingerprint inputs give ",
                     fp.substr(0, 12), ", not the recorded ", r.fingerprint().substr(0, 12)));
  }
  for (const auto& f : r.files()) {
    load::SourceFile s;
    s.name = f.name();
    s.path = f.path();
    s.stat = {f.dev(), f.ino(), f.size(), f.mtime_ns(), f.ctime_ns()};
    s.digest = f.digest();
    s.digest_source = static_cast<identity::DigestSource>(std::min<uint32_t>(
        f.digest_source(), static_cast<uint32_t>(identity::DigestSource::kPinned)));
    out.files.push_back(std::move(s));
  }
  if (r.segment_sizes().empty() || r.segment_used_size() != r.segment_sizes_size()) {
    return absl::InvalidArgumentError(absl::StrCat("keeper record of model '", r.model(),
                                                   "': ", r.segment_sizes_size(), " segments and ",
                                                   r.segment_used_size(), " used sizes"));
  }
  // Without a cryptographic digest per segment nothing vouches for the memory.
  bool sized = r.segment_sha256_size() == r.segment_sizes_size();
  for (const auto& d : r.segment_sha256()) sized = sized && d.size() == integrity::kSha256Bytes;
  if (!sized) {
    return absl::InvalidArgumentError(
        absl::StrCat("keeper record of model '", r.model(), "': ", r.segment_sha256_size(),
                     " cryptographic digests for ", r.segment_sizes_size(),
                     " segments (each of 32 bytes): its memory cannot be checked"));
  }
  out.plan.segment_bytes.assign(r.segment_used().begin(), r.segment_used().end());
  out.plan.total_bytes = r.total_bytes();
  for (const auto& t : r.tensors()) {
    WC_ASSIGN_OR_RETURN(auto pt, GetTensor(t, r));
    out.plan.tensors.push_back(std::move(pt));
  }
  for (const auto& t : r.views()) {
    WC_ASSIGN_OR_RETURN(auto pt, GetTensor(t, r));
    out.plan.views.push_back(std::move(pt));
  }
  return out;
}

std::string KeeperKey(const std::string& fingerprint, const std::string& device) {
  return fingerprint + "@" + device;
}

}  // namespace weightcache::server
