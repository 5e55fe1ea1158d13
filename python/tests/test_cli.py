"""python -m weightcache: status, load, verify, evict, and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import weightcache


def cli(*args: str, env: dict = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "weightcache", *args], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, **(env or {})))


def test_status_table_and_json(daemon):
    r = cli("--socket", daemon.socket, "status")
    assert r.returncode == 0, r.stderr
    assert "known models:" in r.stdout and "tiny" in r.stdout
    acquire = next(line for line in r.stdout.splitlines() if line.startswith("acquire: "))
    assert [part.split(" ", 1)[1] for part in acquire[len("acquire: "):].split(", ")] == [
        "hit", "peer copy", "miss", "mismatch", "stale", "rejected", "denied", "error"]
    assert any(line.split()[:3] == ["tiny", "0/1", "ready"] for line in r.stdout.splitlines())
    j = cli("--socket", daemon.socket, "status", "--json")
    st = json.loads(j.stdout)
    assert {"tiny", "tiny2", "awq", "other"} <= set(st["known_models"])
    tiny = next(e for e in weightcache.status(socket=daemon.socket)["entries"]
                if e["model"] == "tiny")
    assert isinstance(tiny["bytes"], int) and tiny["bytes"] > 8 << 20


def test_load_verify_evict(daemon):
    # "other" is a checkpoint of its own: evicting it leaves the other tests' entries alone.
    r = cli("--socket", daemon.socket, "load", "other")  # tp_size 2: loads rank 0
    assert r.returncode == 0, r.stderr
    v = cli("--socket", daemon.socket, "verify", "other", "--tp-size", "2")
    assert v.returncode == 0, v.stdout + v.stderr
    assert "every tensor equals the checkpoint" in v.stdout
    e = cli("--socket", daemon.admin_socket, "evict", "other")  # the operator's socket
    assert e.returncode == 0 and e.stdout.startswith("evicted "), e.stderr
    assert int(e.stdout.split()[1]) >= 1


def test_verify_reports_a_differing_tensor(daemon, checkpoints, tmp_path):
    # The same checkpoint with one tensor's bytes changed, as a second directory to compare.
    import shutil

    other = tmp_path / "changed"
    shutil.copytree(checkpoints["tiny"], other)
    f = other / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF  # the last byte belongs to the last tensor in file order
    f.write_bytes(bytes(data))
    r = cli("--socket", daemon.socket, "verify", "tiny", "--model-dir", str(other))
    assert r.returncode == 1
    assert "MISMATCH model.norm.weight" in r.stdout or "MISMATCH" in r.stdout, r.stdout


def test_no_daemon_is_a_clear_error(tmp_path):
    r = cli("--socket", str(tmp_path), "status")
    assert r.returncode == 1
    assert "DaemonUnavailable" in r.stderr and str(tmp_path) in r.stderr
