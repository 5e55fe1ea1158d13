"""The C ABI: a C program over the header, the exported symbols, and the library in one
process with torch and grpcio."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

import weightcache
from weightcache import _lib
from conftest import CAPI_EXAMPLE, LIB, run_python, tensor_sha


def _fnv1a64(data: bytes) -> int:
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def test_c_program_reads_the_same_bytes_and_errors(daemon, tiny_tensors):
    r = subprocess.run([str(CAPI_EXAMPLE), daemon.socket, "tiny"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    by_kind = {}
    for line in lines:
        by_kind.setdefault(line.split(" ", 1)[0], []).append(line.split(" ", 1)[1])
    assert by_kind["version"] == [f"{weightcache.library_version()} abi {_lib.ABI_VERSION}"]
    assert by_kind["miss"][0].startswith("NOT_FOUND ") and "no-such-model" in by_kind["miss"][0]
    assert by_kind["bad-layout"][0].startswith("INVALID_ARGUMENT ") and "tp 3/1" in \
        by_kind["bad-layout"][0]
    assert by_kind["past-end"][0].startswith("OUT_OF_RANGE ")
    assert by_kind["find-missing"][0].startswith("NOT_FOUND ") and "no.such.tensor" in \
        by_kind["find-missing"][0]
    lease = by_kind["lease"][0].split()
    assert lease[lease.index("tensors") + 1] == str(len(tiny_tensors))
    seen = {}
    for row in by_kind["tensor"]:
        name, dtype, shape, nbytes, fnv = row.split()
        seen[name] = (dtype, shape, int(nbytes), int(fnv, 16))
    assert sorted(seen) == sorted(tiny_tensors)
    for name, t in tiny_tensors.items():
        raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        assert seen[name] == ("BF16", ",".join(str(d) for d in t.shape), len(raw), _fnv1a64(raw))
    leased = json.loads(by_kind["status"][0].split(" ", 1)[1])
    lease_id = lease[0]
    assert any(l["lease_id"] == lease_id for e in leased["entries"] for l in e.get("leases", []))


def test_only_wc_symbols_are_exported():
    out = subprocess.run(["nm", "-D", "--defined-only", str(LIB)], capture_output=True, text=True,
                         check=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert names and all(n.startswith("wc_") for n in names), [n for n in names
                                                               if not n.startswith("wc_")]
    assert {"wc_connect", "wc_acquire", "wc_lease_close", "wc_status_json", "wc_load",
            "wc_evict", "wc_release", "wc_version"} <= set(names)


def test_library_lives_beside_torch_and_grpcio(daemon, tiny_tensors):
    pytest.importorskip("grpc")
    name = "model.layers.0.self_attn.q_proj.weight"
    r = run_python(f"""
import hashlib, tempfile
from concurrent import futures
import grpc, torch
import weightcache

# grpcio's own gRPC core: a server and a call through it, before and after weightcache.
d = tempfile.mkdtemp(prefix='wcg', dir='/tmp')
def echo(req, ctx): return req
handler = grpc.method_handlers_generic_handler('t.Echo', {{'Call': grpc.unary_unary_rpc_method_handler(echo)}})
server = grpc.server(futures.ThreadPoolExecutor(2))
server.add_generic_rpc_handlers((handler,))
server.add_insecure_port('unix:' + d + '/g.sock')
server.start()
call = grpc.insecure_channel('unix:' + d + '/g.sock').unary_unary('/t.Echo/Call')
assert call(b'before', timeout=10) == b'before'
w = weightcache.acquire('tiny', socket={daemon.socket!r})
t = w[{name!r}]
print(hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest())
print(float((t.float() @ torch.ones(t.shape[1])).sum()))
assert call(b'after', timeout=10) == b'after'
print(grpc.__version__, torch.__version__)
server.stop(0)
""")
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == tensor_sha(tiny_tensors[name])
    assert float(out[1]) == pytest.approx(
        float((tiny_tensors[name].float() @ torch.ones(tiny_tensors[name].shape[1])).sum()))
