"""Every `dppipeline ...` command the README and docs/ show is a command the CLI takes.

A reader copies commands from the docs; a renamed or misspelt flag there fails them silently
until someone tries. So every command line in README.md and docs/**/*.md (fenced blocks,
`$ dppipeline`, `python -m dppipeline`, `.venv/bin/dppipeline`, the two job scripts, and
inline `dppipeline ...` code in prose) is parsed by the CLI's own parser (`build_parser`):
each subcommand and flag exists, exactly as written (no abbreviation), and every `--config`
path exists. Complete commands (no `...`, no placeholder such as DIR or E) must parse whole;
those that are cheap and read no data (`plan --config`, `--help`, `spec-doc`, `budget ...`
against a temporary ledger) are run for real and must exit 0. The docs' own shape is held
here too: the README is a first page (at most 300 lines), docs/index.md lists every page, and
every relative link resolves.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import REPO

from dppipeline.cli.parser import build_parser

ROOT = REPO
DOCS = ROOT / "docs"
README_MAX_LINES = 300

# Example job files a page writes from the YAML it shows, then runs (not in the repository).
WRITTEN_BY_THE_PAGE = {"distinct.yaml": "docs/tutorials/multi-query-job.md"}
# Pages another part of issue 34 writes (linked from the index before they land).
PENDING_PAGES = {"docs/reference/environment.md"}

_LAUNCHERS = re.compile(
    r"^(?:(?:\.venv/bin/)?python(?:3(?:\.11)?)? -m dppipeline|(?:\.venv/bin/)?dppipeline)(?=\s|$)"
)
_JOB_SCRIPT = re.compile(r"(?:^|\s)jobs/(spark|beam)_terminal_stats\.py(?=\s|$)")
_ENV_PREFIX = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+")
_PLACEHOLDER = re.compile(r"^(?:\.\.\.|[A-Z][A-Z0-9_]*(?:\.[a-z]+)?|[A-Z]+_[A-Za-z_]+)$")
_SHELL_ENDS = {"|", "||", "&&", ";", "&", ">", "2>&1", "2>"}


@dataclass(frozen=True)
class Command:
    """One documented command line: where it is, the CLI arguments, how it was shown."""

    where: str  # page:line
    argv: tuple[str, ...]  # the arguments after `dppipeline`
    synopsis: bool  # usage notation ([--flag], a|b, {x,y}): only flags are checked
    inline: bool  # a mention in prose: only the subcommand and flags are checked

    @property
    def partial(self) -> bool:
        """Not a whole command: a synopsis, a placeholder, or a mention in prose (prose names
        a command with some of its flags, except a `plan` or `budget` command given whole)."""
        if self.synopsis or any(_PLACEHOLDER.match(a) for a in self.argv):
            return True
        return self.inline and not (self.argv[0] in ("plan", "budget") and len(self.argv) > 2)


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _logical_lines(block: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Lines of a fenced block with `\\` continuations joined."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, text in block:
        start, line = (number, text) if pending is None else (pending[0], f"{pending[1]} {text}")
        if line.rstrip().endswith("\\"):
            pending = (start, line.rstrip()[:-1])
            continue
        pending = None
        out.append((start, line))
    if pending is not None:
        out.append(pending)
    return out


def _tokens(text: str) -> list[str] | None:
    """Shell words up to a pipe, redirection or comment; None when not shell syntax."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return None
    for i, word in enumerate(words):
        if word in _SHELL_ENDS or word.startswith(("2>", ">")):
            return words[:i]
    return words


def _command_in(text: str) -> list[str] | None:
    """The CLI arguments of one shell line, or None when it runs no dppipeline command."""
    text = _ENV_PREFIX.sub("", text.strip())
    launcher = _LAUNCHERS.match(text)
    if launcher:
        words = _tokens(text[launcher.end() :])
        if words is None or (words and words[0].endswith(":")):  # `dppipeline run: error:`
            return None
        return words
    script = _JOB_SCRIPT.search(text)
    if script:  # the job scripts are `dppipeline run --engine spark|beam ...`
        words = _tokens(text[script.end() :])
        return None if words is None else ["run", "--engine", script.group(1), *words]
    return None


def _is_synopsis(argv: list[str]) -> bool:
    return any(re.search(r"[\[\]{}]|\w\|\w", a) for a in argv) or "COMMAND" in argv


def documented_commands() -> list[Command]:
    found: list[Command] = []
    for page in doc_pages():
        name = page.relative_to(ROOT).as_posix()
        lines = page.read_text().splitlines()
        block: list[tuple[int, str]] | None = None
        for number, line in enumerate(lines, 1):
            if line.lstrip().startswith("```"):
                if block is None:
                    block = []
                    continue
                prompts = any(text.lstrip().startswith("$ ") for _, text in block)
                for start, text in _logical_lines(block):
                    stripped = text.strip()
                    if prompts and not stripped.startswith("$ "):
                        continue  # output lines of a shown session
                    argv = _command_in(stripped.removeprefix("$ "))
                    if argv:
                        found.append(
                            Command(f"{name}:{start}", tuple(argv), _is_synopsis(argv), False)
                        )
                block = None
                continue
            if block is not None:
                block.append((number, line))
                continue
            for span in re.findall(r"`([^`]+)`", line):
                argv = _command_in(span)
                if argv:
                    found.append(Command(f"{name}:{number}", tuple(argv), _is_synopsis(argv), True))
    return found


COMMANDS = documented_commands()


# -------------------------------------------------------------------------------------------
# The parser's vocabulary


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _resolve(argv: tuple[str, ...]) -> tuple[argparse.ArgumentParser, list[str], list[str]]:
    """The (sub)parser the words name, the command path, the words after it. Options before
    the command (`dppipeline -q run`) are the top parser's."""
    parser = build_parser()
    path: list[str] = []
    rest = list(argv)
    while True:
        subs = _subparsers(parser)
        if not subs:
            return parser, path, rest
        index = next((i for i, a in enumerate(rest) if not a.startswith("-")), None)
        if index is None or rest[index] in ("COMMAND", "..."):  # `dppipeline COMMAND ...`
            return parser, path, rest
        word, *others = rest[index].split("|")  # a synopsis' `show|history|plot`
        assert all(w in subs for w in others), f"unknown command among {rest[index]!r}"
        assert word in subs, f"unknown command {' '.join([*path, word])!r} (known: {sorted(subs)})"
        path.append(word)
        parser, rest = subs[word], rest[:index] + rest[index + 1 :]


def _beam_option_error(flags: list[str]) -> str | None:
    """Beam's own check of pipeline options (what `run --engine beam` applies)."""
    from dppipeline.engines.beam.engine import check_pipeline_options

    try:
        check_pipeline_options(flags)
    except Exception as exc:  # its message is the assertion's
        return str(exc)
    return None


@functools.cache
def _beam_flags() -> frozenset[str]:
    """Beam's pipeline option names, as `run --engine beam` checks them
    (`engines.beam.engine.check_pipeline_options`)."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    return frozenset(_options(parser))


def _flags_of(argv: list[str]) -> list[str]:
    flags = []
    for word in argv:
        for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", word):
            flags.append(flag)
    return flags


def check_flags(command: Command) -> None:
    """Every flag shown is one of its (sub)command's own, exactly; for `run`, a flag that is
    not is a Beam pipeline option Beam accepts."""
    parser, path, rest = _resolve(command.argv)
    own = _options(parser) | _options(build_parser())
    unknown = [f for f in _flags_of(rest) if f.split("=")[0] not in own]
    if path == ["run"]:  # with --engine beam, the rest are Beam's pipeline options
        unknown = [f for f in unknown if f.split("=")[0] not in _beam_flags()]
    assert not unknown, f"{command.where}: {' '.join(path)} has no flag {unknown}"


def check_config_paths(command: Command) -> None:
    argv = list(command.argv)
    for i, word in enumerate(argv):
        value = None
        if word == "--config" and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith("--config="):
            value = word.split("=", 1)[1]
        if value is None or _PLACEHOLDER.match(value) or not re.search(r"[a-z]", value):
            continue
        if value in WRITTEN_BY_THE_PAGE:
            page = ROOT / WRITTEN_BY_THE_PAGE[value]
            assert value in page.read_text(), f"{command.where}: {value} is not on its page"
            continue
        assert (ROOT / value).is_file(), f"{command.where}: --config {value} does not exist"


def parse_whole(command: Command) -> argparse.Namespace:
    """The CLI's own parse of a complete command (usage errors are one line on stderr)."""
    parser = build_parser()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            args, extra = parser.parse_known_args(list(command.argv))
        except SystemExit as exc:
            if exc.code == 0:  # --help
                return argparse.Namespace(command="help")
            pytest.fail(f"{command.where}: {stderr.getvalue().strip()}")
    if extra:
        assert args.command == "run" and args.engine == "beam", f"{command.where}: {extra}"
        assert _beam_option_error(extra) is None, f"{command.where}: {extra}"
    return args


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_every_documented_command_parses(command: Command):
    check_flags(command)
    check_config_paths(command)
    if not command.partial:
        parse_whole(command)


# -------------------------------------------------------------------------------------------
# The ones that read no data, run


def runnable(command: Command) -> bool:
    if command.partial:
        return False
    argv = command.argv
    if "--help" in argv or "-h" in argv or argv[:1] == ("spec-doc",):
        return True
    if argv[:1] == ("plan",):
        return "--config" in argv and not any(a in WRITTEN_BY_THE_PAGE for a in argv)
    if argv[:1] == ("sql",):  # --explain reads no data
        return "--explain" in argv
    if argv[:1] == ("budget",):
        ledger = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--ledger"]
        return not any("://" in url for url in ledger)
    return False


RUNNABLE = [c for c in COMMANDS if runnable(c)]


@pytest.mark.slow
def test_documented_commands_that_read_no_data_run(tmp_path):
    """In the order the pages show them, on one temporary ledger (so `budget set-cap` before
    `budget show` is what the page shows)."""
    state = tmp_path / "state"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "DPPIPELINE_STATE_DIR": str(state),
        "DPPIPELINE_LEDGER": str(state / "ledger.sqlite"),
    }
    for command in RUNNABLE:
        argv = list(command.argv)
        if "--ledger" in argv:  # the page's ledger file: the temporary one
            argv[argv.index("--ledger") + 1] = str(state / "ledger.sqlite")
        cwd = tmp_path if argv[:1] == ["budget"] else ROOT  # plot writes where it is told
        done = subprocess.run(
            [sys.executable, "-m", "dppipeline", *argv],
            cwd=cwd,
            env=env,
            capture_output=True,
            check=False,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (command.where, argv, done.stderr[-2000:])


def test_the_extraction_finds_the_commands_it_should():
    """Not vacuous: the pages' commands are found, the cheap ones run. Counts as of this
    writing: see the report of issue 34."""
    parsed_whole = [c for c in COMMANDS if not c.partial]
    assert len(COMMANDS) >= 60, len(COMMANDS)
    assert len(parsed_whole) >= 20, len(parsed_whole)
    assert len(RUNNABLE) >= 6, len(RUNNABLE)
    pages = {c.where.split(":")[0] for c in COMMANDS}
    assert {"README.md", "docs/reference/cli.md", "docs/how-to/beam-runners.md"} <= pages
    kinds = {c.argv[0] for c in RUNNABLE}
    assert {"plan", "budget"} <= kinds, kinds
    print(
        f"\n{len(COMMANDS)} documented commands: {len(COMMANDS) - len(parsed_whole)} checked "
        f"(subcommand, flags, --config paths), {len(parsed_whole)} parsed whole, "
        f"{len(RUNNABLE)} of those run"
    )


# -------------------------------------------------------------------------------------------
# The shape of the docs


def test_the_readme_is_a_first_page():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def _links(page: Path) -> list[tuple[str, Path]]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        out.append((target, (page.parent / target.split("#")[0]).resolve()))
    return out


def test_the_index_lists_every_page():
    linked = {path for _, path in _links(DOCS / "index.md")}
    orphans = [
        p.relative_to(ROOT).as_posix()
        for p in sorted(DOCS.rglob("*.md"))
        if p != DOCS / "index.md" and p.resolve() not in linked
    ]
    assert not orphans, f"pages docs/index.md does not list: {orphans}"
    assert (ROOT / "README.md").resolve() in linked


def test_every_relative_link_resolves():
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in doc_pages()
        for target, path in _links(page)
        if not path.exists() and path.relative_to(ROOT.resolve()).as_posix() not in PENDING_PAGES
    ]
    assert not broken, broken


def flag_tables() -> str:
    """The flag tables of docs/reference/cli.md ("Every command's flags"), from the parser's
    help: `python -c "import tests.test_docs_commands as t; print(t.flag_tables())"`."""
    top = build_parser()
    logging = _options(top)
    out: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for name, sub in _subparsers(parser).items():
            if not _subparsers(sub):
                out.append(f"### `dppipeline {' '.join([*path, name])}`\n")
                if sub.description:
                    out.append(sub.description + "\n")
                out.append("| flag | meaning |\n|---|---|")
                for action in sub._actions:
                    if isinstance(action, argparse._HelpAction) or (
                        set(action.option_strings) & logging
                    ):
                        continue
                    flag = ", ".join(f"`{o}`" for o in action.option_strings) or (
                        f"`{action.dest.upper()}` (positional)"
                    )
                    if action.choices:
                        flag += " {" + ",".join(map(str, action.choices)) + "}"
                    text = (action.help or "").replace("|", "\\|")
                    if action.required and action.option_strings:
                        text = "required; " + text
                    if action.default not in (None, False, argparse.SUPPRESS) and not isinstance(
                        action, argparse._StoreTrueAction
                    ):
                        text += f" (default {action.default})"
                    out.append(f"| {flag} | {text} |")
                out.append("")
            walk(sub, [*path, name])

    walk(top, [])
    return "\n".join(out)


def test_the_cli_reference_names_every_command_and_flag():
    """docs/reference/cli.md is the reference of every command and flag the parser has (its
    tables: `flag_tables()`, pasted)."""
    text = (DOCS / "reference" / "cli.md").read_text()
    missing = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        if path and f"dppipeline {' '.join(path)}" not in text:
            missing.append(" ".join(path))
        for option in _options(parser) - (_options(top) if path else {"--help"}):
            if option.startswith("--") and not re.search(
                rf"(?<![\w-]){re.escape(option)}(?![\w-])", text
            ):
                missing.append(f"{' '.join(path)} {option}")
        for name, sub in _subparsers(parser).items():
            walk(sub, [*path, name])

    top = build_parser()  # its logging flags, named once, are every command's
    walk(top, [])
    assert not missing, missing
    assert flag_tables().strip() in text, "paste flag_tables() into docs/reference/cli.md"


def test_the_ledger_reference_names_every_table_and_column():
    from dppipeline.ledger import tables

    text = (DOCS / "reference" / "ledger.md").read_text()
    names = [
        name
        for table in tables.metadata.tables.values()
        for name in [table.name, *(f"{table.name}.{c.name}" for c in table.columns)]
    ]
    missing = [name for name in names if f"`{name.split('.')[-1]}`" not in text]
    assert not missing, missing
