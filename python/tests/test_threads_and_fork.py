"""The Python layer under threads and fork (issue 26): a kept connection dropped while other
threads call through it, handles closed from many threads at once, and a forked child (vLLM
forks its workers) that must not free or release what its parent holds."""

from __future__ import annotations

import gc
import os
import threading
import time

import weightcache
from conftest import run_python, tensor_sha, wait_until
from weightcache import _lib


def test_dropping_the_kept_connection_leaves_calls_on_other_threads_working(daemon):
    # Dropping used to close the connection at once: a thread still calling through it got
    # "client is closed" (or, inside a call, a freed handle).
    c = _lib.shared_client(daemon.socket)
    errors = []
    started = threading.Event()

    def caller() -> None:
        try:
            for i in range(100):
                c.status_json()
                if i == 5:
                    started.set()
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
        finally:
            started.set()

    t = threading.Thread(target=caller)
    t.start()
    assert started.wait(30)
    _lib.drop_shared_client(c)
    t.join(60)
    assert not t.is_alive()
    assert errors == []
    assert _lib.shared_client(daemon.socket) is not c  # forgotten: the next call makes another


def test_a_handle_closed_by_many_threads_at_once_is_freed_once(daemon):
    # close() read the handle and cleared it in two steps: two threads could both free it.
    # A double free aborts the interpreter, so this runs in its own.
    code = f"""
import sys, threading
sys.setswitchinterval(1e-6)  # switch threads as often as possible
from weightcache import _lib
for round in range(20):
    clients = [_lib.Client({daemon.socket!r}) for _ in range(30)]
    def close_all():
        for c in clients:
            c.close()
    threads = [threading.Thread(target=close_all) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
print("OK")
"""
    r = run_python(code, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stderr[-2000:]


def test_a_forked_child_leaves_its_parents_lease_and_connection_alone(daemon, tiny_tensors):
    name = "model.norm.weight"
    me = os.getpid()
    w = weightcache.acquire("tiny", socket=daemon.socket)
    t = w[name]
    assert daemon.leases("tiny", me) == 1
    pid = os.fork()
    if pid == 0:  # the child: drops everything it inherited, as a worker that exits does
        code = 0
        try:
            del t
            w.close()
            gc.collect()
            _lib._shared_clients.clear()
            gc.collect()
        except BaseException:  # noqa: BLE001 (the exit code says it)
            code = 1
        os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung finalising its inherited handles")
        time.sleep(0.01)  # polling a condition with a deadline
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    # The parent's lease is still the daemon's (the child released nothing) and its memory
    # still reads the checkpoint's bytes; the parent's connection still works.
    assert daemon.leases("tiny", me) == 1
    assert tensor_sha(t) == tensor_sha(tiny_tensors[name])
    del t
    w.close()
    gc.collect()
    wait_until(lambda: daemon.leases("tiny", me) == 0, what="the lease to end")
