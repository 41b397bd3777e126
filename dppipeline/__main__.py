"""`python -m dppipeline` is the `dppipeline` console script."""

from dppipeline.commands.cli import main

raise SystemExit(main())
