"""One table of every engine's benchmark: `make bench` prints it last.

Reads what `bench.local_engine`, `bench.spark_engine` and `bench.beam_engine` wrote to
`bench/results/<name>.json` in this run (each keeps its own detailed report beside it) and
prints, per contender and size, the median wall time of the whole process and its peak memory,
then each engine's ratios. A benchmark that did not run is named, not guessed.
Run with `python -m bench.summary`; writes `bench/results/summary.md` too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._harness import RESULTS_DIR, SIZE_ORDER
from bench._report import _table_md, _table_text, fmt_ratio

BENCHMARKS = (
    ("local", "local_engine"),
    ("Spark local[2]", "spark_engine"),
    ("Beam", "beam_engine"),
)
# Each engine's ratios, in the order shown: (JSON key, column).
RATIOS = {
    "local_engine": (
        ("ours_over_duckdb", "ours / DuckDB"),
        ("pipelinedp_over_ours", "PipelineDP / ours"),
        ("bank_over_ours", "12 queries / 1"),
    ),
    "spark_engine": (
        ("ours_over_baseline", "ours / groupBy"),
        ("sampled_over_baseline", "sampled Linf / groupBy"),
        ("pipelinedp_over_ours", "PipelineDP / ours"),
        ("bank_over_ours", "12 queries / 1"),
        ("bank_sampled_over_sampled", "12 queries / 1, sampled"),
    ),
    "beam_engine": (
        ("ours_over_baseline", "ours / CombinePerKey"),
        ("pipelinedp_over_ours", "PipelineDP / ours"),
        ("bank_over_ours", "12 queries / 1"),
    ),
}


def load(name: str, results: Path) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def sizes_of(reports: Sequence[dict[str, Any]]) -> list[str]:
    labels = {t["label"] for r in reports for t in r["timings"]}
    return [s for s in SIZE_ORDER if s in labels]


def timing_rows(engine: str, report: dict[str, Any], sizes: Sequence[str]) -> list[list[str]]:
    """One row per program: engine, program, then (seconds, peak MB) per size."""
    programs = list(dict.fromkeys(t["program"] for t in report["timings"]))
    rows = []
    for program in programs:
        cells = [engine, program]
        for size in sizes:
            t = next(
                (t for t in report["timings"] if (t["label"], t["program"]) == (size, program)),
                None,
            )
            if t is None or t["median_s"] is None:
                cells += ["-", "-"] if t is None else ["failed", "-"]
            else:
                cells += [f"{t['median_s']:.1f}", f"{t['peak_mb']:,.0f}"]
        rows.append(cells)
    return rows


def ratio_rows(
    engine: str, name: str, report: dict[str, Any], sizes: Sequence[str]
) -> list[list[str]]:
    rows = []
    for key, column in RATIOS[name]:
        cells = [engine, column]
        for size in sizes:
            r = next((r for r in report["ratios"] if r["label"] == size), None)
            cells.append("-" if r is None else fmt_ratio(r.get(key), ".2f"))
        rows.append(cells)
    return rows


def summary(results: Path = RESULTS_DIR) -> tuple[str, str]:
    """(text, Markdown) of the combined tables."""
    found = [(engine, name, load(name, results)) for engine, name in BENCHMARKS]
    reports = [(e, n, r) for e, n, r in found if r is not None]
    missing = [n for _, n, r in found if r is None]
    sizes = sizes_of([r for _, _, r in reports])
    headers = ["engine", "program"]
    for size in sizes:
        headers += [f"{size} s", f"{size} MB"]
    timings = [row for e, _, r in reports for row in timing_rows(e, r, sizes)]
    ratios = [row for e, n, r in reports for row in ratio_rows(e, n, r, sizes)]
    when = ", ".join(f"{n}: {r['args'].get('finished_at', '?')}" for _, n, r in reports)
    notes = [
        "Median wall time of each process from start to exit (seconds) and the peak memory of "
        "its process tree (MB), per input size; - = not run at that size.",
        f"From bench/results/*.json ({when}).",
    ]
    if missing:
        notes.append(f"Not run: {', '.join(missing)}.")
    tables = [
        ("Every engine, whole process", headers, timings),
        ("Ratios (median seconds)", ["engine", "ratio", *sizes], ratios),
    ]
    text = "\n".join([*notes, *(f"\n{title}\n{_table_text(h, rows)}" for title, h, rows in tables)])
    md = "\n".join(
        ["# Benchmark summary", "", *notes]
        + [f"\n## {title}\n\n{_table_md(h, rows)}" for title, h, rows in tables]
    )
    return text, md + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    del argv
    text, md = summary()
    print(text)
    (RESULTS_DIR / "summary.md").write_text(md)
    print(f"wrote {RESULTS_DIR / 'summary.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
