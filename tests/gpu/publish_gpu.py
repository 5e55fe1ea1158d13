"""Publish on a GPU (run by tests/gpu/run-publish-on-device.sh; issue 15).

  publish_gpu.py publisher DIR   loads DIR/llama (transformers, bf16, cuda:0), transforms its
                                 weights in place (every Linear weight x2, norms x0.5: what an
                                 engine's post-processing does to the bytes), computes logits on
                                 fixed token ids into DIR/publisher-logits.pt, publishes the
                                 transformed tensors (recipe "scaled-v1"), prints PUBLISHED and
                                 waits to be killed.
  publish_gpu.py reader DIR      another process after the publisher's SIGKILL: maps the
                                 published tensors (acquire with the recipe), binds them into a
                                 fresh model and compares its logits with the publisher's (max
                                 abs diff must be 0); checks the tensors are on cuda:0 and
                                 read-only (a write fails in a child).
  publish_gpu.py bench DIR GB    publishes GB GiB of bf16 tensors already on cuda:0 and prints
                                 a table: publish wall time, its effective GB/s, and a plain
                                 D2D copy of the same bytes for reference (goal >= 1 TB/s).
Exit status 0 only when every check passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ENGINE = dict(engine="publish-gpu-test", engine_version="1", recipe="scaled-v1")
IDS = torch.tensor([[1, 5, 9, 42, 7, 300, 2, 11]])


def _model(d: Path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(d / "llama", dtype=torch.bfloat16)


def _sums(tensors) -> dict:
    """name -> SHA-256 of the tensor's bytes (on the CPU)."""
    import hashlib

    return {n: hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
            .hexdigest() for n, t in tensors.items()}


def publisher(d: Path) -> int:
    import weightcache

    model = _model(d).to("cuda:0").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.mul_(0.5 if "norm" in name else 2.0)
        logits = model(IDS.to("cuda:0")).logits.float().cpu()
    torch.save(logits, d / "publisher-logits.pt")
    tensors = {n: t for n, t in model.state_dict().items()}
    (d / "publisher-sums.json").write_text(json.dumps(_sums(tensors)))
    t0 = time.perf_counter()
    fp = weightcache.publish("llama", tensors, device="cuda:0", **ENGINE)
    print(f"PUBLISHED {fp} in {time.perf_counter() - t0:.3f} s", flush=True)
    time.sleep(3600)  # the script SIGKILLs us
    return 0


def reader(d: Path) -> int:
    import transformers
    import weightcache

    ok = True
    w = weightcache.acquire("llama", device="cuda:0", **ENGINE)
    # Every published byte as the publisher had it.
    want_sums = json.loads((d / "publisher-sums.json").read_text())
    got_sums = _sums({n: w[n] for n in want_sums if n in w})
    bad = sorted(n for n in want_sums if got_sums.get(n) != want_sums[n])
    print(f"published tensors equal the publisher's bytes: {len(want_sums) - len(bad)} of "
          f"{len(want_sums)}" + (f" (differ or missing: {', '.join(bad[:5])})" if bad else ""))
    ok &= not bad
    # The model built as the publisher's was (bf16 from the config: rotary inv_freq is then
    # computed as from_pretrained computes it), its weights bound to the mapped tensors.
    from weightcache.transformers import build_and_bind

    cfg = transformers.AutoConfig.from_pretrained(d / "llama")
    model = build_and_bind(
        lambda dt: transformers.AutoModelForCausalLM.from_config(cfg, dtype=dt), w,
        torch.bfloat16)
    with torch.no_grad():
        logits = model(IDS.to("cuda:0")).logits.float().cpu()
    want = torch.load(d / "publisher-logits.pt")
    diff = (logits - want).abs().max().item()
    print(f"logits max abs diff vs the publisher's: {diff}")
    ok &= diff == 0
    dev = {t.device.type for t in w.values()}
    print(f"devices of the mapped tensors: {dev}")
    ok &= dev == {"cuda"}
    name = next(iter(w))
    code = ("import weightcache, torch; w = weightcache.acquire('llama', device='cuda:0', "
            f"engine={ENGINE['engine']!r}, engine_version='1', recipe={ENGINE['recipe']!r}); "
            f"w[{name!r}].add_(1); torch.cuda.synchronize()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    print(f"write through a mapped tensor in a child: exit {r.returncode}")
    ok &= r.returncode != 0
    print("reader:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def bench(d: Path, gib: float) -> int:
    import weightcache

    n = max(1, int(gib))
    per = int(gib * (1 << 30) / n) // 2
    tensors = {f"bench.{i}": torch.randn(per, dtype=torch.bfloat16, device="cuda:0")
               for i in range(n)}
    nbytes = sum(t.numel() * 2 for t in tensors.values())
    dst = torch.empty(per, dtype=torch.bfloat16, device="cuda:0")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for t in tensors.values():
        dst.copy_(t)
    torch.cuda.synchronize()
    d2d = time.perf_counter() - t0
    del dst
    rows = []
    for rep in range(2):
        recipe = f"bench-{gib}g-{rep}"
        t0 = time.perf_counter()
        weightcache.publish("llama", tensors, device="cuda:0", engine="bench",
                            recipe=recipe)
        rows.append((recipe, time.perf_counter() - t0))
    print(f"| what | bytes | seconds | GB/s |")
    print(f"|---|---|---|---|")
    print(f"| D2D copy (torch) | {nbytes} | {d2d:.3f} | {nbytes / d2d / 1e9:.0f} |")
    for recipe, s in rows:
        print(f"| publish ({recipe}) | {nbytes} | {s:.3f} | {nbytes / s / 1e9:.0f} |")
    best = min(s for _, s in rows)
    print(f"effective publish rate {nbytes / best / 1e12:.2f} TB/s (goal >= 1 TB/s: "
          f"{'met' if nbytes / best >= 1e12 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    cmd, d = sys.argv[1], Path(sys.argv[2])
    if cmd == "publisher":
        sys.exit(publisher(d))
    if cmd == "reader":
        sys.exit(reader(d))
    if cmd == "bench":
        sys.exit(bench(d, float(sys.argv[3]) if len(sys.argv) > 3 else 8))
    sys.exit(f"unknown command {cmd}")
