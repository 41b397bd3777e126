"""`SqlError`: a query the front end refuses, as one line that points into the SQL text."""

from __future__ import annotations

from dppipeline.errors import UsageError, one_line


class SqlError(UsageError):
    """The SQL text breaks a rule of the dialect (or the spec it compiles to): exit code 2,
    nothing read, nothing charged. Renders as `SOURCE:LINE:COLUMN: CONSTRUCT: RULE`, where
    CONSTRUCT names what is at that position (`SUM`, `HAVING`, `option foo`) and RULE says
    what is wrong and what is supported; it never quotes more of the text than a name."""

    def __init__(self, line: int, column: int, construct: str, rule: str, source: str = "query"):
        self.line = line
        self.column = column
        self.construct = construct
        self.rule = rule
        self.source = source
        super().__init__(one_line(f"{source}:{line}:{column}: {construct}: {rule}"))

    def with_source(self, source: str) -> SqlError:
        """The same error naming `source` (the query's file) instead."""
        return SqlError(self.line, self.column, self.construct, self.rule, source)
