"""A notebook's release: pandas DataFrame in, pandas DataFrames out (docs/tutorials/python-api.md).

dppipeline generate --output data/tx --days 30
python examples/api/pandas_release.py data/tx
"""

import sys

import pandas as pd

import dppipeline

rows = pd.read_parquet(sys.argv[1], columns=["CUSTOMER_ID", "TERMINAL_ID", "TX_AMOUNT"])
job = dppipeline.load_job("""
name: terminal_stats
metrics: [count, mean]
confidence_intervals: true
budget: {epsilon: 5.0, delta: 1.0e-6}
bounds: {max_partitions_contributed: 4, max_contributions_per_partition: 4,
         min_value: 0, max_value: 200}
partition_selection: {public_partitions: "0..999"}
""")
for m in dppipeline.plan(job).query("terminal_stats"):
    print(f"{m.mechanism}: epsilon {m.epsilon:g}, noise std {m.noise_std}")
scope = "bank.transactions/CUSTOMER_ID"  # what the ledger's cap protects
release = dppipeline.release(job, rows, ledger="ledger.sqlite", scope=scope)
print(release)
