"""The run directory: resolved scenario, ``history.jsonl`` and ``summary.json``.

Notebooks and comparisons read these files and never re-run anything, so the
formats are fixed here, in one place, for both targets. File I/O only: the
caller passes in any time stamp, so this module reads no clock.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any, Iterable, Iterator

import orjson

from rollcall.scenario import Scenario

__all__ = [
    "HISTORY_FILE",
    "SCENARIO_FILE",
    "SUMMARY_FILE",
    "SUMMARY_KEYS",
    "HISTORY_RECORD_BYTES",
    "HistoryWriter",
    "OutDirError",
    "claim_out_dir",
    "default_out_dir",
    "LATEST_LINK",
    "ettr",
    "goodput",
    "history_estimate_bytes",
    "scenario_hash",
    "yaml_hash",
    "staging_dir",
    "store_run",
    "prepare_out_dir",
    "update_latest",
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
    "result",
    "end_reason",
)

#: Keys both targets' summaries add beyond SUMMARY_KEYS (the checker's sharded
#: counts and the ideal step), and those only one target's adds; docs/results.md
#: defines each one.
BOTH_EXTRA_KEYS: tuple[str, ...] = (
    "fallbacks", "lost_steps", "state_bytes_moved", "steps_lost_to_fallback", "ideal_step_s",
    "keeper_failovers", "checkpoint_s",
)
SIM_ONLY_KEYS: tuple[str, ...] = (
    "end_s", "checkpoints", "detections", "evictions", "crashes", "kills",
    "rack_kills", "pauses", "joins", "repairs", "retired", "blames", "pulled", "rounds",
    "min_members",
    "events",
    "keeper_calls", "sim_per_wall", "keeper_wall_s", "check_wall_s",
)
REAL_ONLY_KEYS: tuple[str, ...] = (
    "final_weights_sha256", "final_weights_agree", "survivor_restarts", "recoveries",
    "processes", "keeper_failover_s", "torch_version", "backend", "device", "nccl_version",
)


def check_summary_keys(summary: dict[str, Any], target: str) -> None:
    """Every key a summary carries is one of its target's documented keys,
    and none of the common ones is missing (both drivers call this)."""
    extra = BOTH_EXTRA_KEYS + (SIM_ONLY_KEYS if target == "sim" else REAL_ONLY_KEYS)
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    unknown = [k for k in summary if k not in SUMMARY_KEYS and k not in extra]
    assert not missing and not unknown, ("summary keys", target, missing, unknown)


_STAMP = re.compile(r"^\d{8}T\d{6}Z$")


def default_out_dir(scenario: Scenario, utc_stamp: str, root: str | Path = "runs") -> Path:
    """``runs/<name>/<utc_stamp>-seed<S>/``; the stamp is ``YYYYmmddTHHMMSSZ``.

    The stamp comes from the caller (the CLI) so that this module stays
    clock-free and tests can pass a fixed one.
    """
    if not _STAMP.match(utc_stamp):
        raise ValueError(f"utc_stamp must look like 20250101T120000Z, got {utc_stamp!r}")
    return Path(root) / scenario.name / f"{utc_stamp}-seed{scenario.seed}"


class OutDirError(ValueError):
    """An output directory that must not be written to as asked; ``str()`` is one line."""


def claim_out_dir(path: str | Path, force: bool) -> Path:
    """Make sure a run writes into a directory holding no result of another run.

    A missing or empty directory is fine. A non-empty one is refused unless
    ``force``; with ``force`` its ``summary.json`` and ``history.jsonl`` are
    removed first, so a run cut short can never leave an old summary beside
    a new history (both targets append to the history), and nothing else in
    the directory is touched.
    """
    out = Path(path)
    if not out.exists():
        return out
    if not out.is_dir():
        raise OutDirError(f"{out}: exists and is not a directory")
    if not any(out.iterdir()):
        return out
    if not force:
        raise OutDirError(f"{out}: exists and is not empty; pass --force to reuse it "
                          f"(its {SUMMARY_FILE} and {HISTORY_FILE} are removed first)")
    for name in (SUMMARY_FILE, HISTORY_FILE):
        (out / name).unlink(missing_ok=True)
    return out


#: name of the symlink in the runs root that points at the last directory written there
LATEST_LINK = "latest"


def update_latest(out_dir: str | Path, root: str | Path = "runs") -> Path | None:
    """Point ``root/latest`` at ``out_dir`` (a relative symlink); returns the link, or None.

    Why: after ``rollcall run``, ``compare`` or ``sweep`` the user wants
    ``rollcall report runs/latest`` without copying a time stamp. Only a
    directory inside ``root`` gets the link (an explicit ``--out`` elsewhere
    is the user's own place), and a real directory named ``latest`` (a
    scenario of that name) is left alone. The link is made under a temporary
    name and renamed over the old one, so a reader sees the old or the new
    target, never no link.
    """
    base, out = Path(root).resolve(), Path(out_dir).resolve()
    link = base / LATEST_LINK
    if base == out or base not in out.parents or link == out or link in out.parents:
        return None
    if link.exists() and not link.is_symlink():
        return None
    tmp = base / f".{LATEST_LINK}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.relpath(out, base), tmp)
    try:
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return link


#: Bytes of one history record, about (118-123 B measured on the sim's
#: quickstart runs, compact and per-sample ledger alike).
HISTORY_RECORD_BYTES = 120


def history_estimate_bytes(scenario: Scenario, per_sample_ledger: bool) -> int:
    """The size of a failure-free run's ``history.jsonl``, about.

    Two records per checkpoint interval (the steps' ``commit`` and the
    ``checkpoint``; both strategies checkpoint), plus, with the per-sample
    ledger, one record per member per step. Failures add records too; this
    is the floor, what a run of that many steps cannot avoid writing.
    """
    w = scenario.workload
    segments = -(-w.steps // scenario.strategy.checkpoint_interval_steps)
    records = 2 * segments + (w.steps * scenario.cluster.workers if per_sample_ledger else 0)
    return records * HISTORY_RECORD_BYTES


def ettr(productive_s: float, elapsed_s: float) -> float:
    """Effective training time ratio: the productive share of the elapsed time,
    in [0, 1]; both targets use it. The productive seconds are summed step by
    step and the elapsed ones are the end of the last step, so two sums of the
    same seconds may round an ulp apart: capped at 1."""
    assert productive_s >= 0, productive_s
    if elapsed_s <= 0:
        return 0.0
    return min(1.0, productive_s / elapsed_s)


def goodput(steps_committed: int, ideal_step_s: float | None, elapsed_s: float) -> float:
    """Useful work at the ideal pace over the time it took, in [0, 1]; both targets use it.

    Useful work is the steps actually committed (a run cut short did fewer
    than ``steps_target``), each at ``ideal_step_s``, the full initial
    cluster's step. Capped at 1: a job that steps faster with fewer members
    than with all of them (CPU workers sharing cores, as a calibrated sim
    models) has lost nothing, and "more than all of it" is no fraction.
    """
    assert steps_committed >= 0, steps_committed
    if not ideal_step_s or elapsed_s <= 0:
        return 0.0
    return min(1.0, steps_committed * ideal_step_s / elapsed_s)


def scenario_hash(scenario: Scenario) -> str:
    """SHA-256 of the resolved scenario (its YAML): equal iff the same run would be made."""
    return yaml_hash(scenario.to_yaml())


def yaml_hash(text: str) -> str:
    """:func:`scenario_hash` of the scenario whose ``to_yaml()`` is ``text``."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def finished_summary(run_dir: str | Path, sha256: str) -> dict[str, Any] | None:
    """The summary of a run already made in ``run_dir`` of the very scenario
    whose :func:`scenario_hash` is ``sha256``, or None (then it must run again).

    Made: its ``summary.json`` exists and was not cut short by an interrupt,
    and its ``scenario.yaml`` (the resolved scenario the run wrote before it
    started) hashes to ``sha256``: an edited scenario file, another
    ``--set``, another checkpoint interval or another scenario's run in the
    same directory is stale. The one rule ``compare`` and ``sweep`` resume by.
    """
    run_dir = Path(run_dir)
    try:
        text = (run_dir / SCENARIO_FILE).read_bytes()
        if hashlib.sha256(text).hexdigest() != sha256:
            return None
        summary = read_summary(run_dir)
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("result") == "interrupted":
        return None
    return summary


def atomic_write_text(path: Path, text: str) -> None:
    """Write beside the target and rename: a reader (or a crash) sees either
    the old file or the whole new one, never half a file."""
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
    atomic_write_text(out / SCENARIO_FILE, scenario.to_yaml())
    return out


_FILE_NAME = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")


def staging_dir(run_dir: str | Path) -> Path:
    """Where a run that an engine makes is written before it is whole: a
    sibling of ``run_dir``, renamed onto it by :func:`store_run`."""
    final = Path(run_dir)
    return final.with_name(final.name + ".part")


def store_run(run_dir: str | Path, result: Any, extra: dict[str, str] | None = None) -> None:
    """Put a run an engine made (:func:`rollcall.app.sweeps.point_task`) in
    ``run_dir`` as one rename, so it is on disk whole or not at all, and a
    task an engine ran twice leaves one run, not two. ``result`` is either
    ``{"run_dir": staging}``, a run the task wrote on this file system (it
    must be :func:`staging_dir` of ``run_dir``), or ``{"files": {relative
    name: text}}`` from another machine, written to the staging directory
    here (each name a plain relative path). Either must hold the run's
    scenario and summary; else ValueError (one line). ``extra`` files are
    added (written before the rename)."""
    final, part = Path(run_dir), staging_dir(run_dir)
    if not isinstance(result, dict):
        raise ValueError(f"{final}: the task's answer holds no run")
    if "run_dir" in result:
        if result["run_dir"] != str(part):
            raise ValueError(f"{final}: the task wrote its run elsewhere ({str(result['run_dir'])[:80]})")
        names = {p.name for p in part.iterdir()} if part.is_dir() else set()
        if not {SUMMARY_FILE, SCENARIO_FILE} <= names:
            raise ValueError(f"{final}: the task's run directory holds no finished run")
        files: dict[str, str] = {}
    else:
        files = result.get("files")  # type: ignore[assignment]
        if not isinstance(files, dict) or SUMMARY_FILE not in files or SCENARIO_FILE not in files:
            raise ValueError(f"{final}: the task's answer holds no run")
        for name, text in files.items():
            if not (isinstance(name, str) and _FILE_NAME.fullmatch(name)
                    and ".." not in name.split("/") and isinstance(text, str)):
                raise ValueError(f"{final}: the task's answer names a file {str(name)[:80]!r}")
        if part.exists():
            shutil.rmtree(part)
        part.mkdir(parents=True)
    merged = {**files, **(extra or {})}
    for name in sorted(merged, key=lambda n: n == SUMMARY_FILE):  # the summary last
        path = part / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(merged[name], encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    os.rename(part, final)


def write_summary(out_dir: str | Path, summary: dict[str, Any]) -> Path:
    """Write ``summary.json`` atomically (sorted keys, indent 2); returns its path."""
    path = Path(out_dir) / SUMMARY_FILE
    atomic_write_text(path, json.dumps(summary, sort_keys=True, indent=2) + "\n")
    return path


def read_summary(out_dir: str | Path) -> dict[str, Any]:
    """Load ``summary.json`` from a run directory."""
    with open(Path(out_dir) / SUMMARY_FILE, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{Path(out_dir) / SUMMARY_FILE}: expected a JSON object")
    return data


def read_history(out_dir: str | Path) -> Iterator[dict[str, Any]]:
    """Yield the records of ``history.jsonl`` in order (a torn last line is an
    error), member lists whole (``rollcall.core.history.expand_deltas``)."""
    from rollcall.core import expand_deltas

    yield from expand_deltas(_history_lines(Path(out_dir) / HISTORY_FILE))


def _history_lines(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
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


_STDLIB_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
_ORJSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE
# where orjson 3.13 writes a small float otherwise than the standard library: 1e-6
# for 1e-06 (an exponent of one digit), and 0.00001 or -0.000025 for 1e-05 and
# -2.5e-05 (below 1e-4 the standard library writes an exponent); such a line is
# the standard library's to write
_ORJSON_SMALL_FLOAT = re.compile(r"[0-9]e-[0-9](?![0-9])|(?<![0-9])0\.0000[0-9]")


def history_line(record: dict[str, Any]) -> str:
    """One history record as its line: compact, key-sorted JSON, ASCII only.

    The bytes are those of ``json.dumps(record, sort_keys=True,
    separators=(",", ":"))`` (what every history so far was written with),
    made by orjson, which is several times faster: encoding is a tenth of a
    large sim run. Where the two would differ, the standard library writes
    the line instead: a record with non-string keys or an integer beyond 64
    bits (orjson refuses them) or with non-ASCII text or DEL (orjson writes
    them raw, the standard library escapes them) or a float below 1e-4
    (orjson ``1e-6`` and ``0.00001``, the standard library ``1e-06`` and ``1e-05``).
    A NaN or an infinity, which JSON cannot carry (orjson would write
    ``null``), is an error.
    """
    try:
        line = orjson.dumps(record, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        line = b"null"  # let the standard library say what it cannot write
    # printable ASCII only: orjson escapes controls below 0x20 but not DEL (0x7f),
    # which the standard library writes as \u007f
    if line.isascii():
        text = line.decode("ascii")  # searched as text: `bytes in bytes` raises and clears a TypeError
        if "null" not in text and "\x7f" not in text and (
                ("e-" not in text and "0.0000" not in text)
                or not _ORJSON_SMALL_FLOAT.search(text)):
            return text
    # same bytes where both can write it; raises on a NaN or an infinity
    return _STDLIB_ENCODER.encode(record) + "\n"


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

    @staticmethod
    def _line(record: dict[str, Any]) -> str:
        return history_line(record)

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
