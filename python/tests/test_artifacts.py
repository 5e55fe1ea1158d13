"""Compile artifacts against a real daemon (host backend): put and get, the directory pair
for JIT caches, and compile_cache's protocol around torch's cache calls."""

from __future__ import annotations

import io
import os
import tarfile
import types

import pytest
import torch

import weightcache


def _key(daemon, kind="torch-compile", **kw):
    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        fp = w.fingerprint
    return weightcache.artifact_key(kind, "tiny", fp, **kw)


def test_put_then_get_serves_the_bytes_and_status_names_the_publisher(daemon):
    key = _key(daemon, settings={"mode": "default"}, triton_version="3.6.0")
    assert key["torch_version"] == torch.__version__
    assert key["triton_version"] == "3.6.0"
    assert weightcache.get_artifact(key, socket=daemon.socket) is None
    data = os.urandom(3 << 20)
    assert weightcache.put_artifact(key, data, socket=daemon.socket) is True
    assert weightcache.put_artifact(key, b"other", socket=daemon.socket) is False  # had it
    assert weightcache.get_artifact(key, socket=daemon.socket) == data
    # Other settings: another artifact, never this one.
    other = dict(key, settings_hash=weightcache._artifacts.settings_hash({"mode": "max"}))
    assert weightcache.get_artifact(other, socket=daemon.socket) is None
    st = weightcache.status(socket=daemon.socket)
    mine = [a for a in st["artifacts"] if a["key"]["settings_hash"] == key["settings_hash"]]
    assert len(mine) == 1
    assert mine[0]["publisher"]["pid"] == os.getpid()
    assert int(mine[0]["bytes"]) == len(data)


def test_a_bad_key_is_refused_naming_the_field(daemon):
    key = _key(daemon)
    with pytest.raises(weightcache.WeightcacheError, match="'kind'"):
        weightcache.put_artifact(dict(key, kind="has space"), b"x", socket=daemon.socket)
    with pytest.raises(weightcache.WeightcacheError, match="unknown field"):
        weightcache.get_artifact(dict(key, colour="red"), socket=daemon.socket)
    with pytest.raises(weightcache.CacheMiss, match="model 'nope'"):
        weightcache.get_artifact(dict(key, model="nope"), socket=daemon.socket)


def test_save_dir_then_restore_dir_brings_the_tree_back(daemon, tmp_path):
    src = tmp_path / "triton"
    (src / "ab" / "cd").mkdir(parents=True)
    (src / "ab" / "cd" / "kernel.cubin").write_bytes(os.urandom(5000))
    (src / "ab" / "kernel.json").write_text('{"name": "k"}')
    (src / "top.txt").write_text("t")
    key = _key(daemon, kind="dir:triton")
    assert weightcache.save_dir(key, src, socket=daemon.socket) is True
    dst = tmp_path / "restored"
    assert weightcache.restore_dir(key, dst, socket=daemon.socket) is True
    for p in src.rglob("*"):
        q = dst / p.relative_to(src)
        assert q.exists(), q
        if p.is_file():
            assert q.read_bytes() == p.read_bytes(), q
    assert weightcache.restore_dir(dict(key, kind="dir:none"), tmp_path / "x",
                                   socket=daemon.socket) is False


def test_restore_dir_refuses_members_outside_the_directory(daemon, tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"owned"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    key = _key(daemon, kind="dir:evil")
    assert weightcache.put_artifact(key, buf.getvalue(), socket=daemon.socket)
    with pytest.raises(weightcache.WeightcacheError, match="lies outside"):
        weightcache.restore_dir(key, tmp_path / "cache", socket=daemon.socket)
    assert not (tmp_path / "escaped.txt").exists()


def test_compile_cache_applies_the_nodes_probe_decision_first(daemon, monkeypatch, caplog):
    from weightcache import probes

    monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)
    monkeypatch.setattr(torch, "compiler", types.SimpleNamespace(
        load_cache_artifacts=lambda blob: None, save_cache_artifacts=lambda: None),
        raising=False)
    # The daemon's socket dir holds no decision: this process decides, from its CPU.
    with weightcache.compile_cache("tiny", _key(daemon)["fingerprint"], settings={"p": 1},
                                   socket=daemon.socket):
        assert os.environ.get("TORCHINDUCTOR_VEC_ISA_OK") == probes.decide().env.get(
            "TORCHINDUCTOR_VEC_ISA_OK")
    assert not [r for r in caplog.records if "probe decision" in r.getMessage()]


def test_compile_cache_saves_on_a_miss_and_loads_on_the_next_start(daemon, monkeypatch):
    # torch's two cache calls, recorded (the real ones run on the H200: bench/compile_cache_probe.py).
    calls = []
    fake = types.SimpleNamespace(
        load_cache_artifacts=lambda blob: calls.append(("load", blob)),
        save_cache_artifacts=lambda: (b"inductor+triton caches", object()),
    )
    monkeypatch.setattr(torch, "compiler", fake, raising=False)
    with weightcache.compile_cache("tiny", _key(daemon)["fingerprint"], settings={"m": 1},
                                   socket=daemon.socket) as first:
        calls.append(("warm-up",))
    assert calls == [("warm-up",)]
    assert not first.hit and first.put
    calls.clear()
    with weightcache.compile_cache("tiny", first.key["fingerprint"], settings={"m": 1},
                                   socket=daemon.socket) as second:
        calls.append(("warm-up",))
    assert calls == [("load", b"inductor+triton caches"), ("warm-up",)]
    assert second.hit and not second.put


def test_compile_cache_names_the_torch_it_needs(daemon, monkeypatch):
    monkeypatch.delattr(torch, "compiler", raising=False)
    with pytest.raises(weightcache.WeightcacheError, match="torch 2.6 or later"):
        with weightcache.compile_cache("tiny", "fp", socket=daemon.socket):
            pass


def _triton_tree(root, version, dist_version=None, dist_dir=None):
    """A `triton` package under root whose import is visible (it writes a marker), and when
    dist_version is given, its distribution's metadata (in dist_dir, default root)."""
    pkg = root / "triton"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        f"import os\nopen(os.environ['TRITON_MARKER'], 'w').close()\n__version__ = {version!r}\n")
    if dist_version is not None:
        info = (dist_dir or root) / f"triton-{dist_version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: triton\nVersion: {dist_version}\n")


def _key_in_fresh_process(paths, marker):
    """artifact_key's triton_version in a fresh interpreter with `paths` first on sys.path;
    and whether the package was imported to get it."""
    import subprocess
    import sys

    code = ("import weightcache, sys; print(weightcache.artifact_key('k', 'm', 'f', "
            "torch_version='t', cuda_version='c', compute_capability='9.0')['triton_version']);"
            "print('triton' in sys.modules)")
    env = dict(os.environ, TRITON_MARKER=str(marker),
               PYTHONPATH=os.pathsep.join([str(p) for p in paths] + [os.path.dirname(os.path.dirname(
                   os.path.abspath(weightcache.__file__)))]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0] if out and out[0] not in ("True", "False") else "", out[-1] == "True"


def test_the_triton_version_of_a_key_is_read_without_importing_triton(tmp_path):
    # An installed Triton (package and its distribution's metadata side by side): the
    # version comes from the metadata, Triton's import (0.14 s of an engine start) is skipped.
    _triton_tree(tmp_path / "site", "3.6.0", dist_version="3.6.0")
    version, imported = _key_in_fresh_process([tmp_path / "site"], tmp_path / "m1")
    assert (version, imported) == ("3.6.0", False)
    assert not (tmp_path / "m1").exists()


def test_a_triton_without_its_own_metadata_is_imported_for_its_version(tmp_path):
    # A source tree first on the path, and later on it the metadata of a distribution: that
    # metadata describes another Triton than the one this process would run, so the
    # package's own __version__ is the key's.
    _triton_tree(tmp_path / "src", "3.7.0+git", dist_version="3.6.0",
                 dist_dir=tmp_path / "elsewhere")
    version, imported = _key_in_fresh_process([tmp_path / "src", tmp_path / "elsewhere"],
                                              tmp_path / "m2")
    assert (version, imported) == ("3.7.0+git", True)
    assert (tmp_path / "m2").exists()
