"""Spawn mode: when no daemon answers, start a per-user weightcached and use it.

Where: ``$WEIGHTCACHE_SPAWN_DIR``, else ``$XDG_RUNTIME_DIR/weightcache``, else
``/tmp/weightcache-<uid>`` (created 0700). It holds ``daemon/control.sock`` (the daemon's
socket dir), ``weightcached.pid``, ``weightcached.log`` and ``spawn.lock``. Later processes in
spawn mode find the daemon there again (after trying ``$WEIGHTCACHE_SOCKET`` when it is set);
``python -m weightcache stop`` ends it. The binary is ``$WEIGHTCACHED``, else
``weightcache/bin/weightcached`` beside the package, else ``weightcached`` on PATH.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Optional

from . import _lib
from ._errors import CacheMiss, DaemonUnavailable, WeightcacheError

SPAWN_DIR_ENV = "WEIGHTCACHE_SPAWN_DIR"
BINARY_ENV = "WEIGHTCACHED"


def spawn_dir() -> Path:
    """The per-user directory of a spawned daemon (see the module docstring)."""
    env = os.environ.get(SPAWN_DIR_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "weightcache"
    return Path(f"/tmp/weightcache-{os.getuid()}")


def check_private_dir(d: Path) -> None:
    """Refuses a spawn directory that is not the caller's own: another user could have made
    it first (``/tmp/weightcache-<uid>`` is guessable) with a live control.sock or a pid file
    of its choosing. It must be a directory (not a symlink), owned by this uid, mode 0700."""
    try:
        st = os.lstat(d)
    except OSError as e:
        raise DaemonUnavailable(f"spawn mode: {d}: {e.strerror}") from e
    problem = None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory (a symlink or a file is refused)"
    elif st.st_uid != os.getuid():
        problem = f"is owned by uid {st.st_uid}, not by this process (uid {os.getuid()})"
    elif st.st_mode & 0o077:
        problem = f"has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0700"
    if problem:
        raise DaemonUnavailable(f"spawn mode: the daemon directory {d} {problem}; remove it or "
                                f"set {SPAWN_DIR_ENV} to a directory of your own")


def socket_dir() -> Path:
    return spawn_dir() / "daemon"


def daemon_binary() -> str:
    """The weightcached to start: $WEIGHTCACHED, beside the package, or on PATH."""
    env = os.environ.get(BINARY_ENV)
    if env:
        if os.access(env, os.X_OK):
            return env
        raise DaemonUnavailable(f"spawn mode: {BINARY_ENV}={env} is not an executable")
    tried = []
    beside = Path(__file__).resolve().parent / "bin" / "weightcached"
    if os.access(beside, os.X_OK):
        return str(beside)
    tried.append(str(beside))
    found = shutil.which("weightcached")
    if found:
        return found
    tried.append("weightcached on PATH")
    raise DaemonUnavailable("spawn mode: no weightcached binary found (tried "
                            + "; ".join(tried) + ")")


def _answers(sock: str) -> bool:
    try:
        with _lib.Client(sock) as c:
            c.status_json()
        return True
    except DaemonUnavailable:
        return False


def _log_tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def ensure_daemon(timeout: float) -> str:
    """The control socket dir of a running per-user daemon, started now if none answers."""
    d = spawn_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_dir(d)
    sock = socket_dir()
    with open(d / "spawn.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one spawner at a time; the others then find it
        if (sock / "control.sock").exists() and _answers(str(sock)):
            return str(sock)
        binary = daemon_binary()
        log_path = d / "weightcached.log"
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(
                # A private daemon in the caller's own directory: the caller is its admin
                # (inline specs) and publisher; no admin socket beside it.
                [binary, f"--socket_dir={sock}", "--backend=auto", "--metrics_address=off",
                 f"--admin_uids={os.getuid()}", f"--publish_uids={os.getuid()}",
                 "--admin_socket_dir=none"],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
        (d / "weightcached.pid").write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + min(timeout, 60)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise DaemonUnavailable(
                    f"spawn mode: {binary} exited with {proc.returncode}; its log "
                    f"({log_path}):\n{_log_tail(log_path)}")
            if (sock / "control.sock").exists() and _answers(str(sock)):
                return str(sock)
            time.sleep(0.05)  # polling a readiness condition with a deadline
        raise DaemonUnavailable(f"spawn mode: {binary} did not answer on {sock} within "
                                f"{min(timeout, 60):.0f} s; its log ({log_path}):\n"
                                f"{_log_tail(log_path)}")


def stop() -> Optional[int]:
    """Stops the daemon this user's spawn mode started (SIGTERM, then waits up to 10 s).
    Returns its pid, or None when none is running."""
    pid_file = spawn_dir() / "weightcached.pid"
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pid_file.unlink(missing_ok=True)
        return None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    pid_file.unlink(missing_ok=True)
    return pid


def spec_yaml(name: str, model_dir: str, o: "_lib.AcquireOptions") -> str:
    """An inline spec (JSON is YAML) for the asked model-rank."""
    spec = {"version": 1, "name": name, "model_dir": model_dir, "tp_size": o.tp_size,
            "tp_ranks": [o.tp_rank], "pp_size": o.pp_size, "pp_rank": o.pp_rank}
    if o.dtype:
        spec["dtype"] = o.dtype.decode()
    if o.quantization:
        spec["quantization"] = o.quantization.decode()
    return json.dumps(spec)


def acquire_spawned(socket: Optional[str], o: "_lib.AcquireOptions", name: str,
                    model_dir: Optional[str], timeout: float) -> "_lib.Lease":
    """Acquire in spawn mode: $WEIGHTCACHE_SOCKET (or `socket`) when a daemon answers there,
    else the per-user daemon (started if needed), which loads `model_dir` on a miss."""
    if socket or os.environ.get("WEIGHTCACHE_SOCKET"):
        try:
            with _lib.Client(socket) as c:
                return _lib.acquire_lease(c, o)
        except DaemonUnavailable:
            pass
    sock = ensure_daemon(timeout)
    with _lib.Client(sock) as c:
        try:
            return _lib.acquire_lease(c, o)
        except CacheMiss:
            if not model_dir:
                raise WeightcacheError(
                    f"spawn mode: the spawned daemon does not know model '{name}'; pass "
                    "model_dir= (or a directory as model) so it can load it") from None
            c.load(spec_yaml=spec_yaml(name, model_dir, o))
            return _lib.acquire_lease(c, o)
