"""The `dppipeline` command line: the parser (`parser.py`) and one function per command
(`main.py`, whose `main` is the console script)."""
