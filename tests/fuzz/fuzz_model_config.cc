// libFuzzer target: config.json (architecture, heads, dtype and the quantization allowlist).
// A config that parses must resolve against the spec's quantization choices without
// crashing, and only to a served method.
#include <cstddef>
#include <cstdint>
#include <string>

#include "pkg/spec/model_config.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace spec = weightcache::spec;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = spec::ParseModelConfig(text, "config.json");
  if (!config.ok()) {
    FUZZ_CHECK(config.status().message().size() < 4096);
    return 0;
  }
  FUZZ_CHECK(!config->architecture.empty());
  FUZZ_CHECK(config->num_key_value_heads >= 0 && config->num_attention_heads >= 0);
  const std::string& method = config->quantization.method;
  FUZZ_CHECK(method == "none" || method == "fp8_block");
  if (method == "fp8_block") {
    FUZZ_CHECK(config->quantization.weight_block_size.size() == 2);
    for (int b : config->quantization.weight_block_size) FUZZ_CHECK(b > 0);
  }
  for (const char* q : {"auto", "none", "fp8_block"}) {
    spec::ModelSpec s;
    s.name = "fuzz";
    s.model_dir = "/m";
    s.quantization = q;
    auto resolved = spec::ResolveQuantization(s, *config);
    if (resolved.ok()) {
      FUZZ_CHECK(resolved->method == "none" || resolved->method == "fp8_block");
    }
  }
  return 0;
}
