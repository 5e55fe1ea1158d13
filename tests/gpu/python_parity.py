"""Real-model parity of the Python package on a GPU (run by tests/gpu/run-python-on-device.sh).

  python_parity.py make DIR     writes a Qwen2 (tied embeddings, q/k/v biases) and a Llama,
                                from configs with seeded random weights (save_pretrained, bf16),
                                and DIR/specs.json naming them for weightcached
  python_parity.py check DIR    in this process (the daemon is another): for each model,
                                logits of weightcache.transformers.from_pretrained against
                                AutoModelForCausalLM.from_pretrained on fixed token ids (max
                                abs diff must be 0); tp 1 and tp 2 ranks' tensors against the
                                disk slices (weightcache.verify); zero copy (data pointers
                                inside the mapped segments, on cuda:0); the lease ends when
                                the model is freed; a write through a mapped tensor fails in
                                a child process and the cache stays intact.
Exit status 0 only when every check passes.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

MODELS = {
    "qwen2": ("Qwen2Config", dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                                  max_position_embeddings=512, tie_word_embeddings=True)),
    "llama": ("LlamaConfig", dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                  num_attention_heads=8, num_key_value_heads=4, vocab_size=1024,
                                  max_position_embeddings=512, tie_word_embeddings=False)),
}


def make(out: Path) -> None:
    import transformers

    specs = []
    for i, (name, (cfg_cls, kw)) in enumerate(MODELS.items()):
        cfg = getattr(transformers, cfg_cls)(**kw)
        torch.manual_seed(1234 + i)
        model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
        d = out / name
        model.save_pretrained(d)  # safetensors
        print(f"{name}: {type(model).__name__}, "
              f"{sum(p.numel() for p in model.parameters())} parameters -> {d}")
        specs.append({"version": 1, "name": name, "model_dir": str(d), "tp_size": 1})
        specs.append({"version": 1, "name": f"{name}-tp2", "model_dir": str(d), "tp_size": 2})
    (out / "specs.json").write_text(json.dumps({"models": specs}, indent=1))


def _leases(model: str) -> int:
    import weightcache

    return sum(len(e.get("leases", [])) for e in weightcache.status()["entries"]
               if e["model"] == model)


def check(out: Path) -> int:
    import transformers

    import weightcache
    from weightcache.transformers import from_pretrained

    failures = []
    ids = torch.tensor([[1, 17, 290, 3, 999, 42, 512, 7, 128, 64, 5, 1000]], device="cuda:0")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name(0)}, weightcache {weightcache.__version__} "
          f"(lib {weightcache.library_version()})")
    for name in MODELS:
        d = out / name
        t0 = time.perf_counter()
        disk = transformers.AutoModelForCausalLM.from_pretrained(
            d, dtype=torch.bfloat16).to("cuda:0").eval()
        t_disk = time.perf_counter() - t0
        t0 = time.perf_counter()
        cached = from_pretrained(str(d), model=name, device="cuda:0", mode="client",
                                 fallback=False)
        t_cache = time.perf_counter() - t0
        w = cached.weightcache_weights
        with torch.no_grad():
            want = disk(ids).logits
            got = cached(ids).logits
        diff = (want.float() - got.float()).abs().max().item()
        print(f"{name}: logits {tuple(got.shape)} max abs diff {diff} "
              f"(disk from_pretrained {t_disk * 1e3:.0f} ms, weightcache {t_cache * 1e3:.0f} ms,"
              f" acquire {w.map_seconds * 1e3:.1f} ms, {len(w)} tensors, backend {w.backend})")
        if diff != 0 or not torch.equal(want, got):
            failures.append(f"{name}: logits differ (max abs diff {diff})")
        for pname, p in cached.named_parameters():
            ptr = p.data_ptr()
            if p.device != torch.device("cuda", 0) or not any(
                    b <= ptr < b + s for b, s in w.segments):
                failures.append(f"{name}: {pname} is not a view of the mapped segments "
                                f"({p.device}, {ptr:#x})")
                break
        tied = getattr(cached.config, "tie_word_embeddings", False)
        if tied and cached.lm_head.weight is not cached.model.embed_tokens.weight:
            failures.append(f"{name}: tied lm_head is not the embedding")
        if _leases(name) != 1:
            failures.append(f"{name}: {_leases(name)} leases while the model lives, expected 1")
        # Every reference to a mapped tensor goes: the model, the Weights, and the last
        # parameter the loop above left bound (`p` keeps its storage, hence the lease).
        del cached, w, got, p
        gc.collect()
        deadline = time.monotonic() + 10
        while _leases(name) and time.monotonic() < deadline:
            time.sleep(0.01)
        if _leases(name):
            failures.append(f"{name}: the lease outlived the model")
        del disk
        gc.collect()
        torch.cuda.empty_cache()
        for size in (1, 2):
            model = name if size == 1 else f"{name}-tp2"
            for rank in range(size):
                with weightcache.acquire(model, tp_rank=rank, tp_size=size, device="cuda:0",
                                         load_on_miss=True) as wr:
                    r = weightcache.verify(wr, str(d), tp_rank=rank, tp_size=size)
                    dev = {str(t.device) for t in wr.values()}
                print(f"{model} tp {rank}/{size}: {r.checked} tensors ({r.bytes} bytes) equal "
                      f"the disk {'slices' if size > 1 else 'tensors'}; fused views "
                      f"{len(r.fused_views)}; devices {sorted(dev)}; failures {len(r.failures)}")
                failures.extend(f"{model} tp {rank}/{size}: {f}" for f in r.failures)
    # A write through a mapped CUDA tensor must fail (read-only mapping) in a child process,
    # and the cache must still hold the checkpoint's bytes afterwards.
    child = subprocess.run([sys.executable, "-c", (
        "import torch, weightcache\n"
        "w = weightcache.acquire('llama', device='cuda:0')\n"
        "t = w['model.layers.0.mlp.up_proj.weight']\n"
        "t.add_(1)\n"
        "torch.cuda.synchronize()\n"
        "print('WROTE')\n")], capture_output=True, text=True, timeout=300)
    print(f"write through a mapped tensor: exit {child.returncode}; "
          f"{(child.stderr.strip().splitlines() or [''])[-1][:200]}")
    if child.returncode == 0 or "WROTE" in child.stdout:
        failures.append("a write through a mapped CUDA tensor succeeded")
    with weightcache.acquire("llama", device="cuda:0") as wr:
        r = weightcache.verify(wr, str(out / "llama"))
    if r.failures:
        failures.append(f"llama after the write attempt: {r.failures[:3]}")
    for f in failures:
        print(f"FAIL {f}")
    print("python parity: " + ("PASS" if not failures else f"FAIL ({len(failures)})"))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "check"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    out = Path(sys.argv[2])
    if sys.argv[1] == "make":
        make(out)
    else:
        sys.exit(check(out))
