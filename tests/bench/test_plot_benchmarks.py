"""bench/plot_benchmarks.py on the made-up fixture: the two PNGs are written, and the
generated block of benchmarks.md is replaced in place (stale figures gone, the text around it
kept, a second run leaves the file byte for byte the same)."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed "
                    "(scripts/install-deps.sh --test)")

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def load_script():
    spec = importlib.util.spec_from_file_location("plot_benchmarks",
                                                  ROOT / "bench" / "plot_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(plot, docs: Path) -> None:
    assert plot.main([f"--results={FIXTURES / 'results.jsonl'}",
                      f"--machine={FIXTURES / 'machine.json'}", f"--docs={docs}"]) == 0


def test_plots_and_block_replaced_idempotently(tmp_path: Path) -> None:
    plot = load_script()
    docs = tmp_path / "docs"
    docs.mkdir()
    md = docs / "benchmarks.md"
    md.write_text(f"# Benchmarks\n\nbefore\n\n{plot.BEGIN}\n| stale | 999.99 |\n{plot.END}\n\n"
                  "## after\n\nkept\n")
    run(plot, docs)
    for name in (plot.MAP_PNG, plot.LOAD_PNG):
        png = docs / "plots" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert png.stat().st_size > 10_000, name
    first = md.read_text()
    assert "999.99" not in first
    assert first.startswith("# Benchmarks\n\nbefore\n\n" + plot.BEGIN)
    assert first.endswith(plot.END + "\n\n## after\n\nkept\n")
    assert first.count(plot.BEGIN) == 1 and first.count(plot.END) == 1
    # Figures of each bench reach the tables: a load row, a concurrency verdict, a skip.
    assert "| 32.02 | hot | weightcache | 4 | 16:256:4:auto |" in first
    assert "**not met**" in first and "| met |" in first
    assert "skipped: needs 122.4 GiB of GPU memory" in first
    assert "commit `0000000`" in first and "made-up reason" in first
    run(plot, docs)
    assert md.read_text() == first


def test_block_appended_when_markers_are_missing(tmp_path: Path) -> None:
    plot = load_script()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "benchmarks.md").write_text("# Benchmarks\n\nhand-written\n")
    assert plot.main([f"--results={FIXTURES / 'results.jsonl'}", f"--docs={docs}",
                      "--no-plots"]) == 0
    text = (docs / "benchmarks.md").read_text()
    assert text.startswith("# Benchmarks\n\nhand-written\n\n## All benchmarks in one run")
    assert text.endswith(plot.END + "\n")
    assert not (docs / "plots").exists()


def test_bad_lines_are_left_out(tmp_path: Path) -> None:
    plot = load_script()
    f = tmp_path / "r.jsonl"
    shutil.copy(FIXTURES / "results.jsonl", f)
    with f.open("a") as out:
        out.write("not json\n{\"bench\": \"other\"}\n\n")
    assert len(plot.read_rows([f])) == len(plot.read_rows([FIXTURES / "results.jsonl"]))
