"""The job spec: loading YAML, validation rules (errors name the field path), hashing, freezing."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from pathlib import Path

import pytest
import yaml

from dppipeline.errors import SpecError, UsageError
from dppipeline.spec import build_spec, load_raw, load_spec

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "jobs" / "configs" / "terminal_stats.yaml"
# A valid spec; each rule case below breaks exactly one thing in it.
BASE = {
    "metrics": ["count", "sum", "mean"],
    "budget": {"epsilon": 1.0, "delta": 1e-6},
    "bounds": {"min_value": 0.0, "max_value": 100.0},
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
    pytest.param(changed(budget__delta=1), "budget.delta", ["[0, 1)"], id="delta-one"),
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
        changed(metrics=["mean"], bounds=DROP), None, ["max_value"], id="bounds-missing-with-mean"
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
        "bounds: {min_value: 0, max_value: 100}\n"
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
    assert raw["budget"]["epsilon"] == 1.0  # the raw data is not modified


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
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.noise = "gaussian"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.budget.epsilon = 100.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.input.start_date = dt.date(2026, 1, 1)  # type: ignore[misc]
    assert spec.budget.epsilon == 1.0


def test_dates_are_parsed():
    spec = build_spec(changed(input__start_date="2026-01-02", input__end_date=dt.date(2026, 1, 3)))
    assert spec.input.start_date == dt.date(2026, 1, 2)
    assert spec.input.end_date == dt.date(2026, 1, 3)
    assert isinstance(spec.metrics, tuple)
