#!/usr/bin/env python3
"""engine_start_bench: a fresh engine process from its start to its first compiled forward
(issue 49), three ways, each run a fresh process with empty Inductor and Triton caches (a new
pod), the weights mapped from weightcached:

  cold   torch.compile inside weightcache.compile_cache, a miss (settings unique per run)
  cc     torch.compile inside weightcache.compile_cache, a hit (the artifact of cold run 1)
  aoti   weightcache.aoti.load: the code-only AOTInductor package from the daemon, loaded by
         torch's C++ loader, constants bound to the mapped weights (the package is built and
         put first by one `aoti-build` process, which is not counted)
  aoti-torch  the same package through torch._inductor.aoti_load_package (Inductor's CPU
         probes run first; weightcache.probes' decision applied): what the probes cost
  cpp    examples/cpp_engine (--cpp-engine BINARY): no Python; the C++ client maps the
         weights, gets the same package, loads it with libtorch's C++ loader, binds the
         mapped weights and runs the forward (its first column: exec and dynamic loading)

Phases, seconds: imports (interpreter start + torch + weightcache, each also shown apart),
cuda init (the first CUDA tensor: the context), map (acquire: connect,
map; for cold/cc also transformers and the module built around the weights), artifact get,
package load, bind, first forward (for cold/cc: the compile happens inside it), total.
Every child records each subprocess it starts (a sys.addaudithook on subprocess.Popen,
os.system, os.posix_spawn, os.exec) with the time from its start: the probes torch runs.

Runs are scheduled inside --budget seconds (each mode's next run is skipped when its last
run's duration would pass the budget; skipped runs are printed). Logits are compared bit for
bit with the building process's (aoti) and with cold run 1's (cold, cc).
Needs CUDA, torch >= 2.6, transformers, and weightcached serving the model
(tests/gpu/run-engine-start-on-device.sh sets everything up).
Usage: engine_start_bench.py --work DIR --model NAME [--runs 5] [--budget 480]
       [--modes cold,cc,aoti,aoti-torch,cpp] [--cpp-engine BINARY]
"""
import time

T_FIRST = time.time()  # the interpreter is up: what came before is its start

import argparse  # noqa: E402 (after the timestamp on purpose)
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

T0 = time.time()
SETTINGS = {"torch.compile": "default", "tokens": 128}
AOTI_SETTINGS = {"aoti": "code-only", "tokens": 128, "dtype": "bfloat16"}
VOCAB = 32000
PHASES = ("import_s", "cuda_init_s", "map_s", "get_s", "load_s", "bind_s", "first_forward_s",
          "total_s")


def _trace_subprocesses(out):
    """Records every process this one starts: (seconds since start, command)."""
    t_start = float(os.environ["BENCH_SPAWNED"])

    def hook(event, args):
        if event == "subprocess.Popen":
            cmd = args[1] if args[1] is not None else args[0]
        elif event in ("os.system", "os.posix_spawn", "os.exec"):
            cmd = args[0] if event == "os.system" else args[1]
        else:
            return
        text = cmd if isinstance(cmd, (str, bytes)) else " ".join(map(str, cmd))
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        out.append([round(time.time() - t_start, 3), event, text[:300]])

    sys.addaudithook(hook)


def _emit(rec):
    print("BENCH " + json.dumps(rec), flush=True)


def _model_dir(work, model_name):
    # compile_cache_bench.py make: llama-1b in work/llama, the others in work/<name>
    return os.path.join(work, "llama" if model_name == "llama-1b" else model_name)


def _module(work, model_name):
    from aoti_bench import _wrapped  # the same Logits wrapper (bench/ is on sys.path)
    from weightcache.transformers import from_pretrained

    m = from_pretrained(_model_dir(work, model_name), model=model_name, device="cuda:0",
                        fallback=False).eval()
    return _wrapped(m)


def child(mode, run, work, model_name):
    procs = []
    _trace_subprocesses(procs)
    t_start = float(os.environ["BENCH_SPAWNED"])
    import torch

    t_torch = time.time()
    import weightcache

    rec = {"mode": mode, "run": run}
    t_wc = time.time()
    ids = torch.arange(128, device="cuda").reshape(1, 128) % VOCAB
    torch.cuda.synchronize()
    t_cuda = time.time()  # map_s starts here: the CUDA context is made before it
    rec.update(import_s=t_wc - t_start, interpreter_s=T_FIRST - t_start,
               torch_import_s=t_torch - T_FIRST, weightcache_import_s=t_wc - t_torch,
               cuda_init_s=t_cuda - t_wc)
    if mode in ("cold", "cc"):
        wrapped = _module(work, model_name)
        with weightcache.acquire(model_name, device="cuda:0") as w:
            fingerprint = w.fingerprint
        torch.cuda.synchronize()
        t_map = time.time()
        settings = dict(SETTINGS, run=run) if mode == "cold" else dict(SETTINGS, run=1)
        with weightcache.compile_cache(model_name, fingerprint, settings=settings) as cc:
            t_ready = time.time()
            fn = torch.compile(wrapped)
            with torch.no_grad():
                logits = fn(ids)
            torch.cuda.synchronize()
            t_first = time.time()
        # get: GetArtifact + torch.compiler.load_cache_artifacts; the compile is in the forward
        rec.update(hit=cc.hit, put=cc.put, artifact_bytes=cc.bytes, get_s=t_ready - t_map,
                   load_s=0.0, bind_s=0.0)
        if mode == "cc" and not cc.hit:
            rec["error"] = "no compile_cache artifact (cold run 1 did not put one)"
    else:
        import weightcache.aoti

        w = weightcache.acquire(model_name, device="cuda:0")
        t_map = time.time()
        fn = weightcache.aoti.load(model_name, w, make_module=lambda: _module(work, model_name),
                                   example_inputs=(ids,), settings=AOTI_SETTINGS,
                                   loader="torch" if mode == "aoti-torch" else "direct")
        t_ready = time.time()
        s = fn.seconds
        rec.update(source=fn.source, reason=fn.reason, put=fn.put, constants=fn.constants,
                   package_bytes=fn.package_bytes, get_s=s.get("get", 0.0),
                   load_s=s.get("load", 0.0), bind_s=s.get("bind", 0.0),
                   build_s=s.get("build", 0.0), probes=fn.probes.source if fn.probes else "",
                   vec_isa_ok=os.environ.get("TORCHINDUCTOR_VEC_ISA_OK", ""))
        with torch.no_grad():
            logits = fn(ids)
        torch.cuda.synchronize()
        t_first = time.time()
        if mode != "aoti-build" and fn.source != "artifact":
            rec["error"] = f"not from the artifact: {fn.source}: {fn.reason}"
        if mode == "aoti-build" and fn.source != "built":
            rec["error"] = f"the build process did not build: {fn.source}: {fn.reason}"
        if mode == "aoti-build":  # what the C++ engine needs: the package's key, the input
            with open(os.path.join(work, f"aoti-key-{model_name}.json"), "w") as f:
                json.dump(fn.key, f)
            with open(os.path.join(work, "ids.bin"), "wb") as f:
                f.write(ids.cpu().contiguous().numpy().tobytes())
        if mode == "aoti-build":  # the node's answer against Inductor's own CPU check
            from torch._inductor.cpu_vec_isa import x86_isa_checker

            rec.update(inductor_isa=x86_isa_checker(),
                       node_isa=fn.probes.cpu_isa if fn.probes else None)
        rec["aoti_load_other_s"] = t_ready - t_map - sum(s.values())  # probes, unpacking
    rec.update(map_s=t_map - t_cuda, first_forward_s=t_first - t_ready,
               total_s=t_first - t_start, subprocesses=procs)
    torch.save(logits.float().cpu(), os.path.join(work, f"logits-{mode}-{run}.pt"))
    _emit(rec)


def run_child(mode, run, work, model_name, timeout, importtime=False, cpp_engine=None):
    caches = tempfile.mkdtemp(prefix=f"caches-{mode}-{run}-", dir=work)
    flags = ["-X", "faulthandler"] + (["-X", "importtime"] if importtime else [])
    argv = [sys.executable, *flags, __file__, "--child", mode, "--run", str(run),
            "--work", work, "--model", model_name]
    if mode == "cpp":
        argv = [cpp_engine, "--model", model_name, "--run", str(run),
                "--key", os.path.join(work, f"aoti-key-{model_name}.json"),
                "--ids", os.path.join(work, "ids.bin"),
                "--logits", os.path.join(work, f"logits-cpp-{run}.bin")]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"),
               TRITON_CACHE_DIR=os.path.join(caches, "triton"), BENCH_SPAWNED=repr(time.time()))
    if mode == "cpp" and os.environ.get("CPP_ENGINE_PRELOAD"):  # e.g. a crash backtrace
        env["LD_PRELOAD"] = os.environ["CPP_ENGINE_PRELOAD"]
    print(f"+ {mode} run {run} (at {time.time() - T0:.0f} s)", flush=True)
    t = time.time()
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "run": run, "error": f"timed out after {timeout:.0f} s",
                "wall_s": time.time() - t}
    rec = {"mode": mode, "run": run}
    for line in p.stdout.splitlines():
        if line.startswith("BENCH "):
            rec = json.loads(line[6:])
    rec["wall_s"] = time.time() - t
    if importtime:
        rec["importtime"] = _top_imports(p.stderr)
    if p.returncode != 0 or "total_s" not in rec:
        rec.setdefault("error", f"exit {p.returncode}")
        sys.stderr.write(f"--- {mode} run {run} failed ---\n{p.stdout[-2000:]}\n"
                         f"{p.stderr[-6000:]}\n")
    elif "warning" in p.stderr.lower():
        sys.stderr.write(f"--- {mode} run {run} stderr (tail) ---\n{p.stderr[-1500:]}\n")
    print(f"  {mode} run {run}: " + (f"total {rec['total_s']:.2f} s, "
                                     f"{len(rec.get('subprocesses', []))} subprocesses"
                                     if "total_s" in rec else rec.get("error", "")), flush=True)
    return rec


def _top_imports(stderr, top=12):
    """`-X importtime` lines -> (the top-level packages by cumulative seconds, the modules by
    their own seconds: what each module's body and its extension's loading took), largest
    first."""
    tops, own = {}, []
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if not m:
            continue
        own.append((m.group(4), int(m.group(1)) / 1e6))
        if len(m.group(3)) <= 1:  # not indented: imported from the program, not a package
            name = m.group(4).split(".")[0]
            tops[name] = tops.get(name, 0.0) + int(m.group(2)) / 1e6
    return (sorted(tops.items(), key=lambda kv: -kv[1])[:top],
            sorted(own, key=lambda kv: -kv[1])[:top])


def _fmt(vals):
    if not vals:
        return "-"

    def f(v):
        return f"{v:.4f}" if abs(v) < 0.1 else f"{v:.2f}"

    if len(vals) == 1:
        return f(vals[0])
    return f"{f(statistics.median(vals))} ({f(min(vals))}-{f(max(vals))})"


def report(work, results, build, skipped, model_name="llama-1b"):
    import torch

    def logits(mode, run):
        p = os.path.join(work, f"logits-{mode}-{run}.pt")
        if mode == "cpp":  # float32, raw, in the building process's logits' shape
            raw = os.path.join(work, f"logits-cpp-{run}.bin")
            ref = logits("aoti-build", 1)
            if not os.path.exists(raw) or ref is None:
                return None
            with open(raw, "rb") as f:
                t = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
            return t.reshape(ref.shape) if t.numel() == ref.numel() else t
        return torch.load(p) if os.path.exists(p) else None

    ref = {"aoti": logits("aoti-build", 1), "aoti-torch": logits("aoti-build", 1),
           "cpp": logits("aoti-build", 1), "cold": logits("cold", 1), "cc": logits("cold", 1)}
    d = _model_dir(work, model_name)
    gb = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
             if f.endswith(".safetensors")) / 1e9 if os.path.isdir(d) else 0.0
    print(f"\n## engine_start_bench: {model_name} ({gb:.2f} GB of bf16 safetensors), 128 "
          f"tokens, weights mapped from weightcached; fresh processes, empty Inductor and "
          f"Triton caches; torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}\n")
    print("| mode | runs | imports s | cuda init s | map s | artifact get s | package load s | "
          "bind s | first forward s | total s | subprocesses | logits |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mode in ["cold", "cc", "aoti", "aoti-torch", "cpp"]:
        rs = [r for r in results if r["mode"] == mode and "error" not in r]
        bad = [r for r in results if r["mode"] == mode and "error" in r]
        if not rs and not bad:
            continue
        same = []
        for r in rs:
            mine, want = logits(mode, r["run"]), ref[mode]
            same.append(mine is not None and want is not None and torch.equal(mine, want))
        verdict = (f"{sum(same)}/{len(same)} bit-equal to "
                   f"{'cold run 1' if mode in ('cold', 'cc') else 'the building process'}")
        procs = [len(r.get("subprocesses", [])) for r in rs]
        cols = " | ".join(_fmt([r[p] for r in rs]) for p in PHASES)
        nprocs = (f"{int(statistics.median(procs))} ({min(procs)}-{max(procs)})"
                  if procs else "-")
        print(f"| {mode} | {len(rs)}{f' (+{len(bad)} failed)' if bad else ''} | {cols} | "
              f"{nprocs} | {verdict} |")
    print("\nmedian (min-max) over the runs. map: acquire (connect, map); for cold and cc also "
          "importing transformers and building the module around the mapped weights (aoti "
          "builds no module on a hit). cold/cc: artifact get is compile_cache's entry "
          "(GetArtifact + load_cache_artifacts) and the compile happens inside the first "
          "forward. aoti: get/load/bind as weightcache.aoti.load timed them. cpp: imports is "
          "the exec and dynamic loading (spawn to main), map is connect, acquire, map and the "
          "zero-copy tensors (client::ToTorch), get/load/bind as client::AotiModel timed them.")
    print("\nimports broken down (median (min-max)): interpreter start (exec to the script's "
          "first line), import torch, import weightcache; cuda init: the first CUDA tensor")
    print("\n| mode | interpreter s | import torch s | import weightcache s | cuda init s |")
    print("|---|---|---|---|---|")
    for mode in ["cold", "cc", "aoti", "aoti-torch"]:
        rs = [r for r in results if r["mode"] == mode and "interpreter_s" in r]
        if rs:
            print(f"| {mode} | " + " | ".join(_fmt([r[k] for r in rs]) for k in (
                "interpreter_s", "torch_import_s", "weightcache_import_s", "cuda_init_s")) + " |")
    timed = next((r for r in results if "importtime" in r), None)
    if timed is not None:
        print(f"\none more {timed['mode']} process under `python -X importtime` (not in the "
              f"table; importtime slows imports): top-level imports by cumulative seconds: "
              + ", ".join(f"{n} {s:.3f}" for n, s in timed["importtime"][0])
              + "; modules by their own seconds: "
              + ", ".join(f"{n} {s:.3f}" for n, s in timed["importtime"][1]))
    for mode in ("aoti", "aoti-torch"):
        r = next((r for r in results if r["mode"] == mode and "probes" in r), None)
        if r is not None:
            print(f"{mode}: probe decision from {r['probes']!r} (node: node-probes.json, self: "
                  f"decided in the process), TORCHINDUCTOR_VEC_ISA_OK={r['vec_isa_ok']!r}; "
                  f"aoti.load outside its timed steps {r.get('aoti_load_other_s', 0):.3f} s")
    if build is not None:
        shown = {k: v for k, v in build.items() if k != "subprocesses"}
        print(f"\naoti-build (not counted): {json.dumps(shown)}")
        if "inductor_isa" in build:
            same = sorted(build["inductor_isa"]) == sorted(build["node_isa"] or [])
            print(f"CPU ISA: node decision {build['node_isa']}, Inductor's x86_isa_checker "
                  f"{build['inductor_isa']}: {'equal' if same else 'DIFFERENT'}")
    eager = logits("cold", 1)
    aot = logits("aoti", 1)
    if eager is not None and aot is not None:
        print(f"aoti run 1 vs cold run 1: max abs diff {(aot - eager).abs().max().item():.3g}")
    print("\n### subprocesses each mode's first run started (seconds from its start, command)")
    for mode in ["cold", "cc", "aoti", "aoti-torch"]:
        r = next((r for r in results if r["mode"] == mode and "subprocesses" in r), None)
        if r is None:
            continue
        print(f"\n{mode} run {r['run']}: {len(r['subprocesses'])}")
        for t, ev, cmd in r["subprocesses"][:40]:
            print(f"  {t:8.2f}  {ev:16s} {cmd}")
    for r in results:
        if "error" in r:
            print(f"\nFAILED {r['mode']} run {r['run']}: {r['error']}")
    if skipped:
        print("\nskipped (budget): " + "; ".join(skipped))
    return results and all("error" not in r for r in results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--run", type=int, default=1)
    ap.add_argument("--work", required=True)
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--budget", type=float, default=480, help="seconds for all runs")
    ap.add_argument("--modes", default="cold,cc,aoti,aoti-torch")
    ap.add_argument("--cpp-engine", help="examples/cpp_engine's binary, for the cpp mode")
    ap.add_argument("--cold-runs", type=int, help="runs of cold (default --runs): the "
                    "slowest mode, often wanted fewer times than the others")
    a = ap.parse_args()
    if "cpp" in a.modes.split(",") and not (a.cpp_engine and os.access(a.cpp_engine, os.X_OK)):
        ap.error(f"--modes has cpp: --cpp-engine={a.cpp_engine!r} is not an executable")
    if a.child:
        child(a.child, a.run, a.work, a.model)
        return 0
    modes = a.modes.split(",")
    deadline = T0 + a.budget
    results, skipped, last = [], [], {}

    # A mode's first run is expected to take this long (issue 49's figures): not started
    # when less is left.
    first_guess = {"aoti-torch": 40.0, "cold": 45.0, "cc": 20.0}

    def go(mode, run):
        left = deadline - time.time()
        need = last.get(mode, first_guess.get(mode, 0.0))
        if need > left:
            skipped.append(f"{mode} run {run} (needs about {need:.0f} s, {left:.0f} s left)")
            return None
        r = run_child(mode, run, a.work, a.model, timeout=max(20.0, left),
                      cpp_engine=a.cpp_engine)
        last[mode] = r.get("wall_s", 0.0)
        results.append(r)
        return r

    # The artifacts first (cold run 1 puts compile_cache's; aoti-build puts the package),
    # then the runs in rounds, so that a budget cut leaves every mode some runs.
    if "cold" in modes or "cc" in modes:
        go("cold", 1)
    if "aoti" in modes or "aoti-torch" in modes or "cpp" in modes:
        build = run_child("aoti-build", 1, a.work, a.model,
                          timeout=max(20.0, deadline - time.time()))
    else:
        build = None
    # cold first in each round (its five runs matter most and cost most), aoti-torch once at
    # the end: what torch's own loader costs with the node's decision, when time is left.
    order = [m for m in ("cold", "aoti", "cpp", "cc") if m in modes]
    for run in range(1, a.runs + 1):
        for mode in order:
            if mode == "cold" and (run == 1 or run > (a.cold_runs or a.runs)):
                continue
            go(mode, run)
    if "aoti-torch" in modes:
        go("aoti-torch", 1)
    if "aoti" in modes and deadline - time.time() > 2 * last.get("aoti", 10.0):
        r = run_child("aoti", 99, a.work, a.model, timeout=deadline - time.time(),
                      importtime=True)
        r["mode"] = "aoti-importtime"  # kept out of the aoti rows
        results.append(r)

    ok = report(a.work, results, build, skipped, a.model)
    print(f"\nbench wall time {time.time() - T0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
