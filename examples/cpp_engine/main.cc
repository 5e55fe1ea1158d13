// wc_cpp_engine: an engine that starts from the node without Python (docs/engines.md, "A C++
// engine"). It maps the model's weights from weightcached (the C++ client and its libtorch
// adapter: zero-copy tensors), gets the model's AOTInductor package from the daemon (put
// there by the first engine that built it: weightcache.aoti), loads it with libtorch's C++
// package loader, binds the mapped weights as the package's constants (no copy) and runs one
// forward. Everything it needs is in this one process: no interpreter, no compiler.
//
//   wc_cpp_engine --model NAME --key KEY.json --ids IDS.bin [--socket PATH] [--device N]
//                 [--logits OUT.bin] [--run N]
//
// KEY.json: the package's artifact key as weightcache.aoti printed it (the key names the
// torch, GPU, settings and code it was built for). IDS.bin: the input token ids, int64
// little-endian, shape [1, n]. OUT.bin: the logits of the first forward as float32.
// It prints one line "BENCH {...}" with the seconds of each phase (bench/engine_start_bench.py
// reads it): exec (from $BENCH_SPAWNED, the spawner's clock, to main: the exec and the
// dynamic loading of libtorch), cuda_init (the CUDA context), map (connect, acquire, map,
// tensors), get, load, bind, first_forward, total. Exit 0 on success; 1 naming what failed.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "pkg/client/client.h"
#include "pkg/client/torch/aoti_package.h"
#include "pkg/client/torch/torch_adapter.h"

namespace {

using weightcache::client::AotiModel;

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Args {
  std::string socket, model, key, ids, logits;
  int device = 0;
  int run = 1;
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "wc_cpp_engine: %s\n", what.c_str());
  return 1;
}

bool Parse(int argc, char** argv, Args& a, std::string& err) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) {
      err = absl::StrCat(flag, ": needs a value");
      return false;
    }
    std::string v = argv[++i];
    if (flag == "--socket") {
      a.socket = v;
    } else if (flag == "--model") {
      a.model = v;
    } else if (flag == "--key") {
      a.key = v;
    } else if (flag == "--ids") {
      a.ids = v;
    } else if (flag == "--logits") {
      a.logits = v;
    } else if (flag == "--device" || flag == "--run") {
      int n = 0;
      if (!absl::SimpleAtoi(v, &n) || n < 0) {
        err = absl::StrCat(flag, "=", v, ": not a number >= 0");
        return false;
      }
      (flag == "--device" ? a.device : a.run) = n;
    } else {
      err = absl::StrCat("unknown flag ", flag,
                         " (flags: --model --key --ids --socket --device --logits --run)");
      return false;
    }
  }
  if (a.model.empty() || a.key.empty() || a.ids.empty()) {
    err = "--model, --key and --ids are required";
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const double t_main = Now();
  Args a;
  std::string err;
  if (!Parse(argc, argv, a, err)) return Fail(err);
  double t_spawned = t_main;
  if (const char* s = std::getenv("BENCH_SPAWNED"); s != nullptr) {
    if (!absl::SimpleAtod(s, &t_spawned))
      return Fail(absl::StrCat("BENCH_SPAWNED=", s, ": not seconds"));
  }

  // The CUDA context: the first CUDA tensor, as the Python engine's first CUDA op.
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(a.device));
  at::zeros({1}, at::TensorOptions().device(device)).cpu();
  const double t_cuda = Now();

  auto uuid = weightcache::client::CudaDeviceUuid(a.device);
  if (!uuid.ok()) return Fail(uuid.status().ToString());
  auto client = weightcache::client::Client::Connect(a.socket);
  if (!client.ok()) return Fail(client.status().ToString());
  weightcache::client::AcquireOptions o;
  o.model = a.model;
  o.device_uuid = *uuid;
  o.wait_ready = true;
  auto acquired = (*client)->Acquire(o);
  if (!acquired.ok()) return Fail(acquired.status().ToString());
  std::shared_ptr<weightcache::client::Lease> lease = std::move(acquired).value();
  auto weights = weightcache::client::ToTorch(lease);
  if (!weights.ok()) return Fail(weights.status().ToString());
  const double t_map = Now();

  auto key = weightcache::client::ReadArtifactKeyFile(a.key);
  if (!key.ok()) return Fail(key.status().ToString());
  auto model = AotiModel::Load(**client, *key, *lease, *weights);
  if (!model.ok()) return Fail(model.status().ToString());
  const double t_ready = Now();

  std::ifstream in(a.ids, std::ios::binary | std::ios::ate);
  if (!in) return Fail(absl::StrCat(a.ids, ": cannot read"));
  const auto bytes = static_cast<int64_t>(in.tellg());
  if (bytes <= 0 || bytes % 8 != 0) {
    return Fail(absl::StrCat(a.ids, ": ", bytes, " bytes is not a list of int64 token ids"));
  }
  at::Tensor ids = at::empty({1, bytes / 8}, at::kLong);
  in.seekg(0);
  in.read(static_cast<char*>(ids.data_ptr()), bytes);
  ids = ids.to(device);
  std::vector<at::Tensor> out = (*model)->Run({ids});
  if (out.empty()) return Fail("the package's forward returned no output");
  at::Tensor logits = out[0].to(at::kFloat).cpu().contiguous();  // waits for the forward
  const double t_first = Now();

  if (!a.logits.empty()) {
    std::ofstream f(a.logits, std::ios::binary);
    f.write(static_cast<const char*>(logits.data_ptr()),
            static_cast<std::streamsize>(logits.numel() * sizeof(float)));
    if (!f) return Fail(absl::StrCat(a.logits, ": cannot write the logits"));
  }
  const auto& s = (*model)->seconds();
  std::printf(
      "BENCH {\"mode\": \"cpp\", \"run\": %d, \"import_s\": %.6f, \"exec_s\": %.6f, "
      "\"cuda_init_s\": %.6f, \"map_s\": %.6f, \"get_s\": %.6f, \"load_s\": %.6f, "
      "\"bind_s\": %.6f, \"first_forward_s\": %.6f, \"total_s\": %.6f, \"main_s\": %.6f, "
      "\"constants\": %zu, \"package_bytes\": %llu, \"source\": \"artifact\", "
      "\"logits_shape\": [%s], \"subprocesses\": []}\n",
      a.run, t_main - t_spawned, t_main - t_spawned, t_cuda - t_main, t_map - t_cuda, s.get, s.load,
      s.bind, t_first - t_ready, t_first - t_spawned, t_first - t_main, (*model)->constants(),
      static_cast<unsigned long long>((*model)->package_bytes()),
      absl::StrJoin(logits.sizes(), ", ").c_str());
  std::fflush(stdout);
  return 0;
}
