"""What every part of the scenario package shares: bounds, field types, the
error a person reads, and the few words it is written with.

Errors matter as much as the schema: a person edits these files by hand, so
every problem is ONE line naming the file, the dotted field and the line in
the file (:class:`ScenarioError`). A validator raises :class:`Problem` to
point at the exact field it found at fault.
"""

from __future__ import annotations

from typing import Annotated, Any, Sequence

from pydantic import BaseModel, ConfigDict, Field, Strict, StringConstraints

# --------------------------------------------------------------------------
# Bounds: input a person cannot mean, refused before it costs memory or time.

#: A scenario file is at most this many bytes (a scenario is a few KiB; a
#: 100k-id kill list is well under it). Bounds memory before YAML sees a byte.
MAX_SCENARIO_BYTES = 1 << 20
#: Mappings and lists nest at most this deep (a scenario needs 5 levels), so
#: the recursive composer, the duplicate-key walk and pydantic never recurse far.
MAX_NESTING = 50
#: Aliases may add at most this many nodes to what the file itself holds: an
#: anchor reused a few times is fine, a billion-laughs bomb is refused.
MAX_ALIAS_NODES = 100_000
#: A schedule's joins add at most ``rendezvous.max_workers`` plus this many
#: newcomers (enough to replace every member many times over).
MAX_EXTRA_JOINS = 1_000
#: Worker ids (workers + spares + joins) in one scenario, at most.
MAX_WORKER_IDS = 1_000_000


# --------------------------------------------------------------------------
# Field types. Strict: a quoted "4" is a typo, not an integer; YAML's `yes`
# must not become 1. Floats accept integers (3600 is a fine number of seconds).

PosInt = Annotated[int, Strict(), Field(ge=1)]
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
PosFloat = Annotated[float, Strict(), Field(gt=0)]
NonNegFloat = Annotated[float, Strict(), Field(ge=0)]
Text = Annotated[str, Strict()]
Name = Annotated[str, StringConstraints(strict=True, pattern=r"^[A-Za-z0-9_.-]+$")]
SomeText = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=4096)]

class Problem(ValueError):
    """A cross-field problem that knows which field (relative path) is at fault.

    Pydantic wraps ValueErrors raised by validators and keeps the instance in
    the error's context, so the formatter can point at the exact field
    instead of at the whole section.
    """

    def __init__(self, where: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.where = where


class Section(BaseModel):
    """Base of every scenario model: unknown keys are errors, values immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)



class ScenarioError(Exception):
    """A scenario that cannot be used; ``str()`` is one line for a person.

    Format: ``<file>: <dotted.field> (line N): <what was wrong>``. The line is
    omitted when it cannot be located; a value that came from the command
    line says so instead (``(from --set)``). ``problems`` holds every problem
    found (one line each); ``str()`` shows the first.
    """

    def __init__(
        self,
        source: str,
        field: str | None,
        message: str,
        *,
        line: int | None = None,
        origin: str | None = None,
        problems: Sequence[str] = (),
    ) -> None:
        self.source = source
        self.field = field
        self.message = " ".join(message.split())
        self.line = line
        self.origin = origin
        text = self._format()
        self.problems: tuple[str, ...] = tuple(problems) or (text,)
        super().__init__(text)

    def _format(self) -> str:
        where = ""
        if self.line is not None:
            where = f" (line {self.line})"
        elif self.origin is not None:
            where = f" (from {self.origin})"
        if self.field:
            return f"{self.source}: {self.field}{where}: {self.message}"
        return f"{self.source}{where}: {self.message}"

    def __str__(self) -> str:
        return self._format()



def count_of(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def num(value: float | int) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def show(value: Any) -> str:
    """A value as a person wrote it in YAML, kept short."""
    if value is True or value is False:
        return "true" if value else "false"
    if value is None:
        return "null"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def dotted(path: Sequence[str | int]) -> str:
    return ".".join(str(p) for p in path)


#: the most times slower a slowdown may make a worker (a scripted ``slow``, the random ones)
MAX_SLOWDOWN = 1000


def check_slowdown(key: str, factor: float) -> None:
    """A slowdown ``factor`` (``key``, relative to the model that checks it)
    is more than 1 and at most :data:`MAX_SLOWDOWN` times slower."""
    if not 1 < factor <= MAX_SLOWDOWN:
        raise Problem((key,), f"must be > 1 and <= {MAX_SLOWDOWN} (times slower), got "
                              f"{num(factor)}")
