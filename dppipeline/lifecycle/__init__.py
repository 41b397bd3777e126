"""The release lifecycle: one run from plan to publication (`runner.py`), the ledger charge
around it, where a release goes (`targets.py`), how it becomes visible (`publication.py`,
`store_publication.py`), and the signals and failpoints that interrupt it."""
