#!/usr/bin/python3
"""The docs name only flags that exist (ctest docs_flags).

Every `--flag` the docs (docs/*.md, README.md) cite on its own, in a backtick span that
starts with it (`--model_roots`, `--memory_budget=80%`) or in a command line that starts with
`weightcached`, must be listed by `weightcached --help` -- or, for the other programs the
docs cite flags of on their own, by theirs (weightcachectl, weightcache-keeper,
weightcache-webhook), or be one of the few flags of programs with no --help here (KNOWN_ELSEWHERE,
each with where it comes from). A span or line that starts with another program
(`load_bench --reps=5`, `helm upgrade --install`) is that program's business.

Usage: docs_flags_test.py REPO WEIGHTCACHED [OTHER_BINARY...]
"""
import re
import subprocess
import sys
from pathlib import Path

# Flags cited alone in the docs that belong to programs without a --help to ask here.
KNOWN_ELSEWHERE = {
    # bench/ and scripts/ programs (flags parsed by hand; benchmark tables cite them alone)
    "--reps": "bench programs", "--sizes_gib": "bench programs", "--max_gib": "gpu_acquire_bench",
    "--chunk": "peer_pull_bench", "--inflight": "peer_pull_bench", "--bytes": "peer_pull_bench",
    "--nic_gbps": "fleet_fill_sim", "--storage_gbps": "fleet_fill_sim",
    "--warm_nodes": "fleet_fill_sim", "--segments": "fleet_fill_sim",
    "--configs": "load_bench", "--torch_script": "load_bench", "--tp": "load_bench",
    "--role": "ucx_transfer_bench", "--err_mode": "ucx_transfer_bench",
    "--method": "ucx_transfer_bench", "--merge": "scripts/fuzz.sh",
    "--prebuilt": "scripts/build-image.sh", "--no-cuda": "scripts/build-image.sh",
    # other projects' tools
    "--max-mutating-requests-inflight": "kube-apiserver", "--cgroup-root": "kubelet",
    "--strict": "helm lint", "--dry-run": "helm", "--use_fast_math": "nvcc",
    "--network": "docker/podman run", "--pull": "docker/podman run",
    "--ulimit": "docker/podman run", "--build-arg": "docker build", "--runtime": "podman run",
    "--cgroup-manager": "podman", "--events-backend": "podman", "--storage-driver": "podman",
    "--load-format": "vLLM", "--with-verbs": "UCX configure", "--enable-check-profile": "UCX",
    "--exclude-libs": "ld", "--no-as-needed": "ld", "--mount-proc": "unshare",
    "--version": "every program", "--help": "every program",
}

FLAG = re.compile(r"--[a-z][a-z0-9_]*(?:-[a-z0-9_]+)*\*?")
SPAN = re.compile(r"`([^`\n]+)`")


def help_flags(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"^  (--[a-z0-9_]+)", out, re.M))


def cited(text):
    """(line number, flag) for each flag cited alone or on a weightcached command line."""
    in_code = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            words = line.split()
            if words and Path(words[0]).name == "weightcached":
                for f in FLAG.findall(line):
                    yield n, f
            continue
        for span in SPAN.findall(line):
            words = span.split()
            if words[0].startswith("--") or Path(words[0]).name == "weightcached":
                for f in FLAG.findall(span):
                    yield n, f


def main():
    repo = Path(sys.argv[1])
    daemon = help_flags(sys.argv[2])
    others = set()
    for b in sys.argv[3:]:
        others |= help_flags(b)
    assert "--model_roots" in daemon and "--acquire_wait" not in daemon, sorted(daemon)
    bad, used = [], set()
    for doc in sorted(repo.glob("docs/*.md")) + [repo / "README.md"]:
        for n, flag in cited(doc.read_text()):
            if flag.endswith("*"):  # `--peer_tls_*`: some flag has that prefix
                if not any(d.startswith(flag[:-1]) for d in daemon | others):
                    bad.append(f"{doc.relative_to(repo)}:{n}: {flag}")
                continue
            name = flag.split("=")[0]
            if name not in daemon and name not in others:
                if name in KNOWN_ELSEWHERE:
                    used.add(name)
                else:
                    bad.append(f"{doc.relative_to(repo)}:{n}: {name}")
    for f, w in sorted(KNOWN_ELSEWHERE.items()):
        if f not in used:
            print(f"note: KNOWN_ELSEWHERE {f} ({w}) is cited by no doc any more: remove it")
    if bad:
        print("flags the docs cite that no program here has (weightcached --help lists "
              "its own):\n  " + "\n  ".join(bad))
        return 1
    print(f"docs flags: every cited flag exists ({len(daemon)} weightcached flags)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
