"""The entry points: a scenario from a file or text, with overrides, and
pydantic's errors said in our words, each at its line in the file.

Pure: no clocks, no randomness, no I/O beyond reading the file it is given.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import UnionType
from typing import Any, Sequence, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from rollcall.scenario.base import MAX_SCENARIO_BYTES, Problem, ScenarioError, dotted, num, show
from rollcall.scenario.faults import FAULT_TAGS
from rollcall.scenario.model import Scenario
from rollcall.scenario.scale import SCALE_HELPERS, drop_alternative
from rollcall.scenario.yaml_text import compose, line_of, load_bounded

def _parse_override(item: str, source: str) -> tuple[tuple[str, ...], Any]:
    key, sep, text = item.partition("=")
    key = key.strip()
    parts = tuple(key.split("."))
    if not sep or not key or any(not p for p in parts):
        raise ScenarioError(source, f"--set {item!r}", "expected dotted.key=value")
    try:
        value = load_bounded(text, source) if text.strip() else None
    except yaml.YAMLError as exc:
        detail = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ScenarioError(source, key, f"value {text!r} is not valid YAML: {detail}", origin="--set") from None
    return parts, value


def _apply_override(raw: dict[str, Any], parts: tuple[str, ...], value: Any, source: str) -> None:
    node: Any = raw
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
        elif isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ScenarioError(
                    source, ".".join(parts),
                    f"{where}: no such list index (the list has {len(node)} items)", origin="--set",
                )
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        else:
            raise ScenarioError(
                source, ".".join(parts),
                f"cannot set inside {'.'.join(parts[:depth])}: it is {show(node)}, not a mapping",
                origin="--set",
            )


def _model_at(path: Sequence[str | int]) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``path`` (for 'expected keys')."""
    model: Any = Scenario
    for part in path:
        if isinstance(part, str) and part in FAULT_TAGS:  # the fault union's choice
            model = FAULT_TAGS[part]
        elif isinstance(model, type) and issubclass(model, BaseModel):
            field = model.model_fields.get(str(part))
            if field is None:
                return None
            model = field.annotation
        elif get_origin(model) is tuple and isinstance(part, int):
            model = get_args(model)[0]
        else:
            return None
        # unwrap Optional[...]
        optional = get_origin(model) in (Union, UnionType)  # X | None, Optional[X]
        args = [a for a in get_args(model) if a is not type(None)] if optional else None
        if args is not None and len(args) == 1:
            model = args[0]
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _untagged(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """``loc`` without the tag the fault union adds after a schedule's index
    (``failures.schedule.0.KillFault.kill`` is ``failures.schedule.0.kill``)."""
    if len(loc) > 3 and loc[:2] == ("failures", "schedule") and loc[3] in FAULT_TAGS:
        return loc[:3] + loc[4:]
    return loc


def _message(err: dict[str, Any]) -> tuple[tuple[str | int, ...], str]:
    """Turn one pydantic error into (path, one-line message in our words)."""
    loc, text = _message_at(err)
    loc = _untagged(loc)
    if loc and loc[-1] == "[key]":  # a mapping's key, not its value, is wrong
        return loc[:-1], f"the key {text}"
    return loc, text


def _message_at(err: dict[str, Any]) -> tuple[tuple[str | int, ...], str]:
    loc = tuple(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    got = show(err.get("input"))
    if kind == "value_error" and isinstance(ctx.get("error"), Problem):
        problem = ctx["error"]
        return loc + problem.where, str(problem)
    if kind == "value_error":
        return loc, str(ctx.get("error", err["msg"]))
    if kind.startswith("rollcall_"):  # raised by our own validators, already worded
        return loc, str(err["msg"])
    if kind == "missing":
        return loc, "required key is missing"
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        helpers = list(SCALE_HELPERS.get(str(loc[0]), {})) if model and len(loc) == 2 else []
        keys = ", ".join(list(model.model_fields) + helpers) if model else "?"
        return loc, f"unknown key (expected one of: {keys})"
    simple = {
        "int_type": "expected an integer",
        "int_parsing": "expected an integer",
        "int_from_float": "expected an integer",
        "float_type": "expected a number",
        "float_parsing": "expected a number",
        "finite_number": "expected a finite number",
        "string_type": "expected a string",
        "model_type": "expected a mapping",
        "model_attributes_type": "expected a mapping",
        "dict_type": "expected a mapping",
        "tuple_type": "expected a list",
        "list_type": "expected a list",
    }
    if kind in simple:
        return loc, f"{simple[kind]}, got {got}"
    if kind == "literal_error":
        return loc, f"expected {ctx.get('expected')}, got {got}"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return loc, f"must be {bounds[kind]} {num(limit)}, got {got}"
    if kind == "string_pattern_mismatch":
        return loc, f"may contain only letters, digits, '_', '.' and '-', got {got}"
    return loc, f"{err['msg']}, got {got}"



# --------------------------------------------------------------------------
# Entry points


def parse_scenario(
    text: str,
    source: str = "<string>",
    overrides: Sequence[str] = (),
    *,
    seed: int | None = None,
    target: str | None = None,
    strategy: str | None = None,
) -> Scenario:
    """Validate a scenario given as YAML text; raise :class:`ScenarioError` on any problem.

    ``overrides`` are ``dotted.key=value`` strings (value parsed as YAML),
    applied to the raw mapping before validation; then ``seed``, ``target``
    and ``strategy`` (CLI flags) override ``seed``, ``target`` and
    ``strategy.kind``.
    """
    root, raw = compose(text, source)
    if raw is None:
        raise ScenarioError(
            source, "top level", "the file is empty; expected a mapping of scenario keys (at least 'name')",
            line=1,
        )
    if not isinstance(raw, dict):
        raise ScenarioError(
            source, "top level",
            f"expected a mapping of scenario keys, got a {type(raw).__name__} ({show(raw)})",
            line=root.start_mark.line + 1 if root is not None else None,
        )
    origins: dict[tuple[str, ...], str] = {}
    if isinstance(overrides, str):  # a lone string is one override, not characters
        overrides = (overrides,)
    for item in overrides:
        parts, value = _parse_override(item, source)
        _apply_override(raw, parts, value, source)
        drop_alternative(raw, parts)
        origins[parts] = "--set"
    if seed is not None:
        raw["seed"] = seed
        origins[("seed",)] = "--seed"
    if target is not None:
        raw["target"] = target
        origins[("target",)] = "--target"
    if strategy is not None:
        section = raw.get("strategy")
        if section is None:
            raw["strategy"] = section = {}
        if isinstance(section, dict):
            section["kind"] = strategy
            origins[("strategy", "kind")] = "--strategy"
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        raise _to_scenario_error(exc, source, root, origins) from None


def load_scenario(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    seed: int | None = None,
    target: str | None = None,
    strategy: str | None = None,
) -> Scenario:
    """Read and validate a scenario file (see :func:`parse_scenario`)."""
    source = str(path)
    try:
        text = _read_bounded(Path(path), source).decode("utf-8")
    except FileNotFoundError:
        raise ScenarioError(source, None, "no such file") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(source, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ScenarioError(source, None, f"cannot read: {exc.strerror or exc}") from None
    return parse_scenario(text, source, overrides, seed=seed, target=target, strategy=strategy)


class NotARegularFile(ValueError):
    """:func:`read_regular` found no regular file of at most the limit:
    ``kind`` is ``directory``, ``special`` (a device, pipe or socket) or ``large``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def read_regular(path: str | Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, else
    :class:`NotARegularFile` (``OSError`` where it cannot be opened).

    Opened non-blocking (a FIFO would block ``open`` until a writer came) and
    checked with ``fstat`` before any read: a device (``/dev/zero``), a pipe
    or a socket is refused, and at most the limit plus one byte is read, so
    a file that grows while read cannot exhaust memory either.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise NotARegularFile("directory", "is a directory")
        if not stat.S_ISREG(mode):
            raise NotARegularFile("special", "not a regular file (a device, pipe or socket)")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise NotARegularFile("large", f"larger than {limit} bytes")
    return data


def _read_bounded(path: Path, source: str) -> bytes:
    """At most ``MAX_SCENARIO_BYTES`` bytes of a regular file, or a ScenarioError."""
    try:
        return read_regular(path, MAX_SCENARIO_BYTES)
    except NotARegularFile as exc:
        if exc.kind == "large":
            raise ScenarioError(source, None, f"larger than {MAX_SCENARIO_BYTES} bytes (1 MiB), "
                                "the limit for a scenario file") from None
        raise ScenarioError(source, None, f"{exc}{',' if exc.kind == 'directory' else ';'}"
                            " expected a scenario file") from None


def _to_scenario_error(
    exc: ValidationError,
    source: str,
    root: yaml.Node | None,
    origins: dict[tuple[str, ...], str],
) -> ScenarioError:
    located: list[tuple[tuple[str | int, ...], str, int | None, str | None]] = []
    for err in exc.errors():
        path, message = _message(dict(err))
        spath = tuple(str(p) for p in path)
        # a value set on the command line is not at any line of the file:
        # the error is in it if one path is a prefix of the other
        origin = next(
            (o for p, o in reversed(origins.items()) if p[: len(spath)] == spath[: len(p)]), None
        ) if spath else None
        line = None if origin else line_of(root, path)
        located.append((path, message, line, origin))
    lines = [
        str(ScenarioError(source, dotted(p) or "top level", m, line=ln, origin=o))
        for p, m, ln, o in located
    ]
    path, message, line, origin = located[0]
    return ScenarioError(
        source, dotted(path) or "top level", message, line=line, origin=origin, problems=lines
    )
