"""A pause on the real target is in force once its signal call returns.

A SIGSTOP reaches one thread of a process, which stops the others when it
next runs; a worker whose trainer thread waits for a CPU could meanwhile
answer a roll call on its control thread. :func:`real.procs.signal_child`
(the launcher's and the host agent's way to signal a worker) returns from a
SIGSTOP only once every thread has stopped. The child here is the worker's
shape: a main thread that computes and a thread that answers messages.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from real.procs import signal_child

CHILD = """
import socket, sys, threading
link = socket.socket(fileno=int(sys.argv[1]))
def answer():
    while (b := link.recv(1)):
        link.sendall(b)
threading.Thread(target=answer, daemon=True).start()
link.sendall(b"r")
n = 0
while True:
    n += 1
"""
WAIT_S = 30.0  # bound on any answer that must come


def states(pid: int) -> list[str]:
    """The scheduler state of each thread of ``pid``."""
    tasks = Path(f"/proc/{pid}/task")
    return [(tasks / t / "stat").read_text().rsplit(")", 1)[1].split()[0]
            for t in os.listdir(tasks)]


def answered(link: socket.socket, within_s: float) -> bytes:
    ready, _, _ = select.select([link], [], [], within_s)
    return link.recv(1) if ready else b""


@pytest.fixture
def child() -> Iterator[tuple[subprocess.Popen, int, socket.socket]]:
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(theirs.fileno())],
                            pass_fds=[theirs.fileno()])
    theirs.close()
    pidfd = os.pidfd_open(proc.pid)
    try:
        assert answered(ours, WAIT_S) == b"r"
        yield proc, pidfd, ours
    finally:
        proc.kill()
        proc.wait(WAIT_S)
        os.close(pidfd)
        ours.close()


@pytest.mark.timeout(60)
def test_a_stopped_child_answers_nothing_until_continued(
        child: tuple[subprocess.Popen, int, socket.socket]) -> None:
    proc, pidfd, link = child
    link.sendall(b"a")
    assert answered(link, WAIT_S) == b"a"
    for _ in range(20):  # each stop in force at once, busy main thread or not
        assert signal_child(proc.pid, pidfd, signal.SIGSTOP)
        assert set(states(proc.pid)) == {"T"}, states(proc.pid)
        link.sendall(b"b")
        assert answered(link, 0.05) == b""  # a stopped answering thread
        assert signal_child(proc.pid, pidfd, signal.SIGSTOP)  # stopped already: at once
        assert signal_child(proc.pid, pidfd, signal.SIGCONT)
        assert answered(link, WAIT_S) == b"b"  # held, not lost


@pytest.mark.timeout(60)
def test_a_dead_child_is_not_waited_on(child: tuple[subprocess.Popen, int, socket.socket]) -> None:
    proc, pidfd, _ = child
    assert signal_child(proc.pid, pidfd, signal.SIGKILL)
    ready, _, _ = select.select([pidfd], [], [], WAIT_S)
    assert ready, "the child did not exit"
    assert not signal_child(proc.pid, pidfd, signal.SIGSTOP)  # a zombie stops never
    proc.wait(WAIT_S)
    assert not signal_child(proc.pid, pidfd, signal.SIGSTOP)  # reaped: gone
