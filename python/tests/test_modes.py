"""Modes: off never connects, client falls back when told to, spawn starts a daemon."""

from __future__ import annotations

import os
import signal
import socket as pysocket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import weightcache
from conftest import WEIGHTCACHED, run_python, tensor_sha, wait_until


def test_off_never_connects_nor_loads_the_library():
    d = tempfile.mkdtemp(prefix="wco", dir="/tmp")
    listener = pysocket.socket(pysocket.AF_UNIX)
    listener.bind(d + "/control.sock")
    listener.listen(8)
    listener.settimeout(0.5)
    try:
        r = run_python("""
import sys, weightcache, weightcache._lib as L
print(weightcache.acquire('tiny', fallback=lambda: 'from-disk'))
try:
    weightcache.acquire('tiny')
except weightcache.WeightcacheError as e:
    print(type(e).__name__, e.code)
print('library loaded:', L._lib is not None)
""", {"WEIGHTCACHE_MODE": "off", "WEIGHTCACHE_SOCKET": d})
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\n")[:3] == ["from-disk", "WeightcacheError DISABLED",
                                            "library loaded: False"]
        with pytest.raises(pysocket.timeout):
            listener.accept()  # nobody came
    finally:
        listener.close()


def test_client_mode_falls_back_on_a_miss(daemon, caplog):
    got = weightcache.acquire("no-such-model", socket=daemon.socket, fallback=lambda: "disk")
    assert got == "disk"
    assert "CacheMiss" in caplog.text


def test_client_mode_falls_back_without_a_daemon(tmp_path):
    assert weightcache.acquire("m", socket=str(tmp_path), fallback=lambda: 7) == 7


def test_unknown_mode_in_the_environment_names_it(monkeypatch):
    monkeypatch.setenv("WEIGHTCACHE_MODE", "always")
    with pytest.raises(weightcache.WeightcacheError, match="WEIGHTCACHE_MODE='always'"):
        weightcache.acquire("m")


def test_spawn_mode_from_nothing(checkpoints, tiny_tensors, tmp_path):
    spawn = tempfile.mkdtemp(prefix="wcsp", dir="/tmp")
    env = {"WEIGHTCACHE_SPAWN_DIR": spawn, "WEIGHTCACHED": str(WEIGHTCACHED),
           "WEIGHTCACHE_MODE": "spawn", "WEIGHTCACHE_SOCKET": ""}
    code = f"""
import hashlib, os, weightcache
from weightcache import _spawn
w = weightcache.acquire({str(checkpoints['tiny'])!r})
t = w['model.layers.1.mlp.down_proj.weight']
print(w.model, w.backend, hashlib.sha256(t.contiguous().view(-1).view(__import__('torch').uint8).numpy().tobytes()).hexdigest())
print(open(os.path.join({spawn!r}, 'weightcached.pid')).read().strip())
"""
    try:
        first = run_python(code, env)
        assert first.returncode == 0, first.stderr
        line, pid = first.stdout.split("\n")[:2]
        assert line.split() == ["tiny", "host",
                                tensor_sha(tiny_tensors["model.layers.1.mlp.down_proj.weight"])]
        os.kill(int(pid), 0)  # the spawned daemon outlives the process that started it
        second = run_python(code, env)  # finds it again: no second daemon
        assert second.returncode == 0, second.stderr
        assert second.stdout.split("\n")[:2] == [line, pid]
        st = run_python("import json, weightcache; from weightcache import _spawn; "
                        "print(json.dumps(weightcache.status(socket=str(_spawn.socket_dir()))))",
                        env)
        assert '"ready"' in st.stdout, st.stderr
        stop = subprocess.run([sys.executable, "-m", "weightcache", "stop"], capture_output=True,
                              text=True, env=dict(os.environ, **env), timeout=60)
        assert stop.returncode == 0 and f"pid {pid}" in stop.stdout, stop.stderr

        def gone() -> bool:
            try:
                os.kill(int(pid), 0)
                return False
            except ProcessLookupError:
                return True

        wait_until(gone, what="the spawned daemon to exit")
    finally:
        pid_file = Path(spawn) / "weightcached.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def test_spawn_mode_without_a_binary_says_where_it_looked(tmp_path):
    r = run_python("import weightcache; weightcache.acquire('/nonexistent', mode='spawn')",
                   {"WEIGHTCACHE_SPAWN_DIR": str(tmp_path / "s"), "WEIGHTCACHED": "/nope",
                    "WEIGHTCACHE_SOCKET": "", "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0
    assert "WEIGHTCACHED=/nope" in r.stderr and "DaemonUnavailable" in r.stderr


def test_spawn_mode_refuses_a_directory_that_is_not_its_own(tmp_path):
    # Attack (issue 25): /tmp/weightcache-<uid> is guessable; another user pre-creates it with
    # a live control.sock or a pid file of its choosing. The spawner refuses, naming why.
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    cases = [(shared, "has mode 0755; it must be 0700"), (link, "is not a directory")]
    if os.getuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        cases.append((theirs, "is owned by uid 65534"))
    for d, why in cases:
        r = run_python("import weightcache; weightcache.acquire('/nonexistent', mode='spawn')",
                       {"WEIGHTCACHE_SPAWN_DIR": str(d), "WEIGHTCACHED": str(WEIGHTCACHED),
                        "WEIGHTCACHE_SOCKET": ""})
        assert r.returncode != 0, d
        assert "DaemonUnavailable" in r.stderr and why in r.stderr, r.stderr
        assert not (d / "weightcached.pid").exists()
