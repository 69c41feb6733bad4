"""The Ray engine: a sweep's tasks on a Ray cluster.

Without an address the engine starts a Ray head of the sweep's own, with
``jobs`` CPUs, inside a network namespace of its own (root: ``unshare
--net``; otherwise an unprivileged user namespace, ``unshare --user
--map-root-user --net``), so its services are reachable on loopback only
and only from that namespace, and with a token drawn for this sweep
(``RAY_AUTH_MODE=token``). With ``--address`` it joins a cluster the user
runs; that cluster must use token authentication too, its token given as
Ray reads it (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
``~/.ray/auth_token``).

On pickle: Ray moves task arguments and results between its processes in
its own serialisation, which is pickle. rollcall hands it JSON text only
(:func:`rollcall.app.engines.call`), reads answers with a JSON parser, and lets
Ray's transport run only between processes that hold the token. The
sweep process itself never unpickles anything: it reads JSON lines from
the host process's stdout (:mod:`rollcall.app.engines.ray_host`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from typing import IO, Any, Sequence

import psutil

from rollcall.app.engines.base import Done, EngineError
from rollcall.app.engines.local import end_processes

__all__ = ["RayEngine", "namespace_prefix"]

#: how long a local head may take to come up on a loaded 2-core machine
START_TIMEOUT_S = 180.0


def namespace_prefix() -> list[str]:
    """The command prefix that runs a process in a fresh network namespace,
    or raises :class:`EngineError` saying why this machine cannot."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise EngineError("--engine ray without --address needs util-linux's unshare (a network "
                          "namespace of the sweep's own); give --address of a Ray cluster instead")
    prefix = [unshare, "--net"] if os.geteuid() == 0 else [unshare, "--user", "--map-root-user", "--net"]
    probe = subprocess.run(prefix + ["true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["unknown"])[-1]
        raise EngineError(f"--engine ray without --address: cannot make a network namespace "
                          f"({why}); run as root or give --address of a Ray cluster")
    return prefix + ["--"]


class RayEngine:
    """Tasks through a :mod:`rollcall.app.engines.ray_host` process."""

    name = "ray"

    def __init__(self, jobs: int, address: str | None = None, log_path: str | None = None,
                 retries: int = 2) -> None:
        assert jobs >= 1 and retries >= 0, (jobs, retries)
        import importlib.util

        if importlib.util.find_spec("ray") is None:  # fail here, in one line
            raise EngineError("--engine ray: the ray package is not installed")
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        cmd = [sys.executable, "-m", "rollcall.app.engines.ray_host", "--retries", str(retries)]
        if address:
            if env.get("RAY_AUTH_MODE") != "token":
                raise EngineError("--engine ray --address: the cluster must use token "
                                  "authentication; set RAY_AUTH_MODE=token and its token "
                                  "(RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)")
            cmd += ["--address", address]
        else:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_urlsafe(32))
            env.pop("RAY_AUTH_TOKEN_PATH", None)
            env.pop("RAY_ADDRESS", None)
            cmd = namespace_prefix() + cmd + ["--cpus", str(jobs), "--loopback-up"]
        self._log: IO[bytes] = open(log_path, "ab") if log_path else open(os.devnull, "wb")
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log, env=env, start_new_session=True,
                                      text=True, encoding="utf-8")
        try:
            ready = self._read(timeout_s=START_TIMEOUT_S)
        except BaseException:
            self._end(abort=True)
            raise
        if "ready" not in ready:
            self._end(abort=True)
            raise EngineError(f"the Ray host answered {str(ready)[:200]!r} instead of ready")
        self.cpus, self.nodes = ready["ready"]["cpus"], ready["ready"]["nodes"]
        self.local_files = not address  # a head of its own runs its tasks on this machine
        # the local head's namespace: every process in it is this engine's
        netns = None if address else _netns_of(self._proc.pid)
        if not address and netns in (None, _netns_of(os.getpid())):
            self._end(abort=True)
            raise EngineError("the local Ray head is not in a network namespace of its own")
        self._netns = netns

    def _read(self, timeout_s: float | None = None) -> dict[str, Any]:
        """The host's next line; EngineError when it ended (or, with a
        timeout, said nothing that long)."""
        assert self._proc.stdout is not None
        if timeout_s is not None:
            import selectors

            with selectors.DefaultSelector() as sel:
                sel.register(self._proc.stdout, selectors.EVENT_READ)
                if not sel.select(timeout=timeout_s):
                    raise EngineError(f"the Ray host did not start within {timeout_s:.0f} s")
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait(timeout=60)
            raise EngineError(f"the Ray host ended (exit {code}); its log: "
                              f"{getattr(self._log, 'name', 'none')}")
        obj = json.loads(line)
        assert isinstance(obj, dict), obj
        return obj

    def map(self, fn: str, payloads: Sequence[dict[str, Any]], done: Done) -> None:
        assert self._proc.stdin is not None
        tasks = [[i, json.dumps(p)] for i, p in enumerate(payloads)]
        failed: list[str] = []
        try:
            self._proc.stdin.write(json.dumps({"fn": fn, "tasks": tasks}) + "\n")
            self._proc.stdin.flush()
            seen: set[int] = set()
            while True:
                msg = self._read()
                if msg.get("batch_done"):
                    break
                i = msg["i"]
                assert i not in seen and 0 <= i < len(tasks), (i, len(tasks))
                seen.add(i)
                if "error" in msg:
                    failed.append(f"task {i}: {msg['error']}")
                else:
                    done(i, json.loads(msg["result"]))
            assert len(seen) == len(tasks), (len(seen), len(tasks))
        except BaseException:
            self._end(abort=True)
            raise
        if failed:
            raise EngineError(f"{len(failed)} task(s) failed; first: {failed[0]}")

    def close(self) -> None:
        """No more batches: the host shuts Ray down (stopping a head it started) and exits."""
        self._end(abort=False)

    def _end(self, abort: bool) -> None:
        """End the host (at once when ``abort``: it is inside a batch, not
        reading), then whatever of its process tree is still there, by PID."""
        proc = getattr(self, "_proc", None)
        if proc is None:
            return
        self._proc = None  # type: ignore[assignment]
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
        if abort and proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # SIGTERM, then SIGKILL
            tree.append(psutil.Process(proc.pid))
        end_processes([p for p in tree if p.is_running()], timeout_s=10.0)
        proc.poll()  # reaped by end_processes if it had to end it
        netns = getattr(self, "_netns", None)
        for _ in range(5):  # a worker the raylet forked as it went down is in it too
            rest = _in_netns(netns) if netns is not None else []
            if not rest:
                break
            end_processes(rest, timeout_s=10.0)
        if proc.stdout is not None:
            proc.stdout.close()
        self._log.close()

    def __del__(self) -> None:  # a forgotten engine still leaves nothing behind
        if getattr(self, "_proc", None) is not None:
            self._end(abort=True)


def _netns_of(pid: int) -> str | None:
    """The network namespace of ``pid`` (``net:[inode]``), or None when gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _in_netns(netns: str) -> list[psutil.Process]:
    """Every process in network namespace ``netns`` (never this one's own)."""
    assert netns != _netns_of(os.getpid()), "not the sweep's own namespace"
    out = []
    for p in psutil.process_iter():
        if _netns_of(p.pid) == netns:
            out.append(p)
    return out
