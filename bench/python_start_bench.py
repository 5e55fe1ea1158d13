"""Process start -> model ready for its first forward, on a GPU: transformers from disk (page
cache cold and hot) against weightcache (the daemon already holds the model). Prints a table.

    python_start_bench.py make DIR      an ~8 GB, 192-tensor Llama (21 layers, hidden 4096,
                                        intermediate 11008, GQA 32/8, bf16) with seeded
                                        weights, written with safetensors; DIR/spec.json for
                                        weightcached
    python_start_bench.py run DIR       (weightcached serving DIR as "start8g" on cuda, its
                                        socket in $WEIGHTCACHE_SOCKET) the four ways, each in a
                                        fresh process, REPS times, then the table
    python_start_bench.py profile DIR   one weightcache.transformers.from_pretrained process
                                        under cProfile

Each child process times, from the moment its parent started it: imports (torch,
transformers with the model's own modeling code, weightcache), the CUDA context
(torch.cuda.init and a first allocation), getting the model and the first forward (8
tokens, synchronized). The ways: AutoModelForCausalLM.from_pretrained(...,
device_map="cuda:0") from disk, page cache cold and hot; weightcache.transformers.
from_pretrained; and what an engine that builds its own model does: the model built from its
config on the meta device, then weightcache.acquire + weightcache.bind (timed alone: the
issue's goal is <= 50 ms for this model).
"Cold" drops the checkpoint from the page cache first (posix_fadvise DONTNEED: no root needed).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

NAME = "start8g"
CONFIG = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=21,
              num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
              max_position_embeddings=4096, tie_word_embeddings=False, torch_dtype="bfloat16",
              architectures=["LlamaForCausalLM"], model_type="llama")


def make(out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in LlamaForCausalLM(cfg).state_dict().items()}
    g = torch.Generator(device="cuda").manual_seed(7)
    tensors = {}
    for name, shape in shapes.items():
        t = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) * 0.02
        tensors[name] = t.to(torch.bfloat16).cpu()
    # Shards of ~2 GB, as checkpoints come.
    shards, cur, size, index = [], {}, 0, {}
    for name in shapes:
        cur[name] = tensors[name]
        size += tensors[name].numel() * 2
        if size >= 2 << 30:
            shards.append(cur)
            cur, size = {}, 0
    if cur:
        shards.append(cur)
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        index.update({n: fname for n in shard})
    total = sum(t.numel() * 2 for t in tensors.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index}))
    (out / "config.json").write_text(json.dumps(cfg.to_dict() | {"architectures": CONFIG["architectures"]}))
    (out / "spec.json").write_text(json.dumps({"models": [
        {"version": 1, "name": NAME, "model_dir": str(out)}]}))
    print(f"{out}: {len(shapes)} tensors, {total / 1e9:.2f} GB in {len(shards)} shards")


CHILD = r"""
import os, sys, time, json
t_start = float(os.environ["WC_BENCH_T0"])
marks = {}
def mark(k):
    marks[k] = time.time() - t_start
import torch, transformers, weightcache, weightcache.transformers
# The model's code too (transformers imports it lazily, with torch._dynamo and more, on the
# first from_pretrained/from_config): every way needs it, so it counts as imports.
from transformers import AutoConfig, AutoModelForCausalLM
import transformers.models.llama.modeling_llama
mark("imports")
torch.cuda.init(); torch.empty(1, device="cuda:0"); torch.cuda.synchronize()
mark("cuda context")
mode, d = sys.argv[1], sys.argv[2]
name = os.environ["WC_BENCH_NAME"]
if mode == "weightcache" and os.environ.get("WC_BENCH_PROFILE"):
    import cProfile, pstats
    prof = cProfile.Profile()
    prof.enable()
    model = weightcache.transformers.from_pretrained(d, model=name, device="cuda:0",
                                                      fallback=False)
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
elif mode == "weightcache":
    model = weightcache.transformers.from_pretrained(d, model=name, device="cuda:0",
                                                      fallback=False)
    marks["acquire ms"] = model.weightcache_weights.map_seconds * 1e3
elif mode == "bind":  # what an engine that builds its own model does
    config = AutoConfig.from_pretrained(d)
    with weightcache.transformers.parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    w = weightcache.acquire(name, device="cuda:0")
    weightcache.bind(model, w)
    marks["acquire ms"] = w.map_seconds * 1e3
    marks["acquire+bind ms"] = (time.perf_counter() - t0) * 1e3
    model.to("cuda:0")  # the non-persistent buffers (rotary inv_freq)
else:
    try:  # straight onto the GPU (needs accelerate)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, device_map="cuda:0")
    except ImportError:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
        model.to("cuda:0")
model.eval()
torch.cuda.synchronize()
mark("model ready")
with torch.no_grad():
    logits = model(torch.arange(8, device="cuda:0").unsqueeze(0)).logits
torch.cuda.synchronize()
mark("first forward")
marks["checksum"] = float(logits.float().sum().item())
print(json.dumps(marks))
"""


def drop_page_cache(d: Path) -> None:
    for f in d.iterdir():
        if f.suffix == ".safetensors":
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def child(mode: str, d: Path) -> dict:
    env = dict(os.environ, WC_BENCH_T0=repr(time.time()), WC_BENCH_NAME=NAME)
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(d)], env=env,
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"{mode}: exit {r.returncode}\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(d: Path, reps: int) -> int:
    rows = {}
    child("disk", d)  # page cache warm
    for label, mode, cold in (("transformers from_pretrained, page cache cold", "disk", True),
                              ("transformers from_pretrained, page cache hot", "disk", False),
                              ("weightcache.transformers.from_pretrained", "weightcache", False),
                              ("weightcache acquire + bind (model built on meta)", "bind", False)):
        runs = []
        for _ in range(reps):
            if cold:
                drop_page_cache(d)
            runs.append(child(mode, d))
        rows[label] = runs
    sums = {k: {r["checksum"] for r in v} for k, v in rows.items()}
    same = len(set().union(*sums.values())) == 1
    print(f"\nProcess start -> first forward, {NAME} (~8 GB bf16, 192 tensors), cuda:0, median of "
          f"{reps} runs; times in s from process start\n")
    print("| way | imports s | CUDA context s | model ready s | get the model s | "
          "first forward s | acquire ms | acquire+bind ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) if k in runs[0] else None
               for k in ("imports", "cuda context", "model ready", "first forward",
                         "acquire ms", "acquire+bind ms")}
        opt = lambda k: f"{med[k]:.1f}" if med[k] is not None else "-"  # noqa: E731
        print(f"| {label} | {med['imports']:.2f} | {med['cuda context']:.2f} | "
              f"{med['model ready']:.2f} | {med['model ready'] - med['cuda context']:.3f} | "
              f"{med['first forward']:.2f} | {opt('acquire ms')} | {opt('acquire+bind ms')} |")
    print(f"\nlogits checksum equal across all runs: {same} ({sorted(set().union(*sums.values()))})")
    return 0 if same else 1


def profile(d: Path) -> int:
    """One weightcache child under cProfile (its profile on stderr, then its marks)."""
    env = dict(os.environ, WC_BENCH_T0=repr(time.time()), WC_BENCH_NAME=NAME,
               WC_BENCH_PROFILE="1")
    r = subprocess.run([sys.executable, "-c", CHILD, "weightcache", str(d)], env=env,
                       capture_output=True, text=True, timeout=900)
    print(r.stderr[-12000:])
    print(r.stdout)
    return r.returncode


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "profile":
        return profile(Path(sys.argv[2]))
    if len(sys.argv) < 3 or sys.argv[1] not in ("make", "run"):
        print(__doc__)
        return 2
    d = Path(sys.argv[2])
    if sys.argv[1] == "make":
        make(d)
        return 0
    return run(d, int(os.environ.get("REPS", "3")))


if __name__ == "__main__":
    sys.exit(main())
