"""What the engines and their callers share: the task contract and the
interface (see :mod:`rollcall.app.engines` for the whole story).

Why a module of its own: the package opens its engines (``local``,
``ray_engine``, ``slurm``), and the engines need these names. Below both,
they leave no import circle between the package and its engines.
"""

from __future__ import annotations

import importlib
import json
from typing import Any, Callable, Protocol, Sequence

__all__ = ["Done", "Engine", "EngineError", "call", "load_fn"]

#: called with a task's index in the batch and its result
Done = Callable[[int, dict[str, Any]], None]


class EngineError(RuntimeError):
    """A task failed for good, or the engine itself cannot run; one line."""


class Engine(Protocol):
    """Runs batches of tasks; see :mod:`rollcall.app.engines` for the contract."""

    name: str
    #: whether its tasks run where the caller's files are (then a task writes
    #: its run straight into the caller's directory; else it sends the files)
    local_files: bool

    def map(self, fn: str, payloads: Sequence[dict[str, Any]], done: Done) -> None:
        """Run ``fn`` on each payload; ``done(i, result)`` per finished task."""

    def close(self) -> None:
        """Stop everything this engine started (idempotent)."""


def load_fn(path: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The function ``"package.module:function"`` names."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"task function {path!r}: expected 'module:function'")
    fn = getattr(importlib.import_module(module), name)
    if not callable(fn):
        raise ValueError(f"task function {path!r} is not callable")
    return fn


def call(path: str, payload_json: str) -> str:
    """Run one task on JSON text, answer JSON text: what crosses a process or
    machine boundary is text a JSON parser reads, never a pickled object of ours."""
    result = load_fn(path)(json.loads(payload_json))
    assert isinstance(result, dict), (path, type(result))
    return json.dumps(result)
