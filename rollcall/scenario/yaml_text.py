"""Reading YAML text under bounds, and finding the line of a dotted path.

The loader refuses what a person cannot mean before it costs memory or
time: more than :data:`MAX_SCENARIO_BYTES`, nesting deeper than
:data:`MAX_NESTING`, aliases that expand past :data:`MAX_ALIAS_NODES`,
a duplicate key (PyYAML would silently keep the last one).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import yaml

from rollcall.scenario.base import (
    MAX_ALIAS_NODES, MAX_NESTING, MAX_SCENARIO_BYTES, ScenarioError, dotted,
)

class ScenarioLoader(yaml.SafeLoader):
    """SafeLoader with bounds, that also reads exponent floats without a sign or dot.

    Exponent floats (``1e9``, ``1.25e9``): YAML 1.1 (PyYAML) reads those as
    strings, which would turn a perfectly ordinary bandwidth into a type error.

    Bounds: ``compose_node`` counts its depth (PyYAML's composer recurses, so
    10,000 nested brackets would end in a RecursionError) and refuses an
    alias to an anchor still being composed (a cycle, which every later walk
    would follow forever). The alias-expansion budget is checked on the
    finished node graph by :func:`check_bounds`.
    """

    source = "<string>"
    _depth = 0
    _open_anchors: frozenset[str] = frozenset()

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open_anchors:
                raise ScenarioError(
                    self.source, "yaml",
                    f"alias *{event.anchor} refers to the structure that contains it (a cycle)",
                    line=event.start_mark.line + 1,
                )
            return super().compose_node(parent, index)
        event = self.peek_event()
        if self._depth >= MAX_NESTING:
            raise ScenarioError(
                self.source, "yaml", f"nested deeper than {MAX_NESTING} levels",
                line=event.start_mark.line + 1,
            )
        anchor = getattr(event, "anchor", None)
        before = self._open_anchors
        self._depth += 1
        if anchor is not None:
            self._open_anchors = before | {anchor}
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open_anchors = before


_EXP_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
ScenarioLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    _EXP_FLOAT,
    list("-+0123456789."),
)


class ScenarioDumper(yaml.SafeDumper):
    """SafeDumper that knows ScenarioLoader's extra float form, so it quotes such strings."""


ScenarioDumper.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    _EXP_FLOAT,
    list("-+0123456789."),
)


def compose(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """Parse ``text`` once into both the node tree (for line numbers) and data."""
    if len(text) > MAX_SCENARIO_BYTES or len(text.encode("utf-8")) > MAX_SCENARIO_BYTES:
        raise ScenarioError(source, None, f"larger than {MAX_SCENARIO_BYTES} bytes (1 MiB), the limit "
                            "for a scenario file")
    loader = ScenarioLoader(text)
    loader.source = source
    try:
        node = loader.get_single_node()
        if node is not None:
            check_bounds(node, source)
            _reject_duplicate_keys(node, (), source, set())
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem:
            # e.g. an unclosed bracket: the problem shows up later than its cause
            started = exc.context_mark
            at = f" started at line {started.line + 1}" if started and started is not mark else ""
            message = f"{exc.problem} ({exc.context}{at})"
        raise ScenarioError(
            source, "yaml syntax", message, line=mark.line + 1 if mark else None
        ) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(source, "yaml syntax", str(exc)) from None
    finally:
        loader.dispose()
    return node, data


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def check_bounds(root: yaml.Node, source: str) -> None:
    """Refuse a node graph whose aliases expand too far or nest too deep.

    Aliases make the node tree a DAG (the composer hands back the anchored
    node itself), so the file is small while its expansion (what pydantic,
    ``repr`` and every walk would see) can be exponential. Sizes and heights
    are memoised per node, so this costs one visit per distinct node.
    """
    memo: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, height)

    def walk(node: yaml.Node, depth: int) -> tuple[int, int]:
        # ``depth`` nodes lie above this one; checked before descending, so
        # this recursion is as shallow as the limit
        known = memo.get(id(node))
        if depth >= MAX_NESTING or (known is not None and depth + known[1] > MAX_NESTING):
            raise ScenarioError(source, "yaml", f"aliases nest the data deeper than {MAX_NESTING} "
                                "levels", line=node.start_mark.line + 1)
        if known is None:
            size, height = 1, 1
            for child in _children(node):
                child_size, child_height = walk(child, depth + 1)
                size += child_size
                height = max(height, child_height + 1)
            known = memo[id(node)] = (size, height)
        return known

    expanded, _ = walk(root, 0)
    added = expanded - len(memo)
    assert added >= 0
    if added > MAX_ALIAS_NODES:
        raise ScenarioError(source, "yaml", f"aliases expand the file by {added} nodes (at most "
                            f"{MAX_ALIAS_NODES}): an alias bomb?", line=root.start_mark.line + 1)


def _reject_duplicate_keys(node: yaml.Node, path: tuple[str | int, ...], source: str,
                           seen_nodes: set[int]) -> None:
    # PyYAML silently keeps the last of two equal keys; that hides edits. An
    # aliased node is checked once (``seen_nodes``), not once per alias.
    if id(node) in seen_nodes:
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    raise ScenarioError(
                        source,
                        dotted(path + (key.value,)),
                        f"duplicate key (first at line {seen[key.value]})",
                        line=key.start_mark.line + 1,
                    )
                seen[key.value] = key.start_mark.line + 1
                _reject_duplicate_keys(value, path + (key.value,), source, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _reject_duplicate_keys(item, path + (i,), source, seen_nodes)


def line_of(root: yaml.Node | None, path: Sequence[str | int]) -> int | None:
    """1-based line of the deepest node along ``path`` that exists in the file."""
    if root is None:
        return None
    node: yaml.Node = root
    line = root.start_mark.line + 1
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    node, line = value, key.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line



def load_bounded(text: str, source: str) -> Any:
    """``yaml.load`` of a ``--set`` value under the same bounds as a file."""
    loader = ScenarioLoader(text)
    loader.source = source
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_bounds(node, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


