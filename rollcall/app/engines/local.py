"""The default engine: a pool of processes on this machine.

A pool process that dies (the OOM killer, a stray signal) breaks the whole
``ProcessPoolExecutor``: every task in flight fails with
``BrokenProcessPool``, not only the one that ran there. So the engine
starts a new pool and submits again what had not finished, each task
charged one try; a task that raised an exception of its own is not tried
again (it would raise again) and ends the batch once the rest are in.
"""

from __future__ import annotations

import concurrent.futures as cf
import concurrent.futures.process as cf_process
import json
import signal
import threading
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Sequence

import psutil

from rollcall.app.engines.base import Done, EngineError, call

__all__ = ["LocalEngine", "end_processes"]

# the thread that feeds a ProcessPoolExecutor (CPython's; joined by _abort;
# an interpreter without it joins none, as before)
_MANAGER_THREAD: Any = getattr(cf_process, "_ExecutorManagerThread", ())


def _pool_worker_init() -> None:
    """A pool process leaves the signals to the sweep: SIGINT (which a
    terminal sends the whole group) is ignored, SIGTERM ends it at once (it
    would otherwise inherit the sweep's handler, turn the signal into an
    exception inside its task and wait for the next)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def end_processes(procs: Sequence[psutil.Process], timeout_s: float) -> None:
    """SIGTERM each, then SIGKILL whichever is still there after ``timeout_s``."""
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout_s)


class LocalEngine:
    """``jobs`` processes; ``retries`` more tries for a task whose process was lost."""

    name = "local"
    local_files = True  # its tasks run on this machine

    def __init__(self, jobs: int, retries: int = 2) -> None:
        assert jobs >= 1 and retries >= 0, (jobs, retries)
        self.jobs, self.retries = jobs, retries
        self._pool: cf.ProcessPoolExecutor | None = None
        self._before: set[int] = set()
        self._threads_before: set[threading.Thread] = set()

    def _open(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            self._before = {c.pid for c in psutil.Process().children()}
            self._threads_before = set(threading.enumerate())
            self._pool = cf.ProcessPoolExecutor(max_workers=self.jobs,
                                                initializer=_pool_worker_init)
        return self._pool

    def map(self, fn: str, payloads: Sequence[dict[str, Any]], done: Done) -> None:
        todo = {i: json.dumps(p) for i, p in enumerate(payloads)}
        tries = dict.fromkeys(todo, 0)
        failed: list[str] = []
        try:
            while todo:
                pool = self._open()
                futures = {pool.submit(call, fn, text): i for i, text in todo.items()}
                broken = False
                for fut in cf.as_completed(futures):
                    i = futures[fut]
                    try:
                        result = fut.result()
                    except BrokenProcessPool:
                        broken = True
                        continue
                    except Exception as exc:  # the task's own error: not retried
                        failed.append(f"task {i}: {type(exc).__name__}: {exc}")
                        del todo[i]
                        continue
                    del todo[i]
                    done(i, json.loads(result))
                if broken:
                    self._abort()
                    self._charge(todo, tries)
        except BaseException:
            self._abort()
            raise
        if failed:
            raise EngineError(f"{len(failed)} task(s) failed; first: {failed[0]}")

    def _charge(self, todo: dict[int, str], tries: dict[int, int]) -> None:
        """One try more for every task the broken pool took down."""
        for i in todo:
            tries[i] += 1
            if tries[i] > self.retries:
                raise EngineError(f"task {i}: its process was lost {tries[i]} times "
                                  f"(retries={self.retries})")

    def close(self) -> None:
        """Let the idle pool's processes exit."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _abort(self) -> None:
        """End this engine's pool processes by PID (a cut-short task has no
        result and reruns next time; a broken pool's are gone or going), then
        join the pool's manager thread: it may otherwise close its wake-up
        pipe while the interpreter's exit handler writes to it (CPython 3.11;
        an "Exception ignored" traceback on stderr, seen in CI). The first
        ``shutdown(wait=False)`` drops the pool's handle on that thread, so a
        second ``shutdown(wait=True)`` cannot join it: it is found among the
        threads started since the pool opened."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        mine = [c for c in psutil.Process().children() if c.pid not in self._before]
        managers = [t for t in threading.enumerate()
                    if t not in self._threads_before and isinstance(t, _MANAGER_THREAD)]
        pool.shutdown(wait=False, cancel_futures=True)
        end_processes(mine, timeout_s=10.0)
        for thread in managers:
            thread.join(timeout=10.0)
