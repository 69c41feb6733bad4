"""The run directory: resolved scenario, ``history.jsonl`` and ``summary.json``.

Notebooks and comparisons read these files and never re-run anything, so the
formats are fixed here, in one place, for both targets. File I/O only: the
caller passes in any time stamp, so this module reads no clock.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any, Iterable, Iterator

from rollcall.scenario import Scenario

__all__ = [
    "HISTORY_FILE",
    "SCENARIO_FILE",
    "SUMMARY_FILE",
    "SUMMARY_KEYS",
    "HistoryWriter",
    "default_out_dir",
    "prepare_out_dir",
    "read_history",
    "read_summary",
    "write_summary",
]

SCENARIO_FILE = "scenario.yaml"
HISTORY_FILE = "history.jsonl"
SUMMARY_FILE = "summary.json"

#: Keys every driver's ``summary.json`` carries (both targets, same meaning).
SUMMARY_KEYS: tuple[str, ...] = (
    "scenario",
    "target",
    "strategy",
    "seed",
    "valid",
    "violations",
    "completed",
    "steps_target",
    "steps_committed",
    "samples_consumed",
    "samples_duplicated",
    "samples_skipped",
    "global_batch_min",
    "global_batch_max",
    "elapsed_s",
    "productive_s",
    "ettr",
    "goodput",
    "lost_work_s",
    "stall_s",
    "recovery_s",
    "failures",
    "generations",
    "restarts",
    "wall_s",
)

_STAMP = re.compile(r"^\d{8}T\d{6}Z$")


def default_out_dir(scenario: Scenario, utc_stamp: str, root: str | Path = "runs") -> Path:
    """``runs/<name>/<utc_stamp>-seed<S>/``; the stamp is ``YYYYmmddTHHMMSSZ``.

    The stamp comes from the caller (the CLI) so that this module stays
    clock-free and tests can pass a fixed one.
    """
    if not _STAMP.match(utc_stamp):
        raise ValueError(f"utc_stamp must look like 20250101T120000Z, got {utc_stamp!r}")
    return Path(root) / scenario.name / f"{utc_stamp}-seed{scenario.seed}"


def _atomic_write_text(path: Path, text: str) -> None:
    # Write beside the target and rename: a reader (or a crash) sees either
    # the old file or the whole new one, never half a file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def prepare_out_dir(path: str | Path, scenario: Scenario) -> Path:
    """Create the run directory (and parents) and write the resolved ``scenario.yaml``."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write_text(out / SCENARIO_FILE, scenario.to_yaml())
    return out


def write_summary(out_dir: str | Path, summary: dict[str, Any]) -> Path:
    """Write ``summary.json`` atomically (sorted keys, indent 2); returns its path."""
    path = Path(out_dir) / SUMMARY_FILE
    _atomic_write_text(path, json.dumps(summary, sort_keys=True, indent=2) + "\n")
    return path


def read_summary(out_dir: str | Path) -> dict[str, Any]:
    """Load ``summary.json`` from a run directory."""
    with open(Path(out_dir) / SUMMARY_FILE, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{Path(out_dir) / SUMMARY_FILE}: expected a JSON object")
    return data


def read_history(out_dir: str | Path) -> Iterator[dict[str, Any]]:
    """Yield the records of ``history.jsonl`` in order (a torn last line is an error)."""
    with open(Path(out_dir) / HISTORY_FILE, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def read_jsonl_so_far(path: str | Path) -> list[dict[str, Any]]:
    """The complete records of a JSON-lines file another process may still be
    writing: a missing file is empty, a torn last line is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # the line being written
    return out


class HistoryWriter:
    """Appends one compact, key-sorted JSON object per line to ``history.jsonl``.

    Every ``write`` is flushed before it returns, so a driver killed mid-run
    (the real target kills things on purpose) never loses a record it wrote.
    Sorted keys and fixed separators make two equal histories byte-identical.
    """

    def __init__(self, out_dir: str | Path, filename: str = HISTORY_FILE) -> None:
        self.path = Path(out_dir) / filename
        self._fh = open(self.path, "a", encoding="utf-8")
        self.count = 0

    _encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"))

    @classmethod
    def _line(cls, record: dict[str, Any]) -> str:
        return cls._encoder.encode(record) + "\n"

    def write(self, record: dict[str, Any]) -> None:
        """Append one record and flush it to the OS."""
        self._fh.write(self._line(record))
        self._fh.flush()
        self.count += 1

    def write_many(self, records: Iterable[dict[str, Any]]) -> None:
        """Append several records with one flush at the end."""
        lines = [self._line(r) for r in records]
        self._fh.write("".join(lines))
        self._fh.flush()
        self.count += len(lines)

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
