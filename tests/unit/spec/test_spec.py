"""The job spec: loading YAML, validation rules (errors name the field path), hashing, freezing."""

from __future__ import annotations

import copy
import datetime as dt
import re
from pathlib import Path

import pydantic
import pytest
import yaml
from support import REPO

from dppipeline.errors import SpecError, UsageError
from dppipeline.spec.loader import load_raw
from dppipeline.spec.model import build_spec, load_spec

CONFIG = REPO / "jobs" / "configs" / "terminal_stats.yaml"
# A valid spec; each rule case below breaks exactly one thing in it.
BASE = {
    "metrics": ["count", "sum", "mean"],
    "budget": {"epsilon": 1.0, "delta": 1e-6},
    "bounds": {
        "min_value": 0.0,
        "max_value": 100.0,
        "max_partitions_contributed": 1,
        "max_contributions_per_partition": 1,
    },
}
DROP = object()


def changed(**changes: object) -> dict:
    """BASE with dotted-path changes (`budget__epsilon=0` sets budget.epsilon; DROP removes)."""
    raw = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target = raw
        for part in parents:
            target = target.setdefault(part, {})
        if value is DROP:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    return raw


def test_load_spec_of_the_shipped_config():
    # Compared with the YAML read independently, so edits of the config do not break the test.
    raw = yaml.safe_load(CONFIG.read_text())
    spec = load_spec(CONFIG)
    for name in ("name", "privacy_unit", "partition_key", "value", "noise"):
        assert getattr(spec, name) == raw[name]
    assert spec.metrics == tuple(raw["metrics"])
    for section in ("budget", "bounds"):
        for key, value in raw[section].items():
            assert getattr(getattr(spec, section), key) == value, f"{section}.{key}"
    assert spec.input.format == raw["input"]["format"]
    assert spec.input.max_rejected_fraction == raw["input"]["max_rejected_fraction"]
    assert spec.input.path is None
    assert spec.output is None
    # ../../schemas/public_terminals.csv, relative to the YAML file, not to the cwd.
    public = Path(spec.partition_selection.public_partitions)
    assert public == (CONFIG.parent / raw["partition_selection"]["public_partitions"]).resolve()
    assert public.samefile(REPO / "schemas" / "public_terminals.csv")
    assert public.is_file()
    assert spec.partition_selection.is_public


def test_base_is_valid():
    spec = build_spec(BASE)
    assert spec.metrics == ("count", "sum", "mean")
    assert spec.bounds.min_value == 0.0
    assert spec.bounds.max_value == 100.0


RULES = [
    # (raw spec, field path named, words the message contains)
    pytest.param(changed(budget__epsilon=0), "budget.epsilon", [">"], id="epsilon-zero"),
    pytest.param(changed(budget__epsilon=-1.0), "budget.epsilon", [], id="epsilon-negative"),
    pytest.param(changed(budget__epsilon=float("inf")), "budget.epsilon", [], id="epsilon-inf"),
    pytest.param(changed(budget__epsilon=float("nan")), "budget.epsilon", [], id="epsilon-nan"),
    pytest.param(changed(budget__epsilon="abc"), "budget.epsilon", [], id="epsilon-text"),
    pytest.param(changed(budget__delta=1), "budget.delta", ["[1e-100, 0.001]"], id="delta-one"),
    pytest.param(
        changed(budget__delta=0.999999), "budget.delta", ["reveal a customer"], id="delta-near-one"
    ),
    pytest.param(changed(budget__delta=-1e-9), "budget.delta", [], id="delta-negative"),
    pytest.param(changed(bounds__min_value=200.0), "bounds.min_value", [], id="min-gt-max"),
    pytest.param(changed(bounds__min_value=100.0), "bounds.min_value", [], id="min-eq-max"),
    pytest.param(
        changed(metrics=["sum"], bounds__max_value=DROP),
        None,
        ["max_value"],
        id="max-missing-with-sum",
    ),
    pytest.param(
        changed(metrics=["mean"], bounds__min_value=DROP, bounds__max_value=DROP),
        None,
        ["max_value"],
        id="bounds-missing-with-mean",
    ),
    pytest.param(changed(bounds__max_value=float("inf")), "bounds.max_value", [], id="max-inf"),
    pytest.param(changed(metrics=["count", "median"]), "metrics", ["median"], id="metric-unknown"),
    pytest.param(changed(metrics=["count", "count"]), "metrics", ["twice"], id="metric-duplicate"),
    pytest.param(changed(metrics=[]), "metrics", [], id="metric-none"),
    pytest.param(changed(epsilon=1.0), "epsilon", ["unknown"], id="unknown-top-level"),
    pytest.param(changed(budget__epsilom=1.0), "budget.epsilom", ["unknown"], id="unknown-nested"),
    pytest.param(
        changed(input__start_date="2026-02-30"), "input.start_date", [], id="bad-date-quoted"
    ),
    pytest.param(changed(input__end_date="yesterday"), "input.end_date", [], id="bad-date-text"),
    pytest.param(
        changed(input__start_date="2026-01-05", input__end_date="2026-01-01"),
        "input.start_date",
        ["input.end_date"],
        id="start-after-end",
    ),
    pytest.param(
        changed(bounds__max_partitions_contributed=0),
        "bounds.max_partitions_contributed",
        [],
        id="l0-zero",
    ),
    pytest.param(
        changed(bounds__max_contributions_per_partition=1.5),
        "bounds.max_contributions_per_partition",
        [],
        id="linf-float",
    ),
    pytest.param(
        changed(bounds__max_contributions_per_partition=True),
        "bounds.max_contributions_per_partition",
        [],
        id="linf-bool",
    ),
    pytest.param(
        changed(noise="gaussian", budget__delta=0, partition_selection__public_partitions="k.csv"),
        "budget.delta",
        ["gaussian"],
        id="gaussian-delta-zero",
    ),
    pytest.param(
        changed(budget__delta=0), "budget.delta", ["partition"], id="private-selection-delta-zero"
    ),
    pytest.param(
        changed(partition_selection__strategy="exponential"),
        "partition_selection.strategy",
        ["exponential"],
        id="bad-strategy",
    ),
    pytest.param(
        changed(partition_selection__pre_threshold=0),
        "partition_selection.pre_threshold",
        [],
        id="pre-threshold-zero",
    ),
    pytest.param(changed(noise="cauchy"), "noise", [], id="bad-noise"),
    pytest.param(changed(input__format="orc"), "input.format", [], id="bad-format"),
    pytest.param(
        changed(input__max_rejected_fraction=1.5),
        "input.max_rejected_fraction",
        [],
        id="reject-fraction-above-one",
    ),
    pytest.param(changed(partition_key="CUSTOMER_ID"), "partition_key", [], id="key-is-unit"),
    pytest.param(changed(name="terminal stats!"), "name", [], id="bad-name"),
]


@pytest.mark.parametrize(("raw", "field", "words"), RULES)
def test_rule_raises_spec_error_naming_the_field(raw, field, words):
    with pytest.raises(SpecError) as info:
        build_spec(raw)
    message = str(info.value)
    if field is None:  # either bound may be blamed, but it must be a bounds field
        assert info.value.field.startswith("bounds.")
    else:
        assert info.value.field == field
    assert message.startswith(f"{info.value.field}: ")
    assert info.value.rule
    for word in words:
        assert word in message
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        pytest.param("budget:\n  epsilon: -1\n", "budget.epsilon", id="epsilon"),
        pytest.param("bounds:\n  min_valu: 1\n", "bounds.min_valu", id="unknown-nested"),
        pytest.param("input:\n  start_date: '2026-02-30'\n", "input.start_date", id="date-quoted"),
        # YAML resolves an unquoted YYYY-MM-DD itself; an impossible one must still be a
        # spec error naming the field, not a ValueError from the YAML library.
        pytest.param("input:\n  start_date: 2026-02-30\n", "input.start_date", id="date-feb-30"),
        pytest.param("input:\n  end_date: 2026-13-01\n", "input.end_date", id="date-month-13"),
    ],
)
def test_yaml_spec_error_names_file_and_field(tmp_path, yaml_text, field):
    path = tmp_path / "job.yaml"
    bounds = "" if "bounds" in yaml_text else "bounds: {min_value: 0, max_value: 100}\n"
    path.write_text(bounds + yaml_text)
    with pytest.raises(UsageError) as info:
        load_spec(path)
    message = str(info.value)
    assert str(path) in message
    assert field in message


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: x\nbudget:\n  epsilon: 1.0\n   delta: 1e-6\n")
    with pytest.raises(UsageError) as info:
        load_raw(path)
    assert type(info.value) is UsageError
    message = str(info.value)
    assert str(path) in message
    assert "line 4" in message


def test_top_level_must_be_a_mapping(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("- epsilon: 1\n")
    with pytest.raises(UsageError, match=r"job\.yaml"):
        load_spec(path)


def test_relative_paths_resolve_against_the_yaml_folder(tmp_path, monkeypatch):
    jobs = tmp_path / "repo" / "jobs"
    jobs.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    absolute_output = tmp_path / "abs" / "release"
    (jobs / "job.yaml").write_text(
        "input:\n  path: ../data/tx\n"
        f"output: {absolute_output}\n"
        "partition_selection:\n  public_partitions: keys.csv\n"
        "bounds: {min_value: 0, max_value: 100, max_partitions_contributed: 1,\n"
        "  max_contributions_per_partition: 1}\n"
    )
    monkeypatch.chdir(elsewhere)
    spec = load_spec(Path("..") / "repo" / "jobs" / "job.yaml")
    assert spec.input.path == str((tmp_path / "repo" / "data" / "tx").resolve())
    assert spec.partition_selection.public_partitions == str((jobs / "keys.csv").resolve())
    assert spec.output == str(absolute_output)


def test_overrides_win_over_yaml_and_none_keeps_it():
    raw = load_raw(CONFIG)
    spec = build_spec(raw, {"budget.epsilon": 3.0, "budget.delta": None, "metrics": "count"})
    assert spec.budget.epsilon == 3.0
    assert spec.budget.delta == 1e-6
    assert spec.metrics == ("count",)
    assert raw["budget"]["epsilon"] == yaml.safe_load(CONFIG.read_text())["budget"]["epsilon"]


def test_spec_hash():
    spec = build_spec(BASE)
    same = build_spec(copy.deepcopy(BASE))
    assert spec == same
    assert len(spec.spec_hash()) == 64
    assert spec.spec_hash() == same.spec_hash()
    moved = build_spec(changed(input__path="/data/a", output="/releases/b"))
    assert moved.spec_hash() == spec.spec_hash()
    assert build_spec(changed(budget__epsilon=1.5)).spec_hash() != spec.spec_hash()
    assert build_spec(changed(bounds__max_value=101.0)).spec_hash() != spec.spec_hash()
    assert build_spec(changed(input__start_date="2026-01-02")).spec_hash() != spec.spec_hash()


def test_spec_is_frozen():
    spec = build_spec(BASE)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        spec.noise = "gaussian"  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        spec.budget.epsilon = 100.0  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        spec.input.start_date = dt.date(2026, 1, 1)  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        spec.queries[0].bounds.max_value = 1e9  # type: ignore[misc]
    assert isinstance(spec.queries, tuple)
    assert spec.budget.epsilon == 1.0


def test_dates_are_parsed():
    spec = build_spec(changed(input__start_date="2026-01-02", input__end_date=dt.date(2026, 1, 3)))
    assert spec.input.start_date == dt.date(2026, 1, 2)
    assert spec.input.end_date == dt.date(2026, 1, 3)
    assert isinstance(spec.metrics, tuple)


# --- bounded YAML: duplicate keys, aliases, size, depth ----------------------------------------


def load_text(tmp_path: Path, text: str | bytes) -> dict:
    path = tmp_path / "job.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return load_raw(path)


@pytest.mark.parametrize(
    ("text", "key", "line", "first"),
    [
        ("budget:\n  epsilon: 1\nmetrics: [count]\nbudget:\n  epsilon: 9\n", "'budget'", 4, 1),
        ("budget:\n  epsilon: 1\n  delta: 0\n  epsilon: 9\n", "'epsilon'", 4, 2),
        ("queries:\n  - {name: a, name: b}\n", "'name'", 2, 2),
        ("1: x\n1: y\n", "1", 2, 1),
    ],
)
def test_a_key_given_twice_is_an_error_naming_key_and_line(tmp_path, text, key, line, first):
    with pytest.raises(UsageError) as info:
        load_text(tmp_path, text)
    message = str(info.value)
    assert f"line {line}: key {key} given twice in one mapping (first at line {first})" in message
    assert "job.yaml" in message


def test_merge_keys_may_be_overridden(tmp_path):
    raw = load_text(
        tmp_path,
        "base: &b {epsilon: 1, delta: 0.001}\nbudget:\n  <<: *b\n  epsilon: 2\n",
    )
    assert raw["budget"] == {"epsilon": 2, "delta": 0.001}


def test_alias_bomb_is_refused_fast_and_in_one_short_line(tmp_path):
    """Ten levels of nine aliases, 341 bytes: 9^10 values once expanded. PyYAML builds it as
    a graph, cheaply; expanding it (a repr in an error, a deep copy) took minutes and GBs."""
    levels = ["a: &a [x,x,x,x,x,x,x,x,x]"]
    for i in range(1, 10):
        name, prev = chr(97 + i), chr(96 + i)
        levels.append(f"{name}: &{name} [{','.join(['*' + prev] * 9)}]")
    text = "\n".join(levels) + "\nmetrics: *j\n"
    assert len(text) < 400
    with pytest.raises(UsageError) as info:
        load_text(tmp_path, text)
    message = str(info.value)
    count = int(re.search(r"aliases expand to ([\d,]+) values", message).group(1).replace(",", ""))
    assert count > 2 * 9**10  # j (9^10 x's and the lists holding them), once more as metrics
    assert "more than the 100,000 a job spec may hold" in message
    assert len(message) < 300


def test_aliases_within_the_limit_still_work(tmp_path):
    raw = load_text(tmp_path, "b: &b {min_value: 0, max_value: 10}\nbounds: *b\n")
    assert raw["bounds"] == {"min_value": 0, "max_value": 10}


def test_recursive_alias_is_refused(tmp_path):
    with pytest.raises(UsageError, match="line 1: an alias refers to a collection that holds"):
        load_text(tmp_path, "metrics: &a [count, *a]\n")


def test_nesting_depth_is_bounded(tmp_path):
    with pytest.raises(UsageError, match="nested deeper than 32 levels"):
        load_text(tmp_path, "metrics: " + "[" * 500 + "]" * 500 + "\n")


def test_file_size_is_bounded(tmp_path):
    from dppipeline.spec.loader import MAX_SPEC_BYTES

    load_text(tmp_path, "name: x\n" + "#" * (MAX_SPEC_BYTES - 9) + "\n")  # at the limit: read
    with pytest.raises(UsageError, match="at most 1,048,576 bytes"):
        load_text(tmp_path, "name: x\n" + "#" * (MAX_SPEC_BYTES - 8) + "\n")


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"name: caf\xe9\n", "not UTF-8 text (byte 10)"),
        (b"budget: {epsilon: " + b"9" * 5000 + b"}\n", "an integer of 5,000 characters"),
        (b"input: {start_date: !!timestamp 2026-02-30}\n", None),  # stays text: a field error
        (b"budget:\n  epsilon: !!int 0x{}\n", "line 2: a value that is not a valid 'int'"),
        (b"budget: {epsilon: !!bool maybe}\n", "line 1: a value that is not a valid 'bool'"),
        (b"budget: {epsilon: !!float ''}\n", "line 1: a value that is not a valid 'float'"),
        (b"budget: !!map [a]\n", "not valid YAML at line 1"),
        (b"budget: !!int [a]\n", "not valid YAML at line 1"),
        (b"x: !!python/name:os.system\n", "not valid YAML at line 1"),
    ],
)
def test_odd_yaml_is_a_usage_error(tmp_path, data, words):
    if words is None:
        path = tmp_path / "job.yaml"
        path.write_bytes(data)
        with pytest.raises(SpecError, match=r"input\.start_date: must be a date"):
            load_spec(path)
        return
    with pytest.raises(UsageError) as info:
        load_text(tmp_path, data)
    assert words in str(info.value)


# --- user text is quoted as a short, escaped excerpt --------------------------------------------

MILLION = "A" * 1_000_000


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(changed(name=MILLION), id="job-name"),
        pytest.param(changed(value=MILLION), id="value-column"),
        pytest.param(changed(privacy_unit=MILLION), id="privacy-unit"),
        pytest.param(changed(metrics=[MILLION]), id="metric"),
        pytest.param(changed(noise=MILLION), id="noise"),
        pytest.param(changed(budget__epsilon=MILLION), id="epsilon-text"),
        pytest.param(changed(**{MILLION: 1}), id="unknown-field"),
        pytest.param(changed(bounds__max_value=MILLION), id="bound-text"),
        pytest.param(changed(queries=[{"name": MILLION}]), id="query-name"),
        pytest.param(changed(queries=[{"name": "q", "partition_by": [MILLION]}]), id="key"),
        pytest.param(changed(queries=[{"name": "q", "filter": MILLION + " = 1"}]), id="filter"),
        pytest.param(
            changed(queries=[{"name": "q", "filter": f"TERMINAL_ID = '{MILLION}'"}]),
            id="filter-string",
        ),
        pytest.param(
            changed(partition_selection__public_partitions={MILLION: "1..5"}), id="key-source"
        ),
        pytest.param(changed(input__start_date=MILLION), id="date"),
    ],
)
def test_a_million_character_value_is_quoted_as_a_short_excerpt(raw):
    with pytest.raises(SpecError) as info:
        build_spec(raw)
    message = str(info.value)
    assert len(message) < 400, message[:400]
    assert "A" * 41 not in message


def test_excerpts_escape_control_characters():
    with pytest.raises(SpecError) as info:
        build_spec(changed(noise="gauss\nian\x1b[31m\u202e"))
    message = str(info.value)
    assert message == r"noise: must be one of laplace, gaussian; got 'gauss\nian\x1b[31m\u202e'"
    assert message.isprintable()


# --- numeric limits: what PyDP and float64 sums handle -------------------------------------------

LIMITS = [
    # (changes, field, words in the message)
    pytest.param({"budget__epsilon": 1e-16}, "budget.epsilon", ["2^-50"], id="epsilon-tiny"),
    pytest.param({"budget__delta": 1e-300}, "budget.delta", ["1e-100"], id="delta-tiny"),
    pytest.param({"bounds__min_value": -1e308}, "bounds.min_value", ["1e+15"], id="min-1e308"),
    pytest.param({"bounds__max_value": 1e308}, "bounds.max_value", ["1e+15"], id="max-1e308"),
    pytest.param({"bounds__max_value": 2e15}, "bounds.max_value", ["1e+15"], id="max-2e15"),
    pytest.param(
        {"bounds__min_value": 0.0, "bounds__max_value": 1e-200},
        "bounds.max_value",
        ["1e-100"],
        id="width-tiny",
    ),
    pytest.param(
        {"bounds__max_partitions_contributed": 10**23},
        "bounds.max_partitions_contributed",
        ["2,147,483,647"],
        id="l0-1e23",
    ),
    pytest.param(
        {"bounds__max_contributions_per_partition": 2**31},
        "bounds.max_contributions_per_partition",
        ["2,147,483,647"],
        id="linf-2^31",
    ),
    pytest.param(
        {"partition_selection__pre_threshold": 10**23},
        "partition_selection.pre_threshold",
        ["2,147,483,647"],
        id="pre-threshold-1e23",
    ),
    pytest.param(
        {"budget__window_days": 10**23}, "budget.window_days", ["36,525"], id="window-1e23"
    ),
    pytest.param(
        {"budget__cap_epsilon": float("inf")}, "budget.cap_epsilon", ["finite"], id="cap-inf"
    ),
    pytest.param({"budget__cap_delta": 2.0}, "budget.cap_delta", ["[0.0, 1.0]"], id="cap-delta"),
    pytest.param(
        {"partition_selection__public_partitions": "0..99999999999999999999999"},
        "partition_selection.public_partitions",
        ["int64"],
        id="range-beyond-int64",
    ),
    pytest.param(
        {"partition_selection__public_partitions": "1..2000000"},
        "partition_selection.public_partitions",
        ["1,000,000"],
        id="range-too-long",
    ),
    pytest.param(
        {"partition_selection__public_partitions": {"TERMINAL_ID": "5..1"}},
        "partition_selection.public_partitions.TERMINAL_ID",
        ["empty"],
        id="range-empty",
    ),
]


@pytest.mark.parametrize(("changes", "field", "words"), LIMITS)
def test_numeric_limits_name_the_field_and_the_rule(changes, field, words):
    with pytest.raises(SpecError) as info:
        build_spec(changed(**changes))
    assert info.value.field == field
    for word in words:
        assert word in info.value.rule


def test_values_at_the_limits_are_accepted():
    from dppipeline.spec.limits import MAX_INT_PARAM, MIN_EPSILON

    spec = build_spec(
        changed(
            budget__epsilon=MIN_EPSILON,
            budget__delta=1e-100,
            bounds__min_value=-1e15,
            bounds__max_value=1e15,
            bounds__max_partitions_contributed=MAX_INT_PARAM,
            bounds__max_contributions_per_partition=MAX_INT_PARAM,
            partition_selection__pre_threshold=MAX_INT_PARAM,
            budget__window_days=36_525,
        )
    )
    assert spec.bounds.max_partitions_contributed == 2**31 - 1


def test_the_field_docs_state_the_limits():
    """`dppipeline spec-doc` (and the docs/reference/job-spec.md table from it) shows each limit."""
    from dppipeline.spec.field_table import describe_fields
    from dppipeline.spec.filters import MAX_FILTER_CHARS, MAX_FILTER_TERMS, MAX_IN_VALUES

    docs = {path: doc for path, _, doc in describe_fields()}
    assert "2^-50" in docs["budget.epsilon"]
    assert "709.78" in docs["budget.epsilon"]
    assert "1e-100" in docs["budget.delta"]
    assert "1e+15" in docs["bounds.min_value"]
    assert "1e-100" in docs["bounds.max_value"]
    for name in ("max_partitions_contributed", "max_contributions_per_partition"):
        assert "2,147,483,647" in docs[f"bounds.{name}"]
    assert "536,870,911" in docs["bounds.max_partitions_contributed"]
    assert "2,147,483,647" in docs["partition_selection.pre_threshold"]
    assert "36,525" in docs["budget.window_days"]
    text = docs["queries[].filter"]
    assert f"{MAX_FILTER_CHARS:,} characters" in text
    assert f"{MAX_FILTER_TERMS} conditions" in text
    assert f"{MAX_IN_VALUES:,} values" in text


# Spec hashes computed by the dataclass spec of commit 0137f71, before the pydantic models:
# release keys made then must stay the same (a retried night after an upgrade must find its
# release, not spend again). Never update these values; add a case instead. L0 and Linf, whose
# default (1) was removed, are stated as 1 where these specs left them to it: the same keys.
# Likewise linf_bounding, `sample` then: unset, these queries now scale, a new release (and
# key, `test_unset_linf_bounding_that_scales_is_a_new_key`); stating sample keeps the old one.
KEYS_BEFORE_PYDANTIC = {
    "2bf3446170e914023cd96bfcbf624ab8cecb9ba615f99335d4d187674972a267": {
        "bounds": {
            "min_value": 0.0,
            "max_value": 100.0,
            "max_partitions_contributed": 1,
            "max_contributions_per_partition": 1,
            "linf_bounding": "sample",
        }
    },
    "43c4da51e020bab1f8fe2e402078fa3e61259e1ebf00c08f3d56954cf5801a56": {
        "metrics": ["count", "privacy_id_count"],
        "noise": "gaussian",
        "budget": {"epsilon": 2.0, "delta": 1e-7, "scope": "x", "cap_epsilon": 9},
        "bounds": {
            "max_partitions_contributed": 3,
            "max_contributions_per_partition": 1,
            "linf_bounding": "sample",
        },
    },
    "727bfef339ea07a222632f0c26332267d3a458da31b1b4d23112234f23b61622": {
        "name": "bank",
        "metrics": ["count", "mean"],
        "bounds": {
            "min_value": 0,
            "max_value": 50,
            "max_contributions_per_partition": 4,
            "max_partitions_contributed": 1,
            "linf_bounding": "sample",
        },
        "queries": [
            {"name": "a", "filter": "TX_AMOUNT >= 25"},
            {
                "name": "b",
                "partition_by": ["day"],
                "budget_weight": 2,
                "partition_selection": {"public_partitions": {"day": "input_range"}},
            },
        ],
    },
}


@pytest.mark.parametrize(
    "expected", list(KEYS_BEFORE_PYDANTIC), ids=["shorthand", "caps", "queries"]
)
def test_spec_hash_survives_the_move_to_models(expected):
    assert build_spec(KEYS_BEFORE_PYDANTIC[expected]).spec_hash() == expected


@pytest.mark.parametrize(
    "expected", list(KEYS_BEFORE_PYDANTIC), ids=["shorthand", "caps", "queries"]
)
def test_unset_linf_bounding_that_scales_is_a_new_key(expected):
    """A job re-run after the default became `scale` (where a query allows it) releases other
    numbers than its sampled release: it must not find the old key (its retry would return the
    sampled release as if it were the scaled one). Unset and an explicit scale are one release."""
    raw = KEYS_BEFORE_PYDANTIC[expected]
    unset = {**raw, "bounds": {k: v for k, v in raw["bounds"].items() if k != "linf_bounding"}}
    spec = build_spec(unset)
    assert {q.bounds.linf_bounding for q in spec.queries} == {"scale"}
    assert spec.spec_hash() != expected
    if "queries" in unset:  # each query states it (the job's own value is only their default)
        scale = {"bounds": {"linf_bounding": "scale"}}
        stated = {**unset, "queries": [{**q, **scale} for q in unset["queries"]]}
    else:
        stated = {**unset, "bounds": {**unset["bounds"], "linf_bounding": "scale"}}
    assert spec.spec_hash() == build_spec(stated).spec_hash()


@pytest.mark.parametrize(
    ("bounds", "metrics"),
    [
        ({"max_contributions": 5}, ["count", "sum", "mean"]),
        ({"max_partitions_contributed": 2, "max_contributions_per_partition": 3}, ["max"]),
        ({"max_partitions_contributed": 2, "max_contributions_per_partition": 3}, ["sum", "min"]),
        ({"max_partitions_contributed": 2, "max_contributions_per_partition": 3},
         ["count", "percentile(50)"]),
        ({"max_partitions_contributed": 2, "max_contributions_per_partition": 3},
         ["count_distinct(TX_AMOUNT)"]),
    ],
)  # fmt: skip
def test_unset_linf_bounding_samples_where_scaling_is_refused(bounds, metrics):
    """Unset, a query samples when its metrics need kept rows or max_contributions bounds a
    unit's total rows (the combinations an explicit scale is refused for); the choice is the
    old default, so the key is the one an explicit sample gives."""
    bounds = {**bounds, "min_value": 0, "max_value": 10}
    spec = build_spec({"metrics": metrics, "bounds": bounds})
    assert spec.queries[0].bounds.linf_bounding == "sample"
    assert spec.bounds.linf_bounding == "sample"  # the shorthand's bounds are its query's
    explicit = build_spec({"metrics": metrics, "bounds": {**bounds, "linf_bounding": "sample"}})
    assert spec.spec_hash() == explicit.spec_hash()
    with pytest.raises(SpecError, match="linf_bounding"):
        build_spec({"metrics": metrics, "bounds": {**bounds, "linf_bounding": "scale"}})


def test_unset_linf_bounding_is_resolved_per_query():
    """Queries of one job choose apart: the job's unset value is every query's own default;
    an explicit job value (or `--linf-bounding`) is every query's, except one bounded by its
    own max_contributions (which takes none of the job's L0/Linf kind)."""
    pair = {"max_partitions_contributed": 2, "max_contributions_per_partition": 3}
    queries = [
        {"name": "totals"},
        {"name": "spread", "metrics": ["count", "percentile(90)"]},
        {"name": "rows", "bounds": {"max_contributions": 4}},
        {"name": "sampled", "bounds": {"linf_bounding": "sample"}},
    ]
    raw = {"bounds": {**pair, "min_value": 0, "max_value": 10}, "queries": queries}
    spec = build_spec(raw)
    chosen = {q.name: q.bounds.linf_bounding for q in spec.queries}
    assert chosen == {"totals": "scale", "spread": "sample", "rows": "sample", "sampled": "sample"}
    assert spec.bounds.linf_bounding is None  # the job's value stays unset: each query chose
    flagged = build_spec(raw, {"bounds.linf_bounding": "sample"})
    assert {q.bounds.linf_bounding for q in flagged.queries} == {"sample"}
    with pytest.raises(SpecError, match=r"queries\.spread\.bounds\.linf_bounding"):
        build_spec(raw, {"bounds.linf_bounding": "scale"})


def test_the_shorthand_is_one_query_named_after_the_job():
    spec = build_spec(
        changed(name="nightly", partition_key="CUSTOMER_ID", privacy_unit="TERMINAL_ID")
    )
    (query,) = spec.queries
    assert spec.is_shorthand
    assert query.name == "nightly"
    assert query.partition_by == ("CUSTOMER_ID",)
    assert query.metrics == spec.metrics and query.value == spec.value
    assert query.bounds == spec.bounds and query.partition_selection == spec.partition_selection
    assert spec.query_path(query) == ""


def test_queries_take_the_job_fields_they_leave_unset():
    spec = build_spec({**BASE, "partition_key": "TRANSACTION_ID", "queries": [
        {"name": "a"},
        {"name": "b", "metrics": ["count"], "bounds": {"max_value": 50.0}, "partition_by": []},
    ]})  # fmt: skip
    a, b = spec.queries
    assert not spec.is_shorthand and spec.query_path(b) == "queries.b."
    assert a.partition_by == ("TRANSACTION_ID",) and a.metrics == ("count", "sum", "mean")
    # every job bound, and the job's unset linf_bounding resolved for the query (it can scale)
    assert spec.bounds.linf_bounding is None
    assert a.bounds == spec.bounds.model_copy(update={"linf_bounding": "scale"})
    assert b.metrics == ("count",) and b.partition_by == ()
    assert (b.bounds.min_value, b.bounds.max_value) == (0.0, 50.0)  # field by field
    assert not a.partition_selection.is_public  # selection is not inherited


def test_an_explicit_query_error_names_the_query_and_the_shorthand_the_job():
    bad = {"min_value": 5.0, "max_value": 1.0}
    with pytest.raises(SpecError) as shorthand:
        build_spec(changed(bounds=bad))
    assert shorthand.value.field == "bounds.min_value"
    with pytest.raises(SpecError) as query:
        build_spec({**BASE, "queries": [{"name": "ok"}, {"name": "q", "bounds": bad}]})
    assert query.value.field == "queries.q.bounds.min_value"
    assert "must be <= bounds.max_value (5.0 > 1.0)" in query.value.rule
    with pytest.raises(SpecError) as unnamed:
        build_spec({**BASE, "queries": [{"name": "ok"}, {"bounds": {"min_value": "x"}}]})
    assert unnamed.value.field.startswith("queries[2].")


def test_a_missing_required_field_reads_is_required():
    """pydantic's own `missing` error is translated too: the YAML path and `is required`."""
    with pytest.raises(SpecError) as missing:
        build_spec({**BASE, "queries": [{"name": "ok"}, {"metrics": ["count"]}]})
    assert str(missing.value) == "queries[2].name: is required"


def test_bounds_a_query_does_not_use_may_be_left_out():
    """L0 bounds partitions and Linf rows per partition: a global total needs no L0 (one
    partition), privacy_id_count alone no Linf (a unit counts once per partition), and
    max_contributions replaces both: each plans without them."""
    from dppipeline.lifecycle.runner import make_plan

    total = changed(partition_key=DROP, bounds__max_partitions_contributed=DROP)
    total["queries"] = [{"name": "all", "partition_by": []}]
    units = changed(metrics=["privacy_id_count"], bounds__max_contributions_per_partition=DROP)
    units["bounds"]["max_partitions_contributed"] = 4
    rows = changed(
        bounds__max_partitions_contributed=DROP, bounds__max_contributions_per_partition=DROP
    )
    rows["bounds"]["max_contributions"] = 7
    for raw, pair in ((total, (1, 1)), (units, (4, 1)), (rows, None)):
        spec = build_spec(raw)
        make_plan(spec)
        if pair is not None:
            assert spec.queries[0].pair_bounds == pair


@pytest.mark.parametrize(
    ("dropped", "fragment"),
    [("max_partitions_contributed", "L0"), ("max_contributions_per_partition", "Linf")],
)
def test_a_release_needs_the_contribution_bounds_it_uses(dropped, fragment):
    """No default suits every dataset: planning a release refuses a bound a query uses and
    does not state, naming the field (the spec itself loads: `tune` recommends bounds)."""
    from dppipeline.lifecycle.runner import make_plan

    spec = build_spec(changed(**{f"bounds__{dropped}": DROP}))
    with pytest.raises(SpecError) as info:
        make_plan(spec)
    assert info.value.field == f"bounds.{dropped}"
    assert "required" in info.value.rule and fragment in info.value.rule
    queries = changed(**{f"bounds__{dropped}": DROP})
    queries["queries"] = [{"name": "q"}]
    with pytest.raises(SpecError) as info:
        make_plan(build_spec(queries))
    assert info.value.field == f"queries.q.bounds.{dropped}"
