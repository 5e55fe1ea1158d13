// The node's answers to the probes torch runs in every fresh engine process (docs/engines.md,
// "Probes torch runs at start"): which CPU vector ISAs Inductor would consider, from the CPU's
// flags. The daemon writes them once, as node-probes.json, into every socket directory engine
// pods mount (read-only there); the Python package (weightcache.probes) believes the file only
// when it is root's or its own, not writable by others, and equal to what the engine reads
// from its own /proc/cpuinfo. Thread-safety: pure functions (WriteNodeProbes writes a file).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace weightcache::probes {

inline constexpr char kNodeProbesFile[] = "node-probes.json";

// The decision for a CPU whose /proc/cpuinfo is `cpuinfo` (its first "flags" line) and whose
// machine (uname -m) is `machine`, as one line of JSON with sorted keys — byte for byte what
// weightcache.probes.write() makes of the same input:
// {"cpu_isa": ["avx2", ...], "machine": "x86_64", "probe_flags": [...], "version": 1}
std::string NodeProbesJson(absl::string_view cpuinfo, absl::string_view machine);

// This machine's decision (/proc/cpuinfo and uname(2)); the flags empty when cpuinfo cannot
// be read.
std::string ThisNodeProbesJson();

// Writes `json` (and a newline) to `dir`/node-probes.json: a temporary file in `dir`, mode
// 0644, renamed over it (a reader sees the old file or the new one, never half). The error
// names the path.
absl::Status WriteNodeProbes(const std::string& dir, absl::string_view json);

// This machine's decision written into each of `dirs` (the socket directory and every slot
// directory), decided once for every engine of the node. Engines decide it themselves when it
// is missing, so a failure to write is logged as a warning, not returned.
void WriteNodeProbesInto(const std::vector<std::string>& dirs);

// The compiled table (python/weightcache/cpu_isa.json): each x86 ISA with the flags it needs,
// in Inductor's order; and the probe flags. For the test that it equals the file.
std::vector<std::pair<std::string, std::vector<std::string>>> X86IsaTable();
std::vector<std::string> ProbeFlags();

}  // namespace weightcache::probes
