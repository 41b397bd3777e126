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
from bench._report import fmt as fmt_number

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
        ("bank_over_ours", "bank job / one query"),
    ),
    "spark_engine": (
        ("ours_over_baseline", "ours / groupBy"),
        ("sampled_over_baseline", "sampled Linf / groupBy"),
        ("pipelinedp_over_ours", "PipelineDP / ours"),
        ("bank_over_ours", "bank job / one query"),
        ("bank_sampled_over_sampled", "bank job / one query, sampled"),
    ),
    "beam_engine": (
        ("ours_over_baseline", "ours / CombinePerKey"),
        ("pipelinedp_over_ours", "PipelineDP / ours"),
        ("bank_over_ours", "bank job / one query"),
    ),
}


# Issue 35's targets: (benchmark, JSON ratio key, target, {size: limit}); "<=" unless the key is
# a PipelineDP-over-ours speed-up, where the ratio must reach the limit.
TARGETS = (
    (
        "spark_engine",
        "ours_over_baseline",
        "Spark default / groupBy",
        {"5M": 1.2, "20M": 1.2, "100M": 1.2},
    ),
    (
        "local_engine",
        "ours_over_duckdb",
        "local default / DuckDB",
        {"5M": 5.0, "20M": 5.0, "100M": 8.0},
    ),
    ("beam_engine", "pipelinedp_over_ours", "Beam: PipelineDP / ours", {"1M": 5.0, "5M": 5.0}),
    ("spark_engine", "bank_over_ours", "Spark bank job / one query", {"5M": 1.5, "20M": 1.5}),
    ("local_engine", "bank_over_ours", "local bank job / one query", {"5M": 3.0, "20M": 3.0}),
)
LOCAL_PEAK_LIMIT_MB = 2048.0  # the local default job's peak at 100M rows


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


def _ratio(report: dict[str, Any] | None, key: str, size: str) -> float | None:
    if report is None:
        return None
    return next((r.get(key) for r in report["ratios"] if r["label"] == size), None)


def target_rows(reports: dict[str, dict[str, Any] | None]) -> list[list[str]]:
    """Each target of issue 35 with the ratio this run measured and whether it is met."""
    rows = []
    for name, key, target, limits in TARGETS:
        speed_up = key.startswith("pipelinedp_over")
        for size, limit in limits.items():
            value = _ratio(reports.get(name), key, size)
            met = None if value is None else (value >= limit if speed_up else value <= limit)
            bound = f">= {limit:g}x" if speed_up else f"<= {limit:g}x"
            status = "not run" if met is None else ("met" if met else "missed")
            rows.append([target, size, bound, fmt_ratio(value, ".2f"), status])
        if name == "spark_engine" and key == "ours_over_baseline":
            at_20m, at_100m = (_ratio(reports.get(name), key, s) for s in ("20M", "100M"))
            status = "not run"
            if at_20m is not None and at_100m is not None:
                status = "met" if at_100m <= at_20m else "missed"
            rows.append([target, "100M vs 20M", "not above 20M", fmt_ratio(at_100m, ".2f"), status])
    local = reports.get("local_engine")
    peak = None
    if local is not None:
        peak = next(
            (
                t["peak_mb"]
                for t in local["timings"]
                if t["label"] == "100M"
                and t["program"] == local.get("ours_program", "dppipeline local")
            ),
            None,
        )
    status = "not run" if peak is None else ("met" if peak <= LOCAL_PEAK_LIMIT_MB else "missed")
    shown = "-" if peak is None else f"{peak:,.0f} MB"
    rows.append(["local default peak memory", "100M", "<= 2,048 MB", shown, status])
    return rows


def accuracy_rows(engine: str, report: dict[str, Any]) -> list[list[str]]:
    """Per size and released program: count and sum RMSE per terminal against the exact bounded
    values, and the noise's standard deviation."""
    rows = []
    for s in report.get("sanity", []):
        for key in [k for k in s if k.endswith("_count_rmse")]:
            prefix = key.removesuffix("_count_rmse")
            rows.append(
                [
                    engine,
                    s["label"],
                    prefix,
                    fmt_number(s.get(key), ",.1f"),
                    fmt_number(s.get("count_noise_sd"), ",.1f"),
                    fmt_number(s.get(f"{prefix}_sum_rmse"), ",.0f"),
                    fmt_number(s.get("sum_noise_sd"), ",.0f"),
                ]
            )
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
    targets = target_rows({n: r for _, n, r in found})
    accuracy = [row for e, _, r in reports for row in accuracy_rows(e, r)]
    when = ", ".join(f"{n}: {r['args'].get('finished_at', '?')}" for _, n, r in reports)
    loads = ", ".join(f"{n}: {r['args'].get('loadavg_at_start', ['?'])[0]}" for _, n, r in reports)
    notes = [
        "Median wall time of each process from start to exit (seconds) and the peak memory of "
        "its process tree (MB), per input size; - = not run at that size.",
        f"From bench/results/*.json ({when}).",
        f"Load average (1 min) at each benchmark's start: {loads}.",
    ]
    if missing:
        notes.append(f"Not run: {', '.join(missing)}.")
    tables = [
        ("Every engine, whole process", headers, timings),
        ("Ratios (median seconds)", ["engine", "ratio", *sizes], ratios),
        ("Issue 35's targets", ["target", "size", "limit", "measured", "status"], targets),
        (
            "Accuracy: RMSE per terminal against the exact bounded values (last run)",
            [
                "engine",
                "size",
                "program",
                "count RMSE",
                "count noise sd",
                "sum RMSE",
                "sum noise sd",
            ],
            accuracy,
        ),
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
