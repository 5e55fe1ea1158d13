// DType helpers and File::Open: the strict single-file header validator.
#include "pkg/safetensors/safetensors.h"

#include <algorithm>
#include <array>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "pkg/safetensors/internal/io.h"
#include "pkg/safetensors/internal/json.h"
#include "pkg/util/log.h"
#include "pkg/util/regular_file.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/untrusted_text.h"

namespace weightcache::safetensors {
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeEntry, 15> kDTypes = {{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kF8_E4M3, "F8_E4M3", 1},
    {DType::kF8_E5M2, "F8_E5M2", 1},
    {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},
    {DType::kF32, "F32", 4},
    {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},
    {DType::kF64, "F64", 8},
}};

const DTypeEntry& Entry(DType dtype) {
  const auto i = static_cast<size_t>(dtype);
  WC_CHECK(i < kDTypes.size() && kDTypes[i].dtype == dtype);
  return kDTypes[i];
}

uint64_t LoadLe64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A tensor entry being validated: its offsets relative to the data area.
struct Span {
  uint64_t begin = 0;
  uint64_t end = 0;
  size_t tensor = 0;  // index into the tensor list
};

// Validates one "name": {...} entry. `prefix` is "<path>: tensor '<name>'".
absl::Status ParseTensorEntry(const std::string& prefix, const nlohmann::json& entry,
                              const Limits& limits, uint64_t data_size, TensorInfo& tensor,
                              Span& span) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ": entry is a JSON ", entry.type_name(), ", not an object"));
  }
  for (const auto& item : entry.items()) {
    const std::string& key = item.key();
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, ": unexpected key '", key, "' (want exactly dtype, shape, data_offsets)"));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, ": missing key '", key, "'"));
    }
  }

  const nlohmann::json& dtype = entry["dtype"];
  if (!dtype.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ": dtype ", internal::Brief(dtype), " is not a string"));
  }
  auto parsed_dtype = ParseDType(dtype.get<std::string>());
  if (!parsed_dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ": ", std::string(parsed_dtype.status().message())));
  }
  tensor.dtype = *parsed_dtype;

  const nlohmann::json& shape = entry["shape"];
  if (!shape.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ": shape ", internal::Brief(shape), " is not an array"));
  }
  if (shape.size() > limits.max_rank) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ": shape ", internal::Brief(shape),
                                                   " has rank ", shape.size(),
                                                   ", above the limit of ", limits.max_rank));
  }
  uint64_t numel = 1;
  bool overflow = false;
  for (const nlohmann::json& dim : shape) {
    if (dim.is_number_integer() && !dim.is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, ": shape ", internal::Brief(shape),
                                                     " has negative dimension ",
                                                     dim.get<int64_t>()));
    }
    if (!dim.is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, ": shape ", internal::Brief(shape),
                                                     " has dimension ", internal::Brief(dim),
                                                     " that is not a non-negative integer"));
    }
    const uint64_t d = dim.get<uint64_t>();
    if (d == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, ": shape ", internal::Brief(shape),
                       " has a zero-sized dimension (empty tensors are not served)"));
    }
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, ": shape ", internal::Brief(shape),
                                                     " has dimension ", d, " above 2^63-1"));
    }
    tensor.shape.push_back(static_cast<int64_t>(d));
    overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  }
  const size_t elem = DTypeSize(tensor.dtype);
  uint64_t nbytes = 0;
  if (overflow || __builtin_mul_overflow(numel, elem, &nbytes)) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ": shape ", internal::Brief(shape),
                                                   " x ", std::string(DTypeName(tensor.dtype)),
                                                   " overflows 64 bits"));
  }

  const nlohmann::json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ": data_offsets ",
                                                   internal::Brief(offsets),
                                                   " is not a pair of non-negative integers"));
  }
  span.begin = offsets[0].get<uint64_t>();
  span.end = offsets[1].get<uint64_t>();
  if (span.begin > span.end) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ": data_offsets ",
                                                   internal::Brief(offsets), " begin ", span.begin,
                                                   " > end ", span.end));
  }
  if (nbytes != span.end - span.begin) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": shape ", internal::Brief(shape), " x ", std::string(DTypeName(tensor.dtype)),
        " = ", nbytes, " bytes but data_offsets span ", span.end - span.begin));
  }
  if (span.end > data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ": data_offsets ", internal::Brief(offsets),
                     " end outside the file: data area is ", data_size, " bytes"));
  }
  tensor.nbytes = nbytes;
  return absl::OkStatus();
}

absl::Status ParseMetadata(const std::string& path, const nlohmann::json& value,
                           std::map<std::string, std::string>& out) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": __metadata__ is a JSON ", value.type_name(), ", not an object of strings"));
  }
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": __metadata__ value of '",
                                                     EscapeTruncated(key), "' is a JSON ",
                                                     v.type_name(), ", not a string"));
    }
    out.emplace(key, v.get<std::string>());
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view DTypeName(DType dtype) { return Entry(dtype).name; }

size_t DTypeSize(DType dtype) { return Entry(dtype).size; }

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", EscapeTruncated(name), "'"));
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // overflow excluded by Open
  return n;
}

absl::StatusOr<File> File::Open(const std::string& path, const Limits& limits) {
  File file;
  file.info_.path = path;
  file.info_.name = internal::Basename(path);

  WC_ASSIGN_OR_RETURN(RegularFile opened, OpenRegularFile(path));
  const int fd = opened.fd.get();
  file.fd_ = std::move(opened.fd);
  const uint64_t size = opened.size;
  file.info_.size = size;

  if (size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": truncated: file is ", size, " bytes, shorter than the 8-byte header length"));
  }
  std::string length_bytes(8, '\0');
  WC_RETURN_IF_ERROR(internal::PreadFull(fd, length_bytes.data(), 8, 0, path + ": header length"));
  const uint64_t header_len = LoadLe64(reinterpret_cast<const unsigned char*>(length_bytes.data()));
  // Both bounds are checked before a byte of the header is read: a hostile length
  // costs nothing.
  if (header_len > limits.max_header_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_len, " exceeds the limit of ",
                     limits.max_header_bytes, " bytes (refused unread)"));
  }
  if (header_len > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " exceeds file size ", size,
                                                   " minus the 8-byte length field"));
  }
  std::string header(header_len, '\0');
  WC_RETURN_IF_ERROR(internal::PreadFull(fd, header.data(), header_len, 8, path + ": header"));
  WC_ASSIGN_OR_RETURN(file.info_.header_sha256, internal::Sha256Hex(length_bytes, header));
  file.info_.data_offset = 8 + header_len;
  const uint64_t data_size = size - file.info_.data_offset;

  WC_ASSIGN_OR_RETURN(nlohmann::json root, internal::ParseStrictJson(header, path + ": header"));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header is a JSON ", root.type_name(), ", not an object"));
  }
  const size_t entries = root.size() - (root.contains("__metadata__") ? 1 : 0);
  if (entries > limits.max_tensors) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header has ", entries, " tensors, above the limit of ", limits.max_tensors));
  }

  std::vector<TensorInfo> tensors;
  std::vector<Span> spans;
  tensors.reserve(root.size());
  spans.reserve(root.size());
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      WC_RETURN_IF_ERROR(ParseMetadata(path, entry, file.info_.metadata));
      continue;
    }
    WC_RETURN_IF_ERROR(internal::CheckTensorName(path, name, limits));
    TensorInfo tensor;
    tensor.name = name;
    Span span;
    span.tensor = tensors.size();
    WC_RETURN_IF_ERROR(ParseTensorEntry(internal::TensorPrefix(path, name), entry, limits,
                                        data_size, tensor, span));
    tensor.file_offset = file.info_.data_offset + span.begin;
    tensors.push_back(std::move(tensor));
    spans.push_back(span);
  }
  // No two tensors may share a byte, and every byte of the data area belongs to a tensor: no
  // gap between two, nothing after the last (the reference reader's InvalidOffset and
  // MetadataIncompleteBuffer; docs/usage.md, "What a checkpoint file may hold"). Empty
  // tensors occupy nothing.
  std::sort(spans.begin(), spans.end(), [&](const Span& a, const Span& b) {
    return std::tie(a.begin, a.end, tensors[a.tensor].name) <
           std::tie(b.begin, b.end, tensors[b.tensor].name);
  });
  const Span* widest = nullptr;  // the non-empty span reaching furthest so far
  for (const Span& s : spans) {
    if (s.begin == s.end) continue;
    if (widest != nullptr && s.begin < widest->end) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensors '", tensors[widest->tensor].name, "' [", widest->begin, ",", widest->end,
          ") and '", tensors[s.tensor].name, "' [", s.begin, ",", s.end, ") overlap"));
    }
    const uint64_t covered = widest == nullptr ? 0 : widest->end;
    if (s.begin > covered) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": data bytes [", covered, ",", s.begin, ") belong to no tensor (",
          widest == nullptr ? std::string("before the first, '")
                            : absl::StrCat("between '", tensors[widest->tensor].name, "' and '"),
          tensors[s.tensor].name, "'); the tensors must cover the data area exactly"));
    }
    if (widest == nullptr || s.end > widest->end) widest = &s;
  }
  if (const uint64_t covered = widest == nullptr ? 0 : widest->end; covered != data_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", data_size - covered, " bytes after the last tensor",
        widest == nullptr ? std::string()
                          : absl::StrCat(" ('", tensors[widest->tensor].name, "' ends at ", covered,
                                         " of the data area's ", data_size, ")"),
        " belong to no tensor; the tensors must cover the data area exactly (a truncated or "
        "appended-to file?)"));
  }

  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.file_offset, a.name) < std::tie(b.file_offset, b.name);
  });
  file.tensors_ = std::move(tensors);
  return file;
}

}  // namespace weightcache::safetensors
