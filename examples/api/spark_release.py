"""An existing Spark job: its DataFrame released in its own session (docs/tutorials/python-api.md).

python examples/api/spark_release.py data/tx
"""

import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import dppipeline

spark = SparkSession.builder.master("local[2]").appName("bank-etl").getOrCreate()
# ... the job's own steps: here, only card payments of January
tx = spark.read.parquet(sys.argv[1]).where(F.col("TX_DATETIME") < "2026-01-16")
release = dppipeline.release(
    {
        "name": "terminal_stats",
        "metrics": ["count", "sum"],
        "budget": {"epsilon": 1.0, "delta": 1.0e-6},
        "bounds": {
            "max_partitions_contributed": 10,
            "max_contributions_per_partition": 10,
            "min_value": 0,
            "max_value": 200,
        },
        "partition_selection": {"public_partitions": "0..999"},
    },
    tx,
    ledger="ledger.sqlite",
    scope="bank.transactions/CUSTOMER_ID",
    dataset_id="tx-2026-01-01-to-15",
)
stats = release.datasets["terminal_stats"]  # a Spark DataFrame in `spark`
stats.orderBy("TERMINAL_ID").show(5)
print(stats.sparkSession is spark, release.manifest.released_partitions)
