#!/usr/bin/env python3
"""compile_cache_probe: where an engine's start goes after the weights (issue 29, item 4).

For a ~1.1 B Llama (hidden 2048, 16 layers, bf16, random weights saved once) on one GPU, each
mode runs in a fresh process and reports seconds from process start to the first forward of
128 tokens, split into import, model build, compile/load and the first forward:

  eager        no torch.compile
  cold         torch.compile, empty Inductor cache
  inductor     torch.compile, Inductor's on-disk cache from `cold` (same machine)
  megacache    torch.compile, empty cache + torch.compiler.load_cache_artifacts(blob saved by
               `cold`): what an artifact served by weightcache would give today
  aoti         torch._inductor.aoti_load_package of a package compiled once beforehand
               (aoti_compile_and_package, timed separately; it holds the weights too, so
               no model is built): no tracing at start

Logits of every mode are compared with eager's (max abs difference). Prints a markdown table.
For torch.compile modes the compile happens inside the first forward (it is lazy).
Usage: compile_cache_probe.py [--work DIR] [--layers N] [--modes eager,cold,...]   (needs CUDA, torch >= 2.6, transformers)
"""
import argparse
import json
import os
import subprocess
import sys
import time

T0 = time.time()


def child(mode, work, layers):
    t_start = float(os.environ["PROBE_SPAWNED"])
    import torch  # noqa: E402
    import transformers  # noqa: E402
    from safetensors.torch import load_file, save_file  # noqa: E402

    t_import = time.time()
    cfg = transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632,
                                   num_hidden_layers=layers, num_attention_heads=32,
                                   num_key_value_heads=4, vocab_size=32000,
                                   max_position_embeddings=2048, torch_dtype=torch.bfloat16)
    weights = os.path.join(work, "weights.safetensors")
    ids = torch.arange(128, device="cuda").reshape(1, 128) % 32000
    if mode == "aoti":
        # The package holds the weights (as constants) and the compiled code: no model to build.
        sys.stderr.write("aoti: loading the package\n")
        t_model = time.time()
        fn = torch._inductor.aoti_load_package(os.path.join(work, "model.pt2"))
        t_ready = time.time()
        sys.stderr.write("aoti: loaded; first forward\n")
        with torch.no_grad():
            logits = fn(ids)
        torch.cuda.synchronize()
        t_first = time.time()
        torch.save(logits.float().cpu(), os.path.join(work, f"logits-{mode}.pt"))
        print("PROBE " + json.dumps({
            "mode": mode, "import_s": t_import - t_start, "model_s": t_model - t_import,
            "compile_or_load_s": t_ready - t_model, "first_forward_s": t_first - t_ready,
            "total_s": t_first - t_start}), flush=True)
        return
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    if not os.path.exists(weights):
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
    else:
        model.load_state_dict(load_file(weights, device="cuda"), strict=False)
    torch.cuda.synchronize()
    t_model = time.time()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(input_ids=x, use_cache=False).logits

    wrapped = Logits(model).eval()
    out = {"mode": mode}
    with torch.no_grad():
        if mode == "eager":
            fn = wrapped
        elif mode in ("cold", "inductor", "megacache"):
            if mode == "megacache":
                with open(os.path.join(work, "megacache.bin"), "rb") as f:
                    blob = f.read()
                out["blob_bytes"] = len(blob)
                torch.compiler.load_cache_artifacts(blob)
            fn = torch.compile(wrapped)
        elif mode == "aoti_build":
            t = time.time()
            ep = torch.export.export(wrapped, (ids,))
            t_export = time.time()
            path = torch._inductor.aoti_compile_and_package(
                ep, package_path=os.path.join(work, "model.pt2"))
            out["export_s"] = t_export - t
            out["aoti_compile_s"] = time.time() - t_export
            out["package_bytes"] = os.path.getsize(path)
            print("PROBE " + json.dumps(out), flush=True)
            return
        t_ready = time.time()
        logits = fn(ids)
        torch.cuda.synchronize()
        t_first = time.time()
    if mode == "cold":
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is not None:
            blob, _info = artifacts
            with open(os.path.join(work, "megacache.bin"), "wb") as f:
                f.write(blob)
            out["blob_bytes"] = len(blob)
    torch.save(logits.float().cpu(), os.path.join(work, f"logits-{mode}.pt"))
    out.update(import_s=t_import - t_start, model_s=t_model - t_import,
               compile_or_load_s=t_ready - t_model, first_forward_s=t_first - t_ready,
               total_s=t_first - t_start)
    print("PROBE " + json.dumps(out), flush=True)


def run(mode, work, layers, env_extra):
    env = dict(os.environ, **env_extra, PROBE_SPAWNED=repr(time.time()))
    p = subprocess.run([sys.executable, __file__, "--child", mode, "--work", work,
                        "--layers", str(layers)], env=env, capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("PROBE "):
            return json.loads(line[6:])
    sys.stderr.write(f"--- {mode} failed (exit {p.returncode}) ---\n{p.stdout[-3000:]}\n"
                     f"{p.stderr[-6000:]}\n")
    return {"mode": mode, "error": f"exit {p.returncode}"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--work", default="/tmp/compile-cache-probe")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--modes", default="eager,cold,inductor,megacache,aoti")
    a = ap.parse_args()
    if a.child:
        child(a.child, a.work, a.layers)
        return 0
    os.makedirs(a.work, exist_ok=True)
    cache = os.path.join(a.work, "inductor-cache")
    empty = os.path.join(a.work, "inductor-empty")
    modes = a.modes.split(",")
    envs = {"eager": {}, "cold": {"TORCHINDUCTOR_CACHE_DIR": cache},
            "inductor": {"TORCHINDUCTOR_CACHE_DIR": cache},
            "megacache": {"TORCHINDUCTOR_CACHE_DIR": empty},
            "aoti": {"TORCHINDUCTOR_CACHE_DIR": os.path.join(a.work, "inductor-aoti2")}}
    results, build = [], {"error": "not run"}
    for mode in modes:  # eager first: it writes the weights file the others load
        if mode == "aoti":
            build = run("aoti_build", a.work, a.layers,
                        {"TORCHINDUCTOR_CACHE_DIR": os.path.join(a.work, "inductor-aoti")})
        results.append(run(mode, a.work, a.layers, envs[mode]))
    import torch

    ref_path = os.path.join(a.work, "logits-eager.pt")
    ref = torch.load(ref_path) if os.path.exists(ref_path) else None
    print(f"\n## compile_cache_probe: Llama hidden 2048, {a.layers} layers, bf16, 128 tokens, "
          f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}\n")
    print("| mode | import s | model s | compile/load s | first forward s | total s | "
          "max abs diff vs eager | artifact |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['mode']} | failed: {r['error']} | | | | | | |")
            continue
        path = os.path.join(a.work, f"logits-{r['mode']}.pt")
        diff = ((torch.load(path) - ref).abs().max().item()
                if os.path.exists(path) and ref is not None else float("nan"))
        art = f"{r['blob_bytes'] / 1e6:.1f} MB blob" if "blob_bytes" in r else ""
        if r["mode"] == "aoti" and "package_bytes" in build:
            art = f"{build['package_bytes'] / 1e6:.1f} MB package"
        print(f"| {r['mode']} | {r['import_s']:.2f} | {r['model_s']:.2f} | "
              f"{r['compile_or_load_s']:.2f} | {r['first_forward_s']:.2f} | {r['total_s']:.2f} | "
              f"{diff:.3g} | {art} |")
    if "error" not in build:
        print(f"\nAOTInductor package built once: export {build['export_s']:.2f} s, "
              f"aoti_compile_and_package {build['aoti_compile_s']:.2f} s")
    print(f"\nprobe wall time {time.time() - T0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
