"""spark-submit entry point: the same job spec and flags as `dppipeline run`, on any master.

    spark-submit --master spark://host:7077 jobs/spark_terminal_stats.py \\
        --config jobs/configs/terminal_stats.yaml --input DIR --output DIR

The master and resources come from spark-submit, never from this file. Exit codes and error
lines are those of `dppipeline run`.
"""

import sys

from dppipeline.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["run", "--engine", "spark", *sys.argv[1:]]))
