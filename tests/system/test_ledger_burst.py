"""Issue 32 case 1: a burst of runs racing for one capped scope on a loaded machine, on SQLite
and on PostgreSQL. Before, on SQLite, a reservation held the write lock while it loaded
dp_accounting and composed the scope (seconds on a loaded machine): other runs gave up after
the default 10 s wait, among them runs that had read their data and were committing (16 racers
for 3 releases: 1 committed, 2 "failed after reading (charged)"), and runs in other scopes failed
"locked" too. Now exactly the cap's releases commit, every other racer is refused before reading
(exit 3, or 75 while a live reservation holds the budget), nothing is charged without a release,
and the other scope's runs are unaffected. See `ledger_burst.py` for how the racers run."""

from __future__ import annotations

import datetime as dt

import pytest
from support.data import SMALL
from support.ledger_burst import CAP, OTHER, SCOPE, race

from dppipeline.storage.releases import published_run_id
from dppipeline.synthetic.transactions import generate


@pytest.mark.slow
def test_a_burst_commits_exactly_what_the_cap_allows(ledger_url, small_inputs, tmp_path):
    other_data = generate(
        tmp_path / "other-data", fmt="parquet", start_date=dt.date(2026, 1, 1),
        **{**SMALL, "seed": 12},
    ).output  # fmt: skip
    burst = race(ledger_url, (small_inputs["parquet"], other_data), tmp_path / "out")

    assert burst.tracebacks == []
    racers = burst.of("racer")
    winners = sorted(name for name, code in racers.items() if code == 0)
    assert len(winners) == int(CAP), burst.last_lines
    for name, code in racers.items():
        if name in winners:
            continue
        line = burst.last_lines[name]
        assert code in (3, 75), (name, code, line)  # refused: never "locked", never failed
        assert ("exhausted" in line) if code == 3 else ("held by run" in line), line
        assert not (tmp_path / "out" / name).exists()

    states = burst.states[SCOPE]
    committed = [run for run, state in states.items() if state == "committed"]
    assert len(committed) == int(CAP)
    # Every other row is a reservation given back before reading: none read, none charged.
    assert {s for s in states.values() if s != "committed"} <= {"aborted"}, states
    for run in committed:  # charged means released: each commit is a published release
        assert published_run_id(burst.outputs[run]) == run

    assert set(burst.of("other").values()) == {0}, burst.last_lines
    assert set(burst.states[OTHER].values()) == {"committed"}
