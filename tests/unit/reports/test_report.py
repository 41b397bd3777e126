"""`dppipeline report`: the page shows only what the release and the ledger already hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from support.data import release_small

from dppipeline.cli.main import main
from dppipeline.errors import UsageError
from dppipeline.ledger import Ledger
from dppipeline.reports.release_report import PREVIEW_ROWS, _cell, build_report, fmt

NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")
STATIC = {"95"}  # "95% half-width": the interval level, a public parameter


def page_text(index: Path) -> str:
    """What a reader sees: the page's text, without style sheet, markup and the embedded
    images (the charts are drawn from the same sources)."""
    text = re.sub(r"<style>.*?</style>", " ", index.read_text(), flags=re.S)
    return re.sub(r"<[^>]+>", " ", text)


def leaves(value) -> list:
    if isinstance(value, dict):
        return [x for v in value.values() for x in leaves(v)] + list(value)
    if isinstance(value, list):
        return [x for v in value for x in leaves(v)]
    return [value]


def allowed_numbers(release: Path, ledger: str | None) -> set[str]:
    """Every number token of every value the release and the ledger hold, as the report
    formats them."""
    manifest = json.loads((release / "manifest.json").read_text())
    texts = [fmt(v) for v in leaves(manifest)]
    for query in manifest["queries"].values():
        frame = pd.read_parquet(release / query["dataset"])
        texts += [fmt(_cell(v)) for row in frame.itertuples(index=False) for v in row]
    if ledger is not None:
        for row in Ledger(ledger).rows():
            texts += [fmt(v) for v in (row.run_id, row.epsilon, row.delta)]
            texts += [str(row.start_date), str(row.end_date)]
    return {token for text in texts for token in NUMBER.findall(text)} | STATIC


def unreleased_numbers(index: Path, release: Path, ledger: str | None) -> set[str]:
    return set(NUMBER.findall(page_text(index))) - allowed_numbers(release, ledger)


@pytest.fixture
def released(small_inputs, tmp_path):
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    overrides = {
        "bounds.max_partitions_contributed": 5,
        "bounds.max_contributions_per_partition": 3,
        "confidence_intervals": True,
        "budget.epsilon": 1.0,
    }
    release_small(small_inputs, tmp_path, "local", ledger=ledger, **overrides)
    return tmp_path / "release", ledger


@pytest.mark.slow
def test_report_shows_no_value_that_is_not_released(released, tmp_path):
    release, ledger = released
    index = build_report(release, ledger, tmp_path / "report")
    assert index.name == "index.html"
    assert not unreleased_numbers(index, release, ledger)
    text = page_text(index)
    assert "terminal_stats" in text and "Ledger: scope" in text
    # The first released rows are on the page, as released.
    first = pd.read_parquet(release / "terminal_stats").iloc[0]
    assert fmt(float(first["count"])) in text and fmt(float(first["mean_ci_high"])) in text
    pngs = sorted(p.name for p in (tmp_path / "report").glob("*.png"))
    assert pngs == ["budget_split.png", "ledger_spend.png", "terminal_stats.png"]
    for png in (tmp_path / "report").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_the_check_catches_a_value_that_is_not_released(released, tmp_path):
    """The test above can fail: a true count planted in the page is flagged."""
    release, ledger = released
    index = build_report(release, ledger, tmp_path / "report")
    index.write_text(index.read_text().replace("</body>", "<p>true rows: 1,337,421</p></body>"))
    assert unreleased_numbers(index, release, ledger) == {"1,337,421"}


def test_report_without_ledger_and_preview_size(small_inputs, tmp_path, capsys):
    out, _ = release_small(small_inputs, tmp_path, "local")
    release = tmp_path / "release"
    assert main(["report", str(release), "--no-ledger"]) == 0
    index = Path(capsys.readouterr().out.strip())
    assert index == tmp_path / "release_report" / "index.html"
    assert "released with --no-ledger" in index.read_text()
    assert not unreleased_numbers(index, release, None)
    rows = re.findall(r"<tr>", index.read_text().split("First ")[1])
    assert len(rows) == PREVIEW_ROWS + 1  # header + preview rows
    assert len(out) > PREVIEW_ROWS


def test_report_refuses_to_write_inside_the_release(released):
    release, ledger = released
    with pytest.raises(UsageError, match="inside the release"):
        build_report(release, ledger, release / "report")
