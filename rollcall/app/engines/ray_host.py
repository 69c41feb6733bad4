"""The process that talks to Ray for a sweep (``python -m rollcall.app.engines.ray_host``).

Why a process of its own: Ray's services listen on every interface of the
machine they start on (Ray 2.60 binds its gRPC servers to ``*`` unless the
node's address is loopback). A local head started here runs inside a
network namespace of the sweep's own, where the only interface is
loopback, so nothing outside the machine can reach it, and Ray picks
127.0.0.1 as the node's address. The sweep talks to this process over its
stdin and stdout (JSON lines, a pipe, no socket):

* out, first: ``{"ready": {"cpus": N, "nodes": N}}``;
* in: ``{"fn": "module:function", "tasks": [[i, payload_json], ...]}``;
* out, per task: ``{"i": i, "result": result_json}`` or ``{"i": i, "error": "one line"}``;
* out, after the batch: ``{"batch_done": true}``.

Every connection to Ray is authenticated by Ray's token (``RAY_AUTH_MODE=token``,
the token in ``RAY_AUTH_TOKEN``): the sweep draws a fresh one for its own head.
A task whose worker process or node is lost is run again up to ``--retries``
times (Ray's ``max_retries``); one that raises is not.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
from typing import Any, TextIO

from rollcall.app.engines.base import call

__all__ = ["main"]


def _loopback_up() -> None:
    """A fresh network namespace has its loopback down: bring it up."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        (index,) = ipr.link_lookup(ifname="lo")
        ipr.link("set", index=index, state="up")


def _say(out: TextIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else type(exc).__name__


def _run_batch(ray: Any, remote: Any, batch: dict[str, Any], out: TextIO) -> None:
    """Submit every task of the batch, answer each as it finishes."""
    fn = batch["fn"]
    refs = {remote.remote(fn, text): i for i, text in batch["tasks"]}
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1)
        for ref in ready:
            i = refs.pop(ref)
            try:
                _say(out, {"i": i, "result": ray.get(ref)})
            except Exception as exc:  # noqa: BLE001 - the task's failure, reported
                _say(out, {"i": i, "error": _one_line(exc)})
    _say(out, {"batch_done": True})


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rollcall.app.engines.ray_host")
    p.add_argument("--address", help="an existing Ray cluster (else a local head)")
    p.add_argument("--cpus", type=int, default=1, help="CPUs of the local head")
    p.add_argument("--retries", type=int, default=2)
    p.add_argument("--loopback-up", action="store_true",
                   help="bring lo up first (this process runs in a fresh network namespace)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the sweep decides when this ends
    out, sys.stdout = sys.stdout, sys.stderr  # Ray's chatter goes to the log, not the pipe
    if args.loopback_up:
        _loopback_up()
    import ray

    temp = None if args.address else tempfile.mkdtemp(prefix="rc-ray-")
    try:
        if args.address:
            ray.init(address=args.address, log_to_driver=False)
        else:
            ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
                     _temp_dir=temp)
        remote = ray.remote(max_retries=args.retries)(call)
        _say(out, {"ready": {"cpus": ray.cluster_resources().get("CPU", 0),
                             "nodes": len([n for n in ray.nodes() if n.get("Alive")])}})
        for line in sys.stdin:
            if line.strip():
                _run_batch(ray, remote, json.loads(line), out)
    finally:
        ray.shutdown()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
