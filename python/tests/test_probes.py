"""The node's probe decision (weightcache.probes): the same answer an engine computes itself,
and never believed from a file that a tenant could have written or that disagrees with the
CPU. The probes themselves (torch 2.11's Inductor) run on the device:
tests/gpu/run-engine-start-on-device.sh traces them."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weightcache import probes

SPR = "processor\t: 0\nflags\t\t: fpu sse avx avx2 fma avx512f avx512dq avx512vl avx512bw " \
      "avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8\n\nprocessor\t: 1\nflags\t: fpu\n"
ZEN2 = "flags\t: fpu avx avx2 fma sse4_2\n"


def test_decide_reads_the_isas_inductor_checks_from_the_cpu_flags():
    d = probes.decide(SPR, "x86_64")
    assert d.cpu_isa == ["avx2", "avx512", "avx512_vnni", "amx_tile"]
    assert "amx_fp16" not in d.probe_flags and "avx512_bf16" in d.probe_flags
    assert d.env == {"TORCHINDUCTOR_VEC_ISA_OK": "1"}
    assert probes.decide(ZEN2, "x86_64").cpu_isa == ["avx2"]
    # No ISA Inductor knows (or not x86): nothing to skip, nothing claimed.
    assert probes.decide("flags\t: fpu sse\n", "x86_64").env == {}
    assert probes.decide(SPR, "aarch64").cpu_isa == []


def test_the_isa_table_is_the_one_json_file_the_daemon_is_built_from():
    # One table: the installed package reads cpu_isa.json, the file pkg/probes generates the
    # daemon's C++ table from (its node_probes_test holds the compiled side to the same file).
    source = Path(__file__).resolve().parents[1] / "weightcache" / "cpu_isa.json"
    installed = Path(probes.__file__).parent / "cpu_isa.json"
    assert installed.read_bytes() == source.read_bytes()
    table = json.loads(source.read_text())
    assert probes._X86_ISAS == {i["name"]: tuple(i["needs"]) for i in table["x86_isas"]}
    assert list(probes._PROBE_FLAGS) == table["probe_flags"]
    everything = "flags\t: " + " ".join(table["probe_flags"]) + "\n"
    assert probes.decide(everything, "x86_64").cpu_isa == [i["name"] for i in table["x86_isas"]]


def test_the_node_step_writes_what_an_engine_here_decides_and_the_engine_applies_it(tmp_path):
    # The node step is its own process (as in the DaemonSet): python -m weightcache node-probes.
    p = subprocess.run([sys.executable, "-m", "weightcache", "node-probes", "--write",
                        str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    f = tmp_path / probes.FILE_NAME
    assert oct(f.stat().st_mode & 0o777) == "0o644"
    env = {}
    d = probes.apply(path=str(f), environ=env)
    mine = probes.decide()
    assert d.source == "node" and d.path == str(f)
    assert (d.cpu_isa, d.probe_flags) == (mine.cpu_isa, mine.probe_flags)
    assert env == mine.env
    # An explicit setting in the engine's environment wins.
    env = {"TORCHINDUCTOR_VEC_ISA_OK": "0"}
    probes.apply(path=str(f), environ=env)
    assert env == {"TORCHINDUCTOR_VEC_ISA_OK": "0"}
    # Switched off: nothing applied (torch probes as it would without weightcache).
    env = {"WEIGHTCACHE_NODE_PROBES": "off"}
    assert probes.apply(path=str(f), environ=env).source == "off"
    assert env == {"WEIGHTCACHE_NODE_PROBES": "off"}


def test_the_file_is_found_beside_the_socket(tmp_path, monkeypatch):
    probes.write(str(tmp_path))
    monkeypatch.setenv("WEIGHTCACHE_SOCKET", str(tmp_path / "control.sock"))
    assert probes.default_path() == tmp_path / probes.FILE_NAME
    assert probes.apply(environ={}).source == "node"
    # No file there: the engine decides itself, silently.
    (tmp_path / probes.FILE_NAME).unlink()
    assert probes.apply(environ={}).source == "self"


def _lacking_isa() -> str:
    have = probes.decide().cpu_isa
    return next((i for i in ("avx2", "avx512", "avx512_vnni", "amx_tile") if i not in have),
                "zvector")


def _tamper(kind: str, d: Path) -> str:
    f = d / probes.FILE_NAME
    probes.write(str(d))
    if kind == "world-writable file":
        os.chmod(f, 0o666)
        return "writable by group or others (mode 0666)"
    if kind == "directory a tenant can write":
        os.chmod(d, 0o777)
        return f"its directory {d} is writable by group or others"
    if kind == "owned by another user":
        os.chown(f, 65534, 65534)
        return "owned by uid 65534"
    if kind == "symlink":
        real = d / "elsewhere.json"
        f.rename(real)
        f.symlink_to(real)
        return "symbolic links"
    if kind == "not json":
        f.write_text("{avx512: yes")
        return "is not JSON"
    if kind == "newer version":
        f.write_text(json.dumps(dict(probes.decide().as_json(), version=2)))
        return "version 2, this package reads 1"
    if kind == "bad field":
        f.write_text(json.dumps(dict(probes.decide().as_json(), cpu_isa="avx512")))
        return "'cpu_isa' must be a list of strings"
    if kind == "claims an isa this cpu lacks":
        doc = probes.decide().as_json()
        doc["cpu_isa"] = doc["cpu_isa"] + [_lacking_isa()]
        f.write_text(json.dumps(doc))
        return f"claims CPU ISA {_lacking_isa()} that this CPU lacks"
    if kind == "another cpu":
        doc = probes.decide().as_json()
        doc["probe_flags"] = doc["probe_flags"][:-1] if doc["probe_flags"] else ["amx_fp16"]
        f.write_text(json.dumps(doc))
        return "was written for another CPU"
    if kind == "another machine":
        f.write_text(json.dumps(dict(probes.decide().as_json(), machine="s390x")))
        return "written for machine s390x"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", [
    "world-writable file", "directory a tenant can write", "owned by another user", "symlink",
    "not json", "newer version", "bad field", "claims an isa this cpu lacks", "another cpu",
    "another machine"])
def test_a_decision_a_tenant_could_forge_or_that_is_wrong_is_ignored_naming_path_and_why(
        tmp_path, caplog, kind):
    d = tmp_path / "socket-dir"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    if kind == "owned by another user" and os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    why = _tamper(kind, d)
    f = d / probes.FILE_NAME
    with pytest.raises(probes.ProbeError) as e:
        probes.read(str(f))
    assert why in str(e.value)
    assert str(d) in str(e.value)
    # apply() never raises for it: it warns, naming the file and the reason, and decides here.
    env = {}
    with caplog.at_level(logging.WARNING, logger="weightcache"):
        got = probes.apply(path=str(f), environ=env)
    assert got.source == "self" and got.cpu_isa == probes.decide().cpu_isa
    assert env == probes.decide().env
    assert any(str(d) in r.getMessage() and why in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]


def test_writing_into_a_missing_directory_names_it(tmp_path):
    p = subprocess.run([sys.executable, "-m", "weightcache", "node-probes", "--write",
                        str(tmp_path / "nope")], capture_output=True, text=True)
    assert p.returncode == 1
    assert f"{tmp_path / 'nope'} is not a directory" in p.stderr


def test_the_daemon_writes_the_same_decision_beside_its_socket_and_engines_apply_it(
        daemon, tmp_path):
    # weightcached writes node-probes.json into the socket dir at start (pkg/probes/
    # node_probes.cc): byte for byte what the Python node step writes on this machine.
    written = Path(daemon.socket) / probes.FILE_NAME
    assert written.exists(), sorted(os.listdir(daemon.socket))
    assert oct(written.stat().st_mode & 0o777) == "0o644"
    assert written.read_bytes() == probes.write(str(tmp_path)).read_bytes()
    env = {}
    d = probes.apply(socket=daemon.socket, environ=env)
    assert d.source == "node" and d.path == str(written)
    assert env == probes.decide().env
