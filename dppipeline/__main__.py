"""`python -m dppipeline` is the `dppipeline` console script."""

from dppipeline.cli.main import main

raise SystemExit(main())
