"""Issue 4's baseline (c): how an engine loads a checkpoint today.

    python3 bench/torch_load_baseline.py FILE.safetensors...

Times safetensors.torch.load_file(path, device="cuda") over every file (CUDA initialised
first, outside the timing; the tensors are kept until the end, as an engine keeps them) and
prints `seconds=S bytes=B`. bench/load_bench.cc runs it cold and page-cache-hot.
"""
import sys
import time

import torch
from safetensors.torch import load_file


def main() -> None:
    files = sys.argv[1:]
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    kept = []
    nbytes = 0
    t0 = time.perf_counter()
    for f in files:
        sd = load_file(f, device="cuda")
        nbytes += sum(t.numel() * t.element_size() for t in sd.values())
        kept.append(sd)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    # A value that depends on every tensor, so nothing is skipped.
    check = sum(float(t.reshape(-1)[-1].float()) for sd in kept for t in sd.values())
    print(f"torch {torch.__version__}, {len(files)} files, check {check:.0f}", flush=True)
    print(f"seconds={seconds:.4f} bytes={nbytes}", flush=True)


if __name__ == "__main__":
    main()
