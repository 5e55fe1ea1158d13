"""Per-node probes, decided once: what torch's Inductor would otherwise find out again in every
fresh engine process by starting subprocesses (docs/engines.md, "Probes torch runs at start").

The one that costs seconds is the CPU vector-ISA check: for every ISA the CPU's flags list,
``torch._inductor.cpu_vec_isa`` compiles a test kernel and imports torch in a fresh
``python -c`` to load it (about 2.8 s each on the H200 machine, ten of them on a CPU with
AVX-512 and AMX). Its answer is a property of the node's CPU, so it is decided once per node:

- on the node, ``weightcached`` writes ``node-probes.json`` at start into the socket
  directory and every slot directory (what engine pods mount read-only); without a daemon,
  ``python -m weightcache node-probes --write DIR`` writes the same bytes;
- in an engine, :func:`apply` (called by :mod:`weightcache.aoti` before torch's Inductor is
  imported) reads that file when it can be trusted and agrees with this process's own view of
  the CPU, and otherwise decides the same thing itself from ``/proc/cpuinfo``; then it sets
  ``TORCHINDUCTOR_VEC_ISA_OK=1`` (pytorch #134667: the ISA list stays filtered by the CPU's
  flags; only the compile-and-load check is skipped) unless the environment sets it already.

A decision file is never believed on its own word: it is ignored, with a warning naming the
path and what is wrong, when it is not a regular file, is owned by anyone but root or this
process's user, is writable by group or others, lies in a directory writable by group or
others, is malformed, or claims CPU flags this process's CPU does not have.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, List, MutableMapping, Optional

log = logging.getLogger("weightcache")

FILE_NAME = "node-probes.json"
VERSION = 1
_MAX_BYTES = 64 << 10

# The CPU flags (as /proc/cpuinfo spells them) behind each x86 ISA Inductor checks
# (torch._inductor.cpu_vec_isa.x86_isa_checker, over ATen's cpuinfo tests), in its order, and
# the extra checks its subclasses run (avx512_bf16, VNNI, AMX tile/bf16/int8/fp16). The one
# table is cpu_isa.json beside this module; the daemon's C++ table is generated from the same
# file (pkg/probes/CMakeLists.txt).
_ISA_TABLE = json.loads((Path(__file__).parent / "cpu_isa.json").read_text())
_X86_ISAS = {isa["name"]: tuple(isa["needs"]) for isa in _ISA_TABLE["x86_isas"]}
_PROBE_FLAGS = tuple(_ISA_TABLE["probe_flags"])


class ProbeError(ValueError):
    """A decision file or its input is unusable; the message names it and what is wrong."""


def cpu_flags(cpuinfo: Optional[str] = None) -> FrozenSet[str]:
    """The flags of the first processor in ``/proc/cpuinfo`` (or the text given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def isa_from_flags(flags: FrozenSet[str], machine: str) -> List[str]:
    """The vector ISAs Inductor would consider on this CPU, in its order of preference's
    reverse (avx2 first); empty off x86-64."""
    if machine not in ("x86_64", "AMD64"):
        return []
    return [isa for isa, need in _X86_ISAS.items() if all(f in flags for f in need)]


@dataclass(frozen=True)
class Decision:
    """What a node's probes answer. ``source``: ``"node"`` (from the node's decision file) or
    ``"self"`` (this process decided); ``env``: the variables it stands for."""

    machine: str
    cpu_isa: List[str]
    probe_flags: List[str]
    source: str = "self"
    path: str = ""
    env: Dict[str, str] = field(default_factory=dict)

    def as_json(self) -> Dict[str, object]:
        return {"version": VERSION, "machine": self.machine, "cpu_isa": self.cpu_isa,
                "probe_flags": self.probe_flags}


def _env_for(cpu_isa: List[str]) -> Dict[str, str]:
    # With an ISA the CPU has, Inductor's compile-and-load check only tells whether the
    # engine's C++ compiler builds it: skipping it changes nothing for CUDA models (whose CPU
    # ISA is only compared in a warning when an AOTInductor package loads) and for CPU kernels
    # fails at their compile, with the compiler's error, instead of silently choosing no ISA.
    return {"TORCHINDUCTOR_VEC_ISA_OK": "1"} if cpu_isa else {}


def decide(cpuinfo: Optional[str] = None, machine: Optional[str] = None) -> Decision:
    """This machine's answers, from its CPU flags: what the node step writes and what an
    engine computes when there is no usable decision file."""
    machine = machine or platform.machine()
    flags = cpu_flags(cpuinfo)
    isa = isa_from_flags(flags, machine)
    return Decision(machine=machine, cpu_isa=isa,
                    probe_flags=sorted(f for f in _PROBE_FLAGS if f in flags), env=_env_for(isa))


def write(directory: str, decision: Optional[Decision] = None) -> Path:
    """Writes ``node-probes.json`` into ``directory`` (atomically, mode 0644): the node step."""
    d = Path(directory)
    if not d.is_dir():
        raise ProbeError(f"node-probes: {d} is not a directory")
    decision = decision or decide()
    target = d / FILE_NAME
    tmp = d / f".{FILE_NAME}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        os.fchmod(fd, 0o644)
        os.write(fd, (json.dumps(decision.as_json(), sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    return target


def _check_owner_and_mode(st: os.stat_result, what: str, trusted: FrozenSet[int]) -> None:
    if st.st_uid not in trusted:
        raise ProbeError(f"{what} is owned by uid {st.st_uid}, not by root or this user "
                         f"(uid {os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ProbeError(f"{what} is writable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):04o})")


def read(path: str, *, machine: Optional[str] = None,
         cpuinfo: Optional[str] = None) -> Decision:
    """The decision in ``path``, checked: raises :class:`ProbeError` naming the path and what
    is wrong (untrusted file or directory, malformed, or disagreeing with this CPU)."""
    p = Path(path)
    trusted = frozenset({0, os.geteuid()})
    try:
        _check_owner_and_mode(os.stat(p.parent), f"its directory {p.parent}", trusted)
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise ProbeError(f"{p}: {e.strerror}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ProbeError(f"{p} is not a regular file")
        _check_owner_and_mode(st, str(p), trusted)
        if st.st_size > _MAX_BYTES:
            raise ProbeError(f"{p} holds {st.st_size} bytes, more than {_MAX_BYTES}")
        raw = os.read(fd, _MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ProbeError(f"{p} is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ProbeError(f"{p}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("version") != VERSION:
        raise ProbeError(f"{p}: version {doc.get('version')!r}, this package reads {VERSION}")
    for name in ("cpu_isa", "probe_flags"):
        v = doc.get(name)
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise ProbeError(f"{p}: '{name}' must be a list of strings, got {v!r}")
    if not isinstance(doc.get("machine"), str):
        raise ProbeError(f"{p}: 'machine' must be a string, got {doc.get('machine')!r}")
    # The node's answer must be the one this process would get: the same CPU as seen here.
    mine = decide(cpuinfo, machine)
    if doc["machine"] != mine.machine:
        raise ProbeError(f"{p}: written for machine {doc['machine']}, this is {mine.machine}")
    extra = sorted(set(doc["cpu_isa"]) - set(mine.cpu_isa))
    if extra:
        raise ProbeError(f"{p} claims CPU ISA {', '.join(extra)} that this CPU lacks "
                         f"(its flags give {mine.cpu_isa or 'none'})")
    if sorted(doc["cpu_isa"]) != sorted(mine.cpu_isa) or \
            sorted(doc["probe_flags"]) != mine.probe_flags:
        raise ProbeError(f"{p} was written for another CPU: ISA {doc['cpu_isa']}, flags "
                         f"{doc['probe_flags']}; this CPU: ISA {mine.cpu_isa}, flags "
                         f"{mine.probe_flags}")
    return Decision(machine=mine.machine, cpu_isa=list(doc["cpu_isa"]),
                    probe_flags=list(doc["probe_flags"]), source="node", path=str(p),
                    env=_env_for(list(doc["cpu_isa"])))


def default_path(socket: Optional[str] = None) -> Optional[Path]:
    """``node-probes.json`` in the socket directory (``socket`` or ``$WEIGHTCACHE_SOCKET``,
    the control socket or its directory); None when no socket is configured."""
    s = socket or os.environ.get("WEIGHTCACHE_SOCKET")
    if not s:
        return None
    p = Path(s)
    return (p if p.is_dir() else p.parent) / FILE_NAME


def apply(*, socket: Optional[str] = None, path: Optional[str] = None,
          environ: Optional[MutableMapping[str, str]] = None) -> Decision:
    """Applies the node's decision (or this process's own) as environment, before torch's
    Inductor is imported; variables already set are left as they are (an explicit setting
    wins). Never raises for a bad decision file: it is ignored with a warning.
    ``WEIGHTCACHE_NODE_PROBES=off`` in the environment: nothing is applied (torch probes as
    it would without weightcache; source ``"off"``)."""
    environ = os.environ if environ is None else environ
    if environ.get("WEIGHTCACHE_NODE_PROBES") == "off":
        return Decision(machine=platform.machine(), cpu_isa=[], probe_flags=[], source="off")
    p = Path(path) if path else default_path(socket)
    decision: Optional[Decision] = None
    if p is not None and (path or p.exists()):
        try:
            decision = read(str(p))
        except ProbeError as e:
            log.warning("weightcache: ignoring the node's probe decision: %s; deciding here", e)
    if decision is None:
        decision = decide()
    for k, v in decision.env.items():
        environ.setdefault(k, v)
    config = sys.modules.get("torch._inductor.config")
    if config is not None and environ is os.environ and decision.env.get(
            "TORCHINDUCTOR_VEC_ISA_OK") == environ.get("TORCHINDUCTOR_VEC_ISA_OK") == "1":
        # Imported already: its env default was read then; set the same setting directly.
        config.cpp.vec_isa_ok = True
    return decision
