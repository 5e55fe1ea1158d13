#include "pkg/load/plan.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pkg/load/shard_rules.h"
#include "pkg/util/bytes.h"
#include "pkg/util/status_macros.h"

namespace weightcache::load {

namespace {

using safetensors::DType;
using safetensors::TensorInfo;

constexpr std::string_view kScaleSuffix = ".weight_scale_inv";

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool IsScale(std::string_view name) { return EndsWith(name, kScaleSuffix); }

std::string WeightOf(std::string_view scale) {
  return std::string(scale.substr(0, scale.size() - kScaleSuffix.size())) + ".weight";
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Bytes of one row (dim 0 fixed) of a row-major tensor: no division, so no zero to divide by.
uint64_t RowBytes(const std::vector<int64_t>& shape, uint64_t elem) {
  uint64_t n = elem;
  for (size_t i = 1; i < shape.size(); ++i) n *= static_cast<uint64_t>(shape[i]);
  return n;
}

constexpr std::string_view kOnlineQuantized[] = {
    "q_proj",    "k_proj",  "v_proj",    "o_proj",       "qkv_proj",
    "gate_proj", "up_proj", "down_proj", "gate_up_proj", "w1",
    "w2",        "w3",      "q_a_proj",  "q_b_proj",     "kv_a_proj_with_mqa",
    "kv_b_proj"};

struct Ctx {
  const OpenedModel& model;
  int tp = 1;
  int rank = 0;
  const EngineLayout* engine = nullptr;  // null: hf at tp 1, no preset needed
  std::vector<int> block;                // block-FP8 {rows, cols}; empty otherwise
  bool online = false;                   // online fp8_block quantization
};

// Which part of a split dimension this rank holds.
struct Part {
  int64_t parts = 1;
  int64_t index = 0;
};

absl::StatusOr<Part> Partition(const Ctx& c, const ShardRule& rule, const std::string& tensor) {
  const int tp = c.tp;
  if (rule.heads == Heads::kNone || tp == 1) return Part{tp, c.rank};
  const bool kv = rule.heads == Heads::kKeyValue;
  const char* key = kv ? "num_key_value_heads" : "num_attention_heads";
  const int heads = kv ? c.model.config.num_key_value_heads : c.model.config.num_attention_heads;
  if (heads <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor, "': config.json has no ",
                                                   key, ", needed to split it over tp_size ", tp));
  }
  if (heads >= tp) {
    if (heads % tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor, "': tp_size ", tp,
                                                     " does not divide ", key, " ", heads));
    }
    return Part{tp, c.rank};
  }
  if (!kv) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor, "': tp_size ", tp,
                                                   " does not divide ", key, " ", heads,
                                                   " (more ranks than attention heads)"));
  }
  // GQA with fewer k/v heads than ranks: replicate as vLLM and SGLang do, tp/kv consecutive
  // ranks sharing one head.
  if (tp % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", tensor, "': num_key_value_heads ", heads, " is fewer than tp_size ", tp,
        " and does not divide it, so the k/v heads cannot be replicated evenly (engines need "
        "tp_size % num_key_value_heads == 0)"));
  }
  return Part{heads, static_cast<int64_t>(c.rank) * heads / tp};
}

// Element range [lo, hi) of dimension `dim` (size `size`) that part `p` holds, checking that
// the parts are equal and, for block-FP8 tensors, on block boundaries.
struct Range {
  int64_t lo = 0;
  int64_t hi = 0;
};

absl::StatusOr<Range> SplitDim(const std::string& tensor, int dim, int64_t size, Part p, int block,
                               const Ctx& c) {
  if (size % p.parts != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor, "': dim ", dim, " of size ",
                                                   size, " does not divide into ", p.parts,
                                                   " equal parts (tp_size ", c.tp, ")"));
  }
  const int64_t per = size / p.parts;
  if (block > 0 && p.parts > 1 && per % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor, "': splitting dim ", dim, " (size ", size, ") into ",
                     p.parts, " parts of ", per, " is not on a ", block,
                     "-element weight block boundary (quantization_config.weight_block_size [",
                     absl::StrJoin(c.block, ", "), "])"));
  }
  return Range{p.index * per, (p.index + 1) * per};
}

// This rank's shard of `t` (segment and offset not yet set).
absl::StatusOr<PlannedTensor> Shard(const Ctx& c, const TensorInfo& t, const ShardRule* rule) {
  PlannedTensor p;
  p.name = t.name;
  p.dtype = t.dtype;
  p.shape = t.shape;
  p.file_index = t.file_index;
  p.file_offset = t.file_offset;
  p.nbytes = t.nbytes;
  const uint64_t elem = safetensors::DTypeSize(t.dtype);
  const Split split = rule == nullptr ? Split::kReplicated : rule->split;
  const bool scale = IsScale(t.name);
  const bool fp8_block = c.model.quantization.method == "fp8_block" && c.block.size() == 2;

  if (scale && !fp8_block) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", t.name,
                     "' is a block-FP8 scale, but config.json's "
                     "quantization_config is not fp8 with weight_block_size"));
  }
  // A scale must have its weight's block grid, whatever the split.
  const TensorInfo* weight = nullptr;
  if (scale) {
    weight = c.model.checkpoint.Find(WeightOf(t.name));
    if (weight == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': scale without its weight '", WeightOf(t.name), "'"));
    }
    const bool grid_ok = weight->shape.size() == 2 && t.shape.size() == 2 &&
                         t.shape[0] == (weight->shape[0] + c.block[0] - 1) / c.block[0] &&
                         t.shape[1] == (weight->shape[1] + c.block[1] - 1) / c.block[1];
    if (!grid_ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': shape ", ShapeString(t.shape), " is not the ",
                       absl::StrJoin(c.block, "x"), " block grid of its weight '", weight->name,
                       "' ", ShapeString(weight->shape)));
    }
  }

  if (split == Split::kReplicated) return p;

  if (split == Split::kVocab) {
    if (scale) {
      return absl::UnimplementedError(absl::StrCat(
          "tensor '", t.name, "': block-FP8 scales of a vocab-parallel tensor are not served"));
    }
    if (t.shape.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': vocab-parallel split of a scalar"));
    }
    const int64_t vocab = t.shape[0];
    const int64_t pad = c.engine == nullptr ? 1 : c.engine->vocab_pad;
    const int64_t padded = (vocab + pad - 1) / pad * pad;
    if (padded % c.tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': vocabulary of ", vocab, " rows",
          pad > 1 ? absl::StrCat(" padded to ", padded, " (a multiple of ", pad, ")") : "",
          " does not divide by tp_size ", c.tp));
    }
    const int64_t per = padded / c.tp;
    const int64_t lo = std::min<int64_t>(vocab, c.rank * per);
    const int64_t hi = std::min<int64_t>(vocab, (c.rank + 1) * per);
    const uint64_t row_bytes = RowBytes(t.shape, elem);
    p.shape[0] = per;
    p.nbytes = static_cast<uint64_t>(per) * row_bytes;
    p.file_offset = t.file_offset + static_cast<uint64_t>(lo) * row_bytes;
    if (hi - lo != per) {  // padding rows: read the real ones, the rest stays zero
      p.pieces.push_back(Piece{p.file_offset, 0, static_cast<uint64_t>(hi - lo) * row_bytes, 1, 0});
    }
    return p;
  }

  WC_ASSIGN_OR_RETURN(Part part, Partition(c, *rule, t.name));
  const int dim = split == Split::kColumn ? 0 : 1;
  if (split == Split::kRow && t.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name,
                                                   "': a row-parallel split needs a 2-D [out, "
                                                   "in] tensor, got shape ",
                                                   ShapeString(t.shape)));
  }
  if (t.shape.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", t.name, "': column-parallel split of a scalar"));
  }
  Range r;
  if (scale) {
    // Split the weight's dimension on block boundaries; the scale takes those blocks.
    const int block = c.block[static_cast<size_t>(dim)];
    WC_ASSIGN_OR_RETURN(Range w, SplitDim(weight->name, dim, weight->shape[dim], part, block, c));
    r = {w.lo / block, part.index + 1 == part.parts ? t.shape[dim] : w.hi / block};
  } else {
    const bool f8 = fp8_block && t.dtype == DType::kF8_E4M3 && t.shape.size() == 2;
    WC_ASSIGN_OR_RETURN(r, SplitDim(t.name, dim, t.shape[dim], part,
                                    f8 ? c.block[static_cast<size_t>(dim)] : 0, c));
  }
  p.shape[dim] = r.hi - r.lo;
  p.nbytes = Numel(p.shape) * elem;
  if (dim == 0) {
    const uint64_t row_bytes = RowBytes(t.shape, elem);
    p.file_offset = t.file_offset + static_cast<uint64_t>(r.lo) * row_bytes;
    return p;
  }
  if (p.shape[1] == t.shape[1]) return p;  // one part: the whole tensor
  const uint64_t pitch = static_cast<uint64_t>(t.shape[1]) * elem;
  p.file_offset = t.file_offset + static_cast<uint64_t>(r.lo) * elem;
  p.pieces.push_back(Piece{p.file_offset, 0, static_cast<uint64_t>(p.shape[1]) * elem,
                           static_cast<uint64_t>(t.shape[0]), pitch});
  return p;
}

// Online fp8_block: turns the BF16/F16 shard `p` of a quantized weight into its F8_E4M3
// tensor and returns the scale tensor it writes (segment and offset not yet set).
absl::StatusOr<PlannedTensor> QuantizeOnline(const Ctx& c, PlannedTensor& p) {
  if (p.shape.size() != 2 || (p.dtype != DType::kBF16 && p.dtype != DType::kF16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", p.name,
                     "': online fp8_block quantization needs a 2-D BF16 or F16 weight, "
                     "got ",
                     std::string(safetensors::DTypeName(p.dtype)), " ", ShapeString(p.shape)));
  }
  OnlineQuant q;
  q.src_dtype = p.dtype;
  q.src_nbytes = p.nbytes;
  q.block_rows = c.block[0];
  q.block_cols = c.block[1];
  q.scale = std::string(std::string_view(p.name).substr(0, p.name.size() - 7)) +
            std::string(kScaleSuffix);  // "<module>.weight" -> "<module>.weight_scale_inv"
  PlannedTensor s;
  s.name = q.scale;
  s.dtype = DType::kF32;
  s.shape = {(p.shape[0] + q.block_rows - 1) / q.block_rows,
             (p.shape[1] + q.block_cols - 1) / q.block_cols};
  s.strides = RowMajorStrides(s.shape);
  s.nbytes = Numel(s.shape) * sizeof(float);
  s.scale_of = p.name;
  p.dtype = DType::kF8_E4M3;
  p.nbytes = Numel(p.shape);
  p.quant = std::move(q);
  return s;
}

// A fused-group instance: the fused view's name and its members' names in part order.
struct Fused {
  std::string name;
  std::vector<std::string> members;  // "" where the checkpoint lacks that part
};

// Finds every complete fused-group instance of `engine` among the tensor names.
std::map<std::string, Fused> FindFused(const EngineLayout& engine,
                                       const std::vector<PlannedTensor>& tensors) {
  static constexpr std::string_view kSuffixes[] = {"weight", "bias", "weight_scale_inv"};
  std::map<std::string, Fused> all;
  for (const auto& t : tensors) {
    const std::string& name = t.name;
    for (const auto& g : engine.fused) {
      for (size_t i = 0; i < g.parts.size(); ++i) {
        const std::string needle = absl::StrCat(".", g.parts[i], ".");
        for (size_t pos = name.find(needle); pos != std::string::npos;
             pos = name.find(needle, pos + 1)) {
          const std::string_view prefix = std::string_view(name).substr(0, pos);
          const std::string_view suffix = std::string_view(name).substr(pos + needle.size());
          if (std::find(std::begin(kSuffixes), std::end(kSuffixes), suffix) ==
                  std::end(kSuffixes) ||
              !GlobMatch(g.module_pattern, prefix)) {
            continue;
          }
          const std::string fused =
              absl::StrCat(std::string(prefix), ".", g.fused, ".", std::string(suffix));
          Fused& f = all[fused];
          f.name = fused;
          f.members.resize(g.parts.size());
          f.members[i] = name;
        }
      }
    }
  }
  for (auto it = all.begin(); it != all.end();) {
    const auto& m = it->second.members;
    it = std::any_of(m.begin(), m.end(), [](const auto& s) { return s.empty(); }) ? all.erase(it)
                                                                                  : std::next(it);
  }
  return all;
}

// The view aliasing a fused instance's members (placed back to back): their concatenation
// along dim 0.
absl::StatusOr<PlannedTensor> FusedView(const Ctx& c, const Fused& f,
                                        const std::vector<const PlannedTensor*>& members,
                                        const std::map<std::string, size_t>& index,
                                        const std::vector<PlannedTensor>& shards) {
  const PlannedTensor& first = *members.front();
  PlannedTensor v;
  v.name = f.name;
  v.dtype = first.dtype;
  v.shape = first.shape;
  v.shape[0] = 0;
  v.segment = first.segment;
  v.offset = first.offset;
  for (size_t i = 0; i < members.size(); ++i) {
    const PlannedTensor& m = *members[i];
    const bool same_tail = m.shape.size() == first.shape.size() &&
                           std::equal(m.shape.begin() + 1, m.shape.end(), first.shape.begin() + 1);
    if (m.dtype != first.dtype || m.shape.empty() || !same_tail) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fused view '", f.name, "': member '", m.name, "' (",
          std::string(safetensors::DTypeName(m.dtype)), " ", ShapeString(m.shape),
          ") does not stack with '", first.name, "' (",
          std::string(safetensors::DTypeName(first.dtype)), " ", ShapeString(first.shape), ")"));
    }
    // A fused scale is the concatenation of the members' scales only if every member but
    // the last covers whole weight blocks on this rank.
    if (IsScale(m.name) && i + 1 < members.size()) {
      auto w = index.find(WeightOf(m.name));
      if (w != index.end() && shards[w->second].shape[0] % c.block[0] != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("fused view '", f.name, "': member '", shards[w->second].name, "' has ",
                         shards[w->second].shape[0], " rows on this rank, not a multiple of the ",
                         c.block[0], "-row weight block, so the fused scale is not a plain view"));
      }
    }
    v.shape[0] += m.shape[0];
    v.nbytes += m.nbytes;
  }
  v.strides = RowMajorStrides(v.shape);
  return v;
}

}  // namespace

bool IsOnlineQuantized(std::string_view name) {
  constexpr std::string_view kWeight = ".weight";
  if (!EndsWith(name, kWeight)) return false;
  std::string_view module = name.substr(0, name.size() - kWeight.size());
  const size_t dot = module.rfind('.');
  const std::string_view last = dot == std::string_view::npos ? module : module.substr(dot + 1);
  return std::find(std::begin(kOnlineQuantized), std::end(kOnlineQuantized), last) !=
         std::end(kOnlineQuantized);
}

absl::StatusOr<Plan> PlanRank(const OpenedModel& model, const spec::Layout& layout,
                              const PlanOptions& options) {
  if (layout.pp_size != 1) {
    return absl::UnimplementedError(absl::StrCat(
        "model '", model.spec.name, "': layout pp_size ", layout.pp_size,
        " is not served by this build (pipeline-parallel stages are not planned yet)"));
  }
  if (layout.tp_size < 1 || layout.tp_rank < 0 || layout.tp_rank >= layout.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("model '", model.spec.name, "': tp_rank ",
                                                   layout.tp_rank, " is not in [0, tp_size ",
                                                   layout.tp_size, ")"));
  }
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: alignment ", options.alignment, " is not a power of two"));
  }
  const std::string engine_name = model.spec.layout.empty() ? "hf" : model.spec.layout;
  Ctx c{model, layout.tp_size, layout.tp_rank, nullptr, {}};
  if (model.quantization.method == "fp8_block") c.block = model.quantization.weight_block_size;
  c.online = model.quantization.method == "fp8_block" && model.quantization.online;
  const ArchPreset* preset = nullptr;
  // tp_size 1 as stored needs no knowledge of the architecture: every tensor whole.
  if (layout.tp_size > 1 || engine_name != "hf") {
    auto found = FindPreset(model.architecture);
    if (!found.ok()) {
      return Annotate(found.status(), absl::StrCat("model '", model.spec.name, "': tp_size ",
                                                   layout.tp_size, ", layout ", engine_name));
    }
    preset = *found;
    WC_ASSIGN_OR_RETURN(c.engine, FindLayout(*preset, engine_name));
  }

  const auto& tensors = model.checkpoint.tensors();
  if (tensors.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", model.spec.name, "': the checkpoint has no tensors"));
  }
  // Rules first, and head counts before any dimension: "tp_size 3 does not divide
  // num_attention_heads 32" says more than the first tensor whose rows do not split.
  std::vector<const ShardRule*> rules(tensors.size(), nullptr);
  if (preset != nullptr) {
    const std::string who = absl::StrCat("model '", model.spec.name, "'");
    for (size_t i = 0; i < tensors.size(); ++i) {
      auto r = FindRule(*preset, tensors[i].name);
      if (!r.ok()) return Annotate(r.status(), who);
      rules[i] = *r;
    }
    for (Heads heads : {Heads::kAttention, Heads::kKeyValue}) {
      for (size_t i = 0; i < tensors.size(); ++i) {
        if (rules[i]->heads != heads || rules[i]->split == Split::kReplicated) continue;
        auto part = Partition(c, *rules[i], tensors[i].name);
        if (!part.ok()) return Annotate(part.status(), who);
      }
    }
  }
  if (c.online) {
    for (const auto& t : tensors) {
      if (IsScale(t.name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model '", model.spec.name, "': online fp8_block quantization asked, but tensor '",
            t.name, "' is already a block-FP8 scale (and config.json has no quantization_config)"));
      }
    }
  }
  std::vector<PlannedTensor> shards;
  shards.reserve(tensors.size());
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    const ShardRule* rule = rules[i];
    auto shard = Shard(c, t, rule);
    if (!shard.ok()) return Annotate(shard.status(), absl::StrCat("model '", model.spec.name, "'"));
    shard->strides = RowMajorStrides(shard->shape);
    std::optional<PlannedTensor> scale;
    if (c.online && IsOnlineQuantized(t.name)) {
      auto s = QuantizeOnline(c, *shard);
      if (!s.ok()) return Annotate(s.status(), absl::StrCat("model '", model.spec.name, "'"));
      scale = *std::move(s);
    }
    index[t.name] = shards.size();
    shards.push_back(*std::move(shard));
    if (scale.has_value()) {  // right after its weight: "<x>.weight" < "<x>.weight_scale_inv"
      index[scale->name] = shards.size();
      shards.push_back(*std::move(scale));
    }
  }

  // Placement units: a fused instance's members back to back, or one tensor, in name order
  // of their first member.
  std::map<std::string, Fused> fused;
  if (c.engine != nullptr) fused = FindFused(*c.engine, shards);
  std::map<std::string, const Fused*> fused_of;  // member name -> instance
  for (const auto& [name, f] : fused) {
    for (const auto& m : f.members) fused_of.emplace(m, &f);
  }

  Plan plan;
  std::vector<bool> placed(shards.size(), false);
  uint64_t cursor = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    if (placed[i]) continue;
    std::vector<size_t> unit;
    const Fused* f = nullptr;
    if (auto it = fused_of.find(shards[i].name); it != fused_of.end()) f = it->second;
    if (f != nullptr) {
      for (const auto& m : f->members) unit.push_back(index.at(m));
    } else {
      unit.push_back(i);
    }
    uint64_t unit_bytes = 0;
    for (size_t k : unit) unit_bytes += shards[k].nbytes;
    uint64_t at = RoundUp(cursor, options.alignment);
    // Start a new segment when this unit would overflow a non-empty one.
    if (plan.segment_bytes.empty() || (at + unit_bytes > options.max_segment_bytes && at > 0)) {
      plan.segment_bytes.push_back(0);
      at = 0;
    }
    for (size_t k : unit) {
      shards[k].segment = static_cast<uint32_t>(plan.segment_bytes.size() - 1);
      shards[k].offset = at;
      at += shards[k].nbytes;
      placed[k] = true;
      plan.total_bytes += shards[k].nbytes;
    }
    cursor = at;
    plan.segment_bytes.back() = cursor;
  }
  for (const auto& [name, f] : fused) {
    std::vector<const PlannedTensor*> members;
    for (const auto& m : f.members) members.push_back(&shards[index.at(m)]);
    auto view = FusedView(c, f, members, index, shards);
    if (!view.ok()) return Annotate(view.status(), absl::StrCat("model '", model.spec.name, "'"));
    plan.views.push_back(*std::move(view));
  }
  if (!options.loader_reads_pieces) {
    for (const auto& s : shards) {
      if (!s.pieces.empty()) {
        return absl::UnimplementedError(
            absl::StrCat("model '", model.spec.name, "': tp_size ", layout.tp_size, ", layout ",
                         engine_name, " needs strided or padded reads (tensor '", s.name,
                         "'), which this loader does not perform yet"));
      }
    }
  }
  plan.tensors = std::move(shards);  // already in name order (the checkpoint's)
  return plan;
}

PlanPart PlanSegments(const Plan& plan, std::vector<bool> wanted) {
  wanted.resize(plan.segment_bytes.size(), false);
  // Widen: a quantization writes its weight's segment and its scale's. Each pass can only
  // add segments, so this ends after at most one pass per segment.
  std::map<std::string_view, uint32_t> segment_of;
  for (const auto& t : plan.tensors) segment_of.emplace(t.name, t.segment);
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& t : plan.tensors) {
      if (!t.quant) continue;
      auto s = segment_of.find(t.quant->scale);
      if (s == segment_of.end() || s->second == t.segment) continue;
      if (wanted[t.segment] != wanted[s->second]) {
        wanted[t.segment] = wanted[s->second] = true;
        grew = true;
      }
    }
  }
  PlanPart out;
  std::vector<uint32_t> renumbered(plan.segment_bytes.size(), 0);
  for (uint32_t i = 0; i < plan.segment_bytes.size(); ++i) {
    if (!wanted[i]) continue;
    renumbered[i] = static_cast<uint32_t>(out.segments.size());
    out.segments.push_back(i);
    out.plan.segment_bytes.push_back(plan.segment_bytes[i]);
  }
  for (const auto& t : plan.tensors) {
    if (t.segment >= wanted.size() || !wanted[t.segment]) continue;
    out.plan.tensors.push_back(t);
    out.plan.tensors.back().segment = renumbered[t.segment];
    out.plan.total_bytes += t.nbytes;
  }
  return out;
}

}  // namespace weightcache::load
