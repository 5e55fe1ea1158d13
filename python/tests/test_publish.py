"""publish() and acquire_or_publish() against a real daemon (host backend)."""

from __future__ import annotations

import pytest
import torch

import weightcache
from conftest import tensor_sha


def _processed(tiny_tensors, scale: float):
    # What an engine would make of the checkpoint: transformed, another dtype for one.
    out = {name: (t.float() * scale).to(t.dtype) for name, t in tiny_tensors.items()}
    out["extra.scale_inv"] = torch.arange(16, dtype=torch.float32)
    return out


def test_publish_then_acquire_maps_the_published_bytes(daemon, tiny_tensors):
    processed = _processed(tiny_tensors, 2.0)
    fp = weightcache.publish("tiny", processed, engine="pytest", recipe="double-v1",
                             socket=daemon.socket)
    assert len(fp) == 64
    with weightcache.acquire("tiny", engine="pytest", recipe="double-v1",
                             socket=daemon.socket) as w:
        assert w.fingerprint == fp
        assert sorted(w) == sorted(processed)
        for name, want in processed.items():
            assert w[name].dtype == want.dtype, name
            assert tensor_sha(w[name]) == tensor_sha(want), name
    # Another recipe was never published: a mismatch naming the recipe.
    with pytest.raises(weightcache.FingerprintMismatch) as e:
        weightcache.acquire("tiny", engine="pytest", recipe="other", socket=daemon.socket)
    assert "recipe: cached double-v1, asked other" in str(e.value)


def test_acquire_or_publish_loads_once_then_maps(daemon, tiny_tensors):
    calls = []

    def load():
        calls.append(1)
        return _processed(tiny_tensors, 3.0)

    kw = dict(engine="pytest", recipe="triple-v1", socket=daemon.socket)
    first = weightcache.acquire_or_publish("tiny", load, **kw)
    second = weightcache.acquire_or_publish("tiny", load, **kw)
    assert calls == [1]  # the second engine found it published
    want = _processed(tiny_tensors, 3.0)
    for w in (first, second):
        assert w.fingerprint == first.fingerprint
        for name, t in want.items():
            assert tensor_sha(w[name]) == tensor_sha(t), name
    st = weightcache.status(socket=daemon.socket)
    published = [e for e in st["entries"] if e.get("source") == "publish"
                 and e["publisher"]["recipe"] == "triple-v1"]
    assert len(published) == 1
    assert published[0]["publisher"]["engine"] == "pytest"
    assert published[0]["publisher"]["framework_version"] == f"torch {torch.__version__}"
    first.close()
    second.close()
