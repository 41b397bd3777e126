"""`dppipeline generate | run | sql | plan | budget | check-release | tune | evaluate | report |
spec-doc`: one function per command, and `main`, which parses, dispatches and exits.

Every failure prints one line on stderr, with no traceback (`errors.describe_failure`): exit 2
for usage errors (flags, job spec), 1 for input/output errors (data, files, a release already
there, a ledger that cannot be used), 3 for a budget the ledger refuses, 75 for a budget held
by live reservations of other runs (retry at the time it names), 70 for a bug (any other
exception: its type and place, never its message), 130 when interrupted, 143 when
terminated. `DPPIPELINE_DEBUG=1` shows the traceback.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib.util
import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from dppipeline import logs, settings
from dppipeline.cli.parser import (
    Parser,
    build_parser,
    dashed_flags,
    excerpted,
    spec_from_args,
    sql_spec_from_args,
    with_flag,
)
from dppipeline.errors import UsageError, describe_failure, is_failure
from dppipeline.lifecycle.signals import Terminated, handle_sigterm, signal_behind
from dppipeline.settings import default_ledger
from dppipeline.spec.metrics import percentile_of

if TYPE_CHECKING:
    from dppipeline.spec.model import JobSpec


def _cmd_generate(args: argparse.Namespace) -> int:
    from dppipeline.storage import display  # noqa: PLC0415
    from dppipeline.synthetic.transactions import generate  # noqa: PLC0415

    try:
        summary = generate(
            args.output,
            fmt=args.format,
            customers=args.customers,
            terminals=args.terminals,
            days=args.days,
            start_date=args.start_date,
            tx_per_day=args.tx_per_day,
            seed=args.seed,
            progress=logs.log.info,
            table=args.table,
            single_file=args.single_file,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    where = display(str(summary.output))
    print(f"wrote {summary.rows:,} transactions in {len(summary.files)} files to {where}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from dppipeline.storage import Location  # noqa: PLC0415

    if args.quarantine:
        with_flag("--quarantine", Location.of, args.quarantine)  # before the spec is read
    spec = spec_from_args(args)
    return _run_spec(args, spec)


def _run_spec(args: argparse.Namespace, spec: JobSpec) -> int:
    """`run` of a validated spec (`run`'s and `sql`'s flags): check the budget, or release."""
    _skip_pld_unless_used(args, spec)
    from dppipeline.engines.registry import load_engine, start_early  # noqa: PLC0415

    if not args.check_budget:
        start_early(args.engine)  # Spark's JVM, before the run's heavy imports
    from dppipeline.lifecycle.runner import check_budget, run_job  # noqa: PLC0415

    if args.check_budget:
        if args.no_ledger:
            raise UsageError("--check-budget needs a ledger (drop --no-ledger)")
        _print(check_budget(spec, args.ledger or default_ledger(), new_release=args.new_release))
        return 0
    from dppipeline.lifecycle.ledger_choice import choose_ledger  # noqa: PLC0415

    ledger = choose_ledger(False if args.no_ledger else args.ledger, spec, "--no-ledger")
    result = run_job(
        spec,
        engine=load_engine(args.engine, args.engine_options),
        overwrite=args.overwrite,
        quarantine=args.quarantine or None,
        ledger=ledger,
        new_release=args.new_release,
    )
    _print(str(result.output))  # the release is committed and published whatever happens here
    return 0


def _print(line: str) -> None:
    """A result line on stdout; a reader that went away (`| head`) is not an error."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nothing left to flush at exit
        os.close(devnull)


def _cmd_budget(args: argparse.Namespace) -> int:
    from dppipeline.reports import budget_views as budget_report  # noqa: PLC0415

    policy = None
    if getattr(args, "config", None):
        from dppipeline.ledger import BudgetPolicy  # noqa: PLC0415
        from dppipeline.spec.loader import load_raw  # noqa: PLC0415
        from dppipeline.spec.model import budget_from_dict  # noqa: PLC0415

        budget = budget_from_dict(load_raw(args.config).get("budget"), source=args.config)
        policy = BudgetPolicy(budget.cap_epsilon, budget.cap_delta, budget.window_days)
    url = args.ledger or default_ledger()
    if args.budget_command == "set-cap":
        from dppipeline.ledger import BudgetPolicy  # noqa: PLC0415

        cap = BudgetPolicy(args.epsilon, args.delta, args.window_days)
        _print(budget_report.set_cap(url, args.scope, cap))
    elif args.budget_command == "show":
        _print(budget_report.show(url, args.scope, policy))
    elif args.budget_command == "history":
        _print(budget_report.history(url, args.scope))
    else:
        path = budget_report.plot(url, args.output, args.scope, policy)
        _print(path)
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    return _plan_spec(args, spec_from_args(args))


def _plan_spec(args: argparse.Namespace, spec: JobSpec) -> int:
    """`plan` of a validated spec (and `sql --explain`: the same text for the same spec)."""
    from dppipeline.lifecycle.runner import make_plan  # noqa: PLC0415
    from dppipeline.reports.plan_text import render_plan  # noqa: PLC0415

    _skip_pld_unless_used(args, spec)
    basic = spec.model_copy(update={"accounting": "basic"})
    comparison = make_plan(basic) if spec.accounting != "basic" else None
    _print(render_plan(spec, make_plan(spec), comparison))
    return 0


def _cmd_sql(args: argparse.Namespace) -> int:
    """`dppipeline sql QUERY | --file F`: the DP SQL compiled to the job spec its YAML twin
    gives, then `run` (or with --explain, `plan`) of that spec; a refused query is one line
    naming line:column (exit 2) before anything is read or charged."""
    from dppipeline.storage import Location  # noqa: PLC0415

    if args.quarantine:
        with_flag("--quarantine", Location.of, args.quarantine)
    spec = sql_spec_from_args(args)
    return _plan_spec(args, spec) if args.explain else _run_spec(args, spec)


def _cmd_check_release(args: argparse.Namespace) -> int:
    from dppipeline.reports.check_release import check_release  # noqa: PLC0415

    ledger = None if args.no_ledger else (args.ledger or default_ledger())
    _print(check_release(args.release, ledger))
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    from dppipeline.analysis.tune import render, tune  # noqa: PLC0415
    from dppipeline.lifecycle.ledger_choice import choose_ledger  # noqa: PLC0415

    spec = spec_from_args(args, release=False)
    ledger = choose_ledger(False if args.no_ledger else args.ledger, spec, "--no-ledger")
    if ledger is None:
        logs.log.warning("[tune] --no-ledger: this spend is NOT recorded anywhere")
    result, path = tune(
        spec,
        query_name=args.query,
        epsilon=args.tune_epsilon,
        partitions=args.partitions,
        ledger=None if ledger is None else str(ledger),
        output=Path(args.tune_output) if args.tune_output else None,
        progress=logs.log.info,
    )
    _print(render(result, recorded=ledger is not None))
    if path is not None:
        print(f"\nDP statistics and recommendation: {path}")
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from pathlib import Path  # noqa: PLC0415

    from dppipeline.analysis.evaluate import (  # noqa: PLC0415
        evaluate,
        parse_epsilons,
        refuse_unless_not_sensitive,
    )

    refuse_unless_not_sensitive(args.data_is_not_sensitive)  # before anything is written
    epsilons = parse_epsilons(args.epsilons)
    args.output_folder, args.output = args.output, None  # the job's own output is per run
    spec = spec_from_args(args)
    result = evaluate(
        spec,
        Path(args.output_folder),
        epsilons=epsilons,
        repeats=args.repeats,
        engine=args.engine,
        progress=logs.log.info,
    )
    print(f"table:  {result.csv}\n        {result.json}")
    for name, chart in result.charts.items():
        print(f"chart:  {chart} ({name})")
    print(f"page:   {result.page}\nruns:   {result.runs} (experiments: no ledger, not releases)")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from dppipeline.reports.release_report import build_report  # noqa: PLC0415

    ledger = None if args.no_ledger else (args.ledger or default_ledger())
    _print(build_report(args.release, ledger, args.output))
    return 0


def _cmd_spec_doc(args: argparse.Namespace) -> int:
    from dppipeline.spec.field_table import describe_fields  # noqa: PLC0415

    rows = describe_fields()
    if args.markdown:
        print("| field | default | meaning |\n|---|---|---|")
        for path, default, doc in rows:
            print(f"| `{path}` | `{default}` | {doc} |")
        return 0
    for path, default, doc in rows:
        print(f"{path:42} {default:26} {doc}")
    return 0


COMMANDS = {
    "budget": _cmd_budget,
    "check-release": _cmd_check_release,
    "generate": _cmd_generate,
    "run": _cmd_run,
    "sql": _cmd_sql,
    "plan": _cmd_plan,
    "evaluate": _cmd_evaluate,
    "tune": _cmd_tune,
    "report": _cmd_report,
    "spec-doc": _cmd_spec_doc,
}


def _skip_unused_pipeline_dp_imports(args: argparse.Namespace) -> None:
    """pipeline-dp imports apache_beam and dp_accounting's PLD code (scipy) whenever they are
    installed, about 1.3 s per process, though only its Beam backend and PLD accountant use
    them. A CLI process marks absent what it does not use (apache_beam stays for the Beam
    engine; dp_accounting for a job with tight accounting, see `_skip_pld_unless_used`);
    pipeline-dp guards both imports. Only for a process of its own (`argv` from the command
    line): a caller's process may need them for its next call."""
    if args.command in ("run", "plan", "sql") and getattr(args, "engine", "local") != "beam":
        sys.modules.setdefault("apache_beam", None)  # type: ignore[arg-type]
    args.skip_pld = args.command in ("run", "plan", "sql")


def _lazy_module(name: str) -> None:
    """`name` imported on first use rather than at `import` (the standard library's
    `LazyLoader`): pipeline-dp imports scipy.stats (0.45 s) for one function no run calls;
    dp_accounting's tight accounting uses it, and loads it then."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    # Bound on its package too: `from scipy import stats` then takes it without touching it
    # (the import system reads `__spec__` of a module it finds in sys.modules, which loads it).
    parent, _, child = name.rpartition(".")
    setattr(importlib.import_module(parent), child, module)


def _skip_pld_unless_used(args: argparse.Namespace, spec: JobSpec) -> None:
    """After the spec is read: pipeline-dp imported, where the plan uses it (`_uses_pipeline_dp`),
    without dp_accounting's PLD code, which basic accounting does not need (0.5 s of
    start-up); unblocked right after, for a ledger that composes a scope's releases."""
    if not getattr(args, "skip_pld", False) or spec.accounting != "basic":
        return
    if "dp_accounting.pld" in sys.modules or "pipeline_dp" in sys.modules:
        return
    if not _uses_pipeline_dp(spec):
        return
    _lazy_module("scipy.stats")
    sys.modules["dp_accounting.pld"] = None  # type: ignore[assignment]
    try:
        import pipeline_dp  # noqa: F401, PLC0415
    finally:
        del sys.modules["dp_accounting.pld"]


def _uses_pipeline_dp(spec: JobSpec) -> bool:
    """Whether a basic-accounting plan calls pipeline-dp: Gaussian noise, a private partition
    selection or percentiles (a Laplace job with public partitions needs only PyDP, OpenDP)."""
    return spec.noise != "laplace" or any(
        not query.is_public or any(percentile_of(m) is not None for m in query.metrics)
        for query in spec.queries
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The `dppipeline` command: the exit code (a process of its own ends in `_exit_now`)."""
    if argv is not None:
        return _command(argv)
    _exit_now(_command(None))


def _exit_now(code: int) -> NoReturn:
    """Ends a CLI process without tearing its modules down, which took 0.4-0.8 s after a 5M-row
    local run (pyarrow, Polars, scipy; docs/explanation/benchmarks.md). Everything a normal exit
    does that matters still happens first: the release is committed and published, non-daemon
    threads are joined, atexit handlers run (logging's flush among them) and stdio is
    flushed; only freeing memory the OS reclaims anyway is skipped (mypy exits the same way).
    Threads end by `threading._shutdown`, as at a normal exit: joining them directly hung on
    an idle ThreadPoolExecutor (an audit's finding)."""
    try:  # what a normal exit does first: stop idle executor workers, join the others
        threading._shutdown()  # type: ignore[attr-defined]
    except KeyboardInterrupt:  # a signal while a thread (e.g. Spark's start) is waited for
        code = 130
    except Terminated:
        code = 143
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(code)


def _command(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    own_process = argv is None
    argv = dashed_flags(sys.argv[1:] if argv is None else argv, parser)
    Parser.typed = tuple(argv)
    args, extra = parser.parse_known_args(argv)
    if extra and args.command not in ("run", "sql"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.engine_options = extra  # Beam pipeline options; other engines refuse them
    if own_process:
        _skip_unused_pipeline_dp_imports(args)
    logs.configure(verbose=args.verbose, quiet=args.quiet, debug_statistics=args.debug_statistics)
    handle_sigterm()  # Airflow and Kubernetes stop tasks with SIGTERM: handled like Ctrl-C
    try:
        settings.validate()  # a bad environment variable fails before anything is touched
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print(f"dppipeline {args.command}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"dppipeline {args.command}: terminated", file=sys.stderr)
        return 143
    except BaseException as exc:  # every failure ends as one line (a bug included)
        if not is_failure(exc) or settings.debug():
            raise
        stopped = signal_behind(exc)  # a signal that an engine's library wrapped
        if stopped is not None:
            what, code = ("terminated", 143) if isinstance(stopped, Terminated) else (
                "interrupted", 130)  # fmt: skip
            print(f"dppipeline {args.command}: {what}", file=sys.stderr)
            return code
        code, message = describe_failure(exc)
        line = excerpted(f"dppipeline {args.command}: error: {message}", argv)
        print(line, file=sys.stderr)
        return code


if __name__ == "__main__":
    raise SystemExit(main())
