"""Studies of a job before it is run for real: `tune` (DP statistics that recommend bounds;
charges the ledger) and `evaluate` (error against epsilon on non-sensitive data)."""
