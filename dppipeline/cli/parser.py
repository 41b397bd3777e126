"""The `dppipeline` parser: its commands and flags, and the job spec the flags give.

The spec's choices (engines, noise kinds, accountings, metrics, ...) come from its own
vocabulary (`spec/vocabulary.py`, `spec/metrics.py`), and each job flag names the spec field it
overrides (`FLAG_FIELDS`), so the parser and the spec cannot disagree. Usage errors are one
line and exit code 2 (`Parser`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeAlias, TypeVar

from dppipeline.errors import SpecError, UsageError, excerpt, one_line
from dppipeline.spec.metrics import METRICS, PARAMETRISED_METRICS
from dppipeline.spec.vocabulary import (
    ACCOUNTINGS,
    COUNT_NOISES,
    ENGINES,
    INPUT_FORMATS,
    INPUT_LAYOUTS,
    LINF_BOUNDINGS,
    NOISE_KINDS,
    SELECTION_STRATEGIES,
    SHIPPED_SCHEMAS,
)

T = TypeVar("T")

# CLI flag -> job spec field (dotted YAML path). Flags override the YAML.
FLAG_FIELDS: dict[str, str] = {
    "input": "input.path",
    "format": "input.format",
    "schema": "input.schema",
    "layout": "input.layout",
    "time_column": "input.time_column",
    "start_date": "input.start_date",
    "end_date": "input.end_date",
    "max_rejected_fraction": "input.max_rejected_fraction",
    "output": "output",
    "privacy_unit": "privacy_unit",
    "partition_key": "partition_key",
    "value": "value",
    "metrics": "metrics",
    "epsilon": "budget.epsilon",
    "delta": "budget.delta",
    "noise": "noise",
    "accounting": "accounting",
    "count_noise": "count_noise",
    "confidence_intervals": "confidence_intervals",
    "max_partitions_contributed": "bounds.max_partitions_contributed",
    "max_contributions_per_partition": "bounds.max_contributions_per_partition",
    "max_contributions": "bounds.max_contributions",
    "linf_bounding": "bounds.linf_bounding",
    "min_value": "bounds.min_value",
    "max_value": "bounds.max_value",
    "public_partitions": "partition_selection.public_partitions",
    "partition_selection": "partition_selection.strategy",
    "pre_threshold": "partition_selection.pre_threshold",
    "scope": "budget.scope",
    "cap_epsilon": "budget.cap_epsilon",
    "cap_delta": "budget.cap_delta",
    "window_days": "budget.window_days",
}
_FIELD_FLAGS = {field: "--" + flag.replace("_", "-") for flag, field in FLAG_FIELDS.items()}


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit code 2, quoting what was
    typed only as excerpts; `-1e308` is a number, not an unknown flag."""

    typed: tuple[str, ...] = ()  # the command line being parsed (set by `main`)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")

    def error(self, message: str) -> NoReturn:
        line = excerpted(f"{self.prog}: error: {message} (see {self.prog} --help)", self.typed)
        self.exit(2, line + "\n")


def excerpted(message: str, typed: Sequence[str]) -> str:
    """The message as one line, every unprintable argument, or one too long for a path, it
    repeats cut to its excerpt (argparse and some messages quote a value whole)."""
    for arg in sorted(set(typed), key=len, reverse=True):
        if len(arg) > _ARG_CHARS or not arg.isprintable():
            short = excerpt(arg, limit=_ARG_CHARS)
            message = message.replace(repr(arg), short).replace(arg, short)
    return one_line(message)


_ARG_CHARS = 200  # an argument quoted whole; longer ones (not a path one would type) are cut


def _date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date YYYY-MM-DD: {text!r}") from None


def _listed(words: Sequence[str], notes: Mapping[str, str] | None = None, default: str = "") -> str:
    """Words of the spec's vocabulary as help text, `a (note, default), b or c`, so that a
    help line lists what the spec accepts, not a copy of it."""
    notes = notes or {}

    def word(w: str) -> str:
        said = [n for n in (notes.get(w, ""), "default" if w == default else "") if n]
        return f"{w} ({', '.join(said)})" if said else w

    shown = [word(w) for w in words]
    return f"{', '.join(shown[:-1])} or {shown[-1]}" if len(shown) > 1 else shown[0]


def _add_privacy_flags(parser: argparse.ArgumentParser) -> None:
    """The job spec's flags (`FLAG_FIELDS`): `run`, `plan`, `tune` and `evaluate` take them."""
    _add_query_flags(parser)
    _add_noise_flags(parser)
    _add_bound_flags(parser)
    _add_selection_flags(parser)


def _add_query_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--config", help="YAML job spec (jobs/configs/terminal_stats.yaml); flags override it")
    add("--privacy-unit", help="column protected by DP (default CUSTOMER_ID)")
    add("--partition-key", help="column whose values are the released partitions")
    add("--value", help="column aggregated by sum and mean (default TX_AMOUNT)")
    add("--metrics", help=f"comma list of {', '.join((*METRICS, *PARAMETRISED_METRICS))}")


def _add_noise_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--epsilon", type=float, help="total epsilon of the run (metrics + selection)")
    add("--delta", type=float, help="total delta of the run")
    add("--noise", choices=NOISE_KINDS, help="noise distribution")
    add(
        "--accounting",
        choices=ACCOUNTINGS,
        help=f"how the mechanisms compose: {_listed(ACCOUNTINGS, default=ACCOUNTINGS[0])} "
        "(dp_accounting)",
    )
    add(
        "--count-noise",
        choices=COUNT_NOISES,
        help="noise on counts: "
        + _listed(
            COUNT_NOISES, {"discrete": "integers", "continuous": "decimals"}, COUNT_NOISES[0]
        ),
    )
    add(
        "--confidence-intervals",
        action="store_true",
        default=None,
        help="release 95%% intervals <metric>_ci_low/_ci_high for count, sum, mean, "
        "privacy_id_count, count_distinct (from the noise distribution: no extra budget)",
    )


def _add_bound_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--max-partitions-contributed", type=int, help="L0: partitions kept per privacy unit")
    add(
        "--max-contributions-per-partition",
        type=int,
        help="Linf: rows kept per privacy unit and partition",
    )
    add(
        "--max-contributions",
        type=int,
        help="rows kept per privacy unit across all partitions (instead of L0 and Linf)",
    )
    add(
        "--linf-bounding",
        choices=LINF_BOUNDINGS,
        help="scale: a pair's count capped at Linf and its sums scaled to match (count, sum, "
        "mean, variance, stddev, privacy_id_count); sample: Linf rows kept per pair. Unset: "
        "scale where a query allows it, else sample",
    )
    add("--min-value", type=float, help="lower clipping bound (sum, mean)")
    add("--max-value", type=float, help="upper clipping bound (sum, mean)")


def _add_selection_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--public-partitions", help="file of public keys; without it: private selection")
    add(
        "--partition-selection",
        choices=SELECTION_STRATEGIES,
        help=f"private selection strategy (default {SELECTION_STRATEGIES[0]})",
    )
    add("--pre-threshold", type=int, help="private selection: minimum privacy units")


def _add_ledger_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ledger",
        help="budget ledger: sqlite:////ABSOLUTE/PATH, sqlite:///PATH (relative to the working "
        "folder), a file path, or postgresql://USER@HOST:PORT/DB shared by every host "
        "(default $DPPIPELINE_LEDGER, else state/ledger.sqlite in $DPPIPELINE_STATE_DIR)",
    )


def _add_schema_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--schema",
        help="input columns: "
        + _listed((*SHIPPED_SCHEMAS, "a .json schema file"), default=SHIPPED_SCHEMAS[0]),
    )
    parser.add_argument(
        "--layout",
        choices=INPUT_LAYOUTS,
        help="daily partitions (default), or files: one file or a folder of files, filtered "
        "to --start-date..--end-date by the time column",
    )
    parser.add_argument("--time-column", help="the timestamp column (default: the schema's)")


def _add_input_flags(parser: argparse.ArgumentParser) -> None:
    """--input, --format and the schema's flags, as `tune` and `evaluate` take them."""
    parser.add_argument("--input", help="input folder (or input.path in the job spec)")
    parser.add_argument("--format", choices=INPUT_FORMATS, help="input layout")
    _add_schema_flags(parser)


def _cap_number(name: str, low: float, high: float | None = None) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: not a number: {text!r}") from None
        if not (math.isfinite(value) and low <= value and (high is None or value <= high)):
            bounds = f">= {low:g}" if high is None else f"in [{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"{name}: must be {bounds}, got {text!r}")
        return value

    return parse


def _window_days(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


# What `add_subparsers` returns: where each `_add_<command>` adds its parser.
Commands: TypeAlias = "argparse._SubParsersAction[Parser]"


def build_parser() -> argparse.ArgumentParser:
    """The `dppipeline` parser: one subcommand per `_add_<command>`; the spec's choices come
    from its vocabulary (`spec/vocabulary.py`, `spec/metrics.py`)."""
    parser = Parser(
        prog="dppipeline",
        description="Differentially private per-partition statistics of transaction data.",
    )
    _add_logging_flags(parser, argparse.SUPPRESS)
    parser.set_defaults(verbose=False, quiet=False, debug_statistics=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add_command in (  # in the order `dppipeline --help` lists them
        _add_generate,
        _add_run,
        _add_sql,
        _add_plan,
        _add_budget,
        _add_check_release,
        _add_tune,
        _add_evaluate,
        _add_report,
        _add_spec_doc,
    ):
        add_command(sub)
    for command in sub.choices.values():  # before or after the command: `run -q` as `-q run`
        _add_logging_flags(command, argparse.SUPPRESS)
    return parser


def _add_generate(sub: Commands) -> None:
    gen = sub.add_parser(
        "generate",
        help="write synthetic card transactions",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,  # --help shows the defaults
    )
    gen.add_argument("--output", required=True, default=argparse.SUPPRESS, help="folder to write")
    gen.add_argument("--format", choices=INPUT_FORMATS, default=INPUT_FORMATS[0],
                     help="parquet: DIR/date=YYYY-MM-DD/; csv: DIR/YYYY-MM-DD.csv")  # fmt: skip
    gen.add_argument("--customers", type=int, default=5000, help="customers (privacy units)")
    gen.add_argument("--terminals", type=int, default=1000, help="terminals (partitions)")
    gen.add_argument("--days", type=int, default=30, help="days of transactions")
    gen.add_argument("--start-date", type=_date, default=dt.date(2026, 1, 1), help="first day")
    gen.add_argument("--tx-per-day", type=int, default=25000, help="transactions per day")
    gen.add_argument("--seed", type=int, default=0, help="random seed (same seed, same data)")
    gen.add_argument("--table", choices=SHIPPED_SCHEMAS, default=SHIPPED_SCHEMAS[0],
                     help="columns (schemas/<table>.json): book_transactions adds the book's "
                     "TX_TIME_SECONDS, TX_TIME_DAYS, TX_FRAUD, TX_FRAUD_SCENARIO; card_payments "
                     "is a merchant-category table")  # fmt: skip
    gen.add_argument("--single-file", action="store_true",
                     help="one file OUTPUT/<table>.<format> for all days (read it with "
                     "input.layout: files)")  # fmt: skip


def _add_run(sub: Commands) -> None:
    run = sub.add_parser(
        "run",
        help="compute and publish a DP release",
        description="Compute and publish a DP release. With --engine beam, arguments this "
        "command does not define are Beam pipeline options (--runner, --direct_num_workers, "
        "--direct_running_mode, --setup_file, ...).",
        allow_abbrev=False,  # a Beam option must never be taken for an abbreviated flag
    )
    run.add_argument(  # no `choices`: `load_engine` names the engines (exit 2 either way)
        "--engine",
        default=ENGINES[0],
        help=_listed(ENGINES, {"local": "in-process", "spark": "local[*], or the spark-submit "
                     "master", "beam": "DirectRunner unless --runner says otherwise"}),
    )  # fmt: skip
    _add_release_flags(run, schema=True)
    _add_privacy_flags(run)


def _add_release_flags(parser: argparse.ArgumentParser, *, schema: bool) -> None:
    """What a release reads, writes and charges: `run`'s flags beside the spec's, which
    `sql` takes too (its SQL states the rest)."""
    parser.add_argument("--input", help="input folder (daily partitions)")
    parser.add_argument("--output", help="release folder to create")
    parser.add_argument("--format", choices=INPUT_FORMATS, help="input layout")
    if schema:
        _add_schema_flags(parser)
    else:  # the SQL's FROM names the schema
        parser.add_argument(
            "--layout",
            choices=INPUT_LAYOUTS,
            help="daily partitions (default), or files: one file or a folder of files, "
            "filtered to --start-date..--end-date by the time column",
        )
    parser.add_argument("--start-date", type=_date, help="first day, inclusive")
    parser.add_argument("--end-date", type=_date, help="last day, inclusive")
    parser.add_argument("--max-rejected-fraction", type=float, help="fail above this reject share")
    parser.add_argument(
        "--quarantine",
        help="operator-only folder for rejected rows (default $DPPIPELINE_STATE_DIR/quarantine; "
        "never inside or beside the release)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing release")
    _add_ledger_flags(parser)
    parser.add_argument("--no-ledger", action="store_true", help="run without a budget ledger")
    parser.add_argument(
        "--check-budget",
        action="store_true",
        help="only check that the ledger would accept this release (or already has it): "
        "reads no data, spends nothing; exit 3 when the budget is exhausted, 75 when live "
        "reservations of other runs hold it (retry at the time named)",
    )
    parser.add_argument(
        "--new-release",
        action="store_true",
        help="draw new noise and spend again even if this release key was already published",
    )
    parser.add_argument("--scope", help="ledger scope (default <input folder>/<privacy unit>)")
    parser.add_argument("--cap-epsilon", type=float, help="ledger cap on the scope's epsilon")
    parser.add_argument("--cap-delta", type=float, help="ledger cap on the scope's delta")
    parser.add_argument("--window-days", type=int, help="caps hold per rolling window of N days")


def _add_sql(sub: Commands) -> None:
    sql = sub.add_parser(
        "sql",
        help="compile a DP SQL query (SELECT WITH DIFFERENTIAL_PRIVACY) and release it",
        description="Compile a DP SQL query (BigQuery's SELECT WITH DIFFERENTIAL_PRIVACY, "
        "docs/reference/sql.md) to the job spec its YAML twin gives, then release it as "
        "`run` does (the same plan, ledger charge and manifest), or with --explain print "
        "what `plan` prints for it. A query the dialect refuses is one line naming "
        "line:column; nothing is read or charged.",
        allow_abbrev=False,  # as `run`: Beam's options pass through
    )
    sql.add_argument("query", nargs="?", help="the SQL text (or --file)")
    sql.add_argument("--file", help="a .sql file (relative key files are relative to it)")
    sql.add_argument(
        "--name", help="the job's name unless its one SELECT names it (default: the file's stem)"
    )
    sql.add_argument(
        "--explain",
        action="store_true",
        help="print the plan (budget split, noise, bounds) as `plan` does; reads no data",
    )
    sql.add_argument(  # no `choices`: `load_engine` names the engines (exit 2 either way)
        "--engine",
        default=ENGINES[0],
        help=_listed(ENGINES, {"local": "in-process", "spark": "local[*], or the spark-submit "
                     "master", "beam": "DirectRunner unless --runner says otherwise"}),
    )  # fmt: skip
    _add_release_flags(sql, schema=False)


def _add_plan(sub: Commands) -> None:
    plan = sub.add_parser("plan", help="show the budget split and noise; reads no data")
    _add_privacy_flags(plan)


def _add_budget(sub: Commands) -> None:
    budget = sub.add_parser(
        "budget", help="the privacy-budget ledger: show, history, plot, set-cap"
    )
    budget_sub = budget.add_subparsers(dest="budget_command", required=True, parser_class=Parser)
    _add_set_cap(budget_sub)
    for name, text in (
        ("show", "spent budget, stored caps and what is left, per scope"),
        ("history", "every release and every cap change recorded in the ledger"),
        ("plot", "PNG chart of cumulative epsilon per scope against its cap"),
    ):
        cmd = budget_sub.add_parser(name, help=text)
        _add_ledger_flags(cmd)
        cmd.add_argument("--scope", help="only this scope")
        if name in ("show", "plot"):
            cmd.add_argument(
                "--config", help="job spec whose caps to show for scopes without a stored cap"
            )
        if name == "plot":
            cmd.add_argument("--output", required=True, help="PNG file to write")


def _add_set_cap(budget_sub: Commands) -> None:
    set_cap = budget_sub.add_parser(
        "set-cap",
        help="store (or change) a scope's cap; every run and tune in the scope is held to it",
        description="Store or change the cap of a scope, recorded with a history row (when, "
        "what, by whom). The cap is exactly what is given: omitting --delta means no delta "
        "cap, omitting --window-days means for all time.",
    )
    set_cap.add_argument("scope", help="the scope (e.g. transactions/CUSTOMER_ID)")
    set_cap.add_argument(
        "--epsilon", required=True, type=_cap_number("--epsilon", 0.0), help="epsilon cap"
    )
    set_cap.add_argument("--delta", type=_cap_number("--delta", 0.0, 1.0), help="delta cap")
    set_cap.add_argument(
        "--window-days", type=_window_days, help="caps hold per rolling window of N data days"
    )
    _add_ledger_flags(set_cap)


def _add_check_release(sub: Commands) -> None:
    check = sub.add_parser(
        "check-release", help="check a published release: manifest, schema, ledger committed"
    )
    check.add_argument("release", help="the release folder (holds manifest.json)")
    _add_ledger_flags(check)
    check.add_argument("--no-ledger", action="store_true", help="skip the ledger check")


def _add_tune(sub: Commands) -> None:
    tune = sub.add_parser(
        "tune", help="recommend L0, Linf and clipping bounds from DP statistics (spends budget)"
    )
    _add_privacy_flags(tune)
    _add_input_flags(tune)
    tune.add_argument("--query", help="the query to tune (default: the job's first)")
    tune.add_argument(
        "--tune-epsilon", type=float, help="budget tune spends (default: a tenth of the job's)"
    )
    tune.add_argument(
        "--partitions", type=int, help="number of partitions (required under private selection)"
    )
    tune.add_argument(
        "--tune-output",
        help="write the DP statistics and recommendation to this JSON file too (default: "
        "printed only, no file written)",
    )
    _add_ledger_flags(tune)
    tune.add_argument("--no-ledger", action="store_true", help="do not record the spend (!)")


def _add_evaluate(sub: Commands) -> None:
    evaluate = sub.add_parser(
        "evaluate",
        help="error against epsilon on NON-SENSITIVE data (shows true values; no ledger)",
        description="Run the job (every query) at several epsilons, several times each, and "
        "compare each release with the TRUE values of the same rows: synthetic or otherwise "
        "non-sensitive data only (--data-is-not-sensitive is required). The runs are "
        "experiments, not releases: they go to scratch folders under --output/runs and are "
        "never recorded in a budget ledger. Writes evaluation.csv, evaluation.json, one PNG "
        "chart per query and index.html into --output.",
    )
    _add_privacy_flags(evaluate)
    _add_input_flags(evaluate)
    evaluate.add_argument(
        "--output", required=True, help="folder for the tables, charts, page and scratch runs"
    )
    evaluate.add_argument(
        "--epsilons",
        default="0.1,0.3,1,3,10",
        help="comma list of job epsilons to try (budget.epsilon; delta is kept)",
    )
    evaluate.add_argument("--repeats", type=int, default=3, help="runs per epsilon (default 3)")
    evaluate.add_argument("--engine", default=ENGINES[0], choices=ENGINES)
    evaluate.add_argument(
        "--data-is-not-sensitive",
        action="store_true",
        help="required: you state the input is synthetic or otherwise not sensitive",
    )


def _add_report(sub: Commands) -> None:
    report = sub.add_parser(
        "report", help="an HTML page with charts for a release (release and ledger only)"
    )
    report.add_argument("release", help="the release folder (holds manifest.json)")
    report.add_argument("--output", help="folder for index.html and PNGs (default RELEASE_report)")
    _add_ledger_flags(report)
    report.add_argument("--no-ledger", action="store_true", help="leave out the ledger's spend")


def _add_spec_doc(sub: Commands) -> None:
    doc = sub.add_parser("spec-doc", help="list every job spec field, its default and meaning")
    doc.add_argument("--markdown", action="store_true", help="as a Markdown table")


def _add_logging_flags(parser: argparse.ArgumentParser, default: object) -> None:
    """-v, -q and --debug-statistics; `default` SUPPRESS so that a command's parser keeps
    what was given before the command."""
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default,
        help="dppipeline's debug lines (other libraries' only with --debug-statistics)",
    )
    loudness.add_argument(
        "-q", "--quiet", action="store_true", default=default, help="warnings and errors only"
    )
    parser.add_argument(
        "--debug-statistics",
        action="store_true",
        default=default,
        help="also log exact data-dependent figures (partitions before selection, pairs kept); "
        "NOT PRIVATE: for debugging on test data, never in production logs",
    )


def spec_from_args(args: argparse.Namespace, *, release: bool = True):
    """The job spec of the flags and `--config`; `release`: one a run or a plan can release
    from (its contribution bounds stated; `tune`, which recommends them, passes False)."""
    from dppipeline.spec.loader import load_raw  # noqa: PLC0415
    from dppipeline.spec.model import build_spec  # noqa: PLC0415

    raw = with_flag("--config", load_raw, args.config) if args.config else {}
    overrides: dict[str, Any] = {}
    for flag, field in FLAG_FIELDS.items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides[field] = value
    try:
        spec = build_spec(raw, overrides)
        if release:
            spec.require_contribution_bounds()
    except SpecError as exc:
        # Name the flag when the bad value came from one, the config file otherwise.
        field = exc.field
        if field in overrides:
            raise SpecError(f"{_FIELD_FLAGS[field]} ({field})", exc.rule) from None
        if args.config:
            raise SpecError(f"{args.config}: {field}", exc.rule) from None
        flag = _FIELD_FLAGS.get(field)
        raise SpecError(f"{flag} ({field})" if flag else field, exc.rule) from None
    from dppipeline.inputs.files import with_detected_layout  # noqa: PLC0415

    return with_detected_layout(spec)


# `sql`'s flags that set spec fields (the SQL sets the rest).
SQL_FLAGS = (
    "input", "format", "layout", "start_date", "end_date", "max_rejected_fraction", "output",
    "scope", "cap_epsilon", "cap_delta", "window_days",
)  # fmt: skip


def sql_spec_from_args(args: argparse.Namespace):
    """The job spec of `sql`'s query (its text or --file) and flags; a query refused is a
    SqlError naming line:column, a bad flag a SpecError naming the flag."""
    from pathlib import Path  # noqa: PLC0415

    from dppipeline.dpsql.compile import compile_sql, read_query_file  # noqa: PLC0415

    if (args.query is None) == (args.file is None):
        raise UsageError("sql: give the query text or --file (one of them)")
    if args.file is not None:
        path = Path(args.file)
        try:
            text = read_query_file(path, "--file")
        except OSError as exc:
            raise UsageError(f"--file: cannot read {excerpt(args.file)}: {exc.strerror}") from None
        source, base, name = args.file, path.parent, args.name or path.stem
    else:
        text, source, base, name = args.query, "query", None, args.name
    overrides = {
        FLAG_FIELDS[flag]: getattr(args, flag)
        for flag in SQL_FLAGS
        if getattr(args, flag, None) is not None
    }
    try:
        spec = compile_sql(text, name=name, base=base, source=source, overrides=overrides)
    except SpecError as exc:
        if exc.field in overrides:
            raise SpecError(f"{_FIELD_FLAGS[exc.field]} ({exc.field})", exc.rule) from None
        raise
    from dppipeline.inputs.files import with_detected_layout  # noqa: PLC0415

    return with_detected_layout(spec)


def with_flag(flag: str, function: Callable[[str], T], value: str) -> T:
    """`function(value)`, a location refused in it (credentials in the URI, an unknown
    scheme) named by the flag that gave it, as `--input` is."""
    from dppipeline.storage.location import LocationError  # noqa: PLC0415

    try:
        return function(value)
    except LocationError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def dashed_flags(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """`--start_date=D` -> `--start-date=D` for this CLI's own flags: schedulers that build
    Beam-style options (Airflow's Beam operator snake-cases every key) can pass job flags too.
    Beam's options use underscores and none has a dashed twin here, so nothing is taken."""
    known = {
        option
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for sub in action.choices.values()
        for sub_action in sub._actions
        for option in sub_action.option_strings
    }
    out = []
    for token in argv:
        flag, eq, value = token.partition("=")
        dashed = flag.replace("_", "-")
        renamed = flag.startswith("--") and "_" in flag and dashed in known
        out.append(dashed + eq + value if renamed else token)
    return out
