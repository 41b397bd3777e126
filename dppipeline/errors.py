"""Errors a user can act on; the CLI prints them as one line, without a traceback.

Exit codes follow the CLI contract: 2 for usage errors (flags, job spec), 1 for input errors
(missing or bad data, an existing release, a budget refused).
"""


class DPPipelineError(Exception):
    """Base class: a message meant for the user, and the exit code it maps to."""

    exit_code = 1


class UsageError(DPPipelineError):
    """The command line or the job spec is wrong: fix the invocation, not the data."""

    exit_code = 2


class SpecError(UsageError):
    """A job spec field breaks a rule; the message names the field and the rule."""

    def __init__(self, field: str, rule: str):
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class InputError(DPPipelineError):
    """The input data is missing or invalid (names the file, row or field)."""


class OutputError(DPPipelineError):
    """The output location cannot be written as asked (e.g. a release already exists)."""
