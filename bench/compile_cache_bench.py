#!/usr/bin/env python3
"""compile_cache_bench: an engine's start with torch.compile, cold against warm from the node
daemon's compile artifacts (issue 29, item 4). Needs CUDA, torch >= 2.6, transformers, and a
weightcached serving the model (tests/gpu/run-compile-cache-on-device.sh starts one).

A ~1.1 B Llama (hidden 2048, 16 layers, bf16, seeded random weights saved with
save_pretrained) is served by weightcached; every mode is a fresh process that maps the
weights from the daemon (weightcache.transformers.from_pretrained), compiles the model with
the default torch.compile and runs one forward of 128 tokens. Seconds from process start:

  eager        no torch.compile: the reference logits
  cold         empty Inductor cache, inside weightcache.compile_cache (a miss): compiles,
               then saves torch's caches and puts them (the put is timed apart)
  weightcache  empty Inductor cache, inside weightcache.compile_cache (a hit): torch's caches
               loaded from the daemon's artifact (a sealed memfd), then compile
  inductor     Inductor's own on-disk cache left by `cold` (same machine), no daemon

Prints a markdown table; logits of the compiled modes are compared with each other (bit for
bit) and with eager (max abs difference).
Usage: compile_cache_bench.py --work DIR --model NAME [--modes eager,cold,weightcache,inductor]
       compile_cache_bench.py make DIR [NAME...]   (writes each model, default llama-1b
       into DIR/llama, llama-8g (about 8 GB: hidden 4096, 21 layers) into DIR/llama-8g,
       and DIR/specs.json naming them all; PIN_DIGESTS=1 pins each file's SHA-256 there)
"""
import argparse
import json
import os
import subprocess
import sys
import time

T0 = time.time()
CONFIG = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
              num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
              max_position_embeddings=2048)
SETTINGS = {"torch.compile": "default", "tokens": 128}
# Models `make` writes: name -> (directory under the work dir, config over CONFIG).
MODELS = {"llama-1b": ("llama", {}),
          "llama-8g": ("llama-8g", dict(hidden_size=4096, intermediate_size=11008,
                                        num_hidden_layers=21, num_key_value_heads=8))}


def _sha256(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
    return h.hexdigest()


def make(out, names=("llama-1b",)):
    import torch
    import transformers

    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        raise SystemExit(f"make: unknown model(s) {unknown}; known: {sorted(MODELS)}")
    models = []
    for name in names:
        sub, over = MODELS[name]
        torch.manual_seed(29)
        cfg = transformers.LlamaConfig(**dict(CONFIG, **over))
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
        d = os.path.join(out, sub)
        model.save_pretrained(d)
        n = sum(p.numel() for p in model.parameters())
        del model
        torch.cuda.empty_cache()
        # The bench's engines (this uid, a granted publisher) put the AOTInductor package the
        # next engine loads: native code, which the daemon takes only from publishers the
        # spec names for it (native_publishers) and admins.
        m = {"version": 1, "name": name, "model_dir": d, "tp_size": 1,
             "native_publishers": [f"uid:{os.getuid()}"]}
        if os.environ.get("PIN_DIGESTS") == "1":  # the daemon checks them as it loads
            m["digests"] = {f: _sha256(os.path.join(d, f)) for f in sorted(os.listdir(d))
                            if f.endswith(".safetensors")}
        models.append(m)
        print(f"{name}: {n / 1e9:.2f} B parameters -> {d}")
    with open(os.path.join(out, "specs.json"), "w") as f:
        json.dump({"models": models}, f)


def child(mode, work, model_name):
    t_start = float(os.environ["BENCH_SPAWNED"])
    import torch
    import weightcache
    from weightcache.transformers import from_pretrained

    t_import = time.time()
    model = from_pretrained(os.path.join(work, "llama"), model=model_name, device="cuda:0",
                            fallback=False).eval()
    with weightcache.acquire(model_name, device="cuda:0") as w:
        fingerprint = w.fingerprint
    torch.cuda.synchronize()
    t_model = time.time()
    ids = torch.arange(128, device="cuda").reshape(1, 128) % CONFIG["vocab_size"]

    def forward(fn):
        with torch.no_grad():
            out = fn(input_ids=ids, use_cache=False).logits
        torch.cuda.synchronize()
        return out

    out = {"mode": mode}
    if mode in ("eager", "inductor"):
        t_ready = time.time()
        logits = forward(model if mode == "eager" else torch.compile(model))
        t_first = time.time()
    else:
        with weightcache.compile_cache(model_name, fingerprint, settings=SETTINGS) as cc:
            t_ready = time.time()
            logits = forward(torch.compile(model))
            t_first = time.time()
        out.update(hit=cc.hit, put=cc.put, artifact_bytes=cc.bytes,
                   artifact_load_s=cc.load_seconds, save_put_s=cc.save_seconds)
        if mode == "weightcache" and not cc.hit:
            out["error"] = "no artifact from the daemon (the cold run did not put one)"
    torch.save(logits.float().cpu(), os.path.join(work, f"logits-{mode}.pt"))
    out.update(import_s=t_import - t_start, model_s=t_model - t_import,
               compile_or_load_s=t_ready - t_model, first_forward_s=t_first - t_ready,
               total_s=t_first - t_start)
    print("BENCH " + json.dumps(out), flush=True)


def run(mode, work, model_name, env_extra):
    env = dict(os.environ, **env_extra, BENCH_SPAWNED=repr(time.time()))
    p = subprocess.run([sys.executable, __file__, "--child", mode, "--work", work,
                        "--model", model_name], env=env, capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    sys.stderr.write(f"--- {mode} failed (exit {p.returncode}) ---\n{p.stdout[-3000:]}\n"
                     f"{p.stderr[-6000:]}\n")
    return {"mode": mode, "error": f"exit {p.returncode}"}


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3:] or ("llama-1b",))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--work", required=True)
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--modes", default="eager,cold,weightcache,inductor")
    a = ap.parse_args()
    if a.child:
        child(a.child, a.work, a.model)
        return 0
    cache = os.path.join(a.work, "inductor-cache")  # cold fills it; inductor reads it
    envs = {"eager": {"TORCHINDUCTOR_CACHE_DIR": os.path.join(a.work, "inductor-eager")},
            "cold": {"TORCHINDUCTOR_CACHE_DIR": cache},
            "weightcache": {"TORCHINDUCTOR_CACHE_DIR": os.path.join(a.work, "inductor-empty")},
            "inductor": {"TORCHINDUCTOR_CACHE_DIR": cache}}
    results = [run(m, a.work, a.model, envs[m]) for m in a.modes.split(",")]
    import torch

    def logits(mode):
        p = os.path.join(a.work, f"logits-{mode}.pt")
        return torch.load(p) if os.path.exists(p) else None

    ref, cold = logits("eager"), logits("cold")
    print(f"\n## compile_cache_bench: Llama hidden 2048, 16 layers, bf16, 128 tokens, weights "
          f"mapped from weightcached; torch {torch.__version__}, {torch.cuda.get_device_name(0)}\n")
    print("| mode | import s | weights+model s | artifact get s | first (compiled) forward s | "
          "total s | artifact | logits vs cold | max abs diff vs eager |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['mode']} | failed: {r['error']} | | | | | | | |")
            continue
        mine = logits(r["mode"])
        same = ("equal" if cold is not None and torch.equal(mine, cold) else
                f"differ ({(mine - cold).abs().max().item():.3g})" if cold is not None else "")
        diff = (mine - ref).abs().max().item() if ref is not None else float("nan")
        art = ""
        if "hit" in r:
            art = (f"hit: {r['artifact_bytes'] / 1e6:.1f} MB in {r['artifact_load_s']:.2f} s"
                   if r["hit"] else
                   f"miss; saved+put {r['artifact_bytes'] / 1e6:.1f} MB in {r['save_put_s']:.2f} s")
        print(f"| {r['mode']} | {r['import_s']:.2f} | {r['model_s']:.2f} | "
              f"{r['compile_or_load_s']:.2f} | {r['first_forward_s']:.2f} | {r['total_s']:.2f} | {art} | "
              f"{same if r['mode'] != 'eager' else ''} | {diff:.3g} |")
    print(f"\nbench wall time {time.time() - T0:.1f} s")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
