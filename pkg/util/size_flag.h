// Byte sizes in flags: "0", "1048576", "64MiB", "120GiB", "1.5TB". Binary (KiB, MiB, GiB,
// TiB) and decimal (KB, MB, GB, TB) suffixes, case-insensitive, "B" optional.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace weightcache {

// `what` names the input in errors ("--memory_budget: '12XB' is not a size ...").
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text, const std::string& what);
// As ParseByteSize, or a share of `whole` written as a percentage ("90%", in (0, 100]).
absl::StatusOr<uint64_t> ParseByteSizeOrShare(const std::string& text, uint64_t whole,
                                              const std::string& what);
// "1.50 GiB" style, for tables.
std::string FormatBytes(uint64_t bytes);

}  // namespace weightcache
