#include "pkg/util/flags_help.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "pkg/util/version.h"

namespace weightcache {

void HandleHelpFlag(int argc, char** argv, const std::string& usage,
                    const std::vector<std::string>& folders) {
  bool asked = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--help" || a == "-help" || a == "-h" || a == "--helpfull") asked = true;
    if (a == "--version" || a == "-version") {
      std::string_view program = argc > 0 ? argv[0] : "weightcache";
      program = program.substr(program.find_last_of('/') + 1);
      std::printf("%.*s %s\n", static_cast<int>(program.size()), program.data(), Version());
      std::fflush(stdout);
      std::exit(0);
    }
  }
  if (!asked) return;
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    for (const auto& folder : folders) {
      if (absl::StrContains(flag->Filename(), folder)) {
        flags.push_back(flag);
        break;
      }
    }
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::printf("%s\n\nFlags:\n", usage.c_str());
  for (const auto* f : flags) {
    const std::string def = f->DefaultValue();
    std::printf("  --%s  %s\n      (default: %s)\n", std::string(f->Name()).c_str(),
                f->Help().c_str(), def.empty() ? "\"\"" : def.c_str());
  }
  std::fflush(stdout);
  std::exit(0);
}

}  // namespace weightcache
