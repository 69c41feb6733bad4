"""Where a real worker computes, and how its NCCL groups die without taking it along.

``cluster.device`` (``cpu`` | ``cuda``) and ``cluster.backend`` (``gloo`` |
``nccl``) are checked twice: the file alone at parse time (``nccl`` needs
``cuda``, :mod:`rollcall.scenario`), and this machine at run time
(:func:`device_problem`: CUDA present, one GPU per worker process for
``nccl``), because a scenario file can be validated on a machine with no GPU.

The NCCL hazards this module answers:

- a collective whose peer died spins its kernel forever: nothing but
  ``ncclCommAbort`` (the backend's ``abort()``) frees the stream, so the
  worker aborts every communicator of a generation the moment that
  generation ends for it (:class:`Communicators`), on a thread of its own,
  since an abort may wait on NCCL;
- torch's watchdog tears the whole process down on a timeout by default
  (``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``); a survivor must outlive its dead
  peers, so :func:`worker_env` sets the mode that only cleans up;
- destroying a communicator a dead peer may still hold can hang (NCCL
  2.31+ with shrunk communicators): an aborted backend is kept referenced
  until the process ends with ``os._exit``, so no destructor ever runs.

Everything but :func:`nccl_backend`, :func:`cuda_devices` and
:func:`platform_keys` is pure, so the CPU tests cover the decisions; the
torch calls are the documented torch 2.13 names (see docs/limitations.md,
"GPUs": run on one GPU only).
"""

from __future__ import annotations

import importlib.metadata
import math
import queue
import sys
import threading
from datetime import timedelta
from typing import Any, Callable, Optional

__all__ = [
    "ASYNC_ERROR_CLEANUP_ONLY",
    "Communicators",
    "cuda_devices",
    "device_problem",
    "gpus_needed",
    "nccl_backend",
    "pick_device",
    "platform_keys",
    "worker_env",
]

#: ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` values (torch 2.13's
#: ``ProcessGroupNCCL.hpp`` ``ErrorHandlingMode``): 0 no handling, 1 tear
#: down, 2 clean up only (abort the communicators, keep the process), 3 skip
#: clean-up and tear down (the default). A survivor needs 2.
ASYNC_ERROR_CLEANUP_ONLY = 2


def pick_device(worker: int, device: str, backend: str, cuda_count: int,
                gpus_per_worker: int = 1) -> str:
    """The torch device string worker ``worker`` computes on.

    ``cpu``: always ``"cpu"``. ``cuda`` with ``nccl``: worker ``w`` owns GPUs
    ``w * gpus_per_worker ..`` and computes on the first (NCCL refuses two
    ranks of one communicator on one GPU, and any worker id may meet any
    other in a generation, so ids never share). ``cuda`` with ``gloo``:
    workers share the GPUs round-robin (gloo stages CUDA tensors through host
    memory, so four workers on one GPU is fine). Raises ValueError when this
    machine cannot give the worker what the scenario asks for.
    """
    if device == "cpu":
        return "cpu"
    if device != "cuda":
        raise ValueError(f"unknown device {device!r} (cpu or cuda)")
    if cuda_count < 1:
        raise ValueError("cluster.device: cuda, but no CUDA device is visible")
    first = worker * gpus_per_worker
    if backend == "nccl":
        if first + gpus_per_worker > cuda_count:
            raise ValueError(f"worker {worker} needs GPUs {first}..{first + gpus_per_worker - 1} "
                             f"(cluster.backend: nccl), this machine has {cuda_count}")
        return f"cuda:{first}"
    return f"cuda:{first % cuda_count}"


def gpus_needed(worker_ids: int, gpus_per_worker: int, backend: str) -> int:
    """GPUs a ``cuda`` run needs on this machine: one block per worker id for
    ``nccl`` (``worker_ids``: every id that can ever exist, spares, joins and
    the cold pool included, since any two may meet in a generation), one for
    ``gloo`` (shared)."""
    return worker_ids * gpus_per_worker if backend == "nccl" else 1


def device_problem(scenario: Any, cuda_count: Optional[int] = None) -> Optional[str]:
    """Why ``scenario`` cannot run on this machine's devices (one line), or None.

    ``cuda_count``: the CUDA devices visible (None: ask torch, only when the
    scenario wants ``cuda``, so a CPU run never pays for the probe).
    """
    cl = scenario.cluster
    if getattr(scenario, "target", "real") != "real" or cl.device == "cpu":
        return None
    count = cuda_devices() if cuda_count is None else cuda_count
    if count < 1:
        return (f"{scenario.name}: cluster.device: cuda, but CUDA is not available on this "
                f"machine (torch {_torch_version()}); use cluster.device: cpu")
    need = gpus_needed(scenario.worker_id_limit, cl.gpus_per_worker, cl.backend)
    if need > count:
        return (f"{scenario.name}: cluster.backend: nccl needs one GPU per worker process "
                f"({scenario.worker_id_limit} worker ids x cluster.gpus_per_worker="
                f"{cl.gpus_per_worker} = {need} GPUs), this machine has {count}; use "
                f"cluster.backend: gloo (workers share GPUs) or fewer workers")
    return None


def worker_env(device: str, backend: str, timeout_s: float) -> dict[str, str]:
    """Environment a worker sets for itself before its first CUDA or NCCL call.

    Empty on CPU (nothing changes there). ``cuda``: cuBLAS with a fixed
    workspace, so a shard's gradient has the same bits whichever worker
    computes it (exact mode). ``nccl`` adds: the watchdog cleans up and never
    tears the process down; no heartbeat monitor (it kills a process whose
    watchdog is stuck in an abort); no flight-recorder dump (it signals the
    other ranks through a store that may be gone and sleeps first);
    non-blocking communicators whose init and abort give up after
    ``timeout_s`` (the group's own timeout), not torch's 30 minutes.
    """
    env: dict[str, str] = {}
    if device != "cuda":
        return env
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if backend != "nccl":
        return env
    env.update({
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": str(ASYNC_ERROR_CLEANUP_ONLY),
        "TORCH_NCCL_ENABLE_MONITORING": "0",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
        "TORCH_NCCL_PROPAGATE_ERROR": "0",
        "TORCH_NCCL_BLOCKING_WAIT": "0",
        "TORCH_NCCL_USE_COMM_NONBLOCKING": "1",
        "TORCH_NCCL_NONBLOCKING_TIMEOUT": str(max(1, math.ceil(timeout_s))),
    })
    return env


def cuda_devices() -> int:
    """CUDA devices visible to this process (0 on a CPU build or without a GPU)."""
    import torch

    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except (RuntimeError, AssertionError):  # a driver that will not initialise
        return 0


def _torch_version() -> str:
    """torch's version, without importing it when it is not (seconds, at the end of an
    interrupted run whose launcher never needed it)."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "__version__"):
        return str(torch.__version__)
    return importlib.metadata.version("torch")


def _nccl_version() -> Optional[str]:
    """NCCL's version as torch links it (``"2.27.5"``), or None (a CPU build)."""
    try:
        import torch.cuda.nccl

        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a CPU build has no torch._C._nccl_version
        return None
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def platform_keys(device: str, backend: str) -> dict[str, Any]:
    """The real summary's record of what the run ran on: ``torch_version``,
    ``backend``, ``device`` and ``nccl_version`` (null unless the run used
    NCCL), so a result can be told apart from one of another build."""
    return {"torch_version": _torch_version(), "backend": backend, "device": device,
            "nccl_version": _nccl_version() if backend == "nccl" else None}


def nccl_backend(dist: Any, store: Any, rank: int, size: int, device: Any, timeout_s: float,
                 on_created: Callable[[Any], None]) -> Any:
    """A ``ProcessGroupNCCL`` for one generation: non-blocking communicator,
    connected eagerly on ``device`` (torch 2.13: ``Options.config.blocking =
    0``, ``eager_connect_single_device``).

    ``on_created`` hears the backend before it connects: an abort must reach
    a communicator still initialising with a peer that died meanwhile
    (torch aborts those too), or the connect would wait for the timeout.
    """
    opts = dist.ProcessGroupNCCL.Options(is_high_priority_stream=False)
    opts._timeout = timedelta(seconds=timeout_s)
    opts.config.blocking = 0
    backend = dist.ProcessGroupNCCL(store, rank, size, opts)
    on_created(backend)
    backend.eager_connect_single_device(device)
    return backend


_CLOSE = object()  # ends :class:`Communicators`' thread


class Communicators:
    """The NCCL backends of one worker, by generation: aborted, never destroyed.

    :meth:`abort_through` is called by the control thread when a roll call
    opens (the agent's ``Abort``) or a later generation is entered; it only
    queues, so the heartbeats never wait on NCCL. A thread of its own calls
    each backend's ``abort()`` (every communicator it holds, those still
    initialising included) and keeps the backend referenced in
    :attr:`graveyard` for the rest of the process: its destructor would
    finalise a communicator a dead or paused peer may hold, which can hang.
    ``abort`` is a callable so that tests can count calls without torch.
    """

    def __init__(self, abort: Callable[[Any], None] = lambda b: b.abort()) -> None:
        self._abort = abort
        self.lock = threading.Lock()
        self.live: dict[int, list[Any]] = {}
        self.aborted_through = 0  # every generation <= this one is over here
        self.graveyard: list[Any] = []
        self.errors: list[str] = []
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Condition(self.lock)
        self._queued = 0
        self._thread = threading.Thread(target=self._loop, daemon=True, name="nccl-abort")
        self._thread.start()

    def add(self, generation: int, backend: Any) -> None:
        """A backend of ``generation`` exists; aborted at once if that
        generation is already over (its group was still being built)."""
        with self.lock:
            if generation <= self.aborted_through:
                self._put(backend)
            else:
                self.live.setdefault(generation, []).append(backend)

    def abort_through(self, generation: int) -> None:
        """Abort (off this thread) every backend of a generation <= ``generation``."""
        with self.lock:
            self.aborted_through = max(self.aborted_through, generation)
            for g in sorted(g for g in self.live if g <= generation):
                for backend in self.live.pop(g):
                    self._put(backend)

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether every queued abort has returned within ``timeout_s`` (tests)."""
        with self._done:
            return self._done.wait_for(lambda: self._queued == 0, timeout_s)

    def close(self) -> None:
        """End the abort thread once the queued aborts are done (tests; a
        worker never closes: it ends with ``os._exit``)."""
        self._queue.put(_CLOSE)
        self._thread.join()

    def _put(self, backend: Any) -> None:  # the caller holds ``lock``
        self.graveyard.append(backend)  # referenced before anyone can drop it
        self._queued += 1
        self._queue.put(backend)

    def _loop(self) -> None:
        while True:
            backend = self._queue.get()
            if backend is _CLOSE:
                return
            try:
                self._abort(backend)
            except Exception as exc:  # noqa: BLE001 - aborted already, or torn by the watchdog
                self.errors.append(f"{type(exc).__name__}: {exc}")
            with self._done:
                self._queued -= 1
                self._done.notify_all()
