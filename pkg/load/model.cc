#include "pkg/load/model.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/load/internal/pinned.h"
#include "pkg/util/status_macros.h"

namespace weightcache::load {

using safetensors::DType;

std::string ShortDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "fp16";
    case DType::kF32:
      return "fp32";
    case DType::kF64:
      return "fp64";
    case DType::kF8_E4M3:
      return "fp8_e4m3";
    case DType::kF8_E5M2:
      return "fp8_e5m2";
    default: {
      std::string s(safetensors::DTypeName(dtype));
      for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return s;
    }
  }
}

namespace {

bool IsFloat(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32 || d == DType::kF64 ||
         d == DType::kF8_E4M3 || d == DType::kF8_E5M2;
}

// The stored dtype of the weights: the floating dtype holding the most bytes.
absl::StatusOr<DType> StoredDType(const safetensors::Checkpoint& ckpt, bool fp8) {
  std::map<DType, uint64_t> bytes;
  for (const auto& t : ckpt.tensors()) {
    if (IsFloat(t.dtype)) bytes[t.dtype] += t.nbytes;
  }
  if (fp8) return DType::kF8_E4M3;
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ckpt.dir(), ": no floating-point tensors in the checkpoint"));
  }
  DType best = bytes.begin()->first;
  for (const auto& [d, n] : bytes) {
    if (n > bytes[best]) best = d;
  }
  return best;
}

}  // namespace

spec::FingerprintInputs OpenedModel::Inputs(const spec::Layout& layout,
                                            const spec::Environment& env) const {
  spec::FingerprintInputs in;
  in.architecture = architecture;
  in.revision = spec.revision;
  for (const auto& f : files) in.files.push_back({f.name, f.stat.size, f.digest});
  in.layout = layout;
  in.tensor_layout = spec.layout;
  in.quant_method = quantization.method;
  in.quant_config_sha256 = quantization.config_sha256;
  in.dtype = dtype;
  in.env = env;
  return in;
}

bool OpenedModel::Reproduces(const spec::FingerprintInputs& entry,
                             const std::string& fingerprint) const {
  return spec.tp_size == entry.layout.tp_size && spec.pp_size == entry.layout.pp_size &&
         spec.Private() == !entry.env.tenant.empty() &&
         Inputs(entry.layout, entry.env).Digest() == fingerprint;
}

std::vector<std::string> ChangedFiles(const std::vector<SourceFile>& files) {
  std::vector<std::string> out;
  for (const auto& f : files) {
    std::string change = identity::DescribeChange(f.name, f.stat, identity::StatPath(f.path));
    if (!change.empty()) out.push_back(std::move(change));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const OpenedModel>> OpenModel(const spec::ModelSpec& s,
                                                             const OpenOptions& options) {
  WC_RETURN_IF_ERROR(spec::Validate(s));
  WC_ASSIGN_OR_RETURN(spec::ModelConfig config, spec::ReadModelConfig(s.model_dir));
  // The allowlist, before any safetensors file is opened.
  WC_ASSIGN_OR_RETURN(spec::Quantization quant, spec::ResolveQuantization(s, config));
  if (!s.architecture.empty() && !config.architecture.empty() &&
      s.architecture != config.architecture) {
    return absl::InvalidArgumentError(absl::StrCat("model '", s.name, "': spec architecture ",
                                                   s.architecture, " differs from config.json's ",
                                                   config.architecture));
  }
  std::string arch = s.architecture.empty() ? config.architecture : s.architecture;
  WC_ASSIGN_OR_RETURN(safetensors::Checkpoint ckpt, safetensors::Checkpoint::Open(s.model_dir));
  WC_RETURN_IF_ERROR(internal::CheckPinsCover(s, ckpt));
  WC_ASSIGN_OR_RETURN(DType stored, StoredDType(ckpt, quant.method == "fp8_block"));
  std::string dtype = ShortDTypeName(stored);
  if (s.dtype != "auto" && s.dtype != dtype) {
    return absl::UnimplementedError(
        absl::StrCat("model '", s.name, "': dtype ", s.dtype, " asked but the checkpoint stores ",
                     dtype, "; dtype conversion is not served (use dtype: auto or ", dtype, ")"));
  }
  // Content identity of every file, from the descriptors the loader will read through.
  std::unique_ptr<identity::DigestStore> private_store;
  identity::DigestStore* store = options.digests;
  if (store == nullptr && options.content_digests) {
    WC_ASSIGN_OR_RETURN(private_store, identity::DigestStore::Open(""));
    store = private_store.get();
  }
  // Files are identified in parallel: a file this node has not seen is one sequential
  // SHA-256 (~1 GB/s a core), so a sharded checkpoint needs its files side by side to hash at
  // more than one core's speed. Pinned files are not read.
  const auto& ckfiles = ckpt.files();
  std::vector<SourceFile> files(ckfiles.size());
  std::vector<absl::Status> errors(ckfiles.size());
  const unsigned workers = static_cast<unsigned>(std::clamp<size_t>(
      std::max(1u, options.hash_threads), 1, std::max<size_t>(1, ckfiles.size())));
  std::atomic<size_t> next{0};
  auto identify_one = [&](const safetensors::File& f) -> absl::StatusOr<SourceFile> {
    const std::string& path = f.info().path;
    if (s.digests.count(f.info().name) != 0 && options.content_digests) {
      return internal::PinnedSource(s, f.info().name, path, f.fd(), store);
    }
    SourceFile sf{f.info().name, path, {}, "", identity::DigestSource::kHashed};
    if (store == nullptr) {
      WC_ASSIGN_OR_RETURN(sf.stat, identity::StatFd(f.fd(), path));
      return sf;
    }
    WC_ASSIGN_OR_RETURN(identity::ResolvedDigest r, store->Resolve(path, f.fd(), options.cancel));
    sf.stat = r.stat;
    sf.digest = std::move(r.digest);
    sf.digest_source = r.source;
    return sf;
  };
  auto identify = [&] {
    for (size_t i = next++; i < ckfiles.size(); i = next++) {
      auto sf = identify_one(ckfiles[i]);
      if (sf.ok()) {
        files[i] = std::move(*sf);
      } else {
        errors[i] = sf.status();
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned w = 1; w < workers; ++w) pool.emplace_back(identify);
  identify();
  for (auto& t : pool) t.join();
  for (const auto& e : errors) WC_RETURN_IF_ERROR(e);
  return std::make_shared<const OpenedModel>(
      OpenedModel{s, std::move(config), std::move(quant), std::move(arch), std::move(dtype),
                  std::move(ckpt), std::move(files), options.digests});
}

}  // namespace weightcache::load
