// `--help` and `--version` for the thin mains: abseil's own --help lists only flags defined in a
// file named after the program and exits 1 ("No flags matched." for cmd/<name>/main.cc), and its
// --version prints no version. This prints the usage message and every flag defined under the
// given source folders, or "<program> <version>", then exits 0.
// Call before absl::ParseCommandLine. Thread-safety: main thread, at start.
#pragma once

#include <string>
#include <vector>

namespace weightcache {

// When argv holds --help, -help, -h or --helpfull: prints `usage` and the flags whose
// defining file's path contains one of `folders` (e.g. "cmd/weightcachectl/") with their
// defaults to stdout, and exits 0. When argv holds --version or -version: prints
// "<program name> <Version()>" (the name from argv[0]) to stdout and exits 0. Returns otherwise.
void HandleHelpFlag(int argc, char** argv, const std::string& usage,
                    const std::vector<std::string>& folders);

}  // namespace weightcache
