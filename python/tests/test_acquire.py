"""acquire() against a real daemon: bytes, zero copy, read-only memory, lease lifetime."""

from __future__ import annotations

import gc
import os
import signal

import pytest
import torch

import weightcache
from conftest import Daemon, run_python, tensor_sha, wait_until


def test_every_tensor_equals_the_checkpoint(daemon, tiny_tensors):
    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        assert sorted(w) == sorted(tiny_tensors)
        for name, want in tiny_tensors.items():
            got = w[name]
            assert got.dtype == want.dtype, name
            assert tuple(got.shape) == tuple(want.shape), name
            assert got.device.type == "cpu"
            assert tensor_sha(got) == tensor_sha(want), name
        assert w.backend == "host" and w.model == "tiny" and len(w.fingerprint) == 64
        assert (w.tp_rank, w.tp_size) == (0, 1)
        assert w.spec["model_dir"] == w.model_dir and w.spec["name"] == "tiny"
        assert w.map_seconds > 0


def _maps():
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi, parts[1], parts[5] if len(parts) > 5 else ""))
    return out


def test_tensors_are_zero_copy_views_of_the_read_only_segments(daemon):
    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        segs = w.segments
        assert segs and all(size > 0 for _, size in segs)
        maps = _maps()
        for name, t in w.items():
            p = t.data_ptr()
            end = p + t.numel() * t.element_size()
            assert any(b <= p and end <= b + s for b, s in segs), name
            # The mapping holding it is the daemon's memfd, shared and read-only.
            m = [x for x in maps if x[0] <= p < x[1]]
            assert len(m) == 1, name
            assert m[0][2].startswith("r--s"), (name, m[0])
            assert "memfd:" in m[0][3], (name, m[0])


def test_a_second_process_adds_no_anonymous_memory(daemon, tiny_tensors):
    total = sum(t.numel() * t.element_size() for t in tiny_tensors.values())
    code = f"""
import torch, weightcache
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key): return int(line.split()[1]) * 1024
torch.zeros(1).sum()
a0, s0 = status('RssAnon:'), status('RssShmem:')
w = weightcache.acquire('tiny', socket={daemon.socket!r})
for t in w.values():  # read one element of every page
    u = t.reshape(-1)
    float(u[:: max(1, 4096 // t.element_size())].float().sum())
print(status('RssAnon:') - a0, status('RssShmem:') - s0)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    anon_growth, shmem_growth = (int(x) for x in r.stdout.split())
    assert shmem_growth > total * 0.9, (shmem_growth, total)  # the weights: shared memory
    # No private copy of them: one would add every page just read (more than 90% of the
    # weights), while the client's own memory (its gRPC threads, the manifest) is a few
    # hundred KiB to about 1 MiB whatever the model; half the weights tells them apart.
    assert anon_growth < total * 0.5, (anon_growth, total)


def test_writing_through_a_tensor_faults_and_the_cache_stays_intact(daemon, tiny_tensors):
    name = "model.layers.0.mlp.up_proj.weight"
    r = run_python(f"""
import weightcache
w = weightcache.acquire('tiny', socket={daemon.socket!r})
print('mapped', flush=True)
w[{name!r}].add_(1)
print('wrote')
""")
    assert r.stdout.strip() == "mapped", (r.stdout, r.stderr)
    assert r.returncode == -signal.SIGSEGV
    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        assert tensor_sha(w[name]) == tensor_sha(tiny_tensors[name])


def test_tensors_outlive_weights_and_the_last_one_ends_the_lease(daemon, tiny_tensors):
    me = os.getpid()
    name = "model.embed_tokens.weight"
    w = weightcache.acquire("tiny", socket=daemon.socket)
    t = w[name]
    row = t[3]  # a view: holds the storage too
    assert daemon.leases("tiny", me) == 1
    w.close()
    del w
    gc.collect()
    assert daemon.leases("tiny", me) == 1
    assert tensor_sha(t) == tensor_sha(tiny_tensors[name])
    del t
    gc.collect()
    assert daemon.leases("tiny", me) == 1
    assert torch.equal(row, tiny_tensors[name][3])
    del row
    wait_until(lambda: daemon.leases("tiny", me) == 0, what="the lease to end")


def test_closed_weights_refuse_access(daemon):
    w = weightcache.acquire("tiny", socket=daemon.socket)
    w.close()
    assert w.closed
    with pytest.raises(weightcache.WeightcacheError, match="closed"):
        w["model.norm.weight"]


def test_check_is_quiet_while_the_daemon_reports_nothing(daemon):
    # Issue 27: check() polls the lease's connection for the daemon's "corrupt" event (the
    # event itself is tested in C++: pkg/server/integrity/integrity_daemon_test.cc,
    # pkg/server/integrity_service_test.cc, tests/gpu/stack_gpu_test.cc).
    w = weightcache.acquire("tiny", socket=daemon.socket)
    assert w.check() is None
    assert w.check(timeout=0.05) is None
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        w.check(timeout=-1)
    w.close()
    with pytest.raises(weightcache.WeightcacheError, match="closed"):
        w.check()


def test_after_the_daemon_went_check_raises_nothing_and_state_is_unknown(tmp_path, checkpoints):
    # Issue 48 made check() raise DaemonGone once the lease's daemon connection closed (never
    # "clean" for weights nobody watches); issue 60: so every daemon rollout crashed engines
    # written against the documented `except CorruptWeights`. check() raises only for
    # corruption; state() says "unknown", on every later call; the tensors stay readable.
    d = Daemon(tmp_path, [{"name": "tiny", "model_dir": str(checkpoints["tiny"])}])
    try:
        d.wait_ready(["tiny"])
        w = weightcache.acquire("tiny", socket=d.socket)
        assert w.check() is None
        assert w.state() == "clean"
    finally:
        d.stop()
    assert w.check(timeout=10) is None  # reads the close: news, so it returns at once
    for _ in range(2):
        assert w.state() == "unknown"
        assert w.check() is None
    with pytest.raises(ValueError, match="state: timeout must be >= 0"):
        w.state(timeout=-1)
    assert w["model.norm.weight"].numel() > 0
    w.close()
    with pytest.raises(weightcache.WeightcacheError, match="closed"):
        w.state()


def test_unknown_tensor_is_a_key_error_naming_it(daemon):
    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        with pytest.raises(KeyError, match="no.such"):
            w["no.such"]


def test_tp2_ranks_hold_the_disk_slices(daemon, tiny_tensors, checkpoints):
    for rank in (0, 1):
        with weightcache.acquire("tiny2", tp_rank=rank, tp_size=2, load_on_miss=True,
                                 socket=daemon.socket) as w:
            assert (w.tp_rank, w.tp_size) == (rank, 2)
            q = w["model.layers.0.self_attn.q_proj.weight"]
            assert q.shape[0] == tiny_tensors["model.layers.0.self_attn.q_proj.weight"].shape[0] // 2
            report = weightcache.verify(w, str(checkpoints["tiny"]), tp_rank=rank, tp_size=2)
            assert report.failures == []
            assert report.checked == len(tiny_tensors)


def test_the_kept_connection_is_reused_and_survives_a_daemon_restart(tmp_path, checkpoints,
                                                                     tiny_tensors):
    from conftest import Daemon

    from weightcache import _lib

    d = Daemon(tmp_path, [{"name": "tiny", "model_dir": str(checkpoints["tiny"])}])
    norm = tensor_sha(tiny_tensors["model.norm.weight"])
    try:
        d.wait_ready(["tiny"])
        with weightcache.acquire("tiny", socket=d.socket) as w:
            kept = _lib.shared_client(d.socket)
            assert tensor_sha(w["model.norm.weight"]) == norm
        with weightcache.acquire("tiny", socket=d.socket):
            assert _lib.shared_client(d.socket) is kept  # one connection per process
        d.restart()
        d.wait_ready(["tiny"])
        with weightcache.acquire("tiny", socket=d.socket) as w:
            assert tensor_sha(w["model.norm.weight"]) == norm
    finally:
        d.stop()
