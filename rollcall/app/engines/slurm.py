"""The Slurm engine: a sweep's batch as one job array, through submitit.

For HPC sites where the compute nodes are reached through Slurm, not a
long-lived cluster: each batch of tasks goes out as one ``sbatch`` array
(``executor.map_array``), and the results are read back as they finish.
submitit moves a task's function and arguments through files in
``folder`` (which must be on a file system the compute nodes share), not
through a socket; the arguments are JSON text (:func:`rollcall.app.engines.call`).

Options are submitit's own ``update_parameters`` keys, given on the command
line as ``--engine-opt KEY=VALUE`` (``slurm_partition=gpu``,
``timeout_min=120``, ``slurm_array_parallelism=64``, ``cpus_per_task=1``,
``mem_gb=4``...). A job that Slurm lost (node failure, preemption, time
limit: no result) is submitted again up to ``retries`` more times; one
whose task raised is not.
"""

from __future__ import annotations

import json
import shutil
from typing import Any, Mapping, Sequence

from rollcall.app.engines.base import Done, EngineError, call

__all__ = ["SlurmEngine"]

#: how often the job states are read (a scheduler, not a process pool)
POLL_S = 2.0


def _last_line(text: str) -> str:
    """The last line of submitit's message that says something (its traces
    end with a dashed rule)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().strip("-")]
    return lines[-1][:300] if lines else "no message"


class SlurmEngine:
    """``cluster=None`` is Slurm (``sbatch`` must be on PATH); ``"local"`` is
    submitit's stand-in that runs the same jobs as local processes."""

    name = "slurm"
    local_files = False  # a compute node may not see the sweep's directory

    def __init__(self, folder: str, options: Mapping[str, Any], retries: int = 2,
                 cluster: str | None = None) -> None:
        try:
            import submitit
        except ImportError:
            raise EngineError("--engine slurm: the submitit package is not installed") from None
        if cluster is None and shutil.which("sbatch") is None:
            raise EngineError("--engine slurm: no sbatch on PATH (run the sweep on a Slurm "
                              "login node)")
        self.retries = retries
        kind = "slurm" if cluster is None else cluster
        self._executor = submitit.AutoExecutor(folder=folder, cluster=kind)
        try:
            self._executor.update_parameters(**dict(options))
        except (TypeError, ValueError) as exc:
            raise EngineError(f"--engine-opt: {exc}") from None

    def map(self, fn: str, payloads: Sequence[dict[str, Any]], done: Done) -> None:
        from submitit.core.utils import FailedJobError, UncompletedJobError
        from submitit.helpers import as_completed

        texts = [json.dumps(p) for p in payloads]
        jobs = self._executor.map_array(call, [fn] * len(texts), texts)
        index = {id(job): i for i, job in enumerate(jobs)}
        tries = dict.fromkeys(range(len(texts)), 0)
        failed: list[str] = []
        try:
            while jobs:
                again = []
                for job in as_completed(jobs, poll_frequency=POLL_S):
                    i = index.pop(id(job))
                    try:
                        result = job.result()
                    except FailedJobError as exc:  # the task raised: not retried
                        failed.append(f"task {i}: {_last_line(str(exc))}")
                        continue
                    except UncompletedJobError as exc:  # lost: no result
                        tries[i] += 1
                        if tries[i] > self.retries:
                            raise EngineError(f"task {i}: lost {tries[i]} times: "
                                              f"{_last_line(str(exc))}") from None
                        retry = self._executor.submit(call, fn, texts[i])
                        index[id(retry)] = i
                        again.append(retry)
                        continue
                    done(i, json.loads(result))
                jobs = again
        except BaseException:
            for job in jobs:
                job.cancel(check=False)
            raise
        if failed:
            raise EngineError(f"{len(failed)} task(s) failed; first: {failed[0]}")

    def close(self) -> None:
        """Nothing runs between batches: each batch waits for its own jobs."""
