"""`python -m dppipeline` is the `dppipeline` console script."""

from dppipeline.cli import main

raise SystemExit(main())
