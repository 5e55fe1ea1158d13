"""weightcache.aoti against a real daemon (host backend), on the torch here (1.13: no
torch.export, no AOTInductor). What needs torch 2.6+ and a GPU (export, compile, package, the
C++ loader, binding user-managed constants, bit-equal logits in a fresh process) runs on the
device: tests/gpu/run-engine-start-on-device.sh. Here: the key (another torch, CUDA or GPU is
never fetched), the artifact format, a damaged package refused by the daemon (DATA_LOSS) and
its key freed for the rebuilt one, a package that does not load falling back with the reason
logged, and the libstdc++ promotion."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import textwrap

import pytest
import torch

import weightcache
from weightcache import aoti

from conftest import Daemon, run_python


class Head(torch.nn.Module):
    """A module over mapped weights (lm_head, norm) and one constant that is not a weight."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.Parameter(torch.empty(256, dtype=torch.bfloat16))
        self.lm_head = torch.nn.Linear(256, 8192, bias=False, dtype=torch.bfloat16)
        # Not in the checkpoint (as rotary inv_freq): packed into the artifact.
        self.register_buffer("scale", torch.full((1,), 0.5, dtype=torch.bfloat16),
                             persistent=False)

    def forward(self, x):
        return self.lm_head(x * self.norm) * self.scale


def _bound(w):
    m = Head()
    weightcache.bind(m, {"norm": w["model.norm.weight"], "lm_head.weight": w["lm_head.weight"]})
    return m.eval()


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)  # apply() sets it
    monkeypatch.setenv("WEIGHTCACHE_STATE_DIR", str(tmp_path / "state"))  # load markers


X = torch.ones(2, 256, dtype=torch.bfloat16)


def test_the_artifact_round_trips_and_a_malformed_one_is_named(tmp_path):
    c = {"m.rotary.inv_freq": torch.arange(4, dtype=torch.float32),
         "m.b": torch.tensor([[1.5, -2]], dtype=torch.bfloat16)}
    blob = aoti.pack(b"PK-package", {"m.lm_head.weight": "lm_head.weight"}, c)
    pkg, bindings, consts = aoti.unpack(blob)
    assert pkg == b"PK-package" and bindings == {"m.lm_head.weight": "lm_head.weight"}
    assert set(consts) == set(c) and all(torch.equal(consts[k], c[k]) for k in c)
    assert consts["m.b"].dtype == torch.bfloat16
    with pytest.raises(aoti.PackageError, match="without the WCAOTI01 header"):
        aoti.unpack(b"PK\x03\x04 a bare zip")
    with pytest.raises(aoti.PackageError, match="package of 10 bytes, only 3 follow"):
        aoti.unpack(blob[:blob.index(b"PK-package") + 3])
    with pytest.raises(aoti.PackageError, match="constant m.rotary.inv_freq .* lies outside"):
        aoti.unpack(blob[:-4])


def test_mapped_weights_are_bound_by_name_and_the_rest_packed(daemon):
    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        bindings, constants = aoti._split_constants(_bound(w), w)
        assert bindings == {"norm": "model.norm.weight", "lm_head.weight": "lm_head.weight"}
        assert list(constants) == ["scale"]
        # The module bound to another lease (as transformers.from_pretrained acquires its
        # own): other addresses, the same weights by name and contents.
        with weightcache.acquire("tiny", socket=daemon.socket) as w2:
            outer = torch.nn.Module()
            outer.m = torch.nn.Module()
            outer.m.model = torch.nn.Module()
            outer.m.model.embed_tokens = torch.nn.Embedding(8192, 256, dtype=torch.bfloat16)
            weightcache.bind(outer.m, w2, strict=False)
            assert outer.m.model.embed_tokens.weight.data_ptr() != \
                w["model.embed_tokens.weight"].data_ptr()
            bindings, constants = aoti._split_constants(outer, w)
        assert bindings == {"m.model.embed_tokens.weight": "model.embed_tokens.weight"}
        assert constants == {}
        # Same name and shape, other contents: not a weight; and too much of that is refused.
        outer.m.model.embed_tokens.weight = torch.nn.Parameter(
            torch.zeros(8192, 256, dtype=torch.bfloat16))
        monkey = aoti._MAX_CONSTANT_BYTES
        try:
            bindings, constants = aoti._split_constants(outer, w)
            assert bindings == {} and list(constants) == ["m.model.embed_tokens.weight"]
            aoti._MAX_CONSTANT_BYTES = 1 << 20
            with pytest.raises(aoti.PackageError,
                               match="4194304 bytes of tensors that are not the mapped weights "
                                     r"\(largest: m.model.embed_tokens.weight\)"):
                aoti._split_constants(outer, w)
        finally:
            aoti._MAX_CONSTANT_BYTES = monkey


def test_a_package_for_another_torch_cuda_or_gpu_is_never_fetched(daemon, caplog):
    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        m = _bound(w)
        settings = {"test": "other-versions"}
        code = aoti.code_digest(m)
        mine = aoti.package_key("tiny", w.fingerprint, example_inputs=(X,), settings=settings,
                                code=code)
        others = [dict(torch_version="2.11.0+cu130"), dict(cuda_version="13.0"),
                  dict(compute_capability="9.0"), dict(code="0" * 32)]
        for o in others:
            k = aoti.package_key("tiny", w.fingerprint, example_inputs=(X,), settings=settings,
                                 **{"code": code, **o})
            assert k != mine
            assert weightcache.put_artifact(k, aoti.pack(b"built elsewhere", {}, {}),
                                            socket=daemon.admin_socket)
        # Shapes are in the key too: a package specialized to other inputs is another one.
        assert aoti.package_key("tiny", w.fingerprint, example_inputs=(X[:1],),
                                settings=settings, code=code) != mine
        with caplog.at_level(logging.WARNING, logger="weightcache"):
            got = aoti.load("tiny", w, module=m, example_inputs=(X,), settings=settings,
                            socket=daemon.socket)
        # A miss (never "did not load": those packages were not fetched), then the build,
        # which torch 1.13 cannot do, then the module as it is.
        assert got.reason.startswith("no package in the daemon for this key (a miss)")
        assert got.source == "eager" and not got.put
        assert torch.equal(got(X), m(X))
        assert weightcache.get_artifact(mine, socket=daemon.socket) is None


def test_a_package_that_does_not_load_falls_back_with_the_reason_logged(daemon, caplog):
    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        m = _bound(w)
        settings = {"test": "does-not-load"}
        key = aoti.package_key("tiny", w.fingerprint, example_inputs=(X,), settings=settings,
                               code=aoti.code_digest(m))
        assert weightcache.put_artifact(key, b"\x00garbage, not a package",
                                        socket=daemon.admin_socket)
        with caplog.at_level(logging.WARNING, logger="weightcache"):
            got = aoti.load("tiny", w, module=m, example_inputs=(X,), settings=settings,
                            socket=daemon.socket)
        assert got.source == "eager"
        assert "the package from the daemon did not load: PackageError" in got.reason
        assert "without the WCAOTI01 header" in got.reason
        assert torch.equal(got(X), m(X))
        logged = " ".join(r.getMessage() for r in caplog.records)
        assert "did not load" in logged and "building the package failed" in logged
        # A well-formed artifact whose package this torch cannot load: the same path.
        key2 = dict(key, settings_hash=aoti.package_key(
            "tiny", w.fingerprint, example_inputs=(X,), settings="2",
            code=aoti.code_digest(m))["settings_hash"])
        weightcache.put_artifact(key2, aoti.pack(b"PK", {}, {}), socket=daemon.admin_socket)
        got = aoti.load("tiny", w, module=m, example_inputs=(X,), settings="2",
                        socket=daemon.socket)
        assert got.source == "eager"
        assert "has no AOTInductor package loader" in got.reason
        # With fallback=None the failure is the caller's to handle; no module: named.
        with pytest.raises(aoti.PackageError, match="cannot build AOTInductor packages"):
            aoti.load("tiny", w, module=m, example_inputs=(X,), settings="2", fallback=None,
                      socket=daemon.socket)
        with pytest.raises(aoti.PackageError, match="a miss.*no module to build it from"):
            aoti.load("tiny", w, example_inputs=(X,), settings="3", socket=daemon.socket)
        # make_module: the module is built only when needed (here: the miss), once.
        made = []
        got = aoti.load("tiny", w, make_module=lambda: made.append(1) or m,
                        example_inputs=(X,), settings="3", socket=daemon.socket)
        assert made == [1] and got.source == "eager" and torch.equal(got(X), m(X))
        with pytest.raises(weightcache.WeightcacheError, match="loader='fast'"):
            aoti.load("tiny", w, module=m, loader="fast", socket=daemon.socket)


def test_a_damaged_package_is_refused_and_its_key_freed_for_the_rebuilt_one(
        tmp_path, checkpoints, caplog):
    store = tmp_path / "artifacts"
    store.mkdir()
    d = Daemon(tmp_path, [{"name": "tiny", "model_dir": str(checkpoints["tiny"])}],
               ["--preload=true", f"--artifact_dir={store}"])
    try:
        d.wait_ready(["tiny"])
        with weightcache.acquire("tiny", socket=d.socket) as w:
            fp = w.fingerprint
        key = aoti.package_key("tiny", fp, example_inputs=(X,), code=aoti.code_digest(Head()))
        assert weightcache.put_artifact(key, aoti.pack(b"PK" * 4096, {}, {}),
                                        socket=d.admin_socket)
        d.restart()  # the blob is read back from the disk, its SHA-256 checked
        d.wait_ready(["tiny"])
        blobs = list(store.rglob("*.blob"))
        assert len(blobs) == 1, list(store.rglob("*"))
        raw = bytearray(blobs[0].read_bytes())
        raw[100] ^= 0xFF  # one flipped bit on the disk
        blobs[0].write_bytes(bytes(raw))
        with weightcache.acquire("tiny", socket=d.socket) as w:
            m = _bound(w)
            with caplog.at_level(logging.WARNING, logger="weightcache"):
                got = aoti.load("tiny", w, module=m, example_inputs=(X,), socket=d.socket)
            assert got.reason.startswith("the daemon refused the stored package: artifact ")
            assert "damaged" in got.reason
            assert got.source == "eager" and torch.equal(got(X), m(X))
            assert any("refused the stored package" in r.getMessage() for r in caplog.records)
        # Set aside by the daemon: the rebuilt package (the device's build) is stored again.
        assert weightcache.put_artifact(key, aoti.pack(b"rebuilt", {}, {}),
                                        socket=d.admin_socket)
        assert aoti.unpack(weightcache.get_artifact(key, socket=d.socket))[0] == b"rebuilt"
    finally:
        d.stop()


class OtherHead(Head):
    def forward(self, x):
        return self.lm_head(x * self.norm) * self.scale * 2


def test_the_key_carries_a_digest_of_the_modules_code(daemon):
    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        a, b = aoti.code_digest(Head()), aoti.code_digest(OtherHead())
        assert len(a) == 32 and a != b and aoti.code_digest(Head()) == a
        ka = aoti.package_key("tiny", w.fingerprint, example_inputs=(X,), code=a)
        kb = aoti.package_key("tiny", w.fingerprint, example_inputs=(X,), code=b)
        assert ka["engine_version"] == f"code-{a[:16]}" and ka != kb
        # A caller's engine_version is kept; the code is still in the settings hash.
        kc = aoti.package_key("tiny", w.fingerprint, example_inputs=(X,), code=b,
                              engine_version="vllm-0.9")
        assert kc["engine_version"] == "vllm-0.9" and kc["settings_hash"] == kb["settings_hash"]
        # make_module alone (a hit never builds the module): the builder's code.
        assert aoti.code_digest(make_module=_bound) not in ("", a)


def test_planted_package_from_a_publisher_the_spec_does_not_name_is_not_loaded(daemon,
                                                                              monkeypatch):
    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        m = _bound(w)
        key = aoti.package_key("tiny", w.fingerprint, example_inputs=(X,),
                               settings="planted", code=aoti.code_digest(m))
        # This uid is a granted publisher (--publish_uids), which the spec does not name for
        # native code: the package is refused (old daemon: stored, then dlopened below).
        with pytest.raises(weightcache.WeightcacheError, match="may not publish native code") as e:
            weightcache.put_artifact(key, aoti.pack(b"PK-planted", {}, {}), socket=daemon.socket)
        assert e.value.code == "PERMISSION_DENIED"
        assert "native_publishers" in e.value.message
        loads = []
        monkeypatch.setattr(aoti, "load_package_file",
                            lambda *a, **k: loads.append(a) or (_ for _ in ()).throw(
                                aoti.PackageError("not here")))
        got = aoti.load("tiny", w, module=m, example_inputs=(X,), settings="planted",
                        socket=daemon.socket)
        assert got.reason.startswith("no package in the daemon for this key (a miss)")
        assert loads == []


def test_a_package_that_crashed_once_is_skipped_and_compiled_instead(daemon, monkeypatch,
                                                                    caplog):
    with weightcache.acquire("tiny", socket=daemon.socket) as w:
        m = _bound(w)
        key = aoti.package_key("tiny", w.fingerprint, example_inputs=(X,), settings="crash",
                               code=aoti.code_digest(m))
        blob = aoti.pack(b"PK-crashes-in-its-constructor", {}, {})
        assert weightcache.put_artifact(key, blob, socket=daemon.admin_socket)
        sha = hashlib.sha256(blob).hexdigest()
        # The marker is written before the package is opened, and removed when the load
        # returns (here: raises, which is not a crash).
        seen = []

        def opened(path, **kw):
            seen.append(json.loads(open(aoti.marker_path(key)).read()))
            raise aoti.PackageError("this torch has no loader")

        monkeypatch.setattr(aoti, "load_package_file", opened)
        got = aoti.load("tiny", w, module=m, example_inputs=(X,), settings="crash",
                        socket=daemon.socket)
        assert seen and seen[0]["sha256"] == sha and seen[0]["source"] == "artifact"
        assert not os.path.exists(aoti.marker_path(key))
        assert "did not load" in got.reason
        # A load that died: the process was killed inside it, its marker left behind.
        marker = aoti._Marked(key, sha, "artifact").__enter__()
        assert os.path.exists(marker.path)
        seen.clear()
        with caplog.at_level(logging.WARNING, logger="weightcache"):
            got = aoti.load("tiny", w, module=m, example_inputs=(X,), settings="crash",
                            socket=daemon.socket)
        assert seen == [], "old code: dlopened again (a crash loop)"
        assert got.source in ("compile", "eager") and torch.equal(got(X), m(X))
        assert f"package sha256:{sha[:16]} of this key killed a previous load" in got.reason
        assert marker.path in got.reason
        assert any("killed a previous load" in r.getMessage() for r in caplog.records)
        with pytest.raises(aoti.PackageError, match="killed a previous load"):
            aoti.load("tiny", w, module=m, example_inputs=(X,), settings="crash",
                      fallback=None, socket=daemon.socket)
        # Another package for the key (the admin replaced it): tried again.
        with open(marker.path, "w") as f:
            json.dump({"sha256": "0" * 64, "source": "artifact"}, f)
        got = aoti.load("tiny", w, module=m, example_inputs=(X,), settings="crash",
                        socket=daemon.socket)
        assert len(seen) == 1 and "did not load" in got.reason


def test_promote_libstdcxx_puts_torchs_libstdcxx_in_the_global_scope():
    code = textwrap.dedent("""
        import ctypes, torch
        from weightcache import aoti
        g = ctypes.CDLL(None)
        def has(sym):
            return hasattr(g, sym)
        sym = "_ZNSt6locale7classicEv"   # std::locale::classic(), libstdc++ only
        before = has(sym)
        done = aoti.promote_libstdcxx()
        print(before, has(sym), len(done))
    """)
    p = run_python(code)
    assert p.returncode == 0, p.stderr
    before, after, n = p.stdout.split()
    assert (before, after) == ("False", "True") and int(n) >= 1, p.stdout
