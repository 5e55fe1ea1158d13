#include "pkg/load/scatter.h"

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "pkg/load/internal/in_turns.h"
#include "pkg/load/pieces.h"
#include "pkg/util/bytes.h"

namespace weightcache::load {
namespace {

// One destination run of one rank: `rows` rows of `row_bytes`, `pitch` apart in the file
// from `file_offset`, packed from `dst` of segment `segment` (or of job `quant`'s scratch).
struct Item {
  uint64_t file_offset = 0;
  uint64_t row_bytes = 0;
  uint64_t rows = 1;
  uint64_t pitch = 0;
  uint32_t rank = 0;
  uint32_t segment = 0;
  uint64_t dst = 0;
  int32_t quant = -1;

  uint64_t end() const { return file_offset + (rows - 1) * pitch + row_bytes; }
};

// The items of one file and the byte ranges to read for them, in file order.
struct FileWork {
  std::vector<Item> items;                             // sorted by file_offset
  std::vector<std::pair<uint64_t, uint64_t>> extents;  // [begin, end), disjoint, sorted
};

// Appends the copies that move the part of `it` inside file bytes [a, b) out of a span
// whose first byte (file offset `span_file`) sits at buffer byte `span_at`. Rows wholly
// inside become one 2-D copy; a row cut by a or b becomes a 1-D copy of its part.
void Clip(const Item& it, uint64_t a, uint64_t b, uint64_t span_file, uint64_t span_at,
          std::vector<ScatterCopy>* out) {
  if (b <= it.file_offset || a >= it.end()) return;
  const uint64_t pitch = it.rows > 1 ? it.pitch : it.row_bytes;
  auto emit = [&](uint64_t file, uint64_t dst, uint64_t width, uint64_t height) {
    ScatterCopy c;
    c.rank = it.rank;
    c.segment = it.segment;
    c.dst = dst;
    c.src = span_at + (file - span_file);
    c.width = width;
    c.height = height;
    c.src_pitch = height > 1 ? pitch : width;
    c.quant = it.quant;
    out->push_back(c);
  };
  uint64_t i = a > it.file_offset ? (a - it.file_offset) / pitch : 0;
  while (i < it.rows) {
    const uint64_t s = it.file_offset + i * pitch;
    if (s >= b) break;
    const uint64_t e = s + it.row_bytes;
    if (e <= a) {  // in the gap before a
      ++i;
      continue;
    }
    if (s >= a && e <= b) {
      // Rows i..last lie wholly inside [a, b): off + j*pitch + row_bytes <= b.
      const uint64_t last = std::min(it.rows - 1, (b - it.file_offset - it.row_bytes) / pitch);
      emit(s, it.dst + i * it.row_bytes, it.row_bytes, last - i + 1);
      i = last + 1;
    } else {
      const uint64_t cs = std::max(s, a), ce = std::min(e, b);
      emit(cs, it.dst + i * it.row_bytes + (cs - s), ce - cs, 1);
      ++i;
    }
  }
}

// The buffers of up to `width` files in turn (ScatterOptions::interleave_files): a buffer
// belongs to the file of its first span; each file's buffers keep their order.
void Interleave(size_t width, ScatterPlan* out) {
  std::map<size_t, std::deque<ScatterBuffer>> by_file;
  for (auto& b : out->buffers) by_file[b.spans.front().file].push_back(std::move(b));
  std::vector<std::deque<ScatterBuffer>> queues;
  for (auto& [file, q] : by_file) queues.push_back(std::move(q));
  out->buffers = internal::InTurns(std::move(queues), width);
}

}  // namespace

absl::StatusOr<const PlannedTensor*> ScaleTensorOf(const Plan& plan, const PlannedTensor& t) {
  const PlannedTensor* s = nullptr;
  auto it =
      std::lower_bound(plan.tensors.begin(), plan.tensors.end(), t.quant->scale,
                       [](const PlannedTensor& p, const std::string& n) { return p.name < n; });
  if (it != plan.tensors.end() && it->name == t.quant->scale) s = &*it;
  if (s == nullptr) {  // not sorted after all: linear search
    for (const auto& p : plan.tensors) {
      if (p.name == t.quant->scale) s = &p;
    }
  }
  if (s == nullptr || s->dtype != safetensors::DType::kF32 || s->shape.size() != 2 ||
      t.shape.size() != 2 ||
      s->shape[0] != (t.shape[0] + t.quant->block_rows - 1) / t.quant->block_rows ||
      s->shape[1] != (t.shape[1] + t.quant->block_cols - 1) / t.quant->block_cols) {
    return absl::InternalError(absl::StrCat("plan: tensor '", t.name, "' has no scale tensor '",
                                            t.quant->scale, "' of its block grid"));
  }
  return s;
}

absl::StatusOr<ScatterPlan> PlanScatter(const std::vector<const Plan*>& plans,
                                        const ScatterOptions& options) {
  ScatterPlan out;
  out.align = std::max<uint64_t>(1, options.align);
  out.buffer_bytes = std::max(out.align, options.buffer_bytes / out.align * out.align);
  out.scratch_bytes.assign(plans.size(), 0);

  std::map<size_t, FileWork> files;
  for (uint32_t r = 0; r < plans.size(); ++r) {
    for (const PlannedTensor& t : plans[r]->tensors) {
      if (!t.scale_of.empty() || SourceBytes(t) == 0) continue;  // written, never read
      int32_t quant = -1;
      if (t.quant.has_value()) {
        auto scale = ScaleTensorOf(*plans[r], t);
        if (!scale.ok()) return scale.status();
        quant = static_cast<int32_t>(out.jobs.size());
        out.jobs.push_back({r, &t, *scale});
        out.scratch_bytes[r] = std::max(out.scratch_bytes[r], SourceBytes(t));
      }
      FileWork& fw = files[t.file_index];
      // A quantized shard lands in scratch at its source offsets; others in the segment.
      const uint64_t base = quant >= 0 ? 0 : t.offset;
      auto add = [&](uint64_t file_offset, uint64_t row_bytes, uint64_t rows, uint64_t pitch,
                     uint64_t dst) {
        Item it{file_offset, row_bytes, rows, pitch, r, t.segment, base + dst, quant};
        fw.items.push_back(it);
        if (rows > 1 && row_bytes >= options.read_rows_above) {
          for (uint64_t k = 0; k < rows; ++k) {
            fw.extents.emplace_back(file_offset + k * pitch, file_offset + k * pitch + row_bytes);
          }
        } else {
          fw.extents.emplace_back(file_offset, it.end());
        }
      };
      if (t.pieces.empty()) {
        add(t.file_offset, SourceBytes(t), 1, 0, 0);
        continue;
      }
      for (const Piece& p : t.pieces) {
        if (p.row_bytes == 0 || p.rows == 0) continue;
        if (p.rows == 1 || p.src_pitch == p.row_bytes) {
          add(p.file_offset, p.row_bytes * p.rows, 1, 0, p.dst_offset);
        } else {
          add(p.file_offset, p.row_bytes, p.rows, p.src_pitch, p.dst_offset);
        }
      }
    }
  }

  ScatterBuffer cur;
  uint64_t used = 0;  // bytes of the current buffer taken (aligned span starts)
  auto flush = [&] {
    if (cur.spans.empty()) return;
    out.buffers.push_back(std::move(cur));
    cur = ScatterBuffer{};
    used = 0;
  };
  for (auto& [file, fw] : files) {
    std::sort(fw.items.begin(), fw.items.end(), [](const Item& a, const Item& b) {
      return std::tie(a.file_offset, a.rank) < std::tie(b.file_offset, b.rank);
    });
    std::sort(fw.extents.begin(), fw.extents.end());
    std::vector<std::pair<uint64_t, uint64_t>> merged;
    for (const auto& [b, e] : fw.extents) {
      if (!merged.empty() && b <= merged.back().second) {
        merged.back().second = std::max(merged.back().second, e);
      } else {
        merged.emplace_back(b, e);
      }
    }
    size_t first_live = 0;  // items before it end before the current span
    for (const auto& [begin, end] : merged) {
      uint64_t at_file = begin;
      while (at_file < end) {
        const uint64_t lead = at_file % out.align;
        uint64_t start = RoundUp(used, out.align);
        if (start + lead >= out.buffer_bytes) {
          flush();
          start = 0;
        }
        const uint64_t at = start + lead;
        const uint64_t n = std::min(end - at_file, out.buffer_bytes - at);
        cur.spans.push_back({file, at_file, n, at});
        cur.read_bytes += n;
        out.read_bytes += n;
        while (first_live < fw.items.size() && fw.items[first_live].end() <= at_file) ++first_live;
        for (size_t k = first_live; k < fw.items.size(); ++k) {
          const Item& it = fw.items[k];
          if (it.file_offset >= at_file + n) break;
          Clip(it, at_file, at_file + n, at_file, at, &cur.copies);
        }
        used = at + n;
        at_file += n;
        if (used >= out.buffer_bytes) flush();
      }
    }
  }
  flush();
  if (options.interleave_files > 1 && out.jobs.empty()) Interleave(options.interleave_files, &out);
  // Each job's last copy completes its source shard.
  std::vector<ScatterCopy*> last(out.jobs.size(), nullptr);
  for (auto& buf : out.buffers) {
    for (auto& c : buf.copies) {
      out.copy_bytes += c.bytes();
      if (c.quant >= 0) last[static_cast<size_t>(c.quant)] = &c;
    }
  }
  for (size_t j = 0; j < last.size(); ++j) {
    if (last[j] == nullptr) {
      return absl::InternalError(
          absl::StrCat("scatter plan: tensor '", out.jobs[j].tensor->name, "' has no bytes"));
    }
    last[j]->finishes = true;
  }
  return out;
}

}  // namespace weightcache::load
