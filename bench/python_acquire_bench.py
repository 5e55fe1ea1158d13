"""Python acquire + bind overhead over the C++ Acquire -> mapped, host backend. Prints a table.

    bash scripts/install-python.sh build/python-venv    # once (ctest's python_pytest does it too)
    build/python-venv/bin/python bench/python_acquire_bench.py [--build build] [--reps 50]
        [--tensors 1000] [--mib 64] [--daemon PATH]

A weightcached (child process, host backend, real Unix sockets) serves a bf16 checkpoint of
N tensors written here. Each repetition, in this process: weightcache.acquire() then
weightcache.bind() onto a module of N parameters built on the meta device, then everything
is freed (the lease ends). "C++ Acquire -> mapped" is the library's own timing of the same
call (Lease::map_seconds: Acquire RPC, manifest, FDs over the handle channel, mmap, views),
so both figures come from the same repetitions.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_checkpoint(d: Path, tensors: int, mib: int) -> tuple:
    elems = max(1, (mib << 20) // tensors // 2)
    cols = 256 if elems % 256 == 0 else 1
    shape = [elems // cols, cols]
    nbytes = elems * 2
    header, off = {}, 0
    for i in range(tensors):
        header[f"layers.{i}.weight"] = {"dtype": "BF16", "shape": shape,
                                        "data_offsets": [off, off + nbytes]}
        off += nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with open(d / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        f.truncate(8 + len(h) + off)  # sparse zeros: the timing does not depend on values
    return tuple(shape)


def pct(v: list, p: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--daemon", help="weightcached to run (default: BUILD/cmd/weightcached/...)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--tensors", type=int, default=1000)
    ap.add_argument("--mib", type=int, default=64)
    a = ap.parse_args()

    import torch

    import weightcache
    from weightcache import _lib
    from weightcache.transformers import parameters_on_meta

    work = Path(tempfile.mkdtemp(prefix="wc-pybench."))
    shape = write_checkpoint(work / "m", a.tensors, a.mib)
    sock = work / "s"
    daemon = subprocess.Popen(
        [a.daemon or str(Path(a.build) / "cmd/weightcached/weightcached"), f"--socket_dir={sock}",
         "--backend=host", "--metrics_address=off", f"--model=name=bench,model_dir={work / 'm'}"],
        stdout=open(work / "daemon.log", "wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                st = weightcache.status(socket=str(sock))
                if any(e["state"] == "ready" for e in st["entries"]):
                    break
            except weightcache.DaemonUnavailable:
                pass
            if time.monotonic() > deadline or daemon.poll() is not None:
                print((work / "daemon.log").read_text(), file=sys.stderr)
                return 1
            time.sleep(0.05)

        def make_module() -> torch.nn.Module:
            with parameters_on_meta():
                m = torch.nn.Module()
                m.layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(a.tensors))
                for layer in m.layers:
                    layer.weight = torch.nn.Parameter(torch.empty(shape, dtype=torch.bfloat16))
            return m

        from weightcache import _weights

        rows = {k: [] for k in ("connect", "cpp", "build", "bind", "whole", "over", "floor")}
        for rep in range(a.reps + 2):
            module = make_module()
            gc.collect()
            # The public call, whole: acquire() then bind().
            t0 = time.perf_counter()
            w = weightcache.acquire("bench", socket=str(sock))
            weightcache.bind(module, w)
            whole = time.perf_counter() - t0
            info = _lib.LeaseInfo()
            _lib.lib().wc_lease_info_get(w._lease.handle, ctypes.byref(info))
            del w, module
            gc.collect()
            # The same steps one by one: C++ (channel, Acquire -> mapped), then Python.
            module = make_module()
            t0 = time.perf_counter()
            client = _lib.Client(str(sock))
            t1 = time.perf_counter()
            o = _weights._options("bench", None, 0, 1, 0, 1, None, None, None, True, False, 600)
            lease = _lib.acquire_lease(client, o)
            t2 = time.perf_counter()
            w = _weights._build(lease, t2)
            t3 = time.perf_counter()
            weightcache.bind(module, w)
            t4 = time.perf_counter()
            # The torch calls the design cannot avoid: one as_strided view and one Parameter
            # per tensor, alone.
            base = next(iter(w.values()))
            t5 = time.perf_counter()
            for t in w.values():
                torch.Tensor._make_subclass(torch.nn.Parameter, torch.as_strided(
                    base, t.shape, t.stride(), 0), False)
            t6 = time.perf_counter()
            client.close()
            if rep >= 2:  # two warm-ups
                rows["connect"].append((t1 - t0) * 1e3)
                rows["cpp"].append(info.map_seconds * 1e3)
                rows["build"].append((t3 - t2) * 1e3)
                rows["bind"].append((t4 - t3) * 1e3)
                rows["whole"].append(whole * 1e3)
                rows["over"].append((whole - info.map_seconds) * 1e3)
                rows["floor"].append((t6 - t5) * 1e3)
            del w, module, lease, base
            gc.collect()
        print(f"Python acquire + bind vs C++ Acquire -> mapped, host backend: {a.tensors} "
              f"tensors, {a.mib} MiB, {a.reps} reps (torch {torch.__version__}, Python "
              f"{sys.version.split()[0]}, {os.cpu_count()} CPUs)\n")
        print("| step | median ms | min ms | p90 ms |")
        print("|---|---:|---:|---:|")
        for key, label in (
                ("cpp", "C++ Acquire -> mapped (Lease::map_seconds, inside wc_acquire)"),
                ("connect", "C++ wc_connect (gRPC channel; once per process, not in whole)"),
                ("build", "Python: tensor table + DLPack + one view per tensor"),
                ("bind", "Python: weightcache.bind()"),
                ("whole", "acquire() + bind(), the public calls, whole"),
                ("over", "**Python overhead: whole - C++ Acquire -> mapped** (connection kept)"),
                ("floor", "torch alone: as_strided + Parameter per tensor")):
            v = rows[key]
            print(f"| {label} | {statistics.median(v):.2f} | {min(v):.2f} | {pct(v, 0.9):.2f} |")
    finally:
        daemon.terminate()
        daemon.wait(timeout=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
