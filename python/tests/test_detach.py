"""Sleep and wake (docs/engines.md): ``Weights.detach()`` lets go of the memory and the lease,
keeping every tensor's address reserved; ``Weights.reattach()`` maps the same fingerprint at
the same addresses. Through the C ABI's wc_lease_detach / wc_lease_reattach, against a real
daemon on the host backend. Never touch a tensor while detached: reading it faults."""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import pytest

import weightcache
from conftest import CONFIG, Daemon, tensor_sha, write_checkpoint
from weightcache import _lib


def maps_line(address: int) -> str:
    """The /proc/self/maps line of the mapping holding ``address`` ("" when none does)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= address < hi:
            return line
    return ""


def entries(d: Daemon, model: str) -> list:
    return [e for e in weightcache.status(socket=d.socket).get("entries", [])
            if e["model"] == model]


@pytest.fixture()
def sleepy(tmp_path, checkpoints):
    """A daemon of its own (tests here evict and rewrite): model ``m``, a copy of tiny."""
    shutil.copytree(checkpoints["tiny"], tmp_path / "m")
    d = Daemon(tmp_path, [{"name": "m", "model_dir": str(tmp_path / "m")}], ["--preload=false"])
    d.wait_ready([])
    yield d, tmp_path / "m"
    d.stop()


def test_detach_and_reattach_keep_every_address_and_byte(sleepy):
    d, _ = sleepy
    w = weightcache.acquire("m", socket=d.socket, load_on_miss=True)
    ptrs = {n: t.data_ptr() for n, t in w.items()}
    shas = {n: tensor_sha(t) for n, t in w.items()}
    fp, first_id = w.fingerprint, w.lease_id
    base = w.segments[0][0]
    assert "r--s" in maps_line(base)
    assert d.leases("m") == 1

    w.detach()
    assert w.detached
    w.detach()  # twice: a no-op
    assert d.leases("m") == 0  # released by the time detach returns
    assert " ---p " in maps_line(base), maps_line(base)  # reserved, inaccessible
    assert w.state() == "unknown"  # a detached lease never re-attaches on its own
    assert weightcache.evict("m", socket=d.admin_socket) == 1
    assert entries(d, "m") == []  # gone at once: nobody holds it

    w.reattach()  # loaded again from the disk: same fingerprint, same addresses
    assert not w.detached
    assert w.fingerprint == fp and w.lease_id != first_id
    assert {n: t.data_ptr() for n, t in w.items()} == ptrs
    assert {n: tensor_sha(t) for n, t in w.items()} == shas
    assert "r--s" in maps_line(base)
    assert d.leases("m") == 1
    assert w.state() == "clean"
    with pytest.raises(weightcache.WeightcacheError, match="is attached"):
        w.reattach()


def test_reattach_refuses_a_changed_fingerprint_naming_both(sleepy):
    d, mdir = sleepy
    w = weightcache.acquire("m", socket=d.socket, load_on_miss=True)
    old = w.fingerprint
    base = w.segments[0][0]
    w.detach()
    write_checkpoint(mdir, CONFIG, seed=99)  # the model name now means other weights

    with pytest.raises(weightcache.FingerprintMismatch) as e:
        w.reattach()
    new = entries(d, "m")[0]["fingerprint"]
    assert new != old
    assert old in e.value.message and new in e.value.message
    assert e.value.diff == [weightcache.FieldDiff("fingerprint", new, old)]
    assert w.detached and " ---p " in maps_line(base)
    assert d.leases("m") == 0  # the new weights' lease it took was given back

    assert weightcache.evict("m", socket=d.admin_socket) == 1
    with pytest.raises(weightcache.CacheMiss, match="by fingerprint: .*by model name: "):
        w.reattach(load_on_miss=False)
    assert w.detached


def test_detach_needs_an_open_lease_and_the_c_abi_checks_its_arguments(sleepy):
    d, _ = sleepy
    w = weightcache.acquire("m", socket=d.socket, load_on_miss=True)
    with pytest.raises(weightcache.WeightcacheError, match="timeout"):
        w.reattach(timeout=0)
    w.close()
    with pytest.raises(weightcache.WeightcacheError, match="closed"):
        w.detach()
    L, err = _lib.lib(), ctypes.c_void_p()
    assert L.wc_lease_detach(None, ctypes.byref(err)) == 3  # INVALID_ARGUMENT
    assert "lease is NULL" in _lib.take_string(err)
    assert L.wc_lease_reattach(None, 1, 1000, ctypes.byref(err)) == 3
    assert "lease is NULL" in _lib.take_string(err)
    assert L.wc_lease_detached(None) == 0


def test_a_forked_child_cannot_detach_its_parents_weights(sleepy):
    d, _ = sleepy
    w = weightcache.acquire("m", socket=d.socket, load_on_miss=True)
    pid = os.fork()
    if pid == 0:  # the child: refused before any library call (it would end the parent's lease)
        try:
            w.detach()
        except weightcache.WeightcacheError as e:
            os._exit(0 if "forked child" in e.message else 2)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert not w.detached and d.leases("m") == 1
