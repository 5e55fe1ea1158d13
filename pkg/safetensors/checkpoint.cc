// Checkpoint::Open: a directory of shards with or without model.safetensors.index.json.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "pkg/safetensors/internal/io.h"
#include "pkg/safetensors/internal/json.h"
#include "pkg/safetensors/safetensors.h"
#include "pkg/util/errno_status.h"
#include "pkg/util/regular_file.h"
#include "pkg/util/status_macros.h"
#include "pkg/util/untrusted_text.h"

namespace weightcache::safetensors {
namespace {

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr std::string_view kSuffix = ".safetensors";

std::string Join(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

// The index's weight_map: tensor name -> shard file name.
struct Index {
  std::string path;
  std::map<std::string, std::string> weight_map;
};

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t limit) {
  WC_ASSIGN_OR_RETURN(RegularFile fd, OpenRegularFile(path));
  const uint64_t size = fd.size;
  if (size > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes exceeds the limit of ", limit));
  }
  std::string text(size, '\0');
  WC_RETURN_IF_ERROR(internal::PreadFull(fd.fd.get(), text.data(), size, 0, path));
  return text;
}

// A shard name must name a file inside the checkpoint directory itself, and print as itself.
bool SafeShardName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find("..") == std::string::npos && name != "." &&
         std::none_of(name.begin(), name.end(),
                      [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; });
}

absl::StatusOr<Index> ReadIndex(const std::string& path, const Limits& limits) {
  Index index;
  index.path = path;
  // An index lists every tensor name once; bound it like a header.
  WC_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, limits.max_header_bytes));
  WC_ASSIGN_OR_RETURN(nlohmann::json root, internal::ParseStrictJson(text, path));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a JSON ", root.type_name(), ", not an object"));
  }
  const auto it = root.find("weight_map");
  if (it == root.end() || !it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": has no \"weight_map\" object (tensor name -> shard file)"));
  }
  if (it->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": weight_map is empty"));
  }
  for (const auto& item : it->items()) {
    const std::string& tensor = item.key();
    WC_RETURN_IF_ERROR(internal::CheckTensorName(path, tensor, limits));
    if (!item.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(internal::TensorPrefix(path, tensor), ": weight_map entry is a JSON ",
                       item.value().type_name(), ", not a shard file name"));
    }
    std::string shard = item.value().get<std::string>();
    if (!SafeShardName(shard)) {
      return absl::InvalidArgumentError(absl::StrCat(
          internal::TensorPrefix(path, tensor), ": shard file name ", QuoteTruncated(shard),
          " escapes the checkpoint directory or cannot be printed (must be a plain "
          "name: no '/', '..' or control characters)"));
    }
    index.weight_map.emplace(tensor, std::move(shard));
  }
  return index;
}

// The *.safetensors files of `dir` (symlinks followed, as in a Hugging Face cache snapshot).
// One that is not a regular file (a FIFO, a directory, a dangling link) is an error naming
// it: skipping it would load a checkpoint with a shard missing, or say there is none.
absl::StatusOr<std::set<std::string>> ListShards(const std::string& dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return ErrnoStatus(ec.value(), "list directory", dir);
  std::set<std::string> names;
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= kSuffix.size() || !name.ends_with(kSuffix)) continue;
    const std::string path = Join(dir, name);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", path);
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": is ", FileTypeName(st.st_mode), ", not a regular file"));
    }
    names.insert(name);
  }
  if (ec) return ErrnoStatus(ec.value(), "list directory", dir);
  if (names.empty()) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no ", kIndexName, " and no *.safetensors files"));
  }
  return names;
}

}  // namespace

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& dir, const Limits& limits) {
  Checkpoint ckpt;
  ckpt.dir_ = dir;

  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", dir);
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": not a directory"));
  }

  const std::string index_path = Join(dir, kIndexName);
  std::optional<Index> index;
  if (::stat(index_path.c_str(), &st) == 0) {
    WC_ASSIGN_OR_RETURN(index, ReadIndex(index_path, limits));
  } else if (errno != ENOENT) {
    return ErrnoStatus(errno, "stat", index_path);
  }

  std::set<std::string> shard_names;
  if (index) {
    for (const auto& [tensor, shard] : index->weight_map) shard_names.insert(shard);
  } else {
    WC_ASSIGN_OR_RETURN(shard_names, ListShards(dir));
  }

  for (const std::string& name : shard_names) {
    absl::StatusOr<File> file = File::Open(Join(dir, name), limits);
    if (!file.ok()) {
      if (index && absl::IsNotFound(file.status())) {
        return Annotate(file.status(), absl::StrCat(kIndexName, " names shard '", name, "'"));
      }
      return file.status();
    }
    ckpt.files_.push_back(*std::move(file));
  }

  for (size_t i = 0; i < ckpt.files_.size(); ++i) {
    for (const TensorInfo& t : ckpt.files_[i].tensors()) {
      ckpt.tensors_.push_back(t);
      ckpt.tensors_.back().file_index = i;
    }
  }
  std::sort(ckpt.tensors_.begin(), ckpt.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return std::tie(a.name, a.file_index) < std::tie(b.name, b.file_index);
            });
  for (size_t i = 1; i < ckpt.tensors_.size(); ++i) {
    const TensorInfo& a = ckpt.tensors_[i - 1];
    const TensorInfo& b = ckpt.tensors_[i];
    if (a.name == b.name) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": duplicate tensor '", a.name, "' in both ", ckpt.files_[a.file_index].info().name,
          " and ", ckpt.files_[b.file_index].info().name));
    }
  }

  if (index) {
    for (const auto& [name, shard] : index->weight_map) {
      const TensorInfo* t = ckpt.Find(name);
      if (t == nullptr || ckpt.files_[t->file_index].info().name != shard) {
        std::string where = t == nullptr
                                ? "no shard has it"
                                : absl::StrCat("it is in ", ckpt.files_[t->file_index].info().name);
        return absl::InvalidArgumentError(absl::StrCat(internal::TensorPrefix(index->path, name),
                                                       " is missing from shard ", shard, " (",
                                                       where, ")"));
      }
    }
    for (const TensorInfo& t : ckpt.tensors_) {
      if (!index->weight_map.contains(t.name)) {
        return absl::InvalidArgumentError(absl::StrCat(ckpt.files_[t.file_index].info().path,
                                                       ": tensor '", t.name, "' is not listed in ",
                                                       kIndexName));
      }
    }
  }
  return ckpt;
}

const TensorInfo* Checkpoint::Find(std::string_view name) const {
  const auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), name,
      [](const TensorInfo& t, std::string_view n) { return std::string_view(t.name) < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const TensorInfo& t : tensors_) total += t.nbytes;
  return total;
}

}  // namespace weightcache::safetensors
