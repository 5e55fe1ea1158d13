#include "pkg/load/pieces.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "pkg/load/internal/in_turns.h"
#include "pkg/util/status_macros.h"

namespace weightcache::load {

uint64_t SourceBytes(const PlannedTensor& t) {
  if (!t.scale_of.empty()) return 0;
  return t.quant.has_value() ? t.quant->src_nbytes : t.nbytes;
}

void ForEachRun(const PlannedTensor& t, const std::function<void(const Run&)>& fn) {
  if (!t.scale_of.empty()) return;  // written by its weight's quantization, never read
  if (t.pieces.empty()) {
    if (SourceBytes(t) > 0) fn(Run{t.file_offset, SourceBytes(t), 0});
    return;
  }
  for (const Piece& p : t.pieces) {
    if (p.row_bytes == 0 || p.rows == 0) continue;
    if (p.rows == 1 || p.src_pitch == p.row_bytes) {  // contiguous in the file too
      fn(Run{p.file_offset, p.row_bytes * p.rows, p.dst_offset});
      continue;
    }
    for (uint64_t r = 0; r < p.rows; ++r) {
      fn(Run{p.file_offset + r * p.src_pitch, p.row_bytes, p.dst_offset + r * p.row_bytes});
    }
  }
}

void AppendReadRequests(const PlannedTensor& t, int fd, void* dst, std::string_view what,
                        std::vector<safetensors::ReadRequest>* reqs) {
  auto* base = static_cast<uint8_t*>(dst);
  ForEachRun(t, [&](const Run& r) {
    reqs->push_back({fd, r.file_offset, r.length, base + r.dst_offset, what});
  });
}

std::vector<safetensors::ReadRequest> FilesInTurn(
    const std::vector<std::vector<safetensors::ReadRequest>>& by_file, size_t width,
    uint64_t chunk) {
  chunk = std::max<uint64_t>(1, chunk);
  // Each file's requests as a queue of reads of at most `chunk`.
  std::vector<std::deque<safetensors::ReadRequest>> reads;
  for (const auto& reqs : by_file) {
    std::deque<safetensors::ReadRequest> q;
    for (const auto& r : reqs) {
      for (uint64_t at = 0; at < r.length; at += chunk) {
        q.push_back({r.fd, r.offset + at, std::min(chunk, r.length - at),
                     static_cast<uint8_t*>(r.dst) + at, r.what});
      }
    }
    reads.push_back(std::move(q));
  }
  return internal::InTurns(std::move(reads), width);
}

std::vector<std::pair<uint64_t, uint64_t>> PaddingRanges(const PlannedTensor& t) {
  std::vector<std::pair<uint64_t, uint64_t>> covered;
  if (t.pieces.empty()) return {};
  for (const Piece& p : t.pieces) {
    if (p.bytes() > 0) covered.emplace_back(p.dst_offset, p.dst_offset + p.bytes());
  }
  std::sort(covered.begin(), covered.end());
  std::vector<std::pair<uint64_t, uint64_t>> out;
  uint64_t at = 0;
  for (const auto& [b, e] : covered) {
    if (b > at) out.emplace_back(at, b);
    at = std::max(at, e);
  }
  if (at < SourceBytes(t)) out.emplace_back(at, SourceBytes(t));
  return out;
}

absl::Status ReadPlannedTensor(const PlannedTensor& t, int fd, void* dst, std::string_view what,
                               const safetensors::ReadOptions& options, uint64_t gather_below) {
  auto* base = static_cast<uint8_t*>(dst);
  for (const auto& [b, e] : PaddingRanges(t)) std::memset(base + b, 0, e - b);
  std::vector<safetensors::ReadRequest> reqs;
  if (t.pieces.empty()) {
    AppendReadRequests(t, fd, dst, what, &reqs);
    return safetensors::ReadRanges(reqs, options);
  }
  constexpr uint64_t kScratchBytes = 64ull << 20;
  std::vector<uint8_t> scratch;
  for (const Piece& p : t.pieces) {
    if (p.bytes() == 0) continue;
    if (p.rows == 1 || p.src_pitch == p.row_bytes || p.row_bytes >= gather_below) {
      PlannedTensor one;
      one.nbytes = SourceBytes(t);
      one.pieces = {p};
      AppendReadRequests(one, fd, dst, what, &reqs);
      continue;
    }
    // Small strided rows: read whole row groups (covering ranges) and gather.
    const uint64_t rows_per_batch = std::max<uint64_t>(1, kScratchBytes / p.src_pitch);
    for (uint64_t r0 = 0; r0 < p.rows; r0 += rows_per_batch) {
      const uint64_t n = std::min(rows_per_batch, p.rows - r0);
      const uint64_t span = (n - 1) * p.src_pitch + p.row_bytes;
      scratch.resize(span);
      std::vector<safetensors::ReadRequest> one{
          {fd, p.file_offset + r0 * p.src_pitch, span, scratch.data(), what}};
      WC_RETURN_IF_ERROR(safetensors::ReadRanges(one, options));
      for (uint64_t r = 0; r < n; ++r) {
        std::memcpy(base + p.dst_offset + (r0 + r) * p.row_bytes, scratch.data() + r * p.src_pitch,
                    p.row_bytes);
      }
    }
  }
  return reqs.empty() ? absl::OkStatus() : safetensors::ReadRanges(reqs, options);
}

}  // namespace weightcache::load
