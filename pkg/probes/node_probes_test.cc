#include "pkg/probes/node_probes.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace weightcache::probes {
namespace {

constexpr char kSapphireRapids[] =
    "processor\t: 0\nflags\t\t: fpu sse avx avx2 fma avx512f avx512dq avx512vl avx512bw "
    "avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8\n\nprocessor\t: 1\nflags\t: fpu\n";

TEST(NodeProbes, TheIsasInductorChecksComeFromTheFirstProcessorsFlags) {
  EXPECT_EQ(NodeProbesJson(kSapphireRapids, "x86_64"),
            "{\"cpu_isa\": [\"avx2\", \"avx512\", \"avx512_vnni\", \"amx_tile\"], "
            "\"machine\": \"x86_64\", \"probe_flags\": [\"amx_bf16\", \"amx_int8\", "
            "\"amx_tile\", \"avx2\", \"avx512_bf16\", \"avx512_vnni\", \"avx512bw\", "
            "\"avx512dq\", \"avx512f\", \"avx512vl\", \"fma\"], \"version\": 1}");
  // AVX2 needs FMA too; off x86 no ISA is claimed; no flags line: nothing.
  EXPECT_EQ(NodeProbesJson("flags : avx avx2 sse\n", "x86_64"),
            "{\"cpu_isa\": [], \"machine\": \"x86_64\", \"probe_flags\": [\"avx2\"], "
            "\"version\": 1}");
  EXPECT_EQ(NodeProbesJson(kSapphireRapids, "aarch64").rfind("{\"cpu_isa\": [], ", 0), 0u);
  EXPECT_EQ(NodeProbesJson("", "x86_64"),
            "{\"cpu_isa\": [], \"machine\": \"x86_64\", \"probe_flags\": [], \"version\": 1}");
}

// One ISA table (python/weightcache/cpu_isa.json): the compiled one is the file's, entry for
// entry, and each ISA is claimed from exactly the flags the file gives it.
TEST(NodeProbes, TheCompiledIsaTableIsTheJsonFileThePythonPackageReads) {
  std::ifstream in(WC_CPU_ISA_JSON);
  ASSERT_TRUE(in.good()) << WC_CPU_ISA_JSON;
  const auto doc = nlohmann::json::parse(in);
  std::vector<std::pair<std::string, std::vector<std::string>>> want;
  for (const auto& isa : doc.at("x86_isas")) {
    want.emplace_back(isa.at("name").get<std::string>(),
                      isa.at("needs").get<std::vector<std::string>>());
  }
  EXPECT_EQ(X86IsaTable(), want);
  EXPECT_EQ(ProbeFlags(), doc.at("probe_flags").get<std::vector<std::string>>());
  // The decision's "cpu_isa" list only (probe_flags may name the same words).
  auto isas = [](const std::string& flags) {
    const std::string json = NodeProbesJson(flags + "\n", "x86_64");
    return json.substr(0, json.find("\"machine\""));
  };
  for (const auto& [name, needs] : want) {
    std::string flags = "flags :";
    for (const auto& f : needs) flags += " " + f;
    EXPECT_NE(isas(flags).find("\"" + name + "\""), std::string::npos) << name << ": " << flags;
    // Without its last flag the ISA is not claimed.
    const std::string fewer = flags.substr(0, flags.rfind(' '));
    EXPECT_EQ(isas(fewer).find("\"" + name + "\""), std::string::npos) << name << ": " << fewer;
  }
}

TEST(NodeProbes, TheFileIsWrittenWholeWithMode0644) {
  char tmpl[] = "/tmp/wc-node-probes-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const mode_t old = ::umask(077);  // a restrictive umask must not hide it from engines
  ASSERT_TRUE(WriteNodeProbes(dir, "{\"version\": 1}").ok());
  ASSERT_TRUE(WriteNodeProbes(dir, "{\"version\": 1, \"again\": true}").ok());  // replaced
  ::umask(old);
  const std::string path = dir + "/" + kNodeProbesFile;
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "{\"version\": 1, \"again\": true}\n");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator{}),
            1);  // no temporary left
  auto missing = WriteNodeProbes(dir + "/nope", "{}");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find(dir + "/nope/.node-probes.json"), std::string::npos) << missing;
  std::filesystem::remove_all(dir);
}

// Attack: whoever may write the directory leaves a file (theirs) or a link at the temporary
// name, so that the decision engines read is their file. Answer: it is removed, the write's
// file is a new one (O_EXCL), the daemon's, and a link's target is never touched.
TEST(NodeProbes, AFileOrLinkLeftAtTheTemporaryNameIsNeverReused) {
  char tmpl[] = "/tmp/wc-node-probes-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string tmp = dir + "/." + kNodeProbesFile + "." + std::to_string(::getpid());
  const std::string target = dir + "/elsewhere";
  std::ofstream(target) << "untouched";
  for (const bool link : {false, true}) {
    if (link) {
      std::filesystem::create_symlink(target, tmp);
    } else {
      std::ofstream(tmp) << "theirs";
      if (::geteuid() == 0) ASSERT_EQ(::chown(tmp.c_str(), 65534, 65534), 0);
    }
    ASSERT_TRUE(WriteNodeProbes(dir, "{\"version\": 1}").ok()) << (link ? "link" : "file");
    struct stat st {};
    ASSERT_EQ(::lstat((dir + "/" + kNodeProbesFile).c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_uid, ::geteuid()) << (link ? "link" : "file");
    EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(tmp)));
  }
  std::ifstream in(target);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "untouched");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace weightcache::probes
