"""Where a sweep's runs execute: one small interface, three engines.

Why an interface: a 10^5-GPU study is thousands of replicates, more than one
machine's process pool gets through in a day. The sweep hands an engine
plain data and gets plain data back, so the same points give the same rows
wherever they ran:

* a task is ``fn(payload) -> result``, ``fn`` named as ``"module:function"``
  (every engine imports it by name; nothing is shipped as code) and
  ``payload``/``result`` JSON-ready dicts;
* :meth:`Engine.map` runs a batch and calls ``done(index, result)`` in the
  caller's thread as each task finishes, in whatever order they finish;
* a task whose process or machine is lost is run again, up to ``retries``
  more times; a task that raises is not (a deterministic simulation raises
  the same way again) and ends the batch with :class:`EngineError` once the
  other tasks are in, so what finished is kept.

Engines: ``local`` (a process pool on this machine, the default),
``ray`` (a Ray cluster: a local head of its own, or ``--address``) and
``slurm`` (job arrays through submitit). Only this package imports them.
"""

from __future__ import annotations

from typing import Any, Mapping

from rollcall.app.engines.base import Done, Engine, EngineError, call, load_fn

__all__ = ["ENGINES", "Done", "Engine", "EngineError", "call", "load_fn", "open_engine"]

ENGINES: tuple[str, ...] = ("local", "ray", "slurm")


def open_engine(name: str, *, jobs: int, address: str | None = None,
                options: Mapping[str, Any] | None = None, folder: str | None = None,
                log_path: str | None = None, retries: int = 2) -> Engine:
    """An engine by its CLI name. ``jobs``: local processes, or the CPUs of a
    local Ray head; ``address``: an existing Ray cluster; ``options``:
    submitit's parameters (``slurm_partition``, ``timeout_min``, ...);
    ``folder``: where submitit keeps its job files; ``log_path``: where the
    Ray host's own output goes. Raises :class:`EngineError` (one line) when
    the engine cannot start here."""
    assert retries >= 0, retries
    if name == "local":
        from rollcall.app.engines.local import LocalEngine

        return LocalEngine(jobs=jobs, retries=retries)
    if name == "ray":
        from rollcall.app.engines.ray_engine import RayEngine

        return RayEngine(jobs=jobs, address=address, log_path=log_path, retries=retries)
    if name == "slurm":
        from rollcall.app.engines.slurm import SlurmEngine

        assert folder is not None, "the slurm engine needs a folder for its job files"
        return SlurmEngine(folder=folder, options=dict(options or {}), retries=retries)
    raise EngineError(f"unknown engine {name!r} (one of {', '.join(ENGINES)})")
