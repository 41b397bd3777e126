"""Beam entry point: the same job spec and flags as `dppipeline run`, on any Beam runner.

    python jobs/beam_terminal_stats.py --config jobs/configs/terminal_stats.yaml \\
        --input DIR --output DIR [Beam pipeline options]

Arguments that `dppipeline run` does not define are standard Beam pipeline options:
DirectRunner by default (`--direct_running_mode=multi_processing --direct_num_workers=2` to
use two processes), or e.g. `--runner=FlinkRunner --flink_master=host:8081` /
`--runner=DataflowRunner --project=... --region=... --temp_location=gs://...`, with
`--setup_file=./setup.py` or `--requirements_file=requirements.lock` to ship the package and
its dependencies to the workers. Exit codes and error lines are those of `dppipeline run`.
"""

import sys

from dppipeline.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["run", "--engine", "beam", *sys.argv[1:]]))
