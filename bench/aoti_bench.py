#!/usr/bin/env python3
"""aoti_bench: an engine's start that does not trace at all (issue 29, item 4): the compiled
model as an AOTInductor package served by the node daemon as a compile artifact, its weights
mapped from the daemon, in a fresh process. Needs CUDA, torch >= 2.6, transformers and a
weightcached serving the model (tests/gpu/run-compile-cache-on-device.sh starts one and runs
compile_cache_bench.py first, whose `make` wrote the model).

Each mode is a fresh process (python -X faulthandler, so a crash prints where):

  tiny   control: a two-layer MLP packaged and loaded again in a fresh process (does
         AOTInductor load on this machine at all?)
  build  weights mapped from weightcached, the model exported (torch.export) and compiled
         code-only (aot_inductor.package_constants_in_so=False: no weights in the package),
         put as artifact "aoti-package"; the few constants that are not checkpoint tensors
         (the rotary inv_freq buffers) put as "aoti-constants". Then, in the same process,
         the package loaded with the mapped weights bound (user-managed) and run once.
  load   a fresh engine: import, map the weights, get both artifacts, aoti_load_package,
         load_constants(user_managed=True: the mapped GPU memory itself, no copy), first forward

Prints a table of seconds from process start, and the logits compared bit for bit with the
building process's and against eager (max abs difference).
Usage: aoti_bench.py --work DIR --model NAME [--modes tiny,tiny,build,load]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

T0 = time.time()
SETTINGS = {"aoti": "code-only", "tokens": 128, "dtype": "bfloat16"}
VOCAB = 32000


class _Emit:
    """Prints one BENCH line per step as soon as it is known (a later crash keeps them)."""

    def __init__(self, mode):
        self.out = {"mode": mode}

    def __call__(self, **kv):
        self.out.update(kv)
        print("BENCH " + json.dumps(self.out), flush=True)


def tiny(work):
    import torch

    emit = _Emit("tiny")
    path = os.path.join(work, "tiny.pt2")
    x = torch.randn(8, 64, device="cuda")
    if not os.path.exists(path):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8)).cuda().eval()
        ep = torch.export.export(m, (x,))
        torch._inductor.aoti_compile_and_package(ep, package_path=path)
        torch.save(m(x).detach().cpu(), os.path.join(work, "tiny-ref.pt"))
        emit(built=True)
        return
    t = time.time()
    fn = torch._inductor.aoti_load_package(path)
    y = fn(x)
    emit(load_s=time.time() - t,
         max_abs_diff=(y.cpu() - torch.load(os.path.join(work, "tiny-ref.pt"))).abs().max().item())


def diag(work, step):
    """Where a package load crashes (tiny.pt2 from `tiny`): one step per process."""
    import glob
    import zipfile

    import torch

    emit = _Emit("diag-" + step)
    path = os.path.join(work, "tiny.pt2")
    out = os.path.join(work, "tiny-unpacked")
    if not os.path.isdir(out):
        with zipfile.ZipFile(path) as z:
            z.extractall(out)
    sos = sorted(glob.glob(os.path.join(out, "**", "*.so"), recursive=True))
    emit(members=sorted(os.path.relpath(f, out) for f in glob.glob(os.path.join(out, "**", "*"),
                                                                     recursive=True))[:40])
    if step == "ldd":
        for so in sos:
            r = subprocess.run(["ldd", so], capture_output=True, text=True)
            emit(so=os.path.relpath(so, out), ldd=r.stdout[-2000:])
    elif step == "dlopen":
        import ctypes

        for so in sos:
            ctypes.CDLL(so)
            emit(dlopened=os.path.relpath(so, out))
    elif step == "runner":
        for so in sos:
            r = torch._C._aoti.AOTIModelContainerRunnerCuda(so, 1, "cuda:0")
            emit(runner_ok=os.path.relpath(so, out))
            y = r.run([torch.randn(8, 64, device="cuda")])
            emit(ran=list(y[0].shape))
    elif step == "noconst":  # a package without any constant: does loading need them?
        class NoConst(torch.nn.Module):
            def forward(self, x, w):
                return torch.relu(x @ w) + 1

        x, w = torch.randn(8, 64, device="cuda"), torch.randn(64, 8, device="cuda")
        p = os.path.join(work, "noconst.pt2")
        torch._inductor.aoti_compile_and_package(torch.export.export(NoConst(), (x, w)),
                                                 package_path=p)
        emit(built_noconst=True)
        fn = torch._inductor.aoti_load_package(p)
        emit(loaded_noconst=True)
        emit(noconst_max_abs_diff=(fn(x, w) - NoConst()(x, w)).abs().max().item())
    elif step == "single":
        fn = torch._inductor.aoti_load_package(path, run_single_threaded=True)
        emit(loaded_single_threaded=True)
        fn(torch.randn(8, 64, device="cuda"))
        emit(ran=True)


def _wrapped(model):
    import torch

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(input_ids=x, use_cache=False).logits

    return Logits(model).eval()


def _bind(runner, weights, extra):
    """user-managed constants: the package's FQNs ("m." + checkpoint name) bound to the mapped
    tensors themselves; the rest (buffers) from the extra constants."""
    consts = {}
    for name in weights:
        consts["m." + name] = weights[name]
    consts.update(extra)
    runner.load_constants(consts, check_full_update=True, user_managed=True)
    return len(consts)


def build(work, model_name):
    t_start = float(os.environ["BENCH_SPAWNED"])
    import safetensors.torch
    import torch
    import weightcache
    from weightcache.transformers import from_pretrained

    emit = _Emit("build")
    model = from_pretrained(os.path.join(work, "llama"), model=model_name, device="cuda:0",
                            fallback=False).eval()
    ids = torch.arange(128, device="cuda").reshape(1, 128) % VOCAB
    wrapped = _wrapped(model)
    with torch.no_grad():
        torch.save(wrapped(ids).float().cpu(), os.path.join(work, "logits-aoti-eager.pt"))
    w = weightcache.acquire(model_name, device="cuda:0")
    fingerprint = w.fingerprint
    t = time.time()
    with torch.no_grad():
        ep = torch.export.export(wrapped, (ids,))
    t_export = time.time()
    pkg = os.path.join(work, "llama-code.pt2")
    torch._inductor.aoti_compile_and_package(
        ep, package_path=pkg, inductor_configs={"aot_inductor.package_constants_in_so": False})
    t_compile = time.time()
    extra = {n: b.detach().contiguous() for n, b in wrapped.named_buffers()
             if n[2:] not in w}
    key = weightcache.artifact_key("aoti-package", model_name, fingerprint, settings=SETTINGS)
    ckey = weightcache.artifact_key("aoti-constants", model_name, fingerprint, settings=SETTINGS)
    with open(pkg, "rb") as f:
        blob = f.read()
    cblob = safetensors.torch.save({n: t.cpu() for n, t in extra.items()})
    weightcache.put_artifact(key, blob)
    weightcache.put_artifact(ckey, cblob)
    emit(export_s=t_export - t, aoti_compile_s=t_compile - t_export, package_bytes=len(blob),
         constants_bytes=len(cblob), extra_constants=sorted(extra), put_s=time.time() - t_compile,
         build_total_s=time.time() - t_start)
    # The same package in the building process (the fresh-process load is `load`).
    t = time.time()
    runner = torch._inductor.aoti_load_package(pkg)
    t_loaded = time.time()
    n = _bind(runner, w, extra)
    with torch.no_grad():
        logits = runner(ids)
    torch.cuda.synchronize()
    torch.save(logits.float().cpu(), os.path.join(work, "logits-aoti-same.pt"))
    emit(same_load_s=t_loaded - t, same_constants=n, same_first_forward_s=time.time() - t_loaded)
    w.close()


def load(work, model_name):
    t_start = float(os.environ["BENCH_SPAWNED"])
    import safetensors.torch
    import torch
    import weightcache

    emit = _Emit("load")
    t_import = time.time()
    w = weightcache.acquire(model_name, device="cuda:0")  # mapped: no copy, no disk
    t_map = time.time()
    key = weightcache.artifact_key("aoti-package", model_name, w.fingerprint, settings=SETTINGS)
    ckey = weightcache.artifact_key("aoti-constants", model_name, w.fingerprint,
                                    settings=SETTINGS)
    blob, cblob = weightcache.get_artifact(key), weightcache.get_artifact(ckey)
    if blob is None or cblob is None:
        emit(error="no aoti artifacts from the daemon (did `build` run?)")
        return
    tmp = tempfile.mkdtemp(prefix="wc-aoti-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    pkg = os.path.join(tmp, "llama-code.pt2")
    with open(pkg, "wb") as f:
        f.write(blob)
    extra = {n: t.cuda() for n, t in safetensors.torch.load(cblob).items()}
    t_get = time.time()
    emit(import_s=t_import - t_start, map_s=t_map - t_import, artifact_get_s=t_get - t_map,
         package_bytes=len(blob))
    runner = torch._inductor.aoti_load_package(pkg)
    t_loaded = time.time()
    emit(package_load_s=t_loaded - t_get)
    _bind(runner, w, extra)
    t_bound = time.time()
    ids = torch.arange(128, device="cuda").reshape(1, 128) % VOCAB
    with torch.no_grad():
        logits = runner(ids)
    torch.cuda.synchronize()
    t_first = time.time()
    torch.save(logits.float().cpu(), os.path.join(work, "logits-aoti-load.pt"))
    emit(bind_s=t_bound - t_loaded, first_forward_s=t_first - t_bound, total_s=t_first - t_start)
    shutil.rmtree(tmp, ignore_errors=True)
    w.close()


def run(mode, work, model_name):
    env = dict(os.environ, BENCH_SPAWNED=repr(time.time()))
    if mode.startswith("diag-") and os.environ.get("AOTI_SEGV_PRELOAD"):
        env["LD_PRELOAD"] = os.environ["AOTI_SEGV_PRELOAD"]  # tests/gpu/segv_backtrace.c
    argv = [sys.executable, "-X", "faulthandler", __file__, "--child", mode, "--work", work,
            "--model", model_name]
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    last = {"mode": mode}
    for line in p.stdout.splitlines():
        if line.startswith("BENCH "):
            last = json.loads(line[6:])
    if p.returncode != 0:
        sys.stderr.write(f"--- {mode} failed (exit {p.returncode}) ---\n{p.stdout[-3000:]}\n"
                         f"{p.stderr[-8000:]}\n")
        last["error"] = f"exit {p.returncode}"
        gdb = shutil.which("gdb")
        if p.returncode < 0 and gdb:  # a signal: where, natively
            g = subprocess.run([gdb, "-batch", "-ex", "run", "-ex", "bt 25", "--args"] + argv,
                               env=dict(env, BENCH_SPAWNED=repr(time.time())),
                               capture_output=True, text=True, timeout=600)
            sys.stderr.write(f"--- {mode} under gdb ---\n{g.stdout[-6000:]}\n")
    return last


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--work", required=True)
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--modes", default="tiny,tiny,build,load",
                    help="also diag-ldd, diag-dlopen, diag-runner, diag-single (after tiny), "
                    "diag-noconst; AOTI_SEGV_PRELOAD=<segv_backtrace.so> prints native stacks")
    a = ap.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(a.work, "inductor-aoti"))
    if a.child:
        if a.child.startswith("diag-"):
            diag(a.work, a.child[5:])
            return 0
        {"tiny": lambda: tiny(a.work), "build": lambda: build(a.work, a.model),
         "load": lambda: load(a.work, a.model)}[a.child]()
        return 0
    results = [run(m, a.work, a.model) for m in a.modes.split(",")]
    import torch

    def logits(name):
        p = os.path.join(a.work, f"logits-{name}.pt")
        return torch.load(p) if os.path.exists(p) else None

    eager, same, loaded = logits("aoti-eager"), logits("aoti-same"), logits("aoti-load")
    print(f"\n## aoti_bench: Llama hidden 2048, 16 layers, bf16, 128 tokens; package code-only, "
          f"weights mapped from weightcached; torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0)}\n")
    for r in results:
        print(f"- {json.dumps(r)}")
    if loaded is not None:
        print(f"\nfresh-process logits vs the building process's: "
              f"{'equal' if same is not None and torch.equal(loaded, same) else 'differ or missing'}; "
              f"max abs diff vs eager {(loaded - eager).abs().max().item():.3g}")
    print(f"\nbench wall time {time.time() - T0:.1f} s")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
