"""A daemon restart (a rollout) is not an engine failure (issue 60): under an engine that loops
over ``check()``, the daemon is restarted beside the keeper. Nothing is raised, the lease is
re-attached to the memory the keeper kept (the new daemon lists it), and a corruption the new
daemon finds reaches the engine as ``CorruptWeights``.

The daemon is tests/integration/wc_scrub_hook_daemon: the daemon library with one test hook,
which makes the scrubber's digest of segment 0 differ once a trigger file exists (the host
backend's sealed memfds cannot be written; pkg/server/integrity/integrity_daemon_test.cc does
the same in process)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

import weightcache
from conftest import BUILD, wait_until

KEEPER = BUILD / "cmd/weightcache-keeper/weightcache-keeper"
HOOKED_DAEMON = BUILD / "tests/integration/wc_scrub_hook_daemon"


def test_a_daemon_restart_beside_the_keeper_is_not_an_engine_failure(checkpoints):
    root = Path(tempfile.mkdtemp(prefix="wcr", dir="/tmp"))
    sock, keeper_sock, trigger = root / "s", root / "k" / "keeper.sock", root / "corrupt-now"
    log = open(root / "log", "ab")
    argv = [str(HOOKED_DAEMON), str(sock), str(keeper_sock), "tiny", str(checkpoints["tiny"]),
            str(trigger)]
    procs = [subprocess.Popen([str(KEEPER), f"--socket={keeper_sock}"], stdout=log,
                              stderr=subprocess.STDOUT)]

    def start():  # stops, shutting down as on SIGTERM, when its stdin closes
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
    stop, raised, polls = threading.Event(), [], [0]
    engine = None

    def status():
        try:
            return weightcache.status(socket=str(sock))
        except weightcache.DaemonUnavailable:
            return {}

    def entry():
        return next((e for e in status().get("entries", []) if e["model"] == "tiny"), None)

    def my_leases():
        e = entry()
        return [lease for lease in (e or {}).get("leases", []) if lease["pid"] == os.getpid()]

    def kept(st):  # ready, and the keeper holds it (deposits follow readiness)
        e = next((e for e in st.get("entries", []) if e["model"] == "tiny"), None)
        k = st.get("keeper", {})
        return e is not None and e["state"] == "ready" and k.get("up") and \
            int(k.get("pending_entries", 1)) == 0 and int(k.get("descriptors", 0)) > 0

    try:
        procs.append(start())
        wait_until(lambda: kept(status()), timeout=60, what="tiny ready and kept")
        w = weightcache.acquire("tiny", socket=str(sock))
        norm = w["model.norm.weight"]
        expected = norm.clone()
        assert w.state() == "clean"
        first = my_leases()
        assert len(first) == 1

        def loop():  # the documented engine: check() between steps, except CorruptWeights
            while not stop.is_set():
                try:
                    w.check(timeout=0.005)
                except Exception as e:  # noqa: BLE001 -- any exception is the finding
                    raised.append(e)
                    return
                polls[0] += 1

        engine = threading.Thread(target=loop)
        engine.start()

        procs[1].stdin.close()  # the rollout: the daemon shuts down, a new one starts beside
        assert procs[1].wait(timeout=30) == 0  # the same keeper
        wait_until(lambda: w.state() == "unknown", what="the lease to see its daemon go")
        procs[1] = start()
        # Re-attaching is tried at most once a second, once the daemon has adopted the entry.
        wait_until(lambda: w.state() == "clean", timeout=60, what="the lease re-attached")
        assert raised == [], raised
        assert entry()["source"] == "keeper" and int(status()["keeper"]["adopted_entries"]) == 1
        again = my_leases()
        assert len(again) == 1 and again[0]["lease_id"] != first[0]["lease_id"]
        assert torch.equal(norm, expected)
        polls_before = polls[0]
        wait_until(lambda: polls[0] > polls_before, what="the engine to go on checking")

        trigger.touch()  # the new daemon's next scrub finds segment 0 changed
        wait_until(lambda: raised, timeout=60, what="the corruption to reach the engine")
        assert isinstance(raised[0], weightcache.CorruptWeights), raised
        assert "changed" in raised[0].message
        assert w.state() == "corrupt"
        w.close()
    finally:
        stop.set()
        if engine is not None:
            engine.join(timeout=30)
        for p in reversed(procs):
            if p.stdin:
                p.stdin.close()
            else:
                p.terminate()
            p.wait(timeout=30)
        log.close()
        shutil.rmtree(root, ignore_errors=True)
