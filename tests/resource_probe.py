"""Open fds and threads of a real run's worker processes, sampled by generation.

A worker lives through many generations, and each
builds a gloo group over a fresh store connection; a worker that keeps the
old ones grows by a group's sockets and threads every generation. This reads
what the kernel says a worker holds (``/proc/PID/fd`` and ``/proc/PID/task``,
through psutil) while the run goes on, and tags each sample with the latest
generation the worker entered (its ``enter`` records in ``history.jsonl``).
Used by tests/test_real_resources.py and benchmarks/worker_resources.py.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import psutil

from rollcall import interrupts
from rollcall.results import HISTORY_FILE
from rollcall.scenario import Scenario, load_scenario

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Sample:
    t_s: float        # since sampling started
    worker: int
    generation: int   # the latest generation the worker entered; 0 before its first
    fds: int
    threads: int


def pause_scenario(pauses: int, workers: int = 3, period_s: float = 0.9,
                   timeout_s: float = 0.4, margin_s: float = 30.0) -> tuple[Scenario, float]:
    """real-pause-one, made into many generations fast: the last worker is
    paused past a short detector timeout ``pauses`` times, ``period_s``
    apart; each pause is an eviction and a rejoin, two generations. The job
    never completes by steps: the run ends at the wall limit returned,
    ``margin_s`` after the last pause. The wall limit counts from the
    launch and the pauses from the training's start, so the margin holds
    the start-up too: ten seconds were too few beside the rest of the suite
    on 2 cores (23 of 30 pauses came in time)."""
    assert pauses >= 1 and workers >= 2 and period_s > 1.6 * timeout_s
    victim = workers - 1
    schedule = ", ".join(f"{{at_s: {1.0 + i * period_s:.3f}, pause: {victim}, "
                         f"for_s: {1.6 * timeout_s:.3f}}}" for i in range(pauses))
    overrides = [f"cluster.workers={workers}", "workload.steps=1000000",
                 f"detector.timeout_s={timeout_s}", "detector.heartbeat_s=0.05",
                 "rendezvous.last_call_s=0.05", "rendezvous.min_workers=2",
                 f"failures.schedule=[{schedule}]"]
    scenario = load_scenario(ROOT / "scenarios" / "real-pause-one.yaml", overrides)
    return scenario, 1.0 + pauses * period_s + margin_s


class HistoryTail:
    """The latest generation each worker entered, and the paused workers'
    resumptions, from a history file another thread is still appending to
    (read on from where it stopped)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.entered: dict[int, int] = {}
        self.resumes = 0  # pauses ended
        self.entered_at_resume: dict[int, int] = {}  # ``entered`` as the latest pause ended

    def poll(self) -> dict[int, int]:
        if not self.path.exists():
            return self.entered
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            r = json.loads(line)
            if r.get("f") == "enter" and isinstance(r.get("process"), int):
                w = r["process"]
                self.entered[w] = max(self.entered.get(w, 0), r["gen"])
            elif r.get("f") == "fault" and r.get("kind") == "resume":
                self.resumes += 1
                self.entered_at_resume = dict(self.entered)
        return self.entered

    def rejoined_after(self, pauses: int, worker: int) -> bool:
        """Whether ``pauses`` pauses ended and ``worker`` entered a generation
        after the last one ended (it was evicted, and is back)."""
        return (self.resumes >= pauses
                and self.entered.get(worker, 0) > self.entered_at_resume.get(worker, 0))


def first_lives(workers: tuple[int, ...]) -> dict[int, psutil.Process]:
    """This process's children that are the first life of one of ``workers``."""
    out: dict[int, psutil.Process] = {}
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if "real.worker" not in cmd or "--worker" not in cmd:
            continue
        w = int(cmd[cmd.index("--worker") + 1])
        inc = int(cmd[cmd.index("--incarnation") + 1]) if "--incarnation" in cmd else 0
        if w in workers and inc == 0:
            out[w] = child
    return out


def sample_run(scenario: Scenario, out: Path, max_wall_s: float,
               workers: tuple[int, ...] = (0,), every_s: float = 0.05,
               until: Optional[Callable[[HistoryTail], bool]] = None,
               ) -> tuple[dict[str, Any], list[Sample]]:
    """Run ``scenario`` on the real target and sample ``workers``' first
    lives every ``every_s`` until it is over: ended at ``max_wall_s``, or
    stopped as SIGTERM would stop it once ``until`` holds of its history."""
    from real import driver

    result: dict[str, Any] = {}
    stop = interrupts.Stop()

    def run() -> None:
        try:
            result["summary"] = driver.run(scenario, out, max_wall_s=max_wall_s, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
            result["error"] = exc

    th = threading.Thread(target=run, daemon=True, name="real-run")
    t0 = time.monotonic()
    th.start()
    tail = HistoryTail(out / HISTORY_FILE)
    procs: dict[int, psutil.Process] = {}
    samples: list[Sample] = []
    while th.is_alive():
        assert time.monotonic() - t0 < max_wall_s + 60.0, "the run outlived its wall limit"
        if len(procs) < len(workers):
            procs.update(first_lives(workers))
        entered = tail.poll()
        if until is not None and stop.signum is None and until(tail):
            stop.handle(signal.SIGTERM)  # the first signal: the run ends, its results kept
        for w, proc in procs.items():
            s = sample(proc, w, entered.get(w, 0), time.monotonic() - t0)
            if s is not None:
                samples.append(s)
        th.join(every_s)  # bounded: the run's end or the next sample
    if "error" in result:
        raise result["error"]
    return result["summary"], samples


def sample(proc: psutil.Process, worker: int, generation: int, t_s: float) -> Optional[Sample]:
    """One reading of ``proc``; None once it has exited."""
    try:
        return Sample(round(t_s, 3), worker, generation, proc.num_fds(), proc.num_threads())
    except psutil.Error:
        return None


def by_generation(samples: list[Sample], worker: int) -> dict[int, tuple[int, int, int, int]]:
    """Per generation of ``worker``: (fewest fds, most fds, fewest threads, most threads)."""
    out: dict[int, tuple[int, int, int, int]] = {}
    for s in samples:
        if s.worker != worker:
            continue
        lo_f, hi_f, lo_t, hi_t = out.get(s.generation, (s.fds, s.fds, s.threads, s.threads))
        out[s.generation] = (min(lo_f, s.fds), max(hi_f, s.fds),
                             min(lo_t, s.threads), max(hi_t, s.threads))
    return out


def peaks(samples: list[Sample], worker: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``worker``'s most (fds, threads) in its 2nd and 3rd generations, and
    in every later one but its last (the one the run's end cuts: processes
    are stopping). The 2nd and 3rd are one of each kind a pause run makes
    (with and without the paused worker): its steady state once groups are
    being torn down, after the start-up of the first."""
    table = by_generation(samples, worker)
    gens = sorted(g for g in table if g > 0)
    assert len(gens) >= 5, f"worker {worker} entered only generations {gens}"

    def most(of: list[int]) -> tuple[int, int]:
        return max(table[g][1] for g in of), max(table[g][3] for g in of)

    return most(gens[1:3]), most(gens[3:-1])
