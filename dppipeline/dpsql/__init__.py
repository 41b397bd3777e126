"""The DP SQL front end: BigQuery's `SELECT WITH DIFFERENTIAL_PRIVACY` onto the job spec.

Named `dpsql`, not `sql`: `dppipeline.sql(query, data)` is the public API's function, and a
subpackage `dppipeline.sql` would replace it as an attribute of `dppipeline` once imported.

`dialect.py` reads the text (sqlglot's tokens, our grammar of the DP select), `compile.py`
turns what it read into the same spec data a YAML file gives and validates it as the YAML's
spec is validated, `errors.py` is the one-line error that points at line:column. Nothing here
reads data or touches a ledger: the compiled JobSpec runs through the same runner as YAML.
"""
