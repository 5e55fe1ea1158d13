"""``python -m weightcache status|load|verify|evict|stop``: weightcachectl for Python users.

    python -m weightcache status [--json]
    python -m weightcache load MODEL | --spec FILE
    python -m weightcache verify MODEL [--tp-rank R --tp-size N] [--model-dir DIR]
    python -m weightcache evict MODEL | --fingerprint FP
    python -m weightcache stop          (the daemon that spawn mode started for this user)
    python -m weightcache node-probes [--write DIR]   (the node's probe decision: print it,
                                        or write DIR/node-probes.json; weightcache.probes)

``--socket`` (before the command) names control.sock or its directory; default
``$WEIGHTCACHE_SOCKET``. Exit status 0 on success, 1 on an error (printed to stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from . import _spawn, acquire, evict, load, status, verify
from ._errors import WeightcacheError


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _status(args: argparse.Namespace) -> int:
    st = status(socket=args.socket)
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(f"weightcached {st.get('version', '')}, backend {st.get('backend', '')}; known models: "
          + (", ".join(st.get("known_models", [])) or "(none)"))
    # The counters weightcachectl status prints, in its order (proto3 JSON drops zeros).
    counters = [("hits", "hit"), ("peer_copies", "peer copy"), ("misses", "miss"),
                ("mismatches", "mismatch"), ("stale", "stale"), ("rejected", "rejected"),
                ("denied", "denied"), ("errors", "error")]
    print("acquire: " + ", ".join(f"{int(st.get('acquire_' + key, 0))} {label}"
                                  for key, label in counters))
    rows = [("MODEL", "TP", "STATE", "SIZE", "TENSORS", "LEASES", "DEVICE", "FINGERPRINT")]
    for e in st.get("entries", []):
        lay = e.get("layout", {})
        rows.append((e.get("model", ""), f"{lay.get('tp_rank', 0)}/{lay.get('tp_size', 1) or 1}",
                     e.get("state", ""), _gib(int(e.get("bytes", 0))), str(e.get("tensors", 0)),
                     str(len(e.get("leases", []))), e.get("device_uuid", "") or "host",
                     e.get("fingerprint", "")[:12]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def _load(args: argparse.Namespace) -> int:
    spec = ""
    if args.spec:
        with open(args.spec) as f:
            spec = f.read()
    elif not args.model:
        raise WeightcacheError("load: give MODEL or --spec FILE")

    def progress(p: dict) -> None:
        if sys.stderr.isatty():
            print(f"\r{p['state']} {_gib(p['bytes_done'])} / {_gib(p['bytes_total'])} "
                  f"{p['current_file']}", end="", file=sys.stderr)

    load(args.model or "", spec_yaml=spec, socket=args.socket, on_progress=progress)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"loaded {args.model or args.spec}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    with acquire(args.model, tp_rank=args.tp_rank, tp_size=args.tp_size, socket=args.socket,
                 mode="client", load_on_miss=args.load_on_miss) as w:
        model_dir = args.model_dir or w.model_dir
        r = verify(w, model_dir, tp_rank=w.tp_rank, tp_size=w.tp_size)
        print(f"{w.model} tp {w.tp_rank}/{w.tp_size} ({w.backend}): {r.checked} tensors, "
              f"{_gib(r.bytes)} compared with {model_dir}; {len(r.fused_views)} fused views")
    for f in r.failures:
        print(f"MISMATCH {f}")
    if r.failures:
        print(f"verify: {len(r.failures)} tensor(s) differ", file=sys.stderr)
        return 1
    print("verify: every tensor equals the checkpoint")
    return 0


def _evict(args: argparse.Namespace) -> int:
    n = evict(args.model or "", fingerprint=args.fingerprint or "", socket=args.socket)
    print(f"evicted {n} entr{'y' if n == 1 else 'ies'}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    pid = _spawn.stop()
    print(f"stopped weightcached (pid {pid})" if pid else
          f"no spawned weightcached in {_spawn.spawn_dir()}")
    return 0


def _node_probes(args: argparse.Namespace) -> int:
    from . import probes

    if args.write:
        try:
            path = probes.write(args.write)
        except (probes.ProbeError, OSError) as e:
            raise WeightcacheError(f"node-probes --write {args.write}: {e}") from e
        print(f"wrote {path}")
    else:
        print(json.dumps(probes.decide().as_json(), sort_keys=True))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m weightcache", description=__doc__.split("\n")[0])
    p.add_argument("--socket", help="control.sock or its directory (default $WEIGHTCACHE_SOCKET)")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("status", help="cache entries, leases and counters")
    s.add_argument("--json", action="store_true", help="the raw StatusResponse as JSON")
    s.set_defaults(run=_status)
    s = sub.add_parser("load", help="load a known model or a spec file, with progress")
    s.add_argument("model", nargs="?")
    s.add_argument("--spec", help="a spec file (YAML or JSON)")
    s.set_defaults(run=_load)
    s = sub.add_parser("verify", help="map a model-rank and compare every byte with its files")
    s.add_argument("model")
    s.add_argument("--tp-rank", type=int, default=0)
    s.add_argument("--tp-size", type=int, default=1)
    s.add_argument("--model-dir", help="checkpoint directory (default: the daemon's)")
    s.add_argument("--load-on-miss", action="store_true")
    s.set_defaults(run=_verify)
    s = sub.add_parser("evict", help="drop a model's (or a fingerprint's) entries")
    s.add_argument("model", nargs="?")
    s.add_argument("--fingerprint")
    s.set_defaults(run=_evict)
    s = sub.add_parser("stop", help="stop the daemon spawn mode started for this user")
    s.set_defaults(run=_stop)
    s = sub.add_parser("node-probes", help="the node's answers to torch's start-up probes")
    s.add_argument("--write", metavar="DIR",
                   help="write DIR/node-probes.json (the socket dir engines mount)")
    s.set_defaults(run=_node_probes)
    args = p.parse_args(argv)
    try:
        return args.run(args)
    except WeightcacheError as e:
        print(f"weightcache: {type(e).__name__}: {e.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
