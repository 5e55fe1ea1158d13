"""Each typed exception, from a real daemon where one can produce it, and bad input."""

from __future__ import annotations

import ctypes
import socket as pysocket
import tempfile

import pytest
import torch

import weightcache
from weightcache._errors import error_from_status, parse_diff
from conftest import run_python


def test_a_corrupt_lease_is_corrupt_weights():
    e = error_from_status(15, "DATA_LOSS", "lease 1a2b of model m: the daemon found its memory "
                          "corrupt: m: segment 0 of 1 (4096 bytes on host): bytes [0, 4096) changed")
    assert isinstance(e, weightcache.CorruptWeights) and e.code == "DATA_LOSS"
    assert "segment 0" in e.message


def test_a_gone_daemon_connection_is_daemon_gone():
    e = error_from_status(14, "UNAVAILABLE", "lease 1a2b of model m: unknown: the daemon "
                          "connection is gone (the daemon ended or restarted), ...")
    assert isinstance(e, weightcache.DaemonGone) and e.code == "UNAVAILABLE"
    assert isinstance(e, weightcache.DaemonUnavailable)


def test_uncached_rank_is_a_cache_miss(daemon):
    # No test loads rank 1 of "other".
    with pytest.raises(weightcache.CacheMiss) as e:
        weightcache.acquire("other", tp_rank=1, tp_size=2, socket=daemon.socket)
    assert e.value.code == "NOT_FOUND"
    assert "other" in e.value.message and "1/2" in e.value.message


def test_unknown_model_is_a_cache_miss(daemon):
    with pytest.raises(weightcache.CacheMiss, match="no-such-model"):
        weightcache.acquire("no-such-model", socket=daemon.socket)


def test_other_dtype_is_a_mismatch_with_the_field_diff(daemon):
    with pytest.raises(weightcache.FingerprintMismatch) as e:
        weightcache.acquire("tiny", dtype=torch.float16, socket=daemon.socket)
    assert e.value.code == "FAILED_PRECONDITION"
    fields = {d.field: d for d in e.value.diff}
    assert "dtype" in fields, e.value.message
    assert "bf16" in fields["dtype"].cached and "fp16" in fields["dtype"].asked


def test_refused_quantization(daemon):
    with pytest.raises(weightcache.UnsupportedQuantization) as e:
        weightcache.acquire("awq", socket=daemon.socket)
    assert e.value.code == "UNIMPLEMENTED"
    assert "awq" in e.value.message and "fp8_block" in e.value.message


def test_files_changed_after_loading_are_stale_weights(daemon, checkpoints):
    weightcache.load("stale", socket=daemon.socket)
    with weightcache.acquire("stale", socket=daemon.socket) as w:
        assert w.model == "stale"
    # A new version of the file: other bytes, same size, a new inode.
    f = checkpoints["stale"] / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-2:] = bytes(b ^ 0xFF for b in data[-2:])
    tmp = f.with_suffix(".tmp")
    tmp.write_bytes(bytes(data))
    tmp.rename(f)
    with pytest.raises(weightcache.StaleWeights) as e:
        weightcache.acquire("stale", socket=daemon.socket)
    assert e.value.code == "FAILED_PRECONDITION"
    assert e.value.message.startswith("stale:") and "model.safetensors" in e.value.message


def test_stale_is_recognised_by_its_message_prefix():
    e = error_from_status(9, "FAILED_PRECONDITION",
                          "stale: model.safetensors changed on disk after loading")
    assert isinstance(e, weightcache.StaleWeights) and e.code == "FAILED_PRECONDITION"
    other = error_from_status(9, "FAILED_PRECONDITION", "model 'm' is loading")
    assert type(other) is weightcache.WeightcacheError


def test_diff_parsing_keeps_every_field():
    d = parse_diff("model 'm': cached weights do not fit: tp_size: cached 8, asked 4; "
                   "dtype: cached bf16, asked fp16")
    assert d == [weightcache.FieldDiff("tp_size", "8", "4"),
                 weightcache.FieldDiff("dtype", "bf16", "fp16")]


def test_no_socket_is_daemon_unavailable(tmp_path):
    with pytest.raises(weightcache.DaemonUnavailable, match="does not exist"):
        weightcache.acquire("tiny", socket=str(tmp_path / "control.sock"))


def test_dead_socket_is_daemon_unavailable():
    d = tempfile.mkdtemp(prefix="wcd", dir="/tmp")
    s = pysocket.socket(pysocket.AF_UNIX)
    s.bind(d + "/control.sock")  # bound, never listening: connections are refused
    try:
        with pytest.raises(weightcache.DaemonUnavailable, match="unreachable"):
            weightcache.acquire("tiny", socket=d, timeout=5)
    finally:
        s.close()


def test_every_error_is_a_weightcache_error():
    for cls in (weightcache.CacheMiss, weightcache.FingerprintMismatch,
                weightcache.UnsupportedQuantization, weightcache.StaleWeights,
                weightcache.DaemonUnavailable, weightcache.BindError):
        assert issubclass(cls, weightcache.WeightcacheError)


@pytest.mark.parametrize("kwargs,match", [
    ({"tp_rank": 2, "tp_size": 2}, "tp_rank=2"),
    ({"pp_rank": -1}, "pp_rank=-1"),
    ({"timeout": 0}, "timeout=0"),
    ({"mode": "sometimes"}, "mode='sometimes'"),
    ({"device": "tpu:0"}, "tpu"),
    ({"dtype": torch.int8}, "dtype=torch.int8"),
])
def test_bad_arguments_name_the_input(daemon, kwargs, match):
    with pytest.raises(weightcache.WeightcacheError, match=match):
        weightcache.acquire("tiny", socket=daemon.socket, **kwargs)


def test_missing_model_names_the_variable(monkeypatch):
    monkeypatch.delenv("WEIGHTCACHE_MODEL", raising=False)
    with pytest.raises(weightcache.WeightcacheError, match="WEIGHTCACHE_MODEL"):
        weightcache.acquire()


def test_model_from_the_environment(daemon, monkeypatch):
    monkeypatch.setenv("WEIGHTCACHE_MODEL", "tiny")
    monkeypatch.setenv("WEIGHTCACHE_SOCKET", daemon.socket)
    with weightcache.acquire() as w:
        assert w.model == "tiny"


def test_fingerprint_from_the_environment_wins_over_the_model(daemon, monkeypatch):
    monkeypatch.setenv("WEIGHTCACHE_SOCKET", daemon.socket)
    with weightcache.acquire("tiny") as w:
        fingerprint = w.fingerprint
    monkeypatch.delenv("WEIGHTCACHE_MODEL", raising=False)
    monkeypatch.setenv("WEIGHTCACHE_FINGERPRINT", fingerprint)
    with weightcache.acquire() as w:
        assert w.fingerprint == fingerprint and w.model == "tiny"
    # Pinned to other weights: a typed miss, never the model's current entry.
    monkeypatch.setenv("WEIGHTCACHE_MODEL", "tiny")
    monkeypatch.setenv("WEIGHTCACHE_FINGERPRINT", "0" * 64)
    with pytest.raises(weightcache.CacheMiss, match="0000000000"):
        weightcache.acquire()
    # An explicit model= is the caller's choice: the environment is not read.
    with weightcache.acquire("tiny") as w:
        assert w.fingerprint == fingerprint


def test_c_abi_reads_the_environment_when_given_no_target(daemon, monkeypatch):
    from weightcache import _lib

    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        fingerprint = w.fingerprint
    o = _lib.AcquireOptions()
    _lib.lib().wc_acquire_options_init(ctypes.byref(o))  # model and fingerprint NULL
    monkeypatch.delenv("WEIGHTCACHE_MODEL", raising=False)
    monkeypatch.delenv("WEIGHTCACHE_FINGERPRINT", raising=False)
    with _lib.Client(daemon.socket) as c:
        with pytest.raises(weightcache.WeightcacheError, match="WEIGHTCACHE_FINGERPRINT"):
            _lib.acquire_lease(c, o)
        monkeypatch.setenv("WEIGHTCACHE_MODEL", "tiny")
        lease = _lib.acquire_lease(c, o)
        info = _lib.LeaseInfo()
        _lib.lib().wc_lease_info_get(lease.handle, ctypes.byref(info))
        assert info.fingerprint.decode() == fingerprint
        lease.close()
        monkeypatch.setenv("WEIGHTCACHE_FINGERPRINT", "0" * 64)
        with pytest.raises(weightcache.CacheMiss):
            _lib.acquire_lease(c, o)


def test_bad_library_path_names_the_variable(tmp_path):
    r = run_python("import weightcache; weightcache.status()",
                   {"WEIGHTCACHE_LIB": str(tmp_path / "nope.so")})
    assert r.returncode != 0
    assert "WEIGHTCACHE_LIB=" in r.stderr and "nope.so" in r.stderr


def test_devices_are_named_as_the_daemon_names_them():
    from weightcache._torch import device_uuid

    assert device_uuid(None) == "" and device_uuid("cpu") == ""
    assert device_uuid(torch.device("cpu")) == ""
    uuid = "GPU-0123abcd-0000-1111-2222-333344445555"
    assert device_uuid(uuid) == uuid


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_a_cuda_device_without_a_gpu_names_it():
    with pytest.raises(weightcache.WeightcacheError, match=r"cuda:0: this process sees 0"):
        weightcache.acquire("tiny", device="cuda:0", socket="/nonexistent")
