"""An existing Beam pipeline: ReleaseTransform on its PCollection (docs/tutorials/python-api.md).

python examples/api/beam_release.py data/tx/date=2026-01-01   # one day: Create is slow
"""

import sys

import apache_beam as beam
import pyarrow.parquet as pq

import dppipeline
from dppipeline.beam import ReleaseTransform

job = dppipeline.load_job(
    {
        "name": "terminal_counts",
        "metrics": ["count"],
        "budget": {"epsilon": 1.0, "delta": 1.0e-6},
        "bounds": {"max_partitions_contributed": 10, "max_contributions_per_partition": 10},
        "partition_selection": {"public_partitions": "0..999"},
    }
)
columns = ["CUSTOMER_ID", "TERMINAL_ID"]
rows = pq.read_table(sys.argv[1], columns=columns).to_pylist()  # the pipeline's own source
with beam.Pipeline() as pipeline:
    release = ReleaseTransform(job, ledger="ledger.sqlite", scope="bank.transactions/CUSTOMER_ID")
    released = (
        pipeline
        | "Transactions" >> beam.Create(rows)
        | "DP" >> release  # the ledger is charged here, when the transform is applied
    )
    print("charged:", release.run_id, release.manifest.epsilon)
    _ = (
        released["terminal_counts"]
        | beam.Filter(lambda row: row["TERMINAL_ID"] < 3)
        | beam.Map(print)
    )
