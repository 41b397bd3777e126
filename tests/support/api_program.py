"""A program that uses only dppipeline's public API; `mypy --strict` must pass on it
(tests/unit/api/test_api.py). It also runs: `python tests/support/api_program.py`."""

from __future__ import annotations

import datetime as dt

import polars as pl

import dppipeline


def main() -> None:
    rows = pl.DataFrame(
        {
            "CUSTOMER_ID": [1, 1, 2, 3],
            "TERMINAL_ID": [7, 8, 7, 7],
            "TX_AMOUNT": [10.0, 20.0, 30.0, 40.0],
            "TX_DATETIME": [dt.datetime(2026, 1, 1, 9)] * 4,
        }
    )
    job: dppipeline.Job = dppipeline.load_job(
        dppipeline.query(
            metrics=["count", "sum"],
            group_by=["TERMINAL_ID"],
            min_value=0.0,
            max_value=100.0,
            max_partitions_contributed=2,
            max_contributions_per_partition=2,
            public_keys=[7, 8],
            name="terminals",
        ),
        budget__epsilon=1.0,
    )
    plan: dppipeline.Plan = dppipeline.plan(job)
    for mechanism in plan.query("terminals"):
        std: float | None = mechanism.noise_std
        print(mechanism.mechanism, mechanism.epsilon, std)
    release: dppipeline.Release[pl.DataFrame] = dppipeline.release(job, rows, ledger=False, seed=1)
    released: pl.DataFrame = release.datasets["terminals"]
    partitions: int = release.manifest.released_partitions
    print(released.height, partitions)
    try:
        session = dppipeline.Session(rows, ledger="ledger.sqlite", scope="demo", cap=1.0)
        session.release(job, epsilon=2.0)
    except dppipeline.BudgetExceeded as refused:
        left: float | None = refused.remaining_epsilon
        print("refused; left:", left, session.remaining().epsilon)
    except dppipeline.DPPipelineError as error:
        print(error)


if __name__ == "__main__":
    main()
