// wc_upgrade_fixture: what tests/upgrade/make-fixtures.sh needs of this tree to record a
// previous release's state (the daemon and keeper of that release do the rest).
//   wc_upgrade_fixture checkpoint DIR       writes the tiny Llama checkpoint the fixture loads
//   wc_upgrade_fixture wait SOCKET N        until the keeper at SOCKET holds N entries (30 s)
//   wc_upgrade_fixture dump SOCKET OUTDIR   takes every entry the keeper at SOCKET holds and
//                                           writes it as OUTDIR/<n>.key, <n>.record (the
//                                           record's bytes as deposited) and <n>.seg<i> (each
//                                           segment's bytes, trailing zeros dropped)
// The keeper wire protocol (pkg/keeper/wire.h) is the same in both releases, so this tree's
// client reads the older keeper. Single-threaded; exits 0 on success, 1 with a message.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pkg/keeper/client.h"
#include "pkg/safetensors/writer.h"

namespace weightcache {
namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "wc_upgrade_fixture: %s\n", what.c_str());
  return 1;
}

// The whole contents of `fd` from offset 0, trailing zeros dropped (a segment's padding).
bool ReadTrimmed(int fd, std::string* out) {
  char buf[1 << 16];
  off_t off = 0;
  while (true) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n < 0) return false;
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
    off += n;
  }
  while (!out->empty() && out->back() == '\0') out->pop_back();
  return true;
}

int Wait(const std::string& socket, const std::string& n) {
  const std::string want = absl::StrCat("entries=", n, " ");
  std::string last;
  for (int i = 0; i < 300; ++i) {
    if (auto c = keeper::KeeperClient::Connect(socket); c.ok()) {
      auto s = (*c)->Stats();
      last = s.ok() ? *s : std::string(s.status().message());
      if (s.ok() && s->rfind(want, 0) == 0) return 0;
    }
    ::usleep(100 * 1000);  // a script's poll of another process, with a deadline
  }
  return Fail(absl::StrCat("the keeper at ", socket, " does not hold ", n, " entries: ", last));
}

int Dump(const std::string& socket, const std::filesystem::path& outdir) {
  auto c = keeper::KeeperClient::Connect(socket);
  if (!c.ok()) return Fail(std::string(c.status().message()));
  auto held = (*c)->Adopt();
  if (!held.ok()) return Fail(std::string(held.status().message()));
  std::filesystem::create_directories(outdir);
  for (size_t i = 0; i < held->size(); ++i) {
    const auto& e = (*held)[i];
    const std::string stem = (outdir / absl::StrCat(i)).string();
    std::ofstream(stem + ".key", std::ios::binary) << e.key;
    std::ofstream(stem + ".record", std::ios::binary) << e.body;
    for (size_t s = 0; s < e.fds.size(); ++s) {
      std::string bytes;
      if (!ReadTrimmed(e.fds[s].get(), &bytes)) return Fail(absl::StrCat(e.key, ": read segment"));
      std::ofstream(absl::StrCat(stem, ".seg", s), std::ios::binary) << bytes;
    }
    std::printf("%s: %zu record bytes, %zu segments\n", e.key.c_str(), e.body.size(), e.fds.size());
  }
  return 0;
}

}  // namespace
}  // namespace weightcache

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 2 && args[0] == "checkpoint") {
    auto s = weightcache::safetensors::WriteLlamaCheckpoint(args[1],
                                                            weightcache::safetensors::TinyLlama());
    return s.ok() ? 0 : weightcache::Fail(std::string(s.message()));
  }
  if (args.size() == 3 && args[0] == "wait") return weightcache::Wait(args[1], args[2]);
  if (args.size() == 3 && args[0] == "dump") return weightcache::Dump(args[1], args[2]);
  return weightcache::Fail(
      "usage: checkpoint DIR | wait KEEPER_SOCKET N | dump KEEPER_SOCKET OUTDIR");
}
