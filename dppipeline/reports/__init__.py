"""What people read about releases and the ledger, from public parameters, released values
and the ledger only: the plan's text, a release's page and charts, the release check and the
budget views."""
