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
Before every package load the process's libstdc++ is promoted to the global scope (the load
crash otherwise: docs/benchmarks.md; AOTI_GLOBAL_LIBSTDCXX=0 leaves it out). AOTI_PROFILE=1
prints where aoti_load_package's time goes (cProfile); AOTI_LOG_CMDS=1 every compiler command.
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


def _log_commands():
    """AOTI_LOG_CMDS=1: prints each compiler-like command this process starts ("CMD ...")."""
    if os.environ.get("AOTI_LOG_CMDS") != "1":
        return
    orig = subprocess.Popen.__init__

    def init(self, args, *a, **kw):
        text = args if isinstance(args, str) else " ".join(map(str, args))
        if any(k in text for k in ("g++", "gcc", "clang", "c++", "nvcc", "-shared", "cmake")):
            print("CMD " + text, flush=True)
        orig(self, args, *a, **kw)

    subprocess.Popen.__init__ = init


def _so_report(pkg, emit):
    """What the package's shared object carries of libstdc++: its NEEDED entries and how many
    std::locale / facet-id symbols it defines itself (a static copy defines them)."""
    import glob
    import zipfile

    out = pkg + ".unpacked"
    with zipfile.ZipFile(pkg) as z:
        z.extractall(out)
    for so in sorted(glob.glob(os.path.join(out, "**", "*.so"), recursive=True)):
        needed = subprocess.run(["sh", "-c", f"readelf -d '{so}' | grep NEEDED"],
                                capture_output=True, text=True).stdout
        own = subprocess.run(["sh", "-c", f"nm -C --defined-only '{so}' | grep -c 'std::locale'"],
                             capture_output=True, text=True).stdout.strip()
        emit(so=os.path.relpath(so, out), needed=needed.split("\n"), defines_std_locale=own)


def _mapped(name):
    """The files named like `name` mapped into this process."""
    with open("/proc/self/maps") as f:
        return sorted({ln.split()[-1] for ln in f if name in ln and "/" in ln})


def _global_libstdcxx():
    """The fix for the load crash (docs/benchmarks.md): the package's shared object carries its
    own copy of libstdc++'s locale code and binds to it unless the process's libstdc++ is in the
    global scope; torch's (a dependency of an RTLD_LOCAL extension) is not. Promoting the
    already-loaded libstdc++ to RTLD_GLOBAL (RTLD_NOLOAD: nothing new is loaded) makes the
    package bind to it, as LD_PRELOAD would. AOTI_GLOBAL_LIBSTDCXX=0 leaves it out."""
    import ctypes

    if os.environ.get("AOTI_GLOBAL_LIBSTDCXX", "1") == "0":
        return 0.0
    t = time.time()
    for path in _mapped("libstdc++.so"):
        ctypes.CDLL(path, mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
    return time.time() - t


def _profiled(fn, what):
    """fn(), with where its time went printed (cProfile, top 25 by cumulative time) when
    AOTI_PROFILE=1."""
    if os.environ.get("AOTI_PROFILE") != "1":
        return fn()
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    out = prof.runcall(fn)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
    print(f"PROFILE {what}\n{buf.getvalue()}", flush=True)
    return out


def tiny(work):
    import torch

    emit = _Emit("tiny")
    path = os.path.join(work, "tiny.pt2")
    torch.manual_seed(0)
    x = torch.randn(8, 64, device="cuda")
    if not os.path.exists(path):
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8)).cuda().eval()
        ep = torch.export.export(m, (x,))
        torch._inductor.aoti_compile_and_package(ep, package_path=path)
        torch.save(m(x).detach().cpu(), os.path.join(work, "tiny-ref.pt"))
        emit(built=True)
        return
    t = time.time()
    _global_libstdcxx()
    fn = _profiled(lambda: torch._inductor.aoti_load_package(path), "tiny aoti_load_package")
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
    sos = []
    if step in ("ldd", "dlopen", "runner"):
        if not os.path.isdir(out):
            with zipfile.ZipFile(path) as z:
                z.extractall(out)
        sos = sorted(glob.glob(os.path.join(out, "**", "*.so"), recursive=True))
        emit(members=sorted(os.path.relpath(f, out)
                            for f in glob.glob(os.path.join(out, "**", "*"), recursive=True))[:40])
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
    elif step == "linkbuild":  # one package, built in this process (fresh Inductor cache)
        p = os.environ["AOTI_LINK_PKG"]
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8)).cuda().eval()
        x = torch.randn(8, 64, device="cuda")
        torch._inductor.aoti_compile_and_package(torch.export.export(m, (x,)), package_path=p)
        _so_report(p, emit)
        emit(cxx=subprocess.run(["sh", "-c", "c++ --version | head -1; g++ --version | head -1"],
                                capture_output=True, text=True).stdout,
             libstdcxx_in_process=_mapped("libstdc++"), libgcc_in_process=_mapped("libgcc_s"))
    elif step == "linkload":
        emit(libstdcxx_in_process=_mapped("libstdc++"), preload=os.environ.get("LD_PRELOAD", ""))
        if os.environ.get("AOTI_GLOBAL_LIBSTDCXX") == "1":
            emit(global_libstdcxx_s=_global_libstdcxx())
        fn = torch._inductor.aoti_load_package(os.environ["AOTI_LINK_PKG"])
        emit(loaded=True)
        fn(torch.randn(8, 64, device="cuda"))
        emit(ran=True)
    elif step == "link":  # how Inductor links a package, and does it load with the system
        # libstdc++ preloaded?
        sys_stdcxx = subprocess.run(["sh", "-c", "g++ -print-file-name=libstdc++.so.6"],
                                    capture_output=True, text=True).stdout.strip()
        env = dict(os.environ, AOTI_LOG_CMDS="1", AOTI_GLOBAL_LIBSTDCXX="0",
                   AOTI_LINK_PKG=os.path.join(work, "link.pt2"),
                   TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="inductor-link-"))
        for sub, extra in (("linkbuild", {}), ("linkload", {}),
                           ("linkload", {"LD_PRELOAD": os.path.realpath(sys_stdcxx)}),
                           ("linkload", {"AOTI_GLOBAL_LIBSTDCXX": "1"})):
            p = subprocess.run([sys.executable, "-X", "faulthandler", __file__, "--child",
                                "diag-" + sub, "--work", work], env=dict(env, **extra),
                               capture_output=True, text=True)
            cmds = [ln for ln in p.stdout.splitlines() if ln.startswith("CMD ")]
            print(f"--- {sub} {extra} exit {p.returncode}", flush=True)
            for c in cmds[:6]:
                print(c[:3000], flush=True)
            for ln in p.stdout.splitlines():
                if ln.startswith("BENCH "):
                    print(ln[:3000], flush=True)
            if p.returncode:
                print(p.stderr[-1200:], flush=True)
        emit(done=True)
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
    # Buffers the forward never reads (rotary original_inv_freq) are not constants of the
    # package: bind what it has.
    wanted = set(runner.get_constant_fqns())
    missing = sorted(wanted - set(consts))
    if missing:
        raise RuntimeError(f"the package needs constants nobody gives: {missing[:5]}")
    runner.load_constants({k: v for k, v in consts.items() if k in wanted},
                          check_full_update=True, user_managed=True)
    return len(wanted)


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
    _global_libstdcxx()
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
         package_bytes=len(blob), global_libstdcxx_s=_global_libstdcxx())
    runner = _profiled(lambda: torch._inductor.aoti_load_package(pkg), "aoti_load_package")
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
    if mode == "diag-link":
        sys.stderr.write(p.stdout[-20000:])
    cmds = [ln[:400] for ln in p.stdout.splitlines() if ln.startswith("CMD ")]
    if cmds and mode != "diag-link":
        sys.stderr.write(f"--- {mode}: {len(cmds)} commands run\n" + "\n".join(cmds[:40]) + "\n")
    if "PROFILE " in p.stdout:
        sys.stderr.write(p.stdout[p.stdout.index("PROFILE "):][:12000])
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
                    "diag-noconst, diag-link; AOTI_SEGV_PRELOAD=<segv_backtrace.so> prints native stacks")
    a = ap.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(a.work, "inductor-aoti"))
    if a.child:
        _log_commands()
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
