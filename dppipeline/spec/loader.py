"""The hardened YAML loader: a job spec's file as plain data, within bounds.

`load_raw` reads a spec (a local path or a URI) and `parse_raw` its bytes: at most
MAX_SPEC_BYTES of UTF-8, MAX_SPEC_VALUES values with aliases expanded, MAX_SPEC_DEPTH levels,
no key given twice, dates kept as text; every refusal is one `UsageError` naming the file and
the line. Relative paths are then resolved against the file's folder (`paths.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dppipeline.errors import UsageError, excerpt
from dppipeline.spec.paths import resolve_paths
from dppipeline.storage import Location

MAX_SPEC_BYTES = 1 << 20  # 1 MiB: a job spec is a few kB; key lists belong in key files
MAX_SPEC_VALUES = 100_000  # YAML values, every alias counted as the values it stands for
MAX_SPEC_DEPTH = 32  # nesting of YAML collections (a spec needs 5)
MAX_SPEC_INT_DIGITS = 40  # an integer literal longer than this is no spec value


def load_raw(path: str | Path) -> dict[str, Any]:
    """Reads a YAML job spec into plain data; errors say which file and where.

    Bounded: at most MAX_SPEC_BYTES of UTF-8, MAX_SPEC_VALUES values once aliases are
    expanded (a few hundred bytes of nested aliases can stand for billions), MAX_SPEC_DEPTH
    levels; a key given twice in one mapping is an error, not "the last one wins".
    """
    source = Location.of(path)
    path = source.display()  # how errors name it
    try:
        if source.is_local:
            with source.path.open("rb") as file:
                data = file.read(MAX_SPEC_BYTES + 1)
        else:
            data = source.read_bytes()
    except OSError as exc:
        reason = exc.strerror if source.is_local else str(exc).split(": ", 1)[-1]
        raise UsageError(f"cannot read job spec {path}: {reason}") from None
    return resolve_paths(parse_raw(data, path), source.parent)


def parse_raw(data: bytes, path: str) -> dict[str, Any]:
    """`load_raw` of a spec's bytes (`path`: how errors name it); relative paths as written."""
    if len(data) > MAX_SPEC_BYTES:
        raise UsageError(
            f"{path}: a job spec may have at most {MAX_SPEC_BYTES:,} bytes; put long key "
            "lists in a key file (partition_selection.public_partitions)"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start + 1:,})") from None
    try:
        raw = yaml.load(text, Loader=_SpecLoader)
    except _SpecYAMLError as exc:
        raise UsageError(f"{path}: line {exc.line}: {exc.rule}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{path}: not valid YAML{where}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: a job spec must be a mapping of fields")
    return raw


# What PyYAML's constructors raise for a value that does not fit its explicit tag.
_CONSTRUCTOR_ERRORS = (ValueError, KeyError, IndexError, TypeError, OverflowError)


class _SpecYAMLError(yaml.YAMLError):
    """A spec-specific YAML rule broken at a line (duplicate key, too many values, ...)."""

    def __init__(self, rule: str, mark: yaml.Mark | None):
        super().__init__(rule)
        self.rule = rule
        self.line = mark.line + 1 if mark is not None else 1


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader with the bounds of `load_raw`. Dates stay text, so `_parse_date` names the
    field of a bad one (PyYAML itself raises a bare ValueError for `2026-02-30`)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_SPEC_DEPTH:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise _SpecYAMLError(
                    f"nested deeper than {MAX_SPEC_DEPTH} levels", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: yaml.Node) -> Any:
        values = _expanded_values(node)
        if values > MAX_SPEC_VALUES:
            raise _SpecYAMLError(
                f"aliases expand to {values:,} values, more than the {MAX_SPEC_VALUES:,} a job "
                "spec may hold",
                node.start_mark,
            )
        try:
            return super().construct_document(node)
        except _CONSTRUCTOR_ERRORS:  # raised in a collection's deferred second step
            raise _SpecYAMLError("a value that does not fit its tag", node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):  # `!!map [a]`: PyYAML's error
            return super().construct_mapping(node, deep=deep)
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue  # merge keys (<<) may be overridden; a complex key is PyYAML's error
            key = self.construct_object(key_node)
            if key in first_line:
                raise _SpecYAMLError(
                    f"key {excerpt(key)} given twice in one mapping (first at line "
                    f"{first_line[key]})",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """PyYAML's constructors raise ValueError, KeyError or IndexError for a value that
        does not fit an explicit tag (`!!int 0x{}`, `!!bool maybe`, `!!float ''`)."""
        try:
            return super().construct_object(node, deep=deep)
        except _CONSTRUCTOR_ERRORS:
            tag = node.tag.rsplit(":", 1)[-1]
            raise _SpecYAMLError(
                f"a value that is not a valid {excerpt(tag)}", node.start_mark
            ) from None

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if isinstance(node.value, str) and len(node.value) > MAX_SPEC_INT_DIGITS:
            raise _SpecYAMLError(
                f"an integer of {len(str(node.value)):,} characters; at most {MAX_SPEC_INT_DIGITS}",
                node.start_mark,
            )
        return super().construct_yaml_int(node)

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> str:  # type: ignore[override]
        return str(self.construct_scalar(node))  # an explicit !!timestamp stays text too


_SpecLoader.add_constructor("tag:yaml.org,2002:int", _SpecLoader.construct_yaml_int)
_SpecLoader.add_constructor("tag:yaml.org,2002:timestamp", _SpecLoader.construct_yaml_timestamp)
_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _expanded_values(root: yaml.Node) -> int:
    """How many values the document holds with every alias expanded, computed on the node
    graph (an alias is the same node object again) in time linear in the text."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise _SpecYAMLError("an alias refers to a collection that holds it", node.start_mark)
        open_nodes.add(key)
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(item) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        open_nodes.discard(key)
        sizes[key] = total
        return total

    return size(root)
