// libFuzzer target: the model spec parsers (YAML/JSON text and the flag form). A spec that
// parses must validate, and must come back equal through its canonical YAML.
#include <cstddef>
#include <cstdint>
#include <string>

#include "pkg/spec/spec.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using weightcache::spec::ModelSpec;

bool Same(const ModelSpec& a, const ModelSpec& b) {
  return a.version == b.version && a.name == b.name && a.model_dir == b.model_dir &&
         a.architecture == b.architecture && a.revision == b.revision && a.tp_size == b.tp_size &&
         a.tp_ranks == b.tp_ranks && a.pp_size == b.pp_size && a.pp_rank == b.pp_rank &&
         a.dtype == b.dtype && a.quantization == b.quantization && a.layout == b.layout &&
         a.allowed_namespaces == b.allowed_namespaces && a.isolation == b.isolation;
}

void CheckRoundTrip(const ModelSpec& spec) {
  FUZZ_CHECK(weightcache::spec::Validate(spec).ok());
  auto again = weightcache::spec::ParseSpecs(weightcache::spec::ToYaml(spec), "round trip");
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->size() == 1);
  FUZZ_CHECK(Same(again->front(), spec));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto specs = weightcache::spec::ParseSpecs(text, "fuzz.yaml");
  if (specs.ok()) {
    for (const ModelSpec& spec : *specs) CheckRoundTrip(spec);
  } else {
    FUZZ_CHECK(specs.status().message().size() < 4096);
  }
  auto flag = weightcache::spec::ParseSpecFlag(text);
  if (flag.ok()) CheckRoundTrip(*flag);
  return 0;
}
