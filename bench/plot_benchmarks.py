#!/usr/bin/env python3
"""Plots and tables from bench/run-all's results (issue 17, item 6).

    python3 bench/plot_benchmarks.py --results=OUT/results.jsonl [--results=OUT2/results.jsonl]
        [--machine=OUT/machine.json ...] [--docs=docs] [--no-plots]

Reads the JSON lines the benchmarks append (one object per line; the contract is below) and
the machine.json files run-all writes, then
  * writes DOCS/plots/map_time_vs_size.png (Acquire -> every tensor mapped vs weights' size,
    a line per tensor count; beside it the concurrency p50/p99) and
    DOCS/plots/load_gbps_vs_size.png (load GB/s vs size, a line per tp size, hot and cold,
    with safetensors.torch.load_file of the same run as the baseline);
  * prints the Markdown tables and writes them into DOCS/benchmarks.md between the markers
    `<!-- bench/run-all: begin -->` and `<!-- bench/run-all: end -->`, replacing what was
    there (appended as a new section when the markers are missing). Same inputs, same file.

Rows (extra keys are allowed and ignored unless named here):
  {"bench": "acquire", "backend": "cuda"|"host", "size_gib", "tensors", "ms_p50", "ms_min",
   "ms_max", "reps", ["segments"], ["rpc_tensors_ms", "rpc_packed_ms"], ["skipped": reason]}
  {"bench": "concurrency", "backend", "size_gib", "tensors", "engines", "state": "cold"|"warm",
   "ms_p50", "ms_p99", "ms_max", "loads", ["load_s"], ["segments"]}
  {"bench": "load", "size_gib", "tp", "state": "hot"|"cold",
   "path": "weightcache"|"safetensors"|"raw_read", "config", "seconds", "gbps",
   ["per_rank_gbps"]}
Runs with /usr/bin/python3 and Debian's python3-matplotlib (scripts/install-deps.sh --test);
--no-plots needs no matplotlib.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

BEGIN = "<!-- bench/run-all: begin -->"
END = "<!-- bench/run-all: end -->"
MAP_PNG = "map_time_vs_size.png"
LOAD_PNG = "load_gbps_vs_size.png"

Row = dict[str, Any]


def read_rows(paths: Iterable[Path]) -> list[Row]:
    rows: list[Row] = []
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"{path}:{n}: not JSON, left out: {e}", file=sys.stderr)
                continue
            if isinstance(row, dict) and row.get("bench") in ("acquire", "concurrency", "load"):
                rows.append(row)
            else:
                print(f"{path}:{n}: no known 'bench', left out", file=sys.stderr)
    return rows


def by_bench(rows: list[Row], bench: str, measured: bool = True) -> list[Row]:
    """The rows of one bench; measured=True leaves out skipped rows."""
    return [r for r in rows if r["bench"] == bench and (not measured or "skipped" not in r)]


def fmt(x: Any, digits: int = 2) -> str:
    if x is None or x == "":
        return ""
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def size(g: float) -> str:
    return f"{g:g}"


def table(header: list[str], align: str, body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def size_axis(ax, sizes: Iterable[float], label: str) -> None:
    """A log2 x axis ticked at the sizes measured, in plain numbers."""
    ticks = sorted(set(sizes))
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks, [size(t) for t in ticks])
        ax.minorticks_off()
    ax.set_xlabel(label)


def best_load(rows: list[Row]) -> dict[tuple, Row]:
    """The fastest row per (path, tp, state, size): what the plot draws."""
    best: dict[tuple, Row] = {}
    for r in by_bench(rows, "load"):
        key = (r["path"], int(r.get("tp", 1)), r["state"], float(r["size_gib"]))
        if key not in best or float(r["gbps"]) > float(best[key]["gbps"]):
            best[key] = r
    return best


# ---- plots ----


def plot_map(rows: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acq = by_bench(rows, "acquire")
    conc = by_bench(rows, "concurrency")
    panels = 2 if conc else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 4.4), squeeze=False)
    ax = axes[0][0]
    lines: dict[tuple, list[Row]] = defaultdict(list)
    for r in acq:
        lines[(r["backend"], int(r["tensors"]))].append(r)
    for (backend, tensors), rs in sorted(lines.items()):
        rs.sort(key=lambda r: float(r["size_gib"]))
        x = [float(r["size_gib"]) for r in rs]
        y = [float(r["ms_p50"]) for r in rs]
        lo = [max(0.0, y[i] - float(r.get("ms_min", y[i]))) for i, r in enumerate(rs)]
        hi = [max(0.0, float(r.get("ms_max", y[i])) - y[i]) for i, r in enumerate(rs)]
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3,
                    linestyle="-" if backend == "cuda" else "--",
                    label=f"{backend}, {tensors:,} tensors")
    size_axis(ax, [float(r["size_gib"]) for r in acq], "weights (GiB)")
    ax.set_ylabel("Acquire -> every tensor mapped (ms)")
    ax.set_title("One engine: median, min-max bars")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if lines:
        ax.legend(fontsize=8)
    if conc:
        ax = axes[0][1]
        groups: dict[tuple, list[Row]] = defaultdict(list)
        for r in conc:
            groups[(r["backend"], r["state"], int(r["engines"]))].append(r)
        markers = {"warm": "o", "cold": "s"}
        for i, ((backend, state, engines), rs) in enumerate(sorted(groups.items())):
            rs.sort(key=lambda r: float(r["size_gib"]))
            x = [float(r["size_gib"]) for r in rs]
            color = f"C{i}"
            ax.plot(x, [float(r["ms_p50"]) for r in rs], marker=markers.get(state, "^"),
                    color=color, label=f"{backend} {state}, {engines} engines: p50")
            ax.plot(x, [float(r["ms_p99"]) for r in rs], marker=markers.get(state, "^"),
                    color=color, linestyle=":", fillstyle="none", label="  p99")
        ax.axhline(100, color="grey", linewidth=0.8, linestyle="--", label="goal: p99 100 ms")
        size_axis(ax, [float(r["size_gib"]) for r in conc], "weights (GiB)")
        ax.set_ylabel("Acquire -> mapped, per engine (ms)")
        ax.set_title("Engines starting at once (cold: after the one load)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)


def plot_load(rows: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = best_load(rows)
    fig, axes = plt.subplots(1, 2, figsize=(12.4, 4.6), sharey=False, squeeze=False)
    for ax, state in zip(axes[0], ("hot", "cold")):
        series: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
        for (path, tp, st, g), r in best.items():
            if st == state:
                series[(path, tp)].append((g, float(r["gbps"])))
        tps = sorted({tp for (path, tp) in series if path == "weightcache"})
        for i, tp in enumerate(tps):
            pts = sorted(series[("weightcache", tp)])
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{i}",
                    label=f"weightcache, tp {tp} (node GB/s)")
        for path, style in (("safetensors", ("k", "s", "--")), ("raw_read", ("grey", "^", ":"))):
            for tp in sorted({tp for (p, tp) in series if p == path}):
                pts = sorted(series[(path, tp)])
                label = ("safetensors.torch.load_file" if path == "safetensors"
                         else "raw parallel read") + (f", tp {tp}" if tp != 1 else "")
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=style[0],
                        marker=style[1], linestyle=style[2], label=label)
        size_axis(ax, [k[3] for k in best if k[2] == state], "checkpoint (GiB)")
        ax.set_ylabel("GB/s")
        ax.set_title(f"Load, page cache {state}" if state == "hot" else "Load, cold (disk)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if series:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)


# ---- tables ----


def machine_lines(machines: list[Row]) -> list[str]:
    out = []
    for m in machines:
        out.append(
            f"- {m.get('gpu') or 'no GPU'} (driver {m.get('driver') or '-'}), "
            f"{m.get('nproc', '?')} CPUs, {m.get('memory_gib', '?')} GiB memory, "
            f"{m.get('os', '')}; commit `{m.get('commit', 'unknown')}`, {m.get('date', '')}: "
            f"`{m.get('command', 'bench/run-all')}`"
            + (f", load_bench `{m['load_args']}`" if m.get("load_args") else ""))
        for s in m.get("skipped", []):
            out.append(f"  - skipped {s.get('section')} {s.get('what')}: {s.get('reason')}")
    return out


def render_block(rows: list[Row], machines: list[Row], plots: bool) -> str:
    parts = [
        BEGIN,
        "<!-- Generated by bench/plot_benchmarks.py from bench/run-all's results; edits here "
        "are replaced. -->",
        "",
        "Made by `bench/run-all` (its header has the commands), tables and plots by "
        "`bench/plot_benchmarks.py`. Runs:",
        "",
    ]
    parts += machine_lines(machines) or ["- (no machine.json given)"]
    acq = by_bench(rows, "acquire", measured=False)
    if acq:
        acq.sort(key=lambda r: (r["backend"], float(r["size_gib"]), int(r["tensors"])))
        body = []
        for r in acq:
            if "skipped" in r:
                body.append([r["backend"], size(r["size_gib"]), f"{int(r['tensors']):,}",
                             f"skipped: {r['skipped']}", "", "", "", ""])
            else:
                body.append([r["backend"], size(r["size_gib"]), f"{int(r['tensors']):,}",
                             fmt(r.get("segments")), fmt(r["ms_p50"]), fmt(r.get("ms_min")),
                             fmt(r.get("ms_max")), fmt(r.get("reps"))])
        parts += ["", "**Acquire -> every tensor mapped, one engine** (gpu_acquire_bench, "
                  "acquire_bench)", "",
                  table(["backend", "GiB", "tensors", "segments", "median ms", "min ms",
                         "max ms", "reps"], "lrrrrrrr", body)]
    conc = by_bench(rows, "concurrency", measured=False)
    if conc:
        conc.sort(key=lambda r: (r["backend"], float(r["size_gib"]), int(r["engines"]),
                                 r["state"] != "cold"))
        body = []
        for r in conc:
            goal = "met" if float(r["ms_p99"]) <= 100 else "**not met**"
            body.append([r["backend"], str(r["engines"]), size(r["size_gib"]),
                         f"{int(r['tensors']):,}", r["state"], fmt(r.get("load_s"), 3),
                         fmt(r["ms_p50"]), fmt(r["ms_p99"]), fmt(r["ms_max"]), goal,
                         str(r["loads"])])
        parts += ["", "**Engines acquiring one model at once** (concurrency_bench; cold: "
                  "Acquire -> mapped counted from the model ready, the load apart; loads: "
                  "loads the daemon did per repetition, 1 cold and 0 warm expected)", "",
                  table(["backend", "engines", "GiB", "tensors", "state", "load s", "p50 ms",
                         "p99 ms", "max ms", "p99 <= 100 ms", "loads"], "lrrrlrrrrlr", body)]
    load = by_bench(rows, "load")
    if load:
        load.sort(key=lambda r: (float(r["size_gib"]), r["state"] != "cold", r["path"],
                                 int(r.get("tp", 1)), str(r.get("config", ""))))
        base = {(float(r["size_gib"]), r["state"]): float(r["gbps"])
                for r in load if r["path"] == "safetensors"}
        body = []
        for r in load:
            b = base.get((float(r["size_gib"]), r["state"]))
            vs = f"{float(r['gbps']) / b:.2f}x" if b and r["path"] == "weightcache" else ""
            body.append([size(r["size_gib"]), r["state"], r["path"], str(r.get("tp", 1)),
                         str(r.get("config", "")), fmt(r.get("seconds")), fmt(r["gbps"]),
                         fmt(r.get("per_rank_gbps")), vs])
        parts += ["", "**Load into GPU memory** (load_bench; GB/s for the whole node, "
                  "per rank beside it; vs safetensors: the same size and state)", "",
                  table(["GiB", "state", "path", "tp", "config", "s", "GB/s", "per rank GB/s",
                         "vs safetensors"], "rlllrrrrr", body)]
    if plots:
        # The PNGs are generated artifacts, not committed (docs/plots/ is ignored): the block
        # names them and how to draw them from the same results.
        parts += ["", f"Plots: `docs/plots/{MAP_PNG}` (Acquire -> mapped vs size) and "
                  f"`docs/plots/{LOAD_PNG}` (load GB/s vs size), drawn from these results by "
                  "`python3 bench/plot_benchmarks.py --results=... --machine=...` "
                  "(generated, not kept in the repository)."]
    parts += ["", END]
    return "\n".join(parts) + "\n"


def replace_block(doc: Path, block: str) -> None:
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    b, e = text.find(BEGIN), text.find(END)
    if b >= 0 and e > b:
        end = e + len(END)
        if text[end:end + 1] == "\n":
            end += 1
        text = text[:b] + block + text[end:]
    else:
        text = text.rstrip("\n") + "\n\n## All benchmarks in one run (bench/run-all)\n\n" + block
    doc.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", action="append", type=Path, required=True,
                   help="results.jsonl (repeatable)")
    p.add_argument("--machine", action="append", type=Path, default=[],
                   help="machine.json (repeatable)")
    p.add_argument("--docs", type=Path, default=Path(__file__).resolve().parent.parent / "docs",
                   help="the docs folder holding benchmarks.md (plots go to DOCS/plots)")
    p.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib)")
    a = p.parse_args(argv)
    rows = read_rows(a.results)
    machines = [json.loads(m.read_text()) for m in a.machine]
    plots = not a.no_plots
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("matplotlib is missing (Debian: python3-matplotlib, scripts/install-deps.sh "
                  "--test); use --no-plots for the tables alone", file=sys.stderr)
            return 2
        (a.docs / "plots").mkdir(parents=True, exist_ok=True)
        plot_map(rows, a.docs / "plots" / MAP_PNG)
        plot_load(rows, a.docs / "plots" / LOAD_PNG)
    block = render_block(rows, machines, plots)
    replace_block(a.docs / "benchmarks.md", block)
    print(block, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
