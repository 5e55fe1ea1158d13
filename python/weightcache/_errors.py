"""The typed exceptions, and their mapping from the daemon's status codes and messages."""

from __future__ import annotations

import re
from typing import List, NamedTuple, Optional


class WeightcacheError(Exception):
    """Base of every weightcache error.

    ``code`` is the canonical status name from the daemon or the library (``"NOT_FOUND"``,
    ``"FAILED_PRECONDITION"``, ...; ``""`` for errors raised by the Python package itself) and
    ``message`` the full message, which names the model, field or input at fault.
    """

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class DaemonUnavailable(WeightcacheError):
    """No daemon answers on the socket (none running, or a wrong ``WEIGHTCACHE_SOCKET``)."""


class DaemonGone(DaemonUnavailable):
    """A lease's daemon connection is gone and no daemon serving its memory is back (code
    ``UNAVAILABLE``, from the C ABI's ``wc_lease_check``). ``Weights.check`` no longer raises
    it: a daemon restart is not an engine failure (``Weights.state()`` says ``"unknown"``
    until the lease re-attaches). Kept so that code catching it still imports."""


class CacheMiss(WeightcacheError):
    """The daemon does not hold this model-rank (or does not know the model)."""


class FieldDiff(NamedTuple):
    """One differing fingerprint field, e.g. ``FieldDiff("tp_size", "8", "4")``."""

    field: str
    cached: str
    asked: str


class FingerprintMismatch(WeightcacheError):
    """The daemon holds the model, but not in the asked form. ``diff`` lists every differing
    field (``[FieldDiff("dtype", "bf16", "fp16")]``)."""

    def __init__(self, message: str, code: str = "", diff: Optional[List[FieldDiff]] = None):
        super().__init__(message, code)
        self.diff: List[FieldDiff] = list(diff or [])


class UnsupportedQuantization(WeightcacheError):
    """The model's quantization is one the cache refuses to serve (AWQ, GPTQ, per-tensor FP8,
    ...); the message names the method and the supported list."""


class StaleWeights(WeightcacheError):
    """The checkpoint files changed on disk after the daemon loaded them: the cached weights
    are no longer what the files hold. Reload (``weightcachectl load``) or read the disk."""


class CorruptWeights(WeightcacheError):
    """The daemon found that this lease's memory changed after it was sealed (integrity
    scrubbing): a process wrote through a writable import, a stray kernel, a memory error.
    The message names the segment and bytes. Stop using the weights: acquire again (the daemon
    is loading a clean copy) or restart."""


class BindError(WeightcacheError):
    """``bind(strict=True)`` found names that do not fit; every one is listed."""

    def __init__(self, message: str, missing: List[str], unexpected: List[str],
                 mismatched: List[str]) -> None:
        super().__init__(message)
        self.missing = missing
        self.unexpected = unexpected
        self.mismatched = mismatched


_DIFF_PART = re.compile(r"^(?P<field>.+?): cached (?P<cached>.*), asked (?P<asked>.*)$")
_DIFF_MARK = "do not fit: "


def parse_diff(message: str) -> List[FieldDiff]:
    """The field list of a mismatch message ("...: do not fit: f: cached a, asked b; ...")."""
    i = message.find(_DIFF_MARK)
    text = message[i + len(_DIFF_MARK):] if i >= 0 else message
    out = []
    for part in text.split("; "):
        m = _DIFF_PART.match(part.strip())
        if m:
            out.append(FieldDiff(m["field"], m["cached"], m["asked"]))
    return out


def error_from_status(code: int, name: str, message: str) -> WeightcacheError:
    """The typed exception for a failed call: status ``code`` (its ``name``) and message."""
    if code == 5:  # NOT_FOUND
        return CacheMiss(message, name)
    if code == 9:  # FAILED_PRECONDITION
        if message.startswith("stale:"):
            return StaleWeights(message, name)
        diff = parse_diff(message)
        if _DIFF_MARK in message and diff:
            return FingerprintMismatch(message, name, diff)
        return WeightcacheError(message, name)
    if code == 15 and "corrupt" in message:  # DATA_LOSS from a lease check
        return CorruptWeights(message, name)
    if code == 12 and "quantization" in message:  # UNIMPLEMENTED
        return UnsupportedQuantization(message, name)
    if code == 14 and "the daemon connection is gone" in message:  # UNAVAILABLE, lease check
        return DaemonGone(message, name)
    if code == 14 and ("daemon unreachable" in message or "does not exist" in message):
        return DaemonUnavailable(message, name)  # UNAVAILABLE from connecting
    return WeightcacheError(message, name)
